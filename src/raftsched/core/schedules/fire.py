"""Deciding occurrences: the calendar walk, overlap and catch-up policies,
firing jobs, and the schedules' part of Tick.

An occurrence is identified by (schedule id, nominal time before jitter). The
job it creates carries the idempotency key `schedule:<id>:<nominal_ms>`
(`schedule:<id>:trigger:<now_ms>` for a manual trigger) under the job
template's tenant, and an id derived from that key, so that deciding the same
occurrence twice, whatever failed in between, finds the first job instead of
creating a second.

Catch-up. An occurrence whose fire time has passed is *on time* while it is
at most `catchup_grace_ms` late and no later occurrence is due too. Anything
else was missed (downtime, a long election) and follows the catch-up policy:
older than `catchup_window_ms` -> missed; `skip` -> missed; `latest` -> only
the newest due occurrence fires; `all` -> each fires, oldest first, at most
`catchup_max_runs` per backlog. Catch-up firings are paced: one per schedule
per `CATCHUP_PACE_MS`, never a burst.
"""

from __future__ import annotations

from dataclasses import replace
from hashlib import blake2b
from typing import Any, Final

from raftsched.core.jobs.commands import CancelJob, SubmitJobs
from raftsched.core.jobs.operator_commands import cancel_job
from raftsched.core.jobs.submit import submit_jobs
from raftsched.core.kernel.cluster_version import cluster_version
from raftsched.core.kernel.commands import Tick
from raftsched.core.kernel.feature import Context
from raftsched.core.kernel.model import Job
from raftsched.core.kernel.outbox import EVENT_TENANT_SINCE, emit
from raftsched.core.kernel.results import OccurrenceDecided, Rejected
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.shard import shard_of
from raftsched.core.kernel.state import State
from raftsched.core.schedules.calendar import cron_next_ms, interval_next_ms
from raftsched.core.schedules.model import (
    BUFFER_MAX,
    BUFFERED,
    FIRED,
    MISSED,
    SKIPPED_OVERLAP,
    TRIGGERED,
    Schedule,
    book,
    job_unfinished,
    push_timer,
    releasable,
    settle_timers,
)

# Firing work one Tick does at most, whatever its `max_items`: a hot minute of
# 100,000 schedules is spread over many short ticks, so claims and lease
# renewals keep getting committed in between.
FIRINGS_PER_TICK_MAX: Final = 1_000
CATCHUP_PACE_MS: Final = 100
# Occurrences older than the catch-up window are recorded one by one up to
# this many per pass; beyond that the walk jumps to the window with one
# summary record (older records would be evicted anyway).
OUTSIDE_WINDOW_LISTED_MAX: Final = 100

# Missed reasons: a small fixed set (they label metrics).
OUTSIDE_WINDOW: Final = "outside_catchup_window"
CATCHUP_SKIP: Final = "catchup_skip"
SUPERSEDED: Final = "superseded"
MAX_RUNS: Final = "catchup_max_runs"
JOB_REJECTED: Final = "job_rejected"

_CROCKFORD: Final = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


# -- the calendar ------------------------------------------------------------------


def following_ms(schedule: Schedule, after_ms: int) -> int | None:
    """The first nominal occurrence strictly after `after_ms`, within start/end."""
    spec = schedule.spec
    if spec.start_at_ms is not None and after_ms < spec.start_at_ms - 1:
        after_ms = spec.start_at_ms - 1
    if spec.interval_ms is not None:
        found: int | None = interval_next_ms(schedule.anchor_ms, spec.interval_ms, after_ms)
    else:
        assert spec.cron is not None
        found = cron_next_ms(spec.cron, spec.timezone, after_ms)
    if found is None or (spec.end_at_ms is not None and found > spec.end_at_ms):
        return None
    return found


def _u64(*parts: object) -> int:
    text = "\x1f".join(str(part) for part in parts).encode()
    return int.from_bytes(blake2b(text, digest_size=8).digest(), "big")


def jitter_ms(schedule: Schedule, nominal_ms: int) -> int:
    """Deterministic per occurrence, and always before the next occurrence."""
    bound_ms = schedule.spec.jitter_ms
    if bound_ms <= 0:
        return 0
    following = following_ms(schedule, nominal_ms)
    if following is not None:
        bound_ms = min(bound_ms, following - nominal_ms - 1)
    if bound_ms <= 0:
        return 0
    return _u64(schedule.id, nominal_ms) * (bound_ms + 1) >> 64


