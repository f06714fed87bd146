"""Reconciliation of unknown outcomes: the crash window after a provider call.

A worker that called a provider and died before recording the effect (or
whose lease expired mid-call) leaves an attempt whose outcome is unknown.
Retrying it is right for a provider that deduplicates; for one that cannot,
a job with `on_unknown: reconcile` becomes `reconciling` instead, and a
reconcile handler is leased the question "did that attempt's effect
happen?" (see `reconcile_book` for the records). Its answer:

- `happened`: the job completes with the effect's result, and the effects
  it names are recorded (first writer wins), as if the attempt had
  succeeded;
- `did_not_happen`: the job is retried as a normal next attempt (its
  fencing token is above the reconciliation's, which is above the unknown
  attempt's);
- `cannot_tell`: the job is dead-lettered as `unreconciled`, for a human.

Reconciliation leases are fenced like job leases (tokens from the same
counter) and have their own budget: after `RECONCILE_TRIES_MAX` leases
expired unanswered the job is dead-lettered as `unreconciled`, each retry
waiting the job's backoff. Every claim, expiry and decision is in the job's
history with the reconciling worker, its token and its evidence.
"""

from __future__ import annotations

from typing import Final

from raftsched.core.jobs.commands import (
    ClaimJobs,
    HeartbeatJob,
    ReconcileJob,
    RequestReconcile,
    SetUnknownPolicy,
)
from raftsched.core.jobs.lifecycle import (
    SYSTEM_ACTOR,
    retry_or_dead_letter,
    transition,
)
from raftsched.core.jobs.reconcile_book import (
    ON_UNKNOWN_RETRY,
    RECONCILE_TRIES_MAX,
    ReconcileTask,
    awaits_reconciliation,
    book_of,
    close_task,
    guard_defaults,
    guard_task,
    offered,
)
from raftsched.core.jobs.reconcile_log import (
    DECIDED_PREFIX,
    DECISIONS,
    DID_NOT_HAPPEN,
    HAPPENED,
    UNANSWERED_SUFFIX,
)
from raftsched.core.jobs.retry import retry_delay_ms, seeded_u32
from raftsched.core.kernel.commands import Tick
from raftsched.core.kernel.feature import Context
from raftsched.core.kernel.model import (
    CLAIM,
    COMPLETE,
    DEAD_LETTER_EVENT,
    DEFAULT_BACKOFF_MS,
    ERROR_UNRECONCILED,
    RECONCILE,
    RECONCILE_EXPIRED,
    RECONCILING,
    REQUEUE,
    RETRY,
    Job,
    StoredEffect,
)
from raftsched.core.kernel.results import (
    INVALID_STATE,
    LEASE_LOST,
    NOT_FOUND,
    Ack,
    HeartbeatAccepted,
    Lease,
    Reconciled,
    ReconcileTarget,
    Rejected,
)
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.shard import next_fencing_token
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import (
    KEY_CHARS_MAX,
    U32_MAX,
    check_bytes,
    check_int,
    check_name,
    check_on_unknown,
    check_text,
    check_token,
    invalid,
)

DECISION_EVENTS: Final = frozenset({COMPLETE, RETRY, REQUEUE, DEAD_LETTER_EVENT})
EFFECTS_MAX: Final = 100
"""Effects one `happened` decision may record."""

SCOPES: Final = ("queue", "tenant")


def apply_set_unknown_policy(
    state: State, command: SetUnknownPolicy, context: Context
) -> Ack | Rejected:
    if type(command.scope) is not str or command.scope not in SCOPES:
        return invalid("scope", "scope is queue or tenant")
    rejected = check_name(command.name, command.scope) or check_on_unknown(command.on_unknown)
    if rejected is not None:
        return rejected
    book = book_of(state)
    defaults = book.queues if command.scope == "queue" else book.tenants
    guard_defaults(defaults, command.name, context.savepoint)
    if command.on_unknown == ON_UNKNOWN_RETRY:
        defaults.pop(command.name, None)  # the default is not stored
    else:
        defaults[command.name] = command.on_unknown
    return Ack()


def apply_request_reconcile(
    state: State, command: RequestReconcile, context: Context
) -> Ack | Rejected:
    """An operator sends an unreconciled dead letter back to reconciliation:
    a fresh reconciliation task (its own budget) about the same unknown
    attempt. The deadline is dropped, as a replay drops it."""
    rejected = check_text(command.reason, "reason") or check_name(command.actor, "actor")
    if rejected is not None:
        return rejected
    rejected = check_name(command.job_id, "job_id")
    if rejected is not None:
        return rejected
    job = state.jobs.get(command.job_id)
    if job is None:
        return Rejected(NOT_FOUND, f"no job {command.job_id}", {"job_id": command.job_id})
    if not awaits_reconciliation(state, job):
        return Rejected(
            INVALID_STATE,
            "only a dead letter whose unknown outcome was never reconciled goes back to "
            f"reconciliation; this job is {job.status}",
            {"status": job.status, "event": RECONCILE},
        )
    savepoint = context.savepoint
    savepoint.touch(job)
    job.deadline_at_ms = None
    job.cancel_requested = False
    transition(state, job, RECONCILE, command.actor, savepoint, None, command.reason or None)
    return Ack()


