"""node.series: the dashboard's ring of per-queue figures, fed by a real replica.

Each test applies real entries to a `ReplicatedState` (the node's own apply
path, with the ring's hook) and reads the ring with a clock the test moves:
counts land in the bucket of their replicated time, the gauges in the bucket
the sampler ran in, what a node cannot know is null, and the ring stays
within its bounds however long it runs and however many queues come by.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from raftsched import core
from raftsched.core.events.commands import ConfigureOutbox
from raftsched.core.jobs.commands import ClaimJobs, CompleteJob, FailJob, SubmitJobs
from raftsched.core.kernel.commands import Command, Entry, JobSpec, TakeOver
from raftsched.core.kernel.results import Claimed, Failed, Lease
from raftsched.node.machine import ReplicatedState
from raftsched.node.series import (
    FIELDS,
    LAGS_OPEN_BUCKETS,
    LAGS_OPEN_MAX,
    PERIOD_MS,
    QUEUES_MAX,
    SLOTS,
    WINDOW_S,
    SeriesRing,
    lag_step,
    p99_s,
)

T0 = 1_800_000_000_000  # a bucket boundary (divisible by PERIOD_MS)


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


class Replica:
    """A replica whose entries the ring observes, stamped by a test 'leader'."""

    def __init__(
        self, clock: Clock, ring: SeriesRing | None = None, *, take_over: bool = True
    ) -> None:
        self.clock = clock
        self.ring = ring or SeriesRing(clock)
        self.machine = ReplicatedState(
            lambda: None,
            on_results=self.ring.count_applied,
            on_restored=self.ring.note_restored,
        )
        self.ids = 0
        if take_over:
            self.run(TakeOver())

    def run(self, *commands: Command, at_ms: int | None = None) -> list[Any]:
        entry = Entry(1, self.clock.ms if at_ms is None else at_ms, tuple(commands))
        results = self.machine.apply(core.encode_entry(entry))
        assert isinstance(results, list)
        return results

    def submit(self, queue: str, count: int = 1, at_ms: int | None = None, **fields: Any) -> None:
        ids = tuple(f"job_{self.ids + i}" for i in range(count))
        self.ids += count
        specs = tuple(JobSpec(queue=queue, **fields) for _ in ids)
        self.run(SubmitJobs(specs, ids), at_ms=at_ms)

    def claim(self, queue: str, count: int = 1, at_ms: int | None = None) -> list[Lease]:
        (result,) = self.run(ClaimJobs("w1", (queue,), count, None), at_ms=at_ms)
        assert isinstance(result, Claimed), result
        return list(result.leases)

    def reading(self) -> Any:
        return self.machine.reading()


def at(window: Any, field: str, bucket_start_ms: int) -> Any:
    index = window.at.index(_iso(bucket_start_ms))
    return window.values[field][index]


def _iso(ms: int) -> str:
    from raftsched.timefmt import format_ms

    return format_ms(ms)


def test_counts_land_in_the_bucket_of_their_replicated_time() -> None:
    clock = Clock(T0 + 1_000)
    replica = Replica(clock)
    replica.submit("payments", 4, max_attempts=3)
    leases = replica.claim("payments", 4)
    ok, retried, dead, other = leases
    replica.run(
        CompleteJob(ok.job_id, ok.fencing_token),
        FailJob(retried.job_id, retried.fencing_token, "transient", "timeout"),
        FailJob(dead.job_id, dead.fencing_token, "permanent", "card declined"),
    )
    # Applied later, but stamped by the leader in the next bucket.
    replica.run(CompleteJob(other.job_id, other.fencing_token), at_ms=T0 + PERIOD_MS + 10)
    clock.ms = T0 + 3 * PERIOD_MS
    assert replica.ring.read_outbox(replica.reading) is False
    for queue in ("payments", None):
        window = replica.ring.read(queue, WINDOW_S)
        assert window is not None and len(window.at) == WINDOW_S * 1000 // PERIOD_MS
        assert at(window, "succeeded_per_s", T0) == 1 / 5
        assert at(window, "failed_per_s", T0) == 2 / 5
        assert at(window, "dead_lettered_per_s", T0) == 1 / 5
        assert at(window, "succeeded_per_s", T0 + PERIOD_MS) == 1 / 5
        assert at(window, "failed_per_s", T0 + PERIOD_MS) == 0.0
        # Before: the replica applied every entry, so zeros, not unknowns.
        assert at(window, "succeeded_per_s", T0 - PERIOD_MS) == 0.0
        assert sum(v for v in window.values["succeeded_per_s"] if v) * 5 == pytest.approx(2)
    assert replica.ring.read("refunds", WINDOW_S) is None
    assert replica.ring.queues() == ["payments"]


def test_outbox_events_are_read_once_whatever_the_chunks() -> None:
    clock = Clock(T0)
    replica = Replica(clock)
    replica.submit("q", 30)
    leases = replica.claim("q", 30)
    replica.run(*(CompleteJob(lease.job_id, lease.fencing_token) for lease in leases))
    chunks = 0
    while replica.ring.read_outbox(replica.reading, limit=7):
        chunks += 1
    assert chunks == 4  # 30 events, 7 at a time: the fifth read finds 2 and no more
    replica.ring.read_outbox(replica.reading)  # nothing new: counts nothing twice
    clock.ms = T0 + PERIOD_MS
    window = replica.ring.read("q", 60)
    assert window is not None
    assert at(window, "succeeded_per_s", T0) == 30 / 5


def test_due_to_lease_lag_p99_within_one_histogram_step() -> None:
    clock = Clock(T0)
    replica = Replica(clock)
    replica.submit("q", 100)  # due at once
    for i in range(100):  # claimed 10 ms, 20 ms, ... 1000 ms after they became due
        replica.claim("q", 1, at_ms=T0 + 10 * (i + 1))
    clock.ms = T0 + PERIOD_MS
    window = replica.ring.read("q", 60)
    assert window is not None
    p99 = at(window, "due_to_lease_p99_s", T0)
    assert 0.990 <= p99 <= 0.990 * 2 ** (1 / 8)  # the 99th of 100 is 990 ms
    assert at(window, "due_to_lease_p99_s", T0 - PERIOD_MS) is None  # no claim then
    # Reduced to its p99 once the bucket is old enough; late claims do not change it.
    clock.ms = T0 + (LAGS_OPEN_BUCKETS + 2) * PERIOD_MS
    replica.ring.close_lags()
    replica.submit("q", 1)
    replica.claim("q", 1, at_ms=T0 + 4_000)
    window = replica.ring.read("q", 120)
    assert window is not None
    assert at(window, "due_to_lease_p99_s", T0) == p99


def test_lag_histogram_steps() -> None:
    assert lag_step(0) == -1
    assert lag_step(1) == 0
    assert lag_step(2) == 8
    assert p99_s({-1: 100}) == 0.0
    assert p99_s({lag_step(1000): 99, lag_step(60_000): 1}) == pytest.approx(
        2 ** ((lag_step(1000) + 1) / 8) / 1000, rel=1e-6
    )


def test_gauges_are_sampled_into_the_current_bucket() -> None:
    clock = Clock(T0 + 1_000)
    replica = Replica(clock)
    replica.submit("q", 3)
    replica.submit("idle", 1, delay_ms=3_600_000)  # stored, not runnable
    clock.ms = T0 + PERIOD_MS - 250  # when the sampler runs, by this node's clock
    replica.ring.sample_gauges(replica.reading)
    clock.ms = T0 + 3 * PERIOD_MS
    window = replica.ring.read("q", 60)
    assert window is not None
    assert at(window, "depth", T0) == 3
    assert at(window, "oldest_runnable_age_s", T0) == 3.75
    assert at(window, "depth", T0 + PERIOD_MS) is None  # not sampled: unknown
    total = replica.ring.read(None, 60)
    assert total is not None and at(total, "depth", T0) == 3
    # A queue with no runnable job gets no series from the gauges alone.
    assert replica.ring.read("idle", 60) is None


def test_a_loaded_snapshot_leaves_the_applied_counts_unknown() -> None:
    clock = Clock(T0)
    leader = Replica(clock)
    leader.submit("q", 2)
    first, second = leader.claim("q", 2)
    leader.run(FailJob(first.job_id, first.fencing_token, "permanent", "no"))
    snapshot = core.encode_state(leader.machine.state)
    clock.ms = T0 + 2 * PERIOD_MS
    # A new member: applied nothing of the above, it loads the leader's snapshot.
    follower = Replica(clock, take_over=False)
    follower.machine.restore(snapshot)
    follower.run(FailJob(second.job_id, second.fencing_token, "permanent", "no"))
    follower.ring.read_outbox(follower.reading)
    clock.ms = T0 + 4 * PERIOD_MS
    window = follower.ring.read("q", 60)
    assert window is not None
    # The first failure was in the snapshot: unknown; its dead letter is in
    # the replicated outbox: counted.
    assert at(window, "failed_per_s", T0) is None
    assert at(window, "due_to_lease_p99_s", T0) is None
    assert at(window, "dead_lettered_per_s", T0) == 1 / 5
    assert at(window, "failed_per_s", T0 + 2 * PERIOD_MS) == 1 / 5
    assert at(window, "dead_lettered_per_s", T0 + 2 * PERIOD_MS) == 1 / 5


def test_events_gone_from_a_full_outbox_are_unknown_not_zero() -> None:
    clock = Clock(T0)
    replica = Replica(clock)
    replica.run(ConfigureOutbox(events_max=5))
    replica.submit("q", 10)
    leases = replica.claim("q", 10)
    replica.run(*(CompleteJob(lease.job_id, lease.fencing_token) for lease in leases[:8]))
    clock.ms = T0 + 2 * PERIOD_MS
    replica.run(*(CompleteJob(lease.job_id, lease.fencing_token) for lease in leases[8:]))
    replica.ring.read_outbox(replica.reading)  # the first read: 3 of the first 8 are gone
    clock.ms = T0 + 4 * PERIOD_MS
    window = replica.ring.read("q", 60)
    assert window is not None
    assert at(window, "succeeded_per_s", T0) is None
    assert at(window, "succeeded_per_s", T0 + 2 * PERIOD_MS) == 2 / 5
    assert at(window, "failed_per_s", T0) == 0.0  # applied here: known


def test_the_ring_is_bounded_in_time() -> None:
    clock = Clock(T0)
    replica = Replica(clock)
    ring = replica.ring
    size = ring.nbytes()
    for i in range(3 * SLOTS):
        clock.ms = T0 + i * PERIOD_MS
        replica.submit("q", 1)
        (lease,) = replica.claim("q", 1)
        replica.run(FailJob(lease.job_id, lease.fencing_token, "permanent", "x"))
        ring.sample_gauges(replica.reading)
        if i % 50 == 0:
            ring.read_outbox(replica.reading)
            ring.close_lags()
    ring.read_outbox(replica.reading)
    clock.ms += PERIOD_MS
    ring.close_lags()
    window = ring.read("q", WINDOW_S)
    assert window is not None
    assert len(window.at) == SLOTS - 1 == 720
    assert all(value == 1 / 5 for value in window.values["failed_per_s"])
    assert all(value == 1 / 5 for value in window.values["dead_lettered_per_s"])
    assert all(value is not None for value in window.values["depth"])
    assert ring.nbytes() == size + 6 * 8 * SLOTS  # the cluster's and one queue's columns
    # Open lag histograms: the cluster's and the queue's of the recent buckets.
    assert len(ring._lags) <= 2 * (LAGS_OPEN_BUCKETS + 1)


def test_the_ring_is_bounded_in_queues() -> None:
    clock = Clock(T0)
    ring = SeriesRing(clock, queues_max=3)
    replica = Replica(clock, ring)
    for name in ("a", "b", "c", "d"):
        replica.submit(name, 1)
        replica.claim(name, 1)
    assert ring.queues() == ["a", "b", "c"]
    assert ring.refusals > 0
    # The cluster counts every queue's claims.
    clock.ms = T0 + PERIOD_MS
    total = ring.read(None, 60)
    assert total is not None and at(total, "due_to_lease_p99_s", T0) is not None
    # An hour later the idle ones give way; the newcomer's past is unknown
    # (some of it was refused), not zero.
    clock.ms = T0 + (SLOTS + 1) * PERIOD_MS
    replica.submit("d", 1)
    (lease,) = replica.claim("d", 1)
    replica.run(FailJob(lease.job_id, lease.fencing_token, "transient", "x"))
    assert "d" in ring.queues() and len(ring.queues()) == 3
    clock.ms += PERIOD_MS
    window = ring.read("d", 60)
    assert window is not None
    assert window.values["failed_per_s"][-1] == 1 / 5
    assert window.values["failed_per_s"][0] is None
    expected_max = (3 + 1) * 6 * 8 * SLOTS + 8 * SLOTS
    assert ring.nbytes() <= expected_max


def test_the_default_bounds_stated_in_the_docs() -> None:
    assert (SLOTS, PERIOD_MS, QUEUES_MAX) == (721, 5_000, 50)
    per_series = 6 * 8 * SLOTS
    assert per_series == 34_608
    assert (QUEUES_MAX + 1) * per_series + 8 * SLOTS < 1.8e6
    assert FIELDS == (
        "succeeded_per_s",
        "failed_per_s",
        "dead_lettered_per_s",
        "depth",
        "oldest_runnable_age_s",
        "due_to_lease_p99_s",
    )


def test_a_count_stamped_ahead_of_this_nodes_clock_is_counted_now() -> None:
    clock = Clock(T0)
    replica = Replica(clock)
    replica.submit("q", 1)
    (lease,) = replica.claim("q", 1)
    result = replica.run(
        FailJob(lease.job_id, lease.fencing_token, "transient", "x"), at_ms=T0 + 3_600_000
    )
    assert isinstance(result[0], Failed)
    clock.ms = T0 + PERIOD_MS
    window = replica.ring.read("q", 60)
    assert window is not None
    assert at(window, "failed_per_s", T0) == 1 / 5
    assert not any(
        isinstance(v, float) and math.isnan(v) for values in window.values.values() for v in values
    )


def test_open_lag_histograms_are_bounded_when_nothing_samples() -> None:
    """A node replaying an hour of log at start, before its sampler runs:
    the oldest histograms are reduced to their p99 as new ones open."""
    clock = Clock(T0)
    replica = Replica(clock)
    clock.ms = T0 + SLOTS * PERIOD_MS
    for i in range(SLOTS - 1):
        replica.submit("q", 1, at_ms=T0 + i * PERIOD_MS)
        replica.claim("q", 1, at_ms=T0 + i * PERIOD_MS + 100)
    assert len(replica.ring._lags) == LAGS_OPEN_MAX
    window = replica.ring.read("q", WINDOW_S)
    assert window is not None
    assert window.values["due_to_lease_p99_s"][1] == round(2 ** ((lag_step(100) + 1) / 8) / 1000, 6)
