"""A shard's quotas of the cluster-wide flow limits (core.jobs.quota_book).

docs/shards.md, section 4: group 0 gives each shard a quota of every limit
that is a count or a rate, all of one rebalance round in one
`SetShardQuotas`; flow control enforces a limit's quota where one is set,
else the setting, and a shard without quotas behaves and encodes as before.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from core_support import Cluster, assert_rejected_unchanged
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from raftsched import core
from raftsched.core import (
    apply_entry,
    check_invariants,
    decode_entry,
    decode_state,
    encode_entry,
    encode_state,
    new_state,
    state_digest,
)
from raftsched.core.jobs import flow, quota_book
from raftsched.core.jobs.commands import (
    ClaimJobs,
    CompleteJob,
    FailJob,
    SetQueue,
    SetShardQuotas,
    SetTenant,
    SubmitJobs,
)
from raftsched.core.jobs.flow import flow_of
from raftsched.core.jobs.flow_claim import claimable_at_ms
from raftsched.core.jobs.flow_queries import queue_view, tenant_view
from raftsched.core.jobs.quota_book import QueueQuota, TenantQuota
from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.commands import (
    Backoff,
    Barrier,
    Command,
    Entry,
    JobSpec,
    SetShard,
    Tick,
)
from raftsched.core.kernel.results import Ack, Claimed, Lease, Rejected, Result, Submitted
from raftsched.core.kernel.state import State


def sharded() -> Cluster:
    cluster = Cluster()
    assert cluster.one(SetShard(1, 3)) == Ack()
    return cluster


def fill(cluster: Cluster, count: int, queue: str = "q", tenant: str = "default") -> list[str]:
    return [cluster.submit(queue=queue, tenant=tenant) for _ in range(count)]


def claim(cluster: Cluster, n: int = 10, queues: tuple[str, ...] = ("q",)) -> list[Lease]:
    result = cluster.one(ClaimJobs("w1", queues, n))
    assert isinstance(result, Claimed), result
    return list(result.leases)


def complete(cluster: Cluster, lease: Lease) -> None:
    cluster.run(CompleteJob(lease.job_id, lease.fencing_token))


def section_names(state: State) -> list[str]:
    document = msgpack.unpackb(encode_state(state), use_list=True, strict_map_key=False)
    return [name for name, _ in document[-1]]


# -- the command --------------------------------------------------------------------


def test_a_shard_without_quotas_keeps_its_bytes() -> None:
    cluster = sharded()
    cluster.run(SetQueue("q", concurrency_limit=2), SetTenant("t", 2, 3, 4))
    assert quota_book.SHARD_QUOTAS not in section_names(cluster.state)
    assert queue_view(cluster.state, "q", cluster.now_ms).quota is None
    assert tenant_view(cluster.state, "t").quota is None


def test_quotas_are_a_shards() -> None:
    """A group that is no shard has no share to be given."""
    cluster = Cluster()
    rejected = assert_rejected_unchanged(
        cluster, SetShardQuotas(1, (("q", 1, None, None),)), "invalid_state"
    )
    assert "no shard" in rejected.message


def test_one_round_replaces_the_last_and_an_older_one_is_refused() -> None:
    cluster = sharded()
    first = SetShardQuotas(5, (("a", 1, None, None), ("b", None, 1_000, 2)), (("t", 2, 10),))
    assert cluster.one(first) == Ack()
    quotas = quota_book.quotas_of(cluster.state)
    assert quotas.round == 5
    assert quotas.queues == {"a": QueueQuota(1, None, None), "b": QueueQuota(None, 1_000, 2)}
    assert quotas.tenants == {"t": TenantQuota(2, 10)}
    before = cluster.digest()
    assert cluster.one(first) == Ack()  # a repeated proposal changes nothing
    assert cluster.digest() == before
    other = assert_rejected_unchanged(
        cluster, SetShardQuotas(5, (("a", 2, None, None),)), "invalid_request"
    )
    assert other.details == {"field": "round"}
    stale = assert_rejected_unchanged(cluster, SetShardQuotas(4), "invalid_state")
    assert stale.details == {"round": 5}
    assert cluster.one(SetShardQuotas(6, (("c", 0, None, None),))) == Ack()
    quotas = quota_book.quotas_of(cluster.state)
    assert (quotas.round, quotas.queues, quotas.tenants) == (
        6,
        {"c": QueueQuota(0, None, None)},
        {},
    )
    # A round without quotas leaves the shard to the settings (its round stays).
    assert cluster.one(SetShardQuotas(7)) == Ack()
    assert quota_book.SHARD_QUOTAS in section_names(cluster.state)
    assert not quota_book.quotas_of(cluster.state).queues


TOO_MANY = tuple((f"q{n:05d}", 1, None, None) for n in range(quota_book.QUOTA_QUEUES_MAX + 1))


@pytest.mark.parametrize(
    ("command", "details"),
    [
        (SetShardQuotas(0), {"field": "round"}),
        (SetShardQuotas(-1), {"field": "round"}),
        (SetShardQuotas(True), {"field": "round"}),
        (SetShardQuotas("1"), {"field": "round"}),  # type: ignore[arg-type]
        (SetShardQuotas(2**53 + 1), {"field": "round"}),
        (SetShardQuotas(1, [("q", 1, None, None)]), {"field": "queues"}),  # type: ignore[arg-type]
        (SetShardQuotas(1, TOO_MANY), {"field": "queues"}),
        (SetShardQuotas(1, (["q", 1, None, None],)), {"field": "queues", "index": 0}),  # type: ignore[arg-type]
        (SetShardQuotas(1, (("q", 1, None),)), {"field": "queues", "index": 0}),  # type: ignore[arg-type]
        (SetShardQuotas(1, (("", 1, None, None),)), {"field": "queues", "index": 0}),
        (SetShardQuotas(1, ((7, 1, None, None),)), {"field": "queues", "index": 0}),  # type: ignore[arg-type]
        (SetShardQuotas(1, (("q" * 201, 1, None, None),)), {"field": "queues", "index": 0}),
        (
            SetShardQuotas(1, (("b", 1, None, None), ("a", 1, None, None))),
            {"field": "queues", "index": 1},
        ),
        (
            SetShardQuotas(1, (("a", 1, None, None), ("a", 2, None, None))),
            {"field": "queues", "index": 1},
        ),
        (SetShardQuotas(1, (("q", -1, None, None),)), {"field": "queues", "index": 0}),
        (SetShardQuotas(1, (("q", True, None, None),)), {"field": "queues", "index": 0}),
        (SetShardQuotas(1, (("q", 10**9 + 1, None, None),)), {"field": "queues", "index": 0}),
        (SetShardQuotas(1, (("q", None, 1_000, None),)), {"field": "queues", "index": 0}),
        (SetShardQuotas(1, (("q", None, None, 5),)), {"field": "queues", "index": 0}),
        (SetShardQuotas(1, (("q", None, None, None),)), {"field": "queues", "index": 0}),
        (SetShardQuotas(1, (("q", None, -5, 1),)), {"field": "queues", "index": 0}),
        (SetShardQuotas(1, (("q", None, 1.5, 1),)), {"field": "queues", "index": 0}),  # type: ignore[arg-type]
        (SetShardQuotas(1, (), (("t", None, None),)), {"field": "tenants", "index": 0}),
        (SetShardQuotas(1, (), (("t", 1, None, None),)), {"field": "tenants", "index": 0}),  # type: ignore[arg-type]
        (SetShardQuotas(1, (), (("t", 1, -1),)), {"field": "tenants", "index": 0}),
        (SetShardQuotas(1, (), (("t", 1, 1), ("s", 1, 1))), {"field": "tenants", "index": 1}),
        (SetShardQuotas(1, (), ("t",)), {"field": "tenants", "index": 0}),  # type: ignore[arg-type]
        (SetShardQuotas(1, (), None), {"field": "tenants"}),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_round_is_refused_whole(command: SetShardQuotas, details: Any) -> None:
    cluster = sharded()
    cluster.run(SetShardQuotas(1, (("kept", 1, None, None),)))
    rejected = assert_rejected_unchanged(cluster, command, "invalid_request")
    assert rejected.details == details
    assert quota_book.quotas_of(cluster.state).queues == {"kept": QueueQuota(1, None, None)}


def test_set_shard_quotas_waits_for_cluster_version_9() -> None:
    assert core.command_version(SetShardQuotas(1)) == 9
    state = new_state()
    assert core.needs_upgrade(state, SetShardQuotas(1, (("q", 1, None, None),)))


def test_a_round_encodes_and_decodes_exactly() -> None:
    command = SetShardQuotas(
        1_800_000_000_000,
        (("a", 1, None, None), ("b", None, 2_500, 3), ("c", 0, 0, 0)),
        (("t", 4, None), ("u", None, 0)),
    )
    entry = Entry(1, 1_000, (command,))
    data = encode_entry(entry)
    assert decode_entry(data) == entry
    assert encode_entry(decode_entry(data)) == data


@pytest.mark.parametrize(
    "rows",
    [
        {"q": 1},
        [["q", 1, None]],
        [["q", "1", None, None]],
        [[1, 1, None, None]],
        [["q", 1.0, None, None]],
    ],
)
def test_a_malformed_row_does_not_decode(rows: object) -> None:
    data = msgpack.packb([1, 1, 1_000, [[141, 1, rows, []]]])
    with pytest.raises(CodecError):
        decode_entry(data)


@pytest.mark.parametrize(
    "data",
    [
        [1, [], [], []],
        "quotas",
        [0, [], []],
        [1, [["q", 1, None]], []],
        [1, [["q", "x", None, None]], []],
        [1, [], [["t", 1]]],
        [1, {}, []],
    ],
)
def test_a_malformed_section_does_not_decode(data: Any) -> None:
    state = new_state()
    with pytest.raises(CodecError):
        quota_book.SECTION.decode(state, msgpack.unpackb(msgpack.packb(data), use_list=False))


# -- what a claim honours -----------------------------------------------------------------


def test_a_queue_concurrency_quota_below_the_setting_is_what_claims_honour() -> None:
    cluster = sharded()
    cluster.run(SetQueue("q", concurrency_limit=10))
    fill(cluster, 10)
    cluster.run(SetShardQuotas(1, (("q", 2, None, None),)))
    first = claim(cluster)
    assert len(first) == 2 and claim(cluster) == []
    assert claimable_at_ms(cluster.state, ("q",), cluster.now_ms) is None
    complete(cluster, first[0])
    assert claimable_at_ms(cluster.state, ("q",), cluster.now_ms) == cluster.now_ms
    assert len(claim(cluster)) == 1
    # The next round gives the queue no quota: the setting applies again.
    cluster.run(SetShardQuotas(2))
    assert len(claim(cluster)) == 7  # the rest: 2 held, 1 done


def test_a_quota_holds_where_this_shard_has_no_setting() -> None:
    """A shard other than group 0 holds no settings: its quotas are its limits."""
    cluster = sharded()
    fill(cluster, 5)
    fill(cluster, 5, queue="none")
    cluster.run(SetShardQuotas(1, (("none", 0, None, None), ("q", 3, None, None))))
    assert len(claim(cluster, queues=("q", "none"))) == 3
    assert claimable_at_ms(cluster.state, ("none",), cluster.now_ms) is None


def test_a_quota_above_the_setting_is_the_limit_too() -> None:
    """The shard enforces its quota exactly; group 0 keeps their sum within the limit."""
    cluster = sharded()
    cluster.run(SetQueue("q", concurrency_limit=1))
    fill(cluster, 5)
    cluster.run(SetShardQuotas(1, (("q", 3, None, None),)))
    assert len(claim(cluster)) == 3


def test_a_rate_quota_is_the_shards_token_bucket() -> None:
    cluster = sharded()
    cluster.run(SetQueue("q", rate_limit_milli_per_s=10_000, burst=10))
    fill(cluster, 30)
    cluster.run(SetShardQuotas(1, (("q", None, 2_000, 2),)))
    assert len(claim(cluster)) == 2  # the quota's burst, not the setting's
    assert claim(cluster) == []
    assert claimable_at_ms(cluster.state, ("q",), cluster.now_ms) == cluster.now_ms + 500
    cluster.now_ms += 499
    assert claim(cluster) == []
    cluster.now_ms += 1
    assert len(claim(cluster)) == 1
    cluster.now_ms += 10_000  # refills to the quota's burst, not beyond
    assert len(claim(cluster)) == 2
    view = queue_view(cluster.state, "q", cluster.now_ms)
    assert view.quota == QueueQuota(None, 2_000, 2)
    assert (view.rate_limit_milli_per_s, view.burst, view.tokens) == (10_000, 10, 0.0)
    assert view.throttled == view.depth > 0


def test_a_rate_quota_where_there_is_no_setting_keeps_its_bucket_when_idle() -> None:
    cluster = sharded()
    cluster.run(SetShardQuotas(1, (("q", None, 1_000, 1),)))
    assert "q" in flow_of(cluster.state).queues  # the bucket, full
    fill(cluster, 1)
    assert len(claim(cluster)) == 1
    # Nothing is claimable now, and the record's settings are the defaults:
    # a record without a quota would be dropped here, and its bucket with it.
    assert "q" in flow_of(cluster.state).queues
    fill(cluster, 1)
    assert claim(cluster) == []
    cluster.now_ms += 1_000
    assert len(claim(cluster)) == 1
    restored = decode_state(encode_state(cluster.state))
    assert state_digest(restored) == cluster.digest()
    # Without the rate quota the default record goes when next idle.
    cluster.run(SetShardQuotas(2))
    assert "q" not in flow_of(cluster.state).queues


def test_a_rebalance_never_adds_tokens() -> None:
    cluster = sharded()
    fill(cluster, 20)
    cluster.run(SetShardQuotas(1, (("q", None, 1_000, 5),)))
    assert len(claim(cluster)) == 5  # a new bucket starts full
    cluster.run(SetShardQuotas(2, (("q", None, 1_000, 10),)))  # a larger burst
    assert claim(cluster) == []
    cluster.now_ms += 1_000
    assert len(claim(cluster)) == 1
    cluster.now_ms += 60_000
    cluster.run(SetShardQuotas(3, (("q", None, 1_000, 2),)))  # full at 10, kept at 2
    assert len(claim(cluster)) == 2
    # SetQueue changes the setting's bucket, not the quota's: no refill.
    cluster.run(SetQueue("q", rate_limit_milli_per_s=50_000, burst=50))
    assert claim(cluster) == []
    # Without a rate quota the setting's bucket applies, from what it has.
    cluster.run(SetShardQuotas(4))
    assert claim(cluster) == []
    cluster.now_ms += 100
    assert len(claim(cluster)) == 5


def test_a_rate_quota_of_nothing_grants_nothing() -> None:
    cluster = sharded()
    fill(cluster, 3)
    cluster.run(SetShardQuotas(1, (("q", None, 0, 0),)))
    assert claim(cluster) == []
    assert claimable_at_ms(cluster.state, ("q",), cluster.now_ms) is None
    cluster.now_ms += 3_600_000
    assert claim(cluster) == []
    cluster.run(SetShardQuotas(2, (("q", None, 0, 2),)))  # a burst and no refill
    assert claim(cluster) == []  # a rebalance never adds tokens
    cluster.run(SetShardQuotas(3, (("q", None, 1_000, 2),)))
    assert claimable_at_ms(cluster.state, ("q",), cluster.now_ms) == cluster.now_ms + 1_000


def test_a_tenant_concurrency_quota_holds_across_queues() -> None:
    cluster = sharded()
    cluster.run(SetTenant("a", concurrency_limit=10))
    fill(cluster, 5, queue="q1", tenant="a")
    fill(cluster, 5, queue="q2", tenant="a")
    fill(cluster, 3, queue="q2", tenant="b")
    cluster.run(SetShardQuotas(1, (), (("a", 2, None),)))
    leases = claim(cluster, 20, queues=("q1", "q2"))
    tenants = sorted(cluster.job(lease.job_id).tenant for lease in leases)
    assert tenants == ["a", "a", "b", "b", "b"]
    view = tenant_view(cluster.state, "a")
    assert (view.concurrency_limit, view.quota, view.throttled) == (10, TenantQuota(2, None), 8)


def test_a_max_queued_quota_answers_queue_full() -> None:
    cluster = sharded()
    cluster.run(SetTenant("a", max_queued=100))
    cluster.run(SetShardQuotas(1, (), (("a", None, 2),)))
    result = cluster.one(SubmitJobs((JobSpec("q", tenant="a"),) * 3, ("j1", "j2", "j3")))
    assert isinstance(result, Submitted)
    codes = [getattr(item, "code", "ok") for item in result.items]
    assert codes == ["ok", "ok", "queue_full"]
    assert result.items[2].details["max_queued"] == 2  # type: ignore[union-attr]


# -- properties ----------------------------------------------------------------------

QUEUES = ("a", "b")
TENANTS = ("t1", "t2")
EXTRA = st.one_of(st.none(), st.integers(1, 5))  # how far above the quota a setting is


class QuotaTwins(RuleBasedStateMachine):
    """Two shards given the same commands: `quotas` has settings above its
    quotas (or none: no limit) and `plain` has settings equal to them and no
    quotas. The claim path must honour the quota exactly as it honours a
    setting, so every result is the same in both, and no claim takes a
    queue or a tenant past its quota."""

    def __init__(self) -> None:
        super().__init__()
        self.quotas = Cluster()
        self.plain = Cluster()
        self.both(SetShard(2, 4))
        self.round = 0
        self.leases: list[Lease] = []
        self.limits: dict[str, Any] = {}

    def both(self, command: Command, plain: Command | None = None) -> Result:
        """Apply `command` to both (`plain` instead to the plain twin)."""
        (result,) = self.quotas.run(command)
        (twin,) = self.plain.run(command if plain is None else plain)
        assert result == twin, (command, result, twin)
        return result

    def tick_both(self, step_ms: int) -> None:
        for cluster in (self.quotas, self.plain):
            cluster.run(Tick(seed=1), at=cluster.now_ms + step_ms)
        assert self.quotas.now_ms == self.plain.now_ms

    @initialize(
        rate=st.sampled_from([500, 2_000, 5_000]),
        burst=st.integers(1, 3),
        data=st.data(),
    )
    def settings_and_quotas(self, rate: int, burst: int, data: st.DataObject) -> None:
        concurrency = {
            "a": data.draw(st.one_of(st.none(), st.integers(0, 3))),
            "b": data.draw(st.integers(0, 4)),  # queue b always has one: see `_queues`
        }
        tenants = {
            tenant: (
                data.draw(st.integers(1, 2)),
                data.draw(st.one_of(st.none(), st.integers(0, 3))),
                data.draw(st.one_of(st.none(), st.integers(1, 6))),
            )
            for tenant in TENANTS
        }
        self.limits = {"rate": (rate, burst), "concurrency": concurrency, "tenants": tenants}

        def above(quota: int | None) -> int | None:
            extra = data.draw(EXTRA)
            return None if quota is None or extra is None else quota + extra

        # The quota shard: settings above the quotas, then its quotas.
        rate_above, burst_above = rate + data.draw(st.integers(1, 5_000)), burst + 3
        self.both(
            SetQueue("a", False, rate_above, burst_above, above(concurrency["a"])),
            SetQueue("a", False, rate, burst, concurrency["a"]),
        )
        b_above = concurrency["b"] + data.draw(st.integers(1, 5))
        self.both(
            SetQueue("b", concurrency_limit=b_above),
            SetQueue("b", concurrency_limit=concurrency["b"]),
        )
        for tenant, (weight, limit, most) in tenants.items():
            self.both(
                SetTenant(tenant, weight, above(limit), above(most)),
                SetTenant(tenant, weight, limit, most),
            )
        self.new_round()

    def _queues(self) -> tuple[Any, ...]:
        rate, burst = self.limits["rate"]
        concurrency = self.limits["concurrency"]
        # Queue b keeps a concurrency quota in every round, so that both
        # twins keep its record (and its fair-share rotation) alike.
        return (("a", concurrency["a"], rate, burst), ("b", concurrency["b"], None, None))

    def new_round(self) -> None:
        self.round += 1
        tenants = tuple(
            (name, limit, most)
            for name, (_, limit, most) in sorted(self.limits["tenants"].items())
            if (limit, most) != (None, None)
        )
        (result,) = self.quotas.run(SetShardQuotas(self.round, self._queues(), tenants))
        assert result == Ack(), result

    @rule(data=st.data())
    def rebalance(self, data: st.DataObject) -> None:
        """A new round: other counts where there are quotas (the rate stays,
        which `SetQueue` could not keep in the plain twin: it refills)."""
        concurrency = self.limits["concurrency"]
        if concurrency["a"] is not None:
            concurrency["a"] = data.draw(st.integers(0, 3))
        concurrency["b"] = data.draw(st.integers(0, 4))
        rate, burst = self.limits["rate"]
        self.plain.run(SetQueue("a", False, rate, burst, concurrency["a"]))
        self.plain.run(SetQueue("b", concurrency_limit=concurrency["b"]))
        for tenant, (weight, limit, most) in list(self.limits["tenants"].items()):
            limit = limit if limit is None else data.draw(st.integers(0, 3))
            most = most if most is None else data.draw(st.integers(1, 6))
            self.limits["tenants"][tenant] = (weight, limit, most)
            self.plain.run(SetTenant(tenant, weight, limit, most))
        self.new_round()

    @rule(
        queue=st.sampled_from(QUEUES),
        tenant=st.sampled_from(TENANTS),
        priority=st.integers(0, 2),
        count=st.integers(1, 3),
    )
    def submit(self, queue: str, tenant: str, priority: int, count: int) -> None:
        n = self.quotas.next_id
        self.quotas.next_id = self.plain.next_id = n + count
        spec = JobSpec(queue, tenant=tenant, priority=priority, backoff=Backoff(0, 0, 0))
        self.both(SubmitJobs((spec,) * count, tuple(f"job_{n + i}" for i in range(count))))

    @rule(queues=st.sampled_from([("a",), ("b",), ("a", "b")]), n=st.integers(1, 4))
    def claim(self, queues: tuple[str, ...], n: int) -> None:
        state = self.quotas.state
        leased = self.leased(state)
        result = self.both(ClaimJobs("w", queues, n))
        assert isinstance(result, Claimed)
        self.leases += result.leases
        after = self.leased(state)
        for name, count in after.items():
            quota = self.quota_of(name)
            if count > leased.get(name, 0) and quota is not None:
                assert count <= quota, (name, count, quota)  # a claim stops at the quota

    def leased(self, state: State) -> dict[str, int]:
        counts = {queue: state.queue_counts.get(queue, [0, 0, 0])[1] for queue in QUEUES}
        for tenant in TENANTS:
            counts[tenant] = state.runnable.tenants.get(tenant, [0, 0])[1]
        return counts

    def quota_of(self, name: str) -> int | None:
        if name in QUEUES:
            limit: int | None = self.limits["concurrency"][name]
            return limit
        limit = self.limits["tenants"][name][1]
        return limit

    @rule(data=st.data(), fail=st.booleans())
    @precondition(lambda self: self.leases)
    def finish(self, data: st.DataObject, fail: bool) -> None:
        lease = self.leases.pop(data.draw(st.integers(0, len(self.leases) - 1)))
        if fail:
            self.both(FailJob(lease.job_id, lease.fencing_token, "transient", "again"))
        else:
            self.both(CompleteJob(lease.job_id, lease.fencing_token))

    @rule(step_ms=st.sampled_from([0, 100, 400, 1_000, 5_000]))
    def time_passes(self, step_ms: int) -> None:
        self.tick_both(step_ms)

    @invariant()
    def the_twins_agree(self) -> None:
        quotas, plain = self.quotas.state, self.plain.state  # (Cluster.run checked both)
        assert {job_id: job.status for job_id, job in quotas.jobs.items()} == {
            job_id: job.status for job_id, job in plain.jobs.items()
        }
        now_ms = self.quotas.now_ms
        for queue in QUEUES:
            assert claimable_at_ms(quotas, (queue,), now_ms) == claimable_at_ms(
                plain, (queue,), now_ms
            )
            assert (
                queue_view(quotas, queue, now_ms).tokens == queue_view(plain, queue, now_ms).tokens
            )


QuotaTwins.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestQuotaTwins = QuotaTwins.TestCase


def test_a_rolled_back_round_leaves_the_quotas_and_the_buckets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A handler that raises after the round was stored (a bug) is rolled
    back whole: the quotas, the round and the buckets it settled."""
    cluster = sharded()
    cluster.run(SetQueue("q", rate_limit_milli_per_s=1_000, burst=4))
    cluster.run(SetShardQuotas(1, (("q", 1, 500, 2),)))
    at_ms = cluster.now_ms + 10
    expected = decode_state(encode_state(cluster.state))  # the same entry time, nothing else
    apply_entry(expected, Entry(cluster.epoch, at_ms, (Barrier(),)))

    def broken(state: State, queue: str) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(flow, "drop_if_idle", broken)
    entry = Entry(cluster.epoch, at_ms, (SetShardQuotas(2, (("q", None, 9, 9),)),))
    (result,) = apply_entry(cluster.state, entry)
    assert isinstance(result, Rejected) and result.code == "internal_error"
    assert check_invariants(cluster.state) == []
    assert cluster.digest() == state_digest(expected)
    assert quota_book.quotas_of(cluster.state).round == 1
    record = flow_of(cluster.state).queues["q"]
    assert (record.rate_milli, record.burst, record.tokens_micro) == (1_000, 4, 2 * 1_000_000)
