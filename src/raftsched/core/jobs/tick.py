"""The jobs' time-driven work: their steps of Tick, the epoch takeover, the
tidying of the heaps after every entry, and when the jobs next need a Tick.

Each kind of work pops its own heap in key order and counts only entries that
are still valid, so a tick does the same work on every replica however many
stale entries its heaps happen to hold. The steps run in the registry's rank
order (see `kernel.tick`) and stop when the Tick's budget is spent.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from raftsched.core.jobs import reconcile, trace_book
from raftsched.core.jobs.lifecycle import (
    SYSTEM_ACTOR,
    end_attempt,
    retry_or_dead_letter,
    transition,
)
from raftsched.core.jobs.reconcile_book import forget_job, reconciles
from raftsched.core.jobs.retry import seeded_u32
from raftsched.core.kernel import wheel
from raftsched.core.kernel.commands import Tick
from raftsched.core.kernel.feature import Context
from raftsched.core.kernel.model import (
    CANCEL,
    CLAIMED,
    DEAD_LETTER_EVENT,
    DUE,
    ERROR_DEADLINE,
    ERROR_LEASE_EXPIRED,
    FINAL_STATUSES,
    LEASED_STATUSES,
    OUTCOME_FAILED,
    OUTCOME_LEASE_EXPIRED,
    OUTCOME_UNKNOWN,
    REQUEUE,
    WAITING_STATUSES,
    Job,
)
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.state import State, TimedEntry, remove_job

_Validity = Callable[[Job, int], bool]

_LEASE_EXPIRED_DETAIL = "lease expired"
_UNKNOWN_OUTCOME = (ERROR_LEASE_EXPIRED, "lease expired while running; outcome unknown")
_DEADLINE_ERROR = (ERROR_DEADLINE, "deadline exceeded")


# The jobs' steps of Tick (`TickWork.run`); ranks in `jobs.feature`.


def expire_leases(state: State, budget: int, command: Tick, context: Context) -> int:
    return _expire_leases(state, budget, command.seed, context.savepoint)


def enforce_deadlines(state: State, budget: int, command: Tick, context: Context) -> int:
    return _enforce_deadlines(state, budget, context.savepoint)


def make_due_runnable(state: State, budget: int, command: Tick, context: Context) -> int:
    return _make_due_runnable(state, budget, context.savepoint)


def hydrate_wheel(state: State, budget: int, command: Tick, context: Context) -> int:
    """Packed jobs whose bucket came within the horizon become live (`kernel.wheel`)."""
    return wheel.hydrate(state, budget, context.savepoint)


def purge_finished(state: State, budget: int, command: Tick, context: Context) -> int:
    return _purge_finished(state, budget, context.savepoint)


def take_over(state: State) -> None:
    """The first entry of a higher epoch: no active lease expires sooner than
    now plus its duration, because the new leader's clock may run ahead of
    the one the worker's lease was granted under."""
    now_ms = state.now_ms
    for _, token, job in state.leases:
        lease = job.lease
        if lease is not None and lease.fencing_token == token:
            floor_ms = now_ms + lease.lease_ms
            if floor_ms > lease.expires_at_ms:
                lease.expires_at_ms = floor_ms
    reconcile.take_over(state)


def _current_lease_top(state: State, steps: int | None = None) -> TimedEntry | None:
    """The lease heap's top once stale and extended entries are settled.

    An extended lease's entry moves to its real expiry, so that leases are
    processed in (expiry, token) order on every replica. With `steps`, at
    most that many entries are dropped or moved; None then may also mean
    that the top is not settled yet.
    """
    heap = state.leases
    left = -1 if steps is None else steps  # -1 never counts down to 0
    while heap and left != 0:
        key_ms, token, job = top = heap[0]
        lease = job.lease
        if lease is None or lease.fencing_token != token:
            heapq.heappop(heap)
        elif lease.expires_at_ms != key_ms:
            heapq.heapreplace(heap, (lease.expires_at_ms, token, job))
        else:
            return top
        left -= 1
    return None


def _expire_leases(state: State, budget: int, seed: int, savepoint: Savepoint) -> int:
    done = 0
    while done < budget:
        top = _current_lease_top(state)
        if top is None or top[0] > state.now_ms:
            break
        heapq.heappop(state.leases)
        _expire(state, top[2], seed, savepoint)
        done += 1
    return done


def _expire(state: State, job: Job, seed: int, savepoint: Savepoint) -> None:
    lease = job.lease
    assert lease is not None
    token = lease.fencing_token
    savepoint.touch(job)
    started = job.status != CLAIMED
    if job.cancel_requested:
        end_attempt(state, job, OUTCOME_LEASE_EXPIRED, None, savepoint, counted=started)
        transition(state, job, CANCEL, SYSTEM_ACTOR, savepoint, token, _LEASE_EXPIRED_DETAIL)
    elif not started:
        # The handler never started: a safe retry that costs no attempt.
        end_attempt(state, job, OUTCOME_LEASE_EXPIRED, None, savepoint, counted=False)
        job.next_run_at_ms = state.now_ms
        transition(state, job, REQUEUE, SYSTEM_ACTOR, savepoint, token, _LEASE_EXPIRED_DETAIL)
    else:
        end_attempt(state, job, OUTCOME_LEASE_EXPIRED, _UNKNOWN_OUTCOME, savepoint, counted=True)
        job.last_error = _UNKNOWN_OUTCOME
        if reconciles(state, job):
            transition(
                state, job, OUTCOME_UNKNOWN, SYSTEM_ACTOR, savepoint, token, _LEASE_EXPIRED_DETAIL
            )
            return
        retry_or_dead_letter(
            state,
            job,
            SYSTEM_ACTOR,
            token,
            _LEASE_EXPIRED_DETAIL,
            seeded_u32(seed, job.id),
            savepoint,
        )


