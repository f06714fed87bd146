"""The arithmetic of the shards' quotas (node.quota_split, docs/shards.md
section 4): splits that never exceed the limit, at least one for every
shard with demand while the limit allows, and the two phases of a round,
whose every mix stays within the limit."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.node.quota_split import (
    EMPTY,
    QueueDemand,
    QueueLimits,
    RoundInputs,
    ShardQuotas,
    TenantDemand,
    TenantLimits,
    lowered,
    phases,
    same,
    split_count,
    split_equal,
    split_rate,
    starved,
    targets,
)

shard_counts = st.integers(1, 8)
limits = st.integers(0, 1_000)


@given(limits, shard_counts, st.integers(0, 7))
def test_the_equal_split_sums_to_the_limit_and_differs_by_one_at_most(
    limit: int, shards: int, start: int
) -> None:
    parts = split_equal(limit, shards, start % shards)
    assert sum(parts) == limit
    assert max(parts) - min(parts) <= 1


def test_the_equal_split_gives_its_remainder_from_the_start() -> None:
    assert split_equal(6, 3) == [2, 2, 2]
    assert split_equal(7, 3, 0) == [3, 2, 2]
    assert split_equal(7, 3, 2) == [2, 2, 3]
    assert split_equal(2, 3, 1) == [0, 1, 1]
    # ceil(7 / 3) = 3 each would be 9: never above the limit.
    assert sum(split_equal(7, 3)) == 7


@given(limits, st.lists(st.integers(0, 500), min_size=1, max_size=8), st.integers(0, 7))
def test_a_count_split_by_demand(limit: int, demands: list[int], start: int) -> None:
    parts = split_count(limit, demands, start % len(demands))
    assert sum(parts) == limit
    assert all(part >= 0 for part in parts)
    wanting = [shard for shard, demand in enumerate(demands) if demand > 0]
    if sum(demands) <= limit:
        assert all(part >= demand for part, demand in zip(parts, demands, strict=True))
    else:
        assert all(parts[shard] == 0 for shard in range(len(demands)) if demands[shard] == 0)
    if limit >= len(wanting):
        assert all(parts[shard] >= 1 for shard in wanting)
    else:  # the largest demands get one each
        given_one = sorted(demands[shard] for shard in wanting if parts[shard] >= 1)
        left_out = [demands[shard] for shard in wanting if parts[shard] == 0]
        assert len(given_one) == limit
        assert all(demand <= min(given_one, default=0) for demand in left_out) or limit == 0


def test_a_count_follows_the_demand_beyond_the_limit() -> None:
    assert split_count(6, [90, 10, 0]) == [5, 1, 0]
    assert split_count(6, [30, 30, 0]) == [3, 3, 0]
    assert split_count(6, [1, 1, 1]) == [2, 2, 2]  # demand fits: the rest shared equally
    assert split_count(6, [3, 0, 0]) == [4, 1, 1]
    assert split_count(2, [5, 9, 7]) == [0, 1, 1]  # the largest demands get one each
    assert split_count(6, [100, 1, 1]) == [4, 1, 1]


@given(
    st.integers(0, 100_000),
    st.integers(0, 50),
    st.lists(st.integers(0, 50), min_size=1, max_size=8),
    st.integers(0, 7),
)
def test_a_rate_split(rate: int, burst: int, weights: list[int], start: int) -> None:
    parts = split_rate(rate, burst, weights, start % len(weights))
    rates = [part[0] for part in parts]
    bursts = [part[1] for part in parts]
    assert sum(bursts) == burst
    assert sum(rates) == (rate if burst > 0 else 0)
    assert all(part_burst >= 1 for part_rate, part_burst in parts if part_rate > 0)
    wanting = [shard for shard, weight in enumerate(weights) if weight > 0] or list(
        range(len(weights))
    )
    if burst >= len(wanting):
        assert all(bursts[shard] >= 1 for shard in wanting)


# -- rounds ----------------------------------------------------------------------------


@st.composite
def round_inputs(draw: st.DrawFn) -> RoundInputs:
    shards = draw(st.integers(1, 5))
    names = ["a", "b", "c"]
    queues = {}
    for name in draw(st.lists(st.sampled_from(names), unique=True)):
        rate = draw(st.none() | st.integers(0, 10_000))
        queues[name] = QueueLimits(
            draw(st.none() | st.integers(0, 40)),
            rate,
            None if rate is None else draw(st.integers(1, 20)),
        )
    tenants = {
        name: TenantLimits(draw(st.none() | st.integers(0, 40)), draw(st.none() | limits))
        for name in draw(st.lists(st.sampled_from(names), unique=True))
    }
    queue_demand = [
        {name: QueueDemand(draw(st.integers(0, 60)), draw(st.integers(0, 10))) for name in names}
        for _ in range(shards)
    ]
    tenant_demand = [
        {
            name: TenantDemand(
                draw(st.integers(0, 60)), draw(st.integers(0, 10)), draw(st.integers(0, 900))
            )
            for name in names
        }
        for _ in range(shards)
    ]
    return RoundInputs(shards, queues, tenants, queue_demand, tenant_demand, [EMPTY] * shards)


def assert_within_limits(inputs: RoundInputs, quotas: list[ShardQuotas]) -> None:
    for name, queue in inputs.queues.items():
        rows = [shard.queues.get(name, (None, None, None)) for shard in quotas]
        if queue.concurrency_limit is not None:
            assert sum(row[0] or 0 for row in rows) <= queue.concurrency_limit
            assert all(row[0] is not None for row in rows)
        if queue.rate_milli is not None and queue.burst is not None:
            assert sum(row[1] or 0 for row in rows) <= queue.rate_milli
            assert sum(row[2] or 0 for row in rows) <= queue.burst
    for name, tenant in inputs.tenants.items():
        tenant_rows = [shard.tenants.get(name, (None, None)) for shard in quotas]
        if tenant.concurrency_limit is not None:
            assert sum(row[0] or 0 for row in tenant_rows) <= tenant.concurrency_limit
        if tenant.max_queued is not None:
            assert sum(row[1] or 0 for row in tenant_rows) <= tenant.max_queued


@settings(max_examples=200, deadline=None)
@given(round_inputs(), st.booleans())
def test_a_rounds_targets_never_sum_above_a_limit(inputs: RoundInputs, rebalance: bool) -> None:
    first = targets(inputs, rebalance)
    assert_within_limits(inputs, first)
    again = RoundInputs(
        inputs.shards,
        inputs.queues,
        inputs.tenants,
        inputs.queue_demand,
        inputs.tenant_demand,
        first,
    )
    kept = targets(again, rebalance=False)
    assert kept == first  # nothing changed: every shard keeps its quotas
    assert_within_limits(inputs, targets(again, rebalance=True))


@settings(max_examples=200, deadline=None)
@given(round_inputs(), round_inputs(), st.data())
def test_every_mix_of_a_rounds_phases_stays_within_the_limits(
    before: RoundInputs, after: RoundInputs, data: st.DataObject
) -> None:
    """Quotas of one round in force, the next round's computed from other
    limits and demand: while the shards apply the first phase (each at its
    old quota or its lowered one) the sum is at most the old round's, and
    while they apply the second (each at its lowered or its new quota) at
    most the new limits."""
    shards = min(before.shards, after.shards)
    old_inputs = _with_shards(before, shards)
    new_inputs = _with_shards(after, shards)
    present = targets(old_inputs, rebalance=True)
    wanted = targets(
        RoundInputs(
            shards,
            new_inputs.queues,
            new_inputs.tenants,
            new_inputs.queue_demand,
            new_inputs.tenant_demand,
            present,
        ),
        rebalance=data.draw(st.booleans()),
    )
    first, second = phases(present, wanted)
    low = [first.get(shard, present[shard]) for shard in range(shards)]
    for shard in range(shards):
        assert _at_most(low[shard], present[shard])
        assert _at_most(low[shard], wanted[shard])
        assert same(second.get(shard, low[shard]), wanted[shard])  # the round's end
    for mix in itertools.product((0, 1), repeat=shards):
        during_first = [low[s] if pick else present[s] for s, pick in enumerate(mix)]
        for shard in range(shards):
            assert _at_most(during_first[shard], present[shard])
        during_second = [wanted[s] if pick else low[s] for s, pick in enumerate(mix)]
        assert all(_at_most(q, w) for q, w in zip(during_second, wanted, strict=True))
        assert_within_limits(new_inputs, during_second)


def _with_shards(inputs: RoundInputs, shards: int) -> RoundInputs:
    return RoundInputs(
        shards,
        inputs.queues,
        inputs.tenants,
        inputs.queue_demand[:shards],
        inputs.tenant_demand[:shards],
        [EMPTY] * shards,
    )


def _at_most(low: ShardQuotas, high: ShardQuotas) -> bool:
    """Every quota of `low` is at most `high`'s (no quota counts as above any)."""
    for name in low.queues.keys() | high.queues.keys():
        one = low.queues.get(name, (None, None, None))
        two = high.queues.get(name, (None, None, None))
        if not all(_le(a, b) for a, b in zip(one, two, strict=True)):
            return False
    for name in low.tenants.keys() | high.tenants.keys():
        one_t = low.tenants.get(name, (None, None))
        two_t = high.tenants.get(name, (None, None))
        if not all(_le(a, b) for a, b in zip(one_t, two_t, strict=True)):
            return False
    return True


