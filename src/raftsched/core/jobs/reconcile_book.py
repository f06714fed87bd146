"""The reconcile section: on_unknown policies and open reconciliations.

An attempt whose outcome is unknown (its lease expired after the handler
started, or its worker failed it with kind `unknown`) may have had its
effect. For a provider that cannot deduplicate, retrying it blindly charges
twice; a job whose policy is `on_unknown: reconcile` instead becomes
`reconciling`, and a reconciliation task asks a reconcile handler whether
the effect happened (`jobs.reconcile`).

This section keeps what that needs beside the jobs, so that the job
encoding is the one earlier releases wrote and read:

- `policies`: a job's own `on_unknown` and `reconcile_queue`, for the jobs
  whose spec named either (most name neither);
- `queues`, `tenants`: the defaults set with `SetUnknownPolicy`; only
  "reconcile" is stored, since "retry" is the default;
- `tasks`: one per `reconciling` job: the unknown attempt's number, the
  queue its reconcilers claim from, how many reconciliation leases expired
  unanswered, when it may be claimed again, and its current lease.

Beside them, not encoded: `log`, the derived index of unknown outcomes and
ended reconciliations that the reconciliation report reads
(`reconcile_log`), None until a report first needs it.

The section is optional: a state that never used reconciliation keeps the
bytes and the digest of the release before it (since cluster version 5).
Entering `reconciling` opens the task (`lifecycle.ON_ENTER`); a decision,
or the job finishing any other way (deadline, cancel), closes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from raftsched.core.jobs.flow import flow_of
from raftsched.core.kernel.model import (
    DEAD_LETTER,
    ERROR_UNRECONCILED,
    OUTCOME_FAILED,
    OUTCOME_LEASE_EXPIRED,
    RECONCILING,
    Attempt,
    Job,
)
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.shard import last_fencing_token
from raftsched.core.kernel.state import State

if TYPE_CHECKING:
    from raftsched.core.jobs.reconcile_log import Log

RECONCILE: Final = "reconcile"
ON_UNKNOWN_RETRY: Final = "retry"
ON_UNKNOWN_RECONCILE: Final = "reconcile"

RECONCILE_TRIES_MAX: Final = 5
"""Reconciliation leases that may expire unanswered before the job is
dead-lettered as `unreconciled`; each retry waits the job's own backoff."""

ReconcileLease = tuple[str, int, int, int, int]
"""(worker_id, epoch, fencing_token, expires_at_ms, lease_ms); a tuple, so
that changing it (a heartbeat) replaces it and an undo restores it."""


class ReconcileTask:
    __slots__ = ("queue", "attempt", "tries", "available_at_ms", "lease")

    def __init__(
        self,
        queue: str,
        attempt: int,
        tries: int,
        available_at_ms: int,
        lease: ReconcileLease | None,
    ) -> None:
        self.queue = queue
        self.attempt = attempt
        self.tries = tries
        self.available_at_ms = available_at_ms
        self.lease = lease


class Book:
    __slots__ = ("policies", "queues", "tenants", "tasks", "log")

    def __init__(self) -> None:
        self.policies: dict[str, tuple[str | None, str | None]] = {}
        self.queues: dict[str, str] = {}
        self.tenants: dict[str, str] = {}
        self.tasks: dict[str, ReconcileTask] = {}
        # Derived, never encoded; built on first use (reconcile_log.log_of).
        self.log: Log | None = None


def book_of(state: State) -> Book:
    book: Book = state.sections[RECONCILE]
    return book


def on_unknown(state: State, job: Job) -> str:
    """The job's own policy, else its queue's, else its tenant's, else retry."""
    book = book_of(state)
    own = book.policies.get(job.id)
    if own is not None and own[0] is not None:
        return own[0]
    return book.queues.get(job.queue) or book.tenants.get(job.tenant) or ON_UNKNOWN_RETRY


def reconciles(state: State, job: Job) -> bool:
    """Whether an unknown outcome of `job` is reconciled rather than retried."""
    book = book_of(state)
    if not (book.policies or book.queues or book.tenants):
        return False  # the common case: nobody asked for reconciliation
    return on_unknown(state, job) == ON_UNKNOWN_RECONCILE


