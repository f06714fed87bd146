"""Paced hydration of the time wheel (kernel.wheel, cluster version 8).

A bucket enters the horizon at E = start - horizon and should be live by its
soft deadline S = start - horizon / 2. At version 8 a Tick in [E, S) makes
`pace_quota` of its jobs live and the wheel asks for the next Tick one
`PACE_MS` step later; past S a Tick goes at its whole budget. At version 7
(the v0.7.0 fixtures) hydration goes as fast as Ticks go, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from core_support import T0, Cluster

from raftsched.core import (
    State,
    apply_entry,
    check_invariants,
    decode_state,
    encode_state,
    next_due_ms,
    state_digest,
)
from raftsched.core.jobs.commands import CancelJob, ConfigureWheel, SubmitJobs
from raftsched.core.kernel import wheel
from raftsched.core.kernel.commands import Barrier, Entry, JobSpec, RaiseClusterVersion, Tick
from raftsched.core.kernel.model import PENDING, SCHEDULED
from raftsched.core.kernel.results import Ack, Rejected, Submitted, Ticked
from raftsched.core.kernel.validate import BATCH_MAX

HORIZON = 6_000  # paced over its first 3 s: 30 steps
BUCKET = 1_000
CHUNK = wheel.CHUNK_JOBS
BUDGET = 1_000  # the leader's Tick (TICK_ITEMS_MAX)


def wheel_cluster(version: int) -> Cluster:
    cluster = Cluster()
    commands = (RaiseClusterVersion(version), ConfigureWheel(HORIZON, BUCKET))
    assert cluster.run(*commands) == [Ack(), Ack()]
    return cluster


def fill(cluster: Cluster, start_ms: int, count: int, prefix: str = "job") -> list[str]:
    """`count` jobs packed in the bucket that begins at `start_ms`."""
    assert start_ms % BUCKET == 0
    specs = tuple(
        JobSpec("q", payload=bytes([i % 7]), run_at_ms=start_ms + i % 3) for i in range(count)
    )
    ids = [f"{prefix}_{i:05d}" for i in range(count)]
    for at in range(0, count, BATCH_MAX):
        batch = SubmitJobs(specs[at : at + BATCH_MAX], tuple(ids[at : at + BATCH_MAX]))
        (result,) = cluster.run(batch)
        assert isinstance(result, Submitted), result
    assert bucket_count(cluster.state, start_ms) == count
    return ids


def packed(state: State) -> int:
    return wheel.wheel_of(state).size


def bucket_count(state: State, start_ms: int) -> int:
    bucket = wheel.wheel_of(state).buckets.get(start_ms // BUCKET)
    return 0 if bucket is None else bucket.count


@dataclass
class TickRecord:
    at_ms: int
    hydrated: int
    result: Ticked


def lead(
    cluster: Cluster,
    until_ms: int,
    tick_ms: int = 1,
    max_ticks: int = 2_000,
    each: Callable[[TickRecord], None] | None = None,
) -> list[TickRecord]:
    """Tick as the leader's dispatch loop does: when the core says something
    is due, at once if it is due already (a Tick then takes `tick_ms`),
    until `until_ms`. Returns every Tick with the jobs it made live; `each`
    sees each one as it is applied."""
    ticks: list[TickRecord] = []
    for _ in range(max_ticks):
        due_ms = next_due_ms(cluster.state)
        if due_ms is None:
            break
        at_ms = max(due_ms, cluster.now_ms + (tick_ms if ticks else 0))
        if at_ms > until_ms:
            break
        before = packed(cluster.state)
        (result,) = cluster.run(Tick(seed=len(ticks), max_items=BUDGET), at=at_ms)
        assert isinstance(result, Ticked), result
        ticks.append(TickRecord(at_ms, before - packed(cluster.state), result))
        if each is not None:
            each(ticks[-1])
    else:
        pytest.fail("the leader never stopped ticking")
    return ticks


START = T0 + 60_000  # a bucket's start, a minute ahead
ENTERS = START - HORIZON
SOFT = START - HORIZON // 2


def test_version_7_hydrates_as_fast_as_ticks_go() -> None:
    """Today's behaviour, kept at version 7: due at E, whole budgets back to
    back (the v0.7.0 fixtures pin it too)."""
    cluster = wheel_cluster(7)
    count = 200 * CHUNK + 5
    fill(cluster, START, count)
    assert next_due_ms(cluster.state) == ENTERS
    ticks = lead(cluster, SOFT)
    assert ticks[0].at_ms == ENTERS
    assert [tick.hydrated for tick in ticks[:-1]] == [BUDGET // CHUNK * CHUNK] * (len(ticks) - 1)
    assert all(tick.result.more for tick in ticks[:-1]) and not ticks[-1].result.more
    assert ticks[-1].at_ms - ENTERS == len(ticks) - 1  # back to back
    assert packed(cluster.state) == 0


def test_version_8_spreads_a_bucket_over_the_first_half_of_its_horizon() -> None:
    cluster = wheel_cluster(8)
    count = 200 * CHUNK + 5  # 6,405 jobs: 214 a step over 3 s
    fill(cluster, START, count)
    assert next_due_ms(cluster.state) == ENTERS
    ticks = lead(cluster, START - 1)
    assert ticks[-1].at_ms < SOFT  # all live by the soft deadline
    assert packed(cluster.state) == 0 and len(cluster.state.jobs) == count
    # One Tick a step, from entering the horizon to the step before S.
    assert [tick.at_ms for tick in ticks] == list(range(ENTERS, SOFT, wheel.PACE_MS))
    assert not any(tick.result.more for tick in ticks)
    # Each took its share in whole chunks: never more than the quota (at
    # least one chunk), so never near the Tick's budget.
    remaining = count
    for tick in ticks:
        quota = -(-remaining * wheel.PACE_MS // max(wheel.PACE_MS, SOFT - tick.at_ms))
        assert 0 < tick.hydrated <= max(quota, CHUNK), tick
        assert tick.hydrated > quota - CHUNK or tick.hydrated == remaining, tick
        remaining -= tick.hydrated
    assert max(tick.hydrated for tick in ticks[:-1]) <= 10 * CHUNK
    # The jobs come due at their time, as at version 7.
    cluster.run(Tick(seed=9), at=START + BUCKET)
    assert all(job.status == PENDING for job in cluster.state.jobs.values())


def test_version_8_says_due_at_the_next_step_while_paced() -> None:
    cluster = wheel_cluster(8)
    fill(cluster, START, 100 * CHUNK)
    cluster.run(Barrier(), at=ENTERS - 1)
    assert next_due_ms(cluster.state) == ENTERS
    (ticked,) = cluster.run(Tick(seed=1), at=ENTERS + 30)
    assert isinstance(ticked, Ticked) and not ticked.more
    assert next_due_ms(cluster.state) == ENTERS + wheel.PACE_MS
    # Other entries move now on but not the step: steady traffic does not
    # hold the paced Tick back until the deadline.
    cluster.run(Barrier(), at=ENTERS + 90)
    assert next_due_ms(cluster.state) == ENTERS + wheel.PACE_MS
    cluster.run(Barrier(), at=ENTERS + 150)
    assert next_due_ms(cluster.state) == ENTERS + 2 * wheel.PACE_MS
    # Past the soft deadline it is due at once, as at version 7.
    cluster.run(Barrier(), at=SOFT)
    assert next_due_ms(cluster.state) == ENTERS


def test_past_the_soft_deadline_a_tick_goes_at_its_whole_budget() -> None:
    """A leader that was away during the paced half (no Tick since before E)
    catches up as fast as at version 7: the same jobs, the same Ticks."""
    made_live: dict[int, list[list[str]]] = {}
    for version in (7, 8):
        cluster = wheel_cluster(version)
        fill(cluster, START, 100 * CHUNK + 3)
        cluster.run(Barrier(), at=SOFT + 5)
        live: list[list[str]] = []
        seen: set[str] = set()
        for n in range(10):
            assert next_due_ms(cluster.state) == ENTERS  # due: at once
            (ticked,) = cluster.run(Tick(seed=n, max_items=BUDGET), at=SOFT + 5 + n)
            assert isinstance(ticked, Ticked)
            ids = [job_id for job_id in cluster.state.jobs if job_id not in seen]
            assert len(ids) == min(BUDGET // CHUNK * CHUNK, 100 * CHUNK + 3 - len(seen))
            seen.update(ids)
            live.append(ids)
            assert ticked.more == (packed(cluster.state) > 0)
            if not packed(cluster.state):
                break
        assert len(live) == 4
        made_live[version] = live
    assert made_live[7] == made_live[8]
    # A paced bucket that missed its deadline: the quota stops at S.
    cluster = wheel_cluster(8)
    fill(cluster, START, 100 * CHUNK)
    (ticked,) = cluster.run(Tick(seed=1, max_items=BUDGET), at=SOFT - 1)
    # One ms left: a quota of all of it, within the Tick's budget...
    assert isinstance(ticked, Ticked) and not ticked.more
    assert packed(cluster.state) == 100 * CHUNK - BUDGET // CHUNK * CHUNK
    # ...and from S on, whole budgets back to back.
    assert next_due_ms(cluster.state) == SOFT
    cluster.run(Barrier(), at=SOFT)
    assert next_due_ms(cluster.state) == ENTERS


def test_buckets_within_the_horizon_are_paced_each_by_its_own_deadline() -> None:
    cluster = wheel_cluster(8)
    starts = (START, START + BUCKET, START + 2 * BUCKET)
    for n, start in enumerate(starts):
        fill(cluster, start, 60 * CHUNK, prefix=f"b{n}")
    live_at: dict[int, int] = {}

    def watch(tick: TickRecord) -> None:
        assert tick.hydrated <= 3 * 4 * CHUNK, tick  # a few chunks a bucket
        for start in starts:
            if start not in live_at and bucket_count(cluster.state, start) == 0:
                live_at[start] = tick.at_ms

    lead(cluster, starts[-1], each=watch)
    for start in starts:
        # Live by its own soft deadline, and not long before: paced.
        assert start - HORIZON // 2 - 5 * wheel.PACE_MS <= live_at[start] < start - HORIZON // 2


def test_other_tick_work_is_not_held_back_by_a_paced_bucket() -> None:
    cluster = wheel_cluster(8)
    fill(cluster, START, 300 * CHUNK)
    cluster.run(Barrier(), at=ENTERS - 10)
    due = [cluster.submit(JobSpec("q", delay_ms=260)) for _ in range(5)]  # live
    cluster.run(Tick(seed=1, max_items=BUDGET), at=ENTERS)
    # The live jobs' due time is not deferred to the wheel's step...
    cluster.run(Barrier(), at=ENTERS + 200)
    assert next_due_ms(cluster.state) == ENTERS + 250
    before = packed(cluster.state)
    (ticked,) = cluster.run(Tick(seed=2, max_items=BUDGET), at=ENTERS + 250)
    # ...and a paced bucket leaves the Tick's budget to them.
    assert isinstance(ticked, Ticked) and ticked.made_runnable == 5
    assert all(cluster.job(job_id).status == PENDING for job_id in due)
    assert 0 < before - packed(cluster.state) <= 11 * CHUNK  # its share: 320 a step


def test_a_replica_from_a_snapshot_mid_hydration_paces_alike() -> None:
    cluster = wheel_cluster(8)
    ids = fill(cluster, START, 150 * CHUNK + 7)
    fill(cluster, START + BUCKET, 40 * CHUNK + 1, prefix="next")
    first = lead(cluster, ENTERS + HORIZON // 4)
    cluster.run(CancelJob(ids[5 * CHUNK + 3]))  # one job out of a packed chunk
    assert 0 < bucket_count(cluster.state, START) < 150 * CHUNK
    data = encode_state(cluster.state)
    decoded = decode_state(data)
    assert encode_state(decoded) == data and check_invariants(decoded) == []
    assert [bucket.count for bucket in wheel.wheel_of(decoded).buckets.values()] == [
        bucket.count for bucket in wheel.wheel_of(cluster.state).buckets.values()
    ]
    assert next_due_ms(decoded) == next_due_ms(cluster.state)
    ticks = lead(cluster, START + 2 * BUCKET)
    assert len(first) > 10 and len(ticks) > 10
    # Replay the same Ticks on the decoded replica (`lead` ran them on the
    # cluster already): the same results and, at the end, the same bytes.
    for n, tick in enumerate(ticks):
        (result,) = apply_entry(
            decoded, Entry(cluster.epoch, tick.at_ms, (Tick(seed=n, max_items=BUDGET),))
        )
        assert result == tick.result
        assert check_invariants(decoded) == []
    assert state_digest(decoded) == state_digest(cluster.state)
    assert packed(decoded) == 0


def test_the_same_entries_give_the_same_bytes_tick_by_tick() -> None:
    """Two replicas applying the same log, one restarted from a snapshot at
    every tenth Tick: identical digests after every Tick."""
    one, two = wheel_cluster(8), wheel_cluster(8)
    for cluster in (one, two):
        fill(cluster, START, 90 * CHUNK + 11)
    ticks: list[TickRecord] = []

    def follow(tick: TickRecord) -> None:
        if len(ticks) % 10 == 5:
            two.state = decode_state(encode_state(two.state))
        assert two.run(Tick(seed=len(ticks), max_items=BUDGET), at=tick.at_ms) == [tick.result]
        assert state_digest(two.state) == state_digest(one.state)
        ticks.append(tick)

    lead(one, START, each=follow)
    assert len(ticks) > 20 and packed(two.state) == 0


def test_a_failing_paced_tick_rolls_back_its_count(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = wheel_cluster(8)
    fill(cluster, START, 200 * CHUNK)
    cluster.run(Barrier(), at=SOFT - 1_000)  # a quota of 20 chunks
    before = cluster.digest()
    calls: list[object] = []
    real = wheel.index_job

    def index_then_fail(state: State, job: object) -> None:
        calls.append(job)
        if len(calls) == 10 * CHUNK + 3:
            raise RuntimeError("a bug")
        real(state, job)  # type: ignore[arg-type]

    monkeypatch.setattr(wheel, "index_job", index_then_fail)
    (result,) = cluster.run(Tick(seed=1))  # `run` checks the invariants: the counts too
    assert isinstance(result, Rejected) and result.code == "internal_error"
    assert cluster.digest() == before and bucket_count(cluster.state, START) == 200 * CHUNK
    monkeypatch.setattr(wheel, "index_job", real)
    cluster.run(Tick(seed=2))
    assert bucket_count(cluster.state, START) == 180 * CHUNK


def test_a_job_a_command_names_leaves_the_count() -> None:
    cluster = wheel_cluster(8)
    ids = fill(cluster, START, 2 * CHUNK + 2)
    cluster.run(CancelJob(ids[3]), CancelJob(ids[-1]))
    assert bucket_count(cluster.state, START) == 2 * CHUNK
    assert cluster.job(ids[3]).status != SCHEDULED