# -- claims and heartbeats -----------------------------------------------------------


def grant_reconciliations(
    state: State, command: ClaimJobs, limit: int, savepoint: Savepoint
) -> list[Lease]:
    """Up to `limit` reconciliation leases from the claimed queues, oldest
    job first. They come before new work: each one holds a job that nobody
    may run until it is answered. A paused queue grants none."""
    if limit <= 0:
        return []
    now_ms = state.now_ms
    ready = [
        (state.jobs[job_id].seq, job_id, task)
        for job_id, task in offered(state, command.queues)
        if task.available_at_ms <= now_ms
    ]
    ready.sort(key=lambda item: item[0])
    leases = []
    for _, job_id, task in ready[:limit]:
        job = state.jobs[job_id]
        lease_ms = job.lease_ms if command.lease_ms is None else command.lease_ms
        leases.append(_grant(state, job, task, command.worker_id, lease_ms, savepoint))
    return leases


def _grant(
    state: State, job: Job, task: ReconcileTask, worker_id: str, lease_ms: int, savepoint: Savepoint
) -> Lease:
    savepoint.touch(job)
    guard_task(task, savepoint)
    token = next_fencing_token(state)
    expires_at_ms = state.now_ms + lease_ms
    task.lease = (worker_id, state.epoch, token, expires_at_ms, lease_ms)
    attempt = job.attempts[task.attempt - 1]
    detail = f"reconcile attempt {task.attempt} (try {task.tries + 1})"
    transition(state, job, CLAIM, worker_id, savepoint, token, detail)
    target = ReconcileTarget(
        attempt.number,
        attempt.fencing_token,
        attempt.worker_id,
        attempt.started_at_ms,
        tuple(effect.key for effect in job.effects or ()),
        task.queue,
    )
    return Lease(
        job.id,
        attempt.number,
        state.epoch,
        token,
        expires_at_ms,
        lease_ms,
        job.queue,
        job.payload,
        job.idempotency_key,
        job.ordering_key,
        job.correlation_id,
        job.workflow_id,
        job.step,
        reconcile=target,  # no inputs, no claim-wait figure: nothing runs
    )


def heartbeat_reconciliation(
    state: State, command: HeartbeatJob, savepoint: Savepoint
) -> HeartbeatAccepted | None:
    """A heartbeat with a reconciliation's token extends that lease (never
    shortens it); None when the token is not a current reconciliation's."""
    task = _current_task(state, command.job_id, command.fencing_token)
    if task is None or task.lease is None:
        return None
    worker_id, epoch, token, expires_at_ms, lease_ms = task.lease
    extend_ms = lease_ms if command.extend_ms is None else command.extend_ms
    extended_ms = max(expires_at_ms, state.now_ms + extend_ms)
    if extended_ms != expires_at_ms:
        guard_task(task, savepoint)
        task.lease = (worker_id, epoch, token, extended_ms, lease_ms)
    return HeartbeatAccepted(command.job_id, extended_ms, False)


def _current_task(state: State, job_id: object, token: object) -> ReconcileTask | None:
    if type(job_id) is not str or type(token) is not int:
        return None
    task = book_of(state).tasks.get(job_id)
    if task is None or task.lease is None or task.lease[2] != token:
        return None
    return task


# -- decisions --------------------------------------------------------------------------


def apply_reconcile(state: State, command: ReconcileJob, context: Context) -> Reconciled | Rejected:
    savepoint = context.savepoint
    rejected = _check_reconcile(command)
    if rejected is not None:
        return rejected
    job = state.jobs.get(command.job_id)
    if job is None:
        return Rejected(NOT_FOUND, f"no job {command.job_id}", {"job_id": command.job_id})
    task = _current_task(state, command.job_id, command.fencing_token)
    if task is None or task.lease is None:
        return _repeated_decision(job, command) or Rejected(
            LEASE_LOST,
            "the fencing token is not this job's current reconciliation token",
            {"job_id": job.id, "status": job.status},
        )
    worker_id, token = task.lease[0], task.lease[2]
    decision = command.decision
    # The history's form of a decision, which the report reads back (reconcile_log.ending).
    detail = f"{DECIDED_PREFIX}{decision}"
    if command.reason:
        detail += f": {command.reason}"
    savepoint.touch(job)
    close_task(state, job, savepoint)
    if decision == HAPPENED:
        _record_effects(state, job, token, command.effects)
        job.result = command.result
        transition(state, job, COMPLETE, worker_id, savepoint, token, detail)
    elif decision == DID_NOT_HAPPEN:
        retry_or_dead_letter(state, job, worker_id, token, detail, command.random_u32, savepoint)
    else:
        job.last_error = (ERROR_UNRECONCILED, command.reason or "the reconciler cannot tell")
        transition(state, job, DEAD_LETTER_EVENT, worker_id, savepoint, token, detail)
    return Reconciled(job.id, decision, job.status, job.next_run_at_ms)