def _enforce_deadlines(state: State, budget: int, savepoint: Savepoint) -> int:
    heap = state.deadlines
    done = 0
    while heap and done < budget and heap[0][0] <= state.now_ms:
        key_ms, _, job = heapq.heappop(heap)
        if job.status in FINAL_STATUSES or job.deadline_at_ms != key_ms:
            continue
        savepoint.touch(job)
        token = None
        if job.status in LEASED_STATUSES:
            assert job.lease is not None
            token = job.lease.fencing_token
            end_attempt(state, job, OUTCOME_FAILED, _DEADLINE_ERROR, savepoint, counted=False)
        job.last_error = _DEADLINE_ERROR
        transition(
            state, job, DEAD_LETTER_EVENT, SYSTEM_ACTOR, savepoint, token, _DEADLINE_ERROR[1]
        )
        done += 1
    return done


def _make_due_runnable(state: State, budget: int, savepoint: Savepoint) -> int:
    heap = state.due
    done = 0
    while heap and done < budget and heap[0][0] <= state.now_ms:
        key_ms, _, job = heapq.heappop(heap)
        if job.status not in WAITING_STATUSES or job.next_run_at_ms != key_ms:
            continue
        savepoint.touch(job)
        transition(state, job, DUE, SYSTEM_ACTOR, savepoint)
        done += 1
    return done


def _purge_finished(state: State, budget: int, savepoint: Savepoint) -> int:
    heap = state.retention
    done = 0
    while heap and done < budget and heap[0][0] + state.retention_ms <= state.now_ms:
        key_ms, _, job = heapq.heappop(heap)
        if not _purgeable(state, job, key_ms):
            continue
        savepoint.purged.append(job)
        remove_job(state, job)
        forget_job(state, job.id, savepoint)
        trace_book.forget(state, job.id, savepoint)
        done += 1
    return done


def _purgeable(state: State, job: Job, key_ms: int) -> bool:
    return (
        job.status in FINAL_STATUSES
        and job.updated_at_ms == key_ms
        and state.jobs.get(job.id) is job
    )


def next_due_ms(state: State) -> int | None:
    """When the jobs' heaps next need a Tick (`kernel.tick.next_due_ms`
    takes the earliest over every feature). It only drops stale heap
    entries (derived data)."""
    candidates: list[int] = []
    lease_top = _current_lease_top(state)
    if lease_top is not None:
        candidates.append(lease_top[0])
    deadline_top = _settle(state.deadlines, _deadline_valid)
    if deadline_top is not None:
        candidates.append(deadline_top[0])
    due_top = _settle(state.due, _due_valid)
    if due_top is not None:
        candidates.append(due_top[0])
    retention_top = _settle(state.retention, lambda job, key: _purgeable(state, job, key))
    if retention_top is not None:
        candidates.append(retention_top[0] + state.retention_ms)
    wheel_ms = wheel.next_due_ms(state)
    if wheel_ms is not None:
        candidates.append(wheel_ms)
    reconcile_ms = reconcile.next_due_ms(state)
    if reconcile_ms is not None:
        candidates.append(reconcile_ms)
    return min(candidates) if candidates else None


def _deadline_valid(job: Job, key_ms: int) -> bool:
    return job.status not in FINAL_STATUSES and job.deadline_at_ms == key_ms


def _due_valid(job: Job, key_ms: int) -> bool:
    return job.status in WAITING_STATUSES and job.next_run_at_ms == key_ms


# Stale entries (a lease that ended, a deadline of a finished job) that one
# committed entry may drop from the top of each time heap: a few per command
# it carries. Every command makes at most one entry of each heap stale, so
# this keeps up, and its cost follows the entry's own work.
TIDY_STEPS_PER_COMMAND = 2
TIDY_STEPS_MIN = 16


def tidy_heaps(state: State, commands: int) -> None:
    """Drop a bounded number of stale entries from the heaps' tops; run after
    every entry, on every replica.

    Only the leader calls `next_due_ms`, which settles the heaps as it goes,
    so a follower's heaps kept every lease granted since the last Tick: the
    first Tick after 70,000 completed jobs popped 70,000 entries (74 ms, on
    the commit path of every replica) and stalled the cluster. The heaps are
    derived data, never encoded; dropping stale entries changes no outcome.
    """
    steps = TIDY_STEPS_MIN + TIDY_STEPS_PER_COMMAND * commands
    _current_lease_top(state, steps)
    _settle(state.deadlines, _deadline_valid, steps)
    _settle(state.due, _due_valid, steps)


def _settle(
    heap: list[TimedEntry], valid: _Validity, steps: int | None = None
) -> TimedEntry | None:
    """The heap's first valid entry, dropping stale ones above it; with
    `steps`, at most that many (None then may also mean not settled yet)."""
    left = -1 if steps is None else steps  # -1 never counts down to 0
    while heap and left != 0:
        top = heap[0]
        if valid(top[2], top[0]):
            return top
        heapq.heappop(heap)
        left -= 1
    return None