def set_next(state: State, schedule: Schedule, nominal_ms: int | None) -> None:
    """Point the calendar at `nominal_ms` and reschedule the timer."""
    schedule.next_nominal_ms = nominal_ms
    schedule.next_fire_ms = (
        None if nominal_ms is None else nominal_ms + jitter_ms(schedule, nominal_ms)
    )
    refresh_due(state, schedule)


def refresh_due(state: State, schedule: Schedule) -> None:
    due_ms = schedule.next_fire_ms
    if due_ms is not None and schedule.hold_until_ms is not None:
        due_ms = max(due_ms, schedule.hold_until_ms)
    if schedule.paused:
        due_ms = None
    if due_ms != schedule.due_ms:
        schedule.due_ms = due_ms
        push_timer(state, schedule)


# -- undo ---------------------------------------------------------------------------


def capture(savepoint: Savepoint, state: State, schedule: Schedule) -> None:
    """Register how to put `schedule` back as it is now (records excepted:
    `add_record` undoes its own appends)."""
    fields = (
        schedule.spec,
        schedule.paused,
        schedule.updated_at_ms,
        schedule.anchor_ms,
        schedule.next_nominal_ms,
        schedule.next_fire_ms,
        schedule.due_ms,
        schedule.hold_until_ms,
        schedule.catchup_runs,
        schedule.last_fired_at_ms,
        schedule.last_lag_ms,
        schedule.lag_ms_total,
        schedule.lag_count,
    )
    active, buffer, counts = list(schedule.active), list(schedule.buffer), dict(schedule.counts)

    def restore() -> None:
        (
            schedule.spec,
            schedule.paused,
            schedule.updated_at_ms,
            schedule.anchor_ms,
            schedule.next_nominal_ms,
            schedule.next_fire_ms,
            schedule.due_ms,
            schedule.hold_until_ms,
            schedule.catchup_runs,
            schedule.last_fired_at_ms,
            schedule.last_lag_ms,
            schedule.lag_ms_total,
            schedule.lag_count,
        ) = fields
        schedule.active, schedule.buffer, schedule.counts = active, buffer, counts
        push_timer(state, schedule)
        if releasable(state, schedule):
            book(state).ready.add(schedule.id)

    savepoint.on_rollback(restore)


def add_record(
    savepoint: Savepoint,
    state: State,
    schedule: Schedule,
    nominal_ms: int,
    decision: str,
    job_id: str | None,
    reason: str | None,
    count_key: str | None = None,
) -> OccurrenceDecided:
    records = schedule.records
    evicted = records[0] if len(records) == records.maxlen else None
    key = count_key or decision
    totals = book(state).totals

    def undo() -> None:
        records.pop()
        if evicted is not None:
            records.appendleft(evicted)
        totals[key] -= 1

    records.append((nominal_ms, state.now_ms, decision, job_id, reason))
    savepoint.on_rollback(undo)
    schedule.counts[key] = schedule.counts.get(key, 0) + 1
    totals[key] = totals.get(key, 0) + 1
    return OccurrenceDecided(schedule.id, nominal_ms, decision, job_id, reason)


# -- firing -------------------------------------------------------------------------


def occurrence_key(schedule_id: str, nominal_ms: int, kind: str) -> str:
    if kind == TRIGGERED:
        return f"schedule:{schedule_id}:trigger:{nominal_ms}"
    return f"schedule:{schedule_id}:{nominal_ms}"


def occurrence_job_id(now_ms: int, key: str, shard: int = 0) -> str:
    """`job_` + 48 bits of time + 80 bits of the key's hash, like the node's ids:
    sortable by creation time, and the same on every replica. In shard `k`
    >= 1 of a sharded cluster (`SetShard`, cluster version 9) the prefix is
    `job<k>_`, as the node draws its ids there (docs/shards.md), so a request
    for the job is routed to its shard."""
    value = (now_ms << 80) | (_u64(key) << 16) | (_u64(key, 1) & 0xFFFF)
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    prefix = f"job{shard}_" if shard else "job_"
    return prefix + "".join(reversed(chars))


def _fire_job(
    state: State, schedule: Schedule, nominal_ms: int, kind: str, savepoint: Savepoint
) -> tuple[str | None, str | None]:
    """Create (or find) the occurrence's job: (job id, None) or (None, reason)."""
    key = occurrence_key(schedule.id, nominal_ms, kind)
    spec = replace(schedule.spec.job, idempotency_key=key)
    job_id = occurrence_job_id(state.now_ms, key, shard_of(state).index)
    result = submit_jobs(state, SubmitJobs((spec,), (job_id,)), savepoint)
    item = result if isinstance(result, Rejected) else result.items[0]
    if isinstance(item, Rejected):
        return None, f"{JOB_REJECTED}: {item.code}: {item.message}"[:500]
    job: Job = state.jobs[item.job_id]
    if item.created:
        job.schedule_id = schedule.id  # a created job needs no touch: rollback drops it
    if job_unfinished(state, job.id) and job.id not in schedule.active:
        schedule.active.append(job.id)
    if kind == FIRED:
        schedule.last_fired_at_ms = state.now_ms
    return job.id, None