def reconcile_queue(state: State, job: Job) -> str:
    own = book_of(state).policies.get(job.id)
    if own is not None and own[1] is not None:
        return own[1]
    return job.queue


def outcome_unknown(attempt: Attempt) -> bool:
    """Whether an ended attempt may have had its effect with nobody knowing:
    its lease expired after the handler started, or its worker failed it
    with kind `unknown` (docs/reconciliation.md, "Which outcomes are
    unknown"), whatever the job's policy and wherever it went next."""
    outcome = attempt.outcome
    if outcome == OUTCOME_LEASE_EXPIRED:
        return attempt.started_at_ms is not None
    error = attempt.error
    return outcome == OUTCOME_FAILED and error is not None and error[0] == "unknown"


def awaits_reconciliation(state: State, job: Job) -> bool:
    """A dead letter of a `reconcile` job whose effect nobody has vouched
    for: dead-lettered `unreconciled` (cannot tell, or its reconciliations
    expired), or with its last attempt's outcome unknown and no decision
    after it (a deadline ended its reconciliation). Replaying it needs a
    reconcile decision or an operator's `ReplayReconciled`."""
    if job.status != DEAD_LETTER or not job.attempts or not reconciles(state, job):
        return False
    if job.last_error is not None and job.last_error[0] == ERROR_UNRECONCILED:
        return True
    if not outcome_unknown(job.attempts[-1]):
        return False
    for _, _, from_status, _, _, _, _, detail in reversed(job.history or ()):
        if from_status == RECONCILING and detail is not None and detail.startswith("reconciled "):
            return False  # a reconciler decided (did_not_happen, attempts spent)
    return True


def open_reconcile_queue(state: State, job: Job) -> str | None:
    """The queue a reconciling job's open reconciliation is claimed from."""
    task = book_of(state).tasks.get(job.id)
    return None if task is None else task.queue


def remember_policy(
    state: State,
    job_id: str,
    policy: str | None,
    queue: str | None,
    savepoint: Savepoint | None,
) -> None:
    """A new job whose spec named `on_unknown` or `reconcile_queue`."""
    if policy is None and queue is None:
        return
    policies = book_of(state).policies
    policies[job_id] = (policy, queue)
    if savepoint is not None:
        savepoint.on_rollback(lambda: _drop(policies, job_id))


def forget_job(state: State, job_id: str, savepoint: Savepoint) -> None:
    """A purged job's policy goes with it."""
    policies = book_of(state).policies
    policy = policies.pop(job_id, None)
    if policy is not None:
        savepoint.on_rollback(lambda: policies.__setitem__(job_id, policy))


def open_task(state: State, job: Job, savepoint: Savepoint) -> None:
    """Entering `reconciling` (`lifecycle.ON_ENTER`): ask about the last
    attempt, claimable at once from the job's reconcile queue."""
    tasks = book_of(state).tasks
    task = ReconcileTask(
        reconcile_queue(state, job), job.attempts[-1].number, 0, state.now_ms, None
    )
    tasks[job.id] = task
    savepoint.on_rollback(lambda: _drop(tasks, job.id))


def close_task(state: State, job: Job, savepoint: Savepoint) -> None:
    """The reconciliation ended (a decision, or the job finished otherwise)."""
    tasks = book_of(state).tasks
    task = tasks.pop(job.id, None)
    if task is not None:
        savepoint.on_rollback(lambda: tasks.__setitem__(job.id, task))


def close_finished(state: State, job: Job, savepoint: Savepoint) -> None:
    """`on_job_finished` hook: a reconciling job cancelled or dead-lettered
    by its deadline leaves no task behind."""
    if book_of(state).tasks:
        close_task(state, job, savepoint)


def offered(state: State, queues: tuple[str, ...]) -> list[tuple[str, ReconcileTask]]:
    """The open tasks that a claim of `queues` may be offered (unleased, of
    a queue that is not paused), whenever they become available."""
    tasks = book_of(state).tasks
    if not tasks:
        return []
    settings = flow_of(state).queues
    found = []
    for job_id, task in tasks.items():
        if task.lease is not None or task.queue not in queues:
            continue
        record = settings.get(task.queue)
        if record is None or not record.paused:
            found.append((job_id, task))
    return found