def _le(a: int | None, b: int | None) -> bool:
    return b is None or (a is not None and a <= b)


def test_phases_lower_first_then_raise() -> None:
    """Quota moves from shard 0 to shard 1 of a limit of 6: shard 0 goes
    down in the first phase, shard 1 up in the second."""
    present = [ShardQuotas({"q": (5, None, None)}, {}), ShardQuotas({"q": (1, None, None)}, {})]
    wanted = [ShardQuotas({"q": (2, None, None)}, {}), ShardQuotas({"q": (4, None, None)}, {})]
    first, second = phases(present, wanted)
    assert first == {0: ShardQuotas({"q": (2, None, None)}, {})}
    assert second == {1: ShardQuotas({"q": (4, None, None)}, {})}
    # A new limit where there was none: lowered from "no quota" at once.
    fresh = [ShardQuotas({"q": (3, None, None)}, {})] * 2
    first, second = phases([EMPTY, EMPTY], fresh)
    assert first == {0: fresh[0], 1: fresh[1]} and second == {}
    # A limit removed: raised (to no quota) in the second phase only.
    first, second = phases(present, [EMPTY, EMPTY])
    assert first == {} and second == {0: EMPTY, 1: EMPTY}
    assert lowered(present[0], EMPTY) == present[0]


def test_idle_quota_where_another_shard_wants_it_is_starving() -> None:
    limits = {"q": QueueLimits(4, None, None)}
    quotas = [ShardQuotas({"q": (2, None, None)}, {}), ShardQuotas({"q": (2, None, None)}, {})]

    def inputs(*demand: QueueDemand) -> RoundInputs:
        return RoundInputs(2, limits, {}, [{"q": d} for d in demand], [{}, {}], quotas)

    assert not starved(inputs(QueueDemand(5, 2), QueueDemand(5, 2)))  # both use theirs
    assert not starved(inputs(QueueDemand(0, 1), QueueDemand(0, 0)))  # nobody wants more
    assert starved(inputs(QueueDemand(5, 2), QueueDemand(0, 0)))  # shard 1's lies idle
    assert starved(inputs(QueueDemand(0, 0), QueueDemand(3, 2)))
    rated = RoundInputs(
        2,
        {"r": QueueLimits(None, 1_000, 2)},
        {},
        [{}, {"r": QueueDemand(1, 0)}],
        [{}, {}],
        [ShardQuotas({"r": (None, 1_000, 2)}, {}), ShardQuotas({"r": (None, 0, 0)}, {})],
    )
    assert starved(rated)
    tenants = [ShardQuotas({}, {"t": (0, None)}), ShardQuotas({}, {"t": (3, None)})]
    waiting = [{"t": TenantDemand(1, 0, 1)}, {}]
    assert starved(RoundInputs(2, {}, {"t": TenantLimits(3, None)}, [{}, {}], waiting, tenants))
