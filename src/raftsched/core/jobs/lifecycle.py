"""Moves shared by several commands: table-driven transitions, ending an
attempt, and deciding between retry and dead letter.

Callers have validated the move (`allowed`) and touched the job on the
savepoint before calling anything here.
"""

from __future__ import annotations

from raftsched.core.jobs.retry import retry_delay_ms
from raftsched.core.kernel.model import (
    CANCEL,
    DEAD_LETTER_EVENT,
    DEFAULT_BACKOFF_MS,
    REQUEUE,
    RETRY,
    TRANSITIONS,
    ErrorInfo,
    Job,
)
from raftsched.core.kernel.results import INVALID_STATE, Rejected
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.state import (
    State,
    add_history,
    push_due,
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
    fencing_token: int | None = None,
    detail: str | None = None,
) -> None:
    """Apply one row of the transition table and record it in the history."""
    from_status = job.status
    to_status = TRANSITIONS[from_status, event]
    now_ms = state.now_ms
    add_history(
        job, (now_ms, event, from_status, to_status, actor, state.epoch, fencing_token, detail)
    )
    if to_status != from_status:
        set_status(state, job, to_status)
    job.updated_at_ms = now_ms


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


def cancel_leased(
    state: State,
    job: Job,
    actor: str,
    fencing_token: int | None,
    detail: str,
    savepoint: Savepoint,
) -> None:
    transition(state, job, CANCEL, actor, fencing_token, detail)
    finish(state, job, savepoint)


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
        transition(state, job, DEAD_LETTER_EVENT, actor, fencing_token, detail)
        finish(state, job, savepoint)
        return
    backoff = DEFAULT_BACKOFF_MS if job.backoff is None else job.backoff
    delay_ms = retry_delay_ms(backoff, job.attempts_made - 1, random_u32)
    if retry_after_ms is not None and retry_after_ms > delay_ms:
        delay_ms = retry_after_ms  # the worker's hint is a lower bound
    if delay_ms <= 0:
        transition(state, job, REQUEUE, actor, fencing_token, detail)
        job.next_run_at_ms = state.now_ms
        push_runnable(state, job)
        return
    transition(state, job, RETRY, actor, fencing_token, detail)
    due_ms = state.now_ms + delay_ms
    job.next_run_at_ms = due_ms
    push_due(state, job, due_ms)