def _prune_active(state: State, schedule: Schedule) -> None:
    if any(not job_unfinished(state, job_id) for job_id in schedule.active):
        schedule.active = [job_id for job_id in schedule.active if job_unfinished(state, job_id)]


def decide(
    state: State,
    schedule: Schedule,
    nominal_ms: int,
    kind: str,
    overlap: str,
    savepoint: Savepoint,
    reason: str | None = None,
) -> OccurrenceDecided:
    """Decide one occurrence under an overlap policy. The caller captured
    `schedule` on the savepoint."""
    _prune_active(state, schedule)
    if schedule.active and overlap == "cancel_other":
        _cancel_running(state, schedule, savepoint)
        _prune_active(state, schedule)
    if not schedule.active or overlap == "allow_all":
        return _fire_now(state, schedule, nominal_ms, kind, savepoint, reason)
    running_job = schedule.active[0]
    if overlap == "skip":
        why = f"job {running_job} is still running"
        return add_record(savepoint, state, schedule, nominal_ms, SKIPPED_OVERLAP, None, why)
    if overlap == "cancel_other":
        for old_nominal, _ in schedule.buffer:
            add_record(
                savepoint, state, schedule, old_nominal, SKIPPED_OVERLAP, None,
                "replaced by a newer occurrence (cancel_other)",
            )  # fmt: skip
        schedule.buffer = []
    elif len(schedule.buffer) >= (1 if overlap == "buffer_one" else BUFFER_MAX):
        why = f"job {running_job} is still running and the buffer is full"
        return add_record(savepoint, state, schedule, nominal_ms, SKIPPED_OVERLAP, None, why)
    schedule.buffer.append((nominal_ms, kind))
    why = f"waiting for job {running_job} to end"
    return add_record(savepoint, state, schedule, nominal_ms, BUFFERED, None, why)


def _fire_now(
    state: State,
    schedule: Schedule,
    nominal_ms: int,
    kind: str,
    savepoint: Savepoint,
    reason: str | None,
) -> OccurrenceDecided:
    job_id, problem = _fire_job(state, schedule, nominal_ms, kind, savepoint)
    if job_id is None:
        return miss(state, schedule, nominal_ms, JOB_REJECTED, problem, savepoint)
    if kind == FIRED:
        lag_ms = max(0, state.now_ms - nominal_ms)
        schedule.last_lag_ms = lag_ms
        schedule.lag_ms_total += lag_ms
        schedule.lag_count += 1
    return add_record(savepoint, state, schedule, nominal_ms, kind, job_id, reason)


def _cancel_running(state: State, schedule: Schedule, savepoint: Savepoint) -> None:
    """cancel_other: ask every unfinished run to stop (cooperatively when leased)."""
    for job_id in list(schedule.active):
        job = state.jobs.get(job_id)
        if job is not None and job_unfinished(state, job_id) and not job.cancel_requested:
            cancel_job(
                state,
                CancelJob(
                    job_id,
                    "cancel_other: a newer occurrence is due",
                    f"schedule:{schedule.id}"[:200],
                ),
                savepoint,
            )


def miss(
    state: State,
    schedule: Schedule,
    nominal_ms: int,
    code: str,
    detail: str | None,
    savepoint: Savepoint,
) -> OccurrenceDecided:
    reason = code if detail is None else detail
    decided = add_record(
        savepoint, state, schedule, nominal_ms, MISSED, None, reason, f"{MISSED}:{code}"
    )
    data: dict[str, Any] = {"schedule_id": schedule.id, "nominal_ms": nominal_ms, "reason": code}
    # From cluster version 3 every event names its tenant, so that a caller
    # scoped to some tenants sees only theirs; before, a replica of the
    # previous release would store different bytes.
    if cluster_version(state) >= EVENT_TENANT_SINCE:
        data["tenant"] = schedule.spec.job.tenant
    emit(state, "schedule.missed", data, savepoint)
    return decided


# -- Tick -----------------------------------------------------------------------------


