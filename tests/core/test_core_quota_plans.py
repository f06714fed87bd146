"""Group 0's record of every shard's quotas (core.jobs.quota_plans).

docs/shards.md, section 4: group 0's leader records each shard's quotas of
a round with `PlanShardQuotas`; the node hosting that shard's leader then
proposes them there as `SetShardQuotas`. The record is checked as a round
is, a repeat changes nothing, an older round is refused, and a state
without plans keeps its bytes.
"""

from __future__ import annotations

import msgpack
import pytest
from core_support import Cluster, assert_rejected_unchanged

from raftsched import core
from raftsched.core import decode_entry, decode_state, encode_entry, encode_state, new_state
from raftsched.core.jobs import quota_plans
from raftsched.core.jobs.commands import PlanShardQuotas, SetQueue
from raftsched.core.jobs.quota_book import QueueQuota, TenantQuota
from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.commands import Entry, SetShard
from raftsched.core.kernel.results import Ack
from raftsched.core.kernel.state import State


def group_zero(count: int = 3) -> Cluster:
    cluster = Cluster()
    assert cluster.one(SetShard(0, count)) == Ack()
    return cluster


def section_names(state: State) -> list[str]:
    document = msgpack.unpackb(encode_state(state), use_list=True, strict_map_key=False)
    return [name for name, _ in document[-1]]


def test_a_group_without_plans_keeps_its_bytes() -> None:
    cluster = group_zero()
    cluster.run(SetQueue("q", concurrency_limit=3))
    assert quota_plans.QUOTA_PLANS not in section_names(cluster.state)


def test_plans_are_recorded_per_shard_and_rounds_only_go_up() -> None:
    cluster = group_zero()
    first = PlanShardQuotas(1, 10, (("q", 1, None, None),), (("t", None, 4),))
    assert cluster.one(first) == Ack()
    assert cluster.one(PlanShardQuotas(2, 10, (("q", 2, 500, 1),))) == Ack()
    plans = quota_plans.plans_of(cluster.state)
    assert sorted(plans) == [1, 2]
    assert plans[1].round == 10
    assert plans[1].queues == {"q": QueueQuota(1, None, None)}
    assert plans[1].tenants == {"t": TenantQuota(None, 4)}
    assert plans[2].queues == {"q": QueueQuota(2, 500, 1)}
    before = cluster.digest()
    assert cluster.one(first) == Ack()  # a repeat
    assert cluster.digest() == before
    other = assert_rejected_unchanged(cluster, PlanShardQuotas(1, 10), "invalid_request")
    assert other.details == {"field": "round", "shard": 1}
    stale = assert_rejected_unchanged(cluster, PlanShardQuotas(1, 9), "invalid_state")
    assert stale.details == {"round": 10, "shard": 1}
    assert cluster.one(PlanShardQuotas(1, 11)) == Ack()  # a newer round replaces it whole
    assert quota_plans.plans_of(cluster.state)[1].queues == {}
    assert quota_plans.QUOTA_PLANS in section_names(cluster.state)


def test_a_plan_needs_the_shard_count_and_a_shard_below_it() -> None:
    rejected = assert_rejected_unchanged(Cluster(), PlanShardQuotas(0, 1), "invalid_state")
    assert "has not recorded its shard" in rejected.message
    cluster = group_zero(3)
    for shard in (3, -1, 64):
        refused = assert_rejected_unchanged(cluster, PlanShardQuotas(shard, 1), "invalid_request")
        assert refused.details == {"field": "shard"}


@pytest.mark.parametrize(
    "command",
    [
        PlanShardQuotas(0, 0),
        PlanShardQuotas(0, 1, (("q", None, None, None),)),
        PlanShardQuotas(0, 1, (("b", 1, None, None), ("a", 1, None, None))),
        PlanShardQuotas(0, 1, (("q", None, 1_000, None),)),
        PlanShardQuotas(0, 1, (), (("t", -1, None),)),
    ],
)
def test_a_malformed_plan_is_refused_as_a_round_is(command: PlanShardQuotas) -> None:
    assert_rejected_unchanged(group_zero(), command, "invalid_request")


def test_plans_survive_the_snapshot_and_encode_exactly() -> None:
    cluster = group_zero(4)
    cluster.run(
        PlanShardQuotas(0, 7, (("a", 1, None, None), ("b", None, 2_500, 3)), (("t", 4, None),)),
        PlanShardQuotas(3, 8, (), (("u", None, 0),)),
    )
    data = encode_state(cluster.state)
    again = decode_state(data)
    assert encode_state(again) == data
    assert quota_plans.plans_of(again)[3].tenants == {"u": TenantQuota(None, 0)}
    assert core.check_invariants(again) == []
    entry = Entry(1, 1_000, (PlanShardQuotas(2, 9, (("q", 0, 0, 0),), (("t", 1, 2),)),))
    assert decode_entry(encode_entry(entry)) == entry


@pytest.mark.parametrize(
    "data",
    [
        [[0, 1, [], []], [0, 2, [], []]],  # a shard twice
        [[-1, 1, [], []]],
        [[0, 0, [], []]],
        [[0, 1, [["q", 1, None]], []]],
        [[0, 1, [["q", "1", None, None]], []]],
        [[0, 1, [], [["t", 1]]]],
        [[0, 1, []]],
        {"0": 1},
    ],
)
def test_a_malformed_section_does_not_decode(data: object) -> None:
    cluster = group_zero()
    cluster.run(PlanShardQuotas(0, 1, (("q", 1, None, None),)))
    document = msgpack.unpackb(encode_state(cluster.state), use_list=True, strict_map_key=False)
    for row in document[-1]:
        if row[0] == quota_plans.QUOTA_PLANS:
            row[1] = data
    with pytest.raises(CodecError):
        decode_state(msgpack.packb(document, use_bin_type=True))


def test_plan_shard_quotas_waits_for_cluster_version_9() -> None:
    assert core.command_version(PlanShardQuotas(0, 1)) == 9
    assert core.needs_upgrade(new_state(), PlanShardQuotas(0, 1))
