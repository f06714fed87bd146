"""Moves shared by several commands: table-driven transitions, ending an
attempt, and deciding between retry and dead letter.

Callers have validated the move (`allowed`) and touched the job on the
savepoint before calling anything here. `transition` is the only way a job's
status changes, and it does everything that entering the new status means
(`ON_ENTER`): callers set the fields that the new status is indexed by
(`next_run_at_ms` for pending and waiting jobs, `lease` for a claimed one)
and call it; they never push onto the indexes or call `finish` themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from raftsched.core.jobs.reconcile_book import open_task
from raftsched.core.jobs.reconcile_log import note_left_reconciling
from raftsched.core.jobs.retry import retry_delay_ms
from raftsched.core.kernel.model import (
    CANCELLED,
    CLAIMED,
    DEAD_LETTER,
    DEAD_LETTER_EVENT,
    DEFAULT_BACKOFF_MS,
    PENDING,
    RECONCILING,
    REQUEUE,
    RETRY,
    RETRY_WAIT,
    RUNNING,
    SCHEDULED,
    SUCCEEDED,
    TRANSITIONS,
    ErrorInfo,
    Job,
    next_status,
)
from raftsched.core.kernel.results import INVALID_STATE, Rejected
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.state import (
    State,
    add_history,
    push_due,
    push_lease,
    push_retention,
    push_runnable,
    set_status,
)

SYSTEM_ACTOR = "system"


def lease_inputs(state: State, job: Job) -> bytes | None:
    """The `inputs` a lease of this job carries (workflow steps only)."""
    if job.workflow_id is None:
        return None  # most jobs: no hook to ask
    for hook in state.hooks.lease_inputs:
        inputs = hook(state, job)
        if inputs is not None:
            return inputs
    return None


def allowed(job: Job, event: str) -> bool:
    return (job.status, event) in TRANSITIONS


def invalid_state(job: Job, event: str) -> Rejected:
    return Rejected(
        INVALID_STATE,
        f"cannot {event} a job that is {job.status}",
        {"status": job.status, "event": event},
    )


def transition(
    state: State,
    job: Job,
    event: str,
    actor: str,
    savepoint: Savepoint,
    fencing_token: int | None = None,
    detail: str | None = None,
) -> None:
    """Apply one row of the transition table, record it in the history, and
    do what entering the new status means (`ON_ENTER`; nothing when the
    status stays). A row the table lacks is a bug and raises."""
    from_status = job.status
    to_status = next_status(TRANSITIONS, from_status, event, "job")
    now_ms = state.now_ms
    add_history(
        job, (now_ms, event, from_status, to_status, actor, state.epoch, fencing_token, detail)
    )
    if from_status == RECONCILING:
        note_left_reconciling(state, job, savepoint)  # a decision, for the report
    if to_status == from_status:
        job.updated_at_ms = now_ms
        return
    set_status(state, job, to_status)
    job.updated_at_ms = now_ms  # before ON_ENTER: the retention heap is keyed by it
    ON_ENTER[to_status](state, job, savepoint)


def end_attempt(
    state: State,
    job: Job,
    outcome: str,
    error: ErrorInfo | None,
    savepoint: Savepoint,
    counted: bool,
) -> None:
    """Close the current attempt and drop the lease."""
    attempt = job.attempts[-1]
    attempt.ended_at_ms = state.now_ms
    attempt.outcome = outcome
    attempt.error = error
    job.lease = None
    if counted:
        job.attempts_made += 1
    for hook in state.hooks.on_attempt_ended:  # the queue's circuit (jobs.flow)
        hook(state, job, outcome, counted, savepoint)


def finish(state: State, job: Job, savepoint: Savepoint) -> None:
    """A job reached a final status: it now waits out the retention period."""
    job.next_run_at_ms = None
    push_retention(state, job)
    # In rank order (see each feature's record): its outbox event, its
    # workflow's next steps, its ordering key released (or kept blocked when
    # dead-lettered), its schedule's buffered occurrence made ready.
    for hook in state.hooks.on_job_finished:
        hook(state, job, savepoint)


def make_runnable(state: State, job: Job, savepoint: Savepoint) -> None:
    """Into the runnable index: claimable, or parked behind its ordering key."""
    push_runnable(state, job)


def wait_until_due(state: State, job: Job, savepoint: Savepoint) -> None:
    """Into the due heap at `next_run_at_ms`: Tick makes it pending then."""
    assert job.next_run_at_ms is not None
    push_due(state, job, job.next_run_at_ms)


def watch_lease_expiry(state: State, job: Job, savepoint: Savepoint) -> None:
    """Into the lease heap at the lease's expiry: Tick expires it then."""
    lease = job.lease
    assert lease is not None
    push_lease(state, job, lease.expires_at_ms, lease.fencing_token)


def keep_lease(state: State, job: Job, savepoint: Savepoint) -> None:
    """Nothing: the claim's lease heap entry still stands."""


ON_ENTER: Final[dict[str, Callable[[State, Job, Savepoint], None]]] = {
    SCHEDULED: wait_until_due,
    PENDING: make_runnable,
    CLAIMED: watch_lease_expiry,
    RUNNING: keep_lease,
    RETRY_WAIT: wait_until_due,
    SUCCEEDED: finish,
    DEAD_LETTER: finish,
    CANCELLED: finish,
    RECONCILING: open_task,
}
"""Status -> what entering it does, after the status and `updated_at_ms` are
set. Every job status has a row; a move that keeps the status runs none."""


def retry_or_dead_letter(
    state: State,
    job: Job,
    actor: str,
    fencing_token: int,
    detail: str,
    random_u32: int,
    savepoint: Savepoint,
    retry_after_ms: int | None = None,
) -> None:
    """After a counted failure: retry with backoff, or dead-letter when the
    attempt budget is spent."""
    if job.attempts_made >= job.max_attempts:
        transition(state, job, DEAD_LETTER_EVENT, actor, savepoint, fencing_token, detail)
        return
    backoff = DEFAULT_BACKOFF_MS if job.backoff is None else job.backoff
    delay_ms = retry_delay_ms(backoff, job.attempts_made - 1, random_u32)
    if retry_after_ms is not None and retry_after_ms > delay_ms:
        delay_ms = retry_after_ms  # the worker's hint is a lower bound
    if delay_ms <= 0:
        job.next_run_at_ms = state.now_ms
        transition(state, job, REQUEUE, actor, savepoint, fencing_token, detail)
        return
    job.next_run_at_ms = state.now_ms + delay_ms
    transition(state, job, RETRY, actor, savepoint, fencing_token, detail)