def claimable_at_ms(state: State, queues: tuple[str, ...]) -> int | None:
    """When a claim of `queues` could next be granted a reconciliation; None
    when none is open there."""
    times = [task.available_at_ms for _, task in offered(state, queues)]
    return min(times) if times else None


def _drop(mapping: dict[str, Any], key: str) -> None:
    mapping.pop(key, None)


def guard_task(task: ReconcileTask, savepoint: Savepoint) -> None:
    """Call before changing a task's fields."""
    before = (task.tries, task.available_at_ms, task.lease)

    def undo() -> None:
        task.tries, task.available_at_ms, task.lease = before

    savepoint.on_rollback(undo)


def guard_defaults(mapping: dict[str, str], name: str, savepoint: Savepoint) -> None:
    before = mapping.get(name)

    def undo() -> None:
        if before is None:
            mapping.pop(name, None)
        else:
            mapping[name] = before

    savepoint.on_rollback(undo)


# -- encoding ---------------------------------------------------------------------


def _encode(state: State) -> Any:
    book = book_of(state)
    return [
        [[job_id, *policy] for job_id, policy in sorted(book.policies.items())],
        [list(pair) for pair in sorted(book.queues.items())],
        [list(pair) for pair in sorted(book.tenants.items())],
        [
            [job_id, task.queue, task.attempt, task.tries, task.available_at_ms,
             None if task.lease is None else list(task.lease)]
            for job_id, task in sorted(book.tasks.items())
        ],
    ]  # fmt: skip


def _decode(state: State, data: Any) -> None:
    book = Book()
    policies, queues, tenants, tasks = data
    for job_id, policy, queue in policies:
        book.policies[job_id] = (policy, queue)
    book.queues = dict(queues)
    book.tenants = dict(tenants)
    for job_id, queue, attempt, tries, available_at_ms, lease in tasks:
        book.tasks[job_id] = ReconcileTask(
            queue, attempt, tries, available_at_ms, None if lease is None else tuple(lease)
        )
    state.sections[RECONCILE] = book


def _at_default(state: State) -> bool:
    book = book_of(state)
    return not (book.policies or book.queues or book.tenants or book.tasks)


SECTION: Final = Section(RECONCILE, Book, _encode, _decode, _at_default)


def check(state: State) -> list[str]:
    """Invariants: a task exactly for each reconciling job, about its last
    attempt, which ended with an outcome that can be unknown; leases fenced
    by tokens above that attempt's."""
    book = book_of(state)
    problems: list[str] = []
    for job_id, task in book.tasks.items():
        job = state.jobs.get(job_id)
        if job is None or job.status != RECONCILING:
            problems.append(f"reconcile task for {job_id}, which is not reconciling")
            continue
        last = job.attempts[-1] if job.attempts else None
        if last is None or last.number != task.attempt:
            problems.append(f"reconcile task of {job_id} is not about its last attempt")
            continue
        if last.outcome not in (OUTCOME_LEASE_EXPIRED, OUTCOME_FAILED):
            problems.append(f"reconcile task of {job_id} about an attempt that {last.outcome}")
        if not 0 <= task.tries < RECONCILE_TRIES_MAX:
            problems.append(f"reconcile task of {job_id} tried {task.tries} times")
        lease = task.lease
        if lease is not None:
            token = lease[2]
            if not last.fencing_token < token <= last_fencing_token(state):
                problems.append(f"reconcile lease of {job_id} has token {token}")
            if lease[1] > state.epoch:
                problems.append(f"reconcile lease of {job_id}: epoch above state epoch")
    for job_id, job in state.jobs.items():
        if job.status == RECONCILING and job_id not in book.tasks:
            problems.append(f"job {job_id} is reconciling without a task")
    for job_id in book.policies:
        if job_id not in state.jobs:
            problems.append(f"reconcile policy for unknown job {job_id}")
    for policy in (*book.queues.values(), *book.tenants.values()):
        if policy != ON_UNKNOWN_RECONCILE:
            problems.append(f"a stored default on_unknown of {policy!r}")
    return problems