def fire_due(state: State, budget: int, command: Tick, context: Context) -> int:
    """The schedules' step of Tick: release buffers whose run ended, then decide
    due occurrences in timer order. Returns the work done (<= budget)."""
    savepoint = context.savepoint
    budget = min(budget, FIRINGS_PER_TICK_MAX)
    done = _release_buffers(state, budget, savepoint)
    while done < budget:
        top = settle_timers(state)
        if top is None or top[0] > state.now_ms:
            break
        schedule = top[2]
        capture(savepoint, state, schedule)
        worked = advance(state, schedule, budget - done, savepoint)
        done += worked
        if worked == 0 and schedule.due_ms == top[0]:
            break  # defensive: nothing could be decided; do not spin
    return done


def _release_buffers(state: State, budget: int, savepoint: Savepoint) -> int:
    schedules = book(state)
    if not schedules.ready:
        return 0
    done = 0
    ready = sorted(
        (schedules.schedules[sid] for sid in schedules.ready if sid in schedules.schedules),
        key=lambda schedule: schedule.seq,
    )
    for schedule in ready:
        if done >= budget:
            break
        schedules.ready.discard(schedule.id)
        if not releasable(state, schedule):
            continue
        capture(savepoint, state, schedule)
        nominal_ms, kind = schedule.buffer[0]
        schedule.buffer = schedule.buffer[1:]
        _fire_now(state, schedule, nominal_ms, kind, savepoint, "released from the buffer")
        done += 1
    schedules.ready.intersection_update(schedules.schedules)
    return done


def advance(state: State, schedule: Schedule, budget: int, savepoint: Savepoint) -> int:
    """Decide this schedule's due occurrences, at most `budget` of them."""
    now_ms = state.now_ms
    done = 0
    listed_outside = 0
    while done < budget:
        nominal_ms = schedule.next_nominal_ms
        fire_ms = schedule.next_fire_ms
        if nominal_ms is None or fire_ms is None or schedule.paused:
            break
        if schedule.hold_until_ms is not None:
            if schedule.hold_until_ms > now_ms:
                break
            schedule.hold_until_ms = None
        if fire_ms > now_ms:
            schedule.catchup_runs = 0  # caught up
            break
        following = following_ms(schedule, nominal_ms)
        superseded = following is not None and following <= now_ms
        late = now_ms - fire_ms > schedule.spec.catchup_grace_ms
        if not superseded and not late:
            decide(state, schedule, nominal_ms, FIRED, schedule.spec.overlap, savepoint)
        elif nominal_ms < now_ms - schedule.spec.catchup_window_ms:
            if listed_outside >= OUTSIDE_WINDOW_LISTED_MAX:
                following = _jump_to_window(state, schedule, nominal_ms, savepoint)
            else:
                miss(state, schedule, nominal_ms, OUTSIDE_WINDOW, None, savepoint)
                listed_outside += 1
        else:
            _catch_up(state, schedule, nominal_ms, superseded, savepoint)
        set_next(state, schedule, following)
        done += 1
        if schedule.hold_until_ms is not None:
            break
    refresh_due(state, schedule)
    return done


def _jump_to_window(
    state: State, schedule: Schedule, nominal_ms: int, savepoint: Savepoint
) -> int | None:
    """Skip the rest of a long backlog before the window with one record."""
    window_start_ms = state.now_ms - schedule.spec.catchup_window_ms
    detail = (
        f"{OUTSIDE_WINDOW}: this and every later occurrence before "
        f"{window_start_ms} (ms) were missed; not listed one by one"
    )
    miss(state, schedule, nominal_ms, OUTSIDE_WINDOW, detail, savepoint)
    return following_ms(schedule, window_start_ms - 1)


def _catch_up(
    state: State, schedule: Schedule, nominal_ms: int, superseded: bool, savepoint: Savepoint
) -> None:
    policy = schedule.spec.catchup_policy
    if policy == "skip":
        miss(state, schedule, nominal_ms, CATCHUP_SKIP, None, savepoint)
    elif policy == "latest" and superseded:
        miss(state, schedule, nominal_ms, SUPERSEDED, None, savepoint)
    elif policy == "all" and schedule.catchup_runs >= schedule.spec.catchup_max_runs:
        miss(state, schedule, nominal_ms, MAX_RUNS, None, savepoint)
    else:
        schedule.catchup_runs += 1
        schedule.hold_until_ms = state.now_ms + CATCHUP_PACE_MS
        decide(state, schedule, nominal_ms, FIRED, schedule.spec.overlap, savepoint, "catch-up")


def next_due_ms(state: State) -> int | None:
    """When the schedules next need a Tick (now, if a buffer can be released)."""
    schedules = book(state)
    if schedules.ready:
        for schedule_id in list(schedules.ready):
            schedule = schedules.schedules.get(schedule_id)
            if schedule is not None and releasable(state, schedule):
                return state.now_ms
            schedules.ready.discard(schedule_id)
    top = settle_timers(state)
    return None if top is None else top[0]