def _check_reconcile(command: ReconcileJob) -> Rejected | None:
    rejected = check_name(command.job_id, "job_id") or check_token(command.fencing_token)
    if rejected is not None:
        return rejected
    if type(command.decision) is not str or command.decision not in DECISIONS:
        return invalid("decision", "decision is happened, did_not_happen or cannot_tell")
    effects = command.effects
    if type(effects) is not tuple or len(effects) > EFFECTS_MAX:
        return invalid("effects", f"at most {EFFECTS_MAX} effects")
    for pair in effects:
        if type(pair) is not tuple or len(pair) != 2:
            return invalid("effects", "an effect is a key and a result")
        rejected = check_name(pair[0], "effects", KEY_CHARS_MAX) or check_bytes(pair[1], "effects")
        if rejected is not None:
            return rejected
    return (
        check_bytes(command.result, "result")
        or check_text(command.reason, "reason")
        or check_int(command.random_u32, "random_u32", 0, U32_MAX)
    )


def _record_effects(
    state: State, job: Job, token: int, effects: tuple[tuple[str, bytes], ...]
) -> None:
    """Record what the reconciler found, first writer wins: a key already
    recorded (by the attempt itself, or any job) keeps its first result."""
    for key, result in effects:
        if key in state.effects:
            continue
        effect = StoredEffect(key, token, state.epoch, result, state.now_ms)
        if job.effects is None:
            job.effects = [effect]
        else:
            job.effects.append(effect)
        state.effects[key] = (job, effect)


def _repeated_decision(job: Job, command: ReconcileJob) -> Reconciled | None:
    """A decision retried after it committed (its answer lost) gets where the
    first delivery left the job, as a repeated complete or fail does."""
    prefix = f"{DECIDED_PREFIX}{command.decision}"
    for _, event, from_status, _, _, _, token, detail in reversed(job.history or ()):
        if token != command.fencing_token:
            continue
        if (
            from_status == RECONCILING
            and event in DECISION_EVENTS
            and detail is not None
            and detail.startswith(prefix)
        ):
            return Reconciled(job.id, command.decision, job.status, job.next_run_at_ms, True)
        return None
    return None


# -- time -------------------------------------------------------------------------------


def expire_reconciliations(state: State, budget: int, command: Tick, context: Context) -> int:
    """Tick: reconciliation leases that expired unanswered, in (expiry,
    token) order. The reconciliation is offered again after the job's
    backoff, or, its budget spent, the job is dead-lettered `unreconciled`."""
    tasks = book_of(state).tasks
    if not tasks:
        return 0
    now_ms = state.now_ms
    expired = sorted(
        (task.lease[3], task.lease[2], job_id)
        for job_id, task in tasks.items()
        if task.lease is not None and task.lease[3] <= now_ms
    )
    for _, token, job_id in expired[:budget]:
        _expire(state, state.jobs[job_id], tasks[job_id], token, command.seed, context.savepoint)
    return min(len(expired), budget)


def _expire(
    state: State, job: Job, task: ReconcileTask, token: int, seed: int, savepoint: Savepoint
) -> None:
    savepoint.touch(job)
    guard_task(task, savepoint)
    task.lease = None
    task.tries += 1
    if task.tries >= RECONCILE_TRIES_MAX:
        message = f"{task.tries} {UNANSWERED_SUFFIX}"
        job.last_error = (ERROR_UNRECONCILED, message)
        close_task(state, job, savepoint)
        transition(state, job, DEAD_LETTER_EVENT, SYSTEM_ACTOR, savepoint, token, message)
        return
    backoff = DEFAULT_BACKOFF_MS if job.backoff is None else job.backoff
    delay_ms = retry_delay_ms(backoff, task.tries - 1, seeded_u32(seed, job.id))
    task.available_at_ms = state.now_ms + delay_ms
    transition(state, job, RECONCILE_EXPIRED, SYSTEM_ACTOR, savepoint, token, "lease expired")


def take_over(state: State) -> None:
    """The first entry of a higher epoch: reconciliation leases get the same
    floor as job leases (now plus their duration; see `tick.take_over`)."""
    now_ms = state.now_ms
    for task in book_of(state).tasks.values():
        if task.lease is not None:
            worker_id, epoch, token, expires_at_ms, lease_ms = task.lease
            if now_ms + lease_ms > expires_at_ms:
                task.lease = (worker_id, epoch, token, now_ms + lease_ms, lease_ms)


def next_due_ms(state: State) -> int | None:
    """The earliest reconciliation lease expiry (a task waiting out its
    backoff needs no Tick: a claim looks at its time)."""
    expiries = [task.lease[3] for task in book_of(state).tasks.values() if task.lease is not None]
    return min(expiries) if expiries else None
