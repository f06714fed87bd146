"""The job model: statuses, the one transition table, and the stored records.

Jobs, leases and attempts are small slotted classes rather than dataclasses:
a shard holds a million of them, and every byte and every constructor call
counts (see bench/core.py). They are mutated only by the command handlers;
everything outside the core treats them as read-only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Final, TypeVar

from raftsched.core.kernel.commands import Backoff

K = TypeVar("K")
V = TypeVar("V")
S = TypeVar("S")  # a status: str, or str | None where a record may have none yet

SCHEDULED: Final = "scheduled"
PENDING: Final = "pending"
CLAIMED: Final = "claimed"
RUNNING: Final = "running"
RETRY_WAIT: Final = "retry_wait"
SUCCEEDED: Final = "succeeded"
DEAD_LETTER: Final = "dead_letter"
CANCELLED: Final = "cancelled"
# An attempt of a job whose policy is `on_unknown: reconcile` ended with an
# unknown outcome; a reconcile handler decides whether its effect happened
# (jobs.reconcile). Since cluster version 5.
RECONCILING: Final = "reconciling"

JOB_STATUSES: Final = (
    SCHEDULED,
    PENDING,
    CLAIMED,
    RUNNING,
    RETRY_WAIT,
    SUCCEEDED,
    DEAD_LETTER,
    CANCELLED,
    RECONCILING,
)
FINAL_STATUSES: Final = frozenset({SUCCEEDED, DEAD_LETTER, CANCELLED})
LEASED_STATUSES: Final = frozenset({CLAIMED, RUNNING})
WAITING_STATUSES: Final = frozenset({SCHEDULED, RETRY_WAIT})
QUEUED_STATUSES: Final = frozenset({SCHEDULED, PENDING, RETRY_WAIT})

# Job events: what happened to a job. History records them; the table below
# says where each leads from each status.
SUBMIT: Final = "submit"  # derived in history from created_at, never stored
DUE: Final = "due"
CLAIM: Final = "claim"
START: Final = "start"
HEARTBEAT: Final = "heartbeat"
REQUEST_CANCEL: Final = "request_cancel"
COMPLETE: Final = "complete"
RETRY: Final = "retry"
REQUEUE: Final = "requeue"
DEAD_LETTER_EVENT: Final = "dead_letter"
CANCEL: Final = "cancel"
REPLAY: Final = "replay"
# Reconciliation (jobs.reconcile): the attempt's outcome is unknown; a
# reconciliation lease expired unanswered.
OUTCOME_UNKNOWN: Final = "outcome_unknown"
RECONCILE_EXPIRED: Final = "reconcile_expired"
# An operator sends an unreconciled dead letter back to its reconcilers.
RECONCILE: Final = "reconcile"

JOB_EVENTS: Final = (
    SUBMIT,
    DUE,
    CLAIM,
    START,
    HEARTBEAT,
    REQUEST_CANCEL,
    COMPLETE,
    RETRY,
    REQUEUE,
    DEAD_LETTER_EVENT,
    CANCEL,
    REPLAY,
    OUTCOME_UNKNOWN,
    RECONCILE_EXPIRED,
    RECONCILE,
)


def _table() -> dict[tuple[str, str], str]:
    table: dict[tuple[str, str], str] = {
        (SCHEDULED, DUE): PENDING,
        (RETRY_WAIT, DUE): PENDING,
        (PENDING, CLAIM): CLAIMED,
        (CLAIMED, START): RUNNING,
        # A repeated start with the current token is an idempotent retry.
        (RUNNING, START): RUNNING,
        (DEAD_LETTER, REPLAY): PENDING,
    }
    for leased in LEASED_STATUSES:
        # Heartbeats and cancel requests keep the status; they are in the
        # table so that "not leased" is one uniform invalid_state answer.
        table[leased, HEARTBEAT] = leased
        table[leased, REQUEST_CANCEL] = leased
        table[leased, COMPLETE] = SUCCEEDED
        table[leased, RETRY] = RETRY_WAIT
        table[leased, REQUEUE] = PENDING
    for status in QUEUED_STATUSES | LEASED_STATUSES:
        # Leased jobs reach `cancelled` only when the worker honours the
        # request or the lease expires while cancel is requested.
        table[status, CANCEL] = CANCELLED
        table[status, DEAD_LETTER_EVENT] = DEAD_LETTER
    # An operator discards a dead letter; this also releases its ordering key.
    table[DEAD_LETTER, CANCEL] = CANCELLED
    # Reconciliation: an unknown outcome waits for a reconcile decision, which
    # completes the job (the effect happened), retries it (it did not) or
    # dead-letters it (nobody can tell). Claims and expiries of the
    # reconciliation keep the status; an operator may still cancel.
    for leased in LEASED_STATUSES:
        table[leased, OUTCOME_UNKNOWN] = RECONCILING
    table[RECONCILING, CLAIM] = RECONCILING
    table[RECONCILING, RECONCILE_EXPIRED] = RECONCILING
    table[RECONCILING, COMPLETE] = SUCCEEDED
    table[RECONCILING, RETRY] = RETRY_WAIT
    table[RECONCILING, REQUEUE] = PENDING
    table[RECONCILING, DEAD_LETTER_EVENT] = DEAD_LETTER
    table[RECONCILING, CANCEL] = CANCELLED
    table[DEAD_LETTER, RECONCILE] = RECONCILING
    return dict(sorted(table.items()))


TRANSITIONS: Final[dict[tuple[str, str], str]] = _table()
"""(status, event) -> new status. A pair the table lacks is `invalid_state`.
What entering each status does besides is `lifecycle.ON_ENTER`."""


class ImpossibleTransition(Exception):
    """A move that its transition table lacks. Commands ask the table first and
    answer a domain error (`invalid_state`), so reaching this is a bug: the
    apply path rolls the command back and records `Rejected(internal_error)`."""


def next_status(table: Mapping[tuple[S, str], str], status: S, event: str, what: str) -> str:
    """Where `event` leads from `status` in `table` (of `what`: job, workflow, ...)."""
    to_status = table.get((status, event))
    if to_status is None:
        raise ImpossibleTransition(f"no {what} transition {event!r} from {status!r}")
    return to_status


INITIAL_STATUSES: Final = (SCHEDULED, PENDING)
"""A submission creates a job in one of these (scheduled when run_at is ahead)."""

# Attempt outcomes (api.md).
OUTCOME_SUCCEEDED: Final = "succeeded"
OUTCOME_FAILED: Final = "failed"
OUTCOME_LEASE_EXPIRED: Final = "lease_expired"
OUTCOME_CANCELLED: Final = "cancelled"
OUTCOMES: Final = (OUTCOME_SUCCEEDED, OUTCOME_FAILED, OUTCOME_LEASE_EXPIRED, OUTCOME_CANCELLED)

# Error kinds the core itself sets, besides the worker's FailureKind values.
ERROR_LEASE_EXPIRED: Final = "lease_expired"
ERROR_DEADLINE: Final = "deadline_exceeded"
ERROR_UNRECONCILED: Final = "unreconciled"

BackoffMs = tuple[int, int, int]
"""(initial_ms, max_ms, jitter_ms): a job's backoff, stored as a plain tuple so
that snapshots pack it without a Python callback."""

DEFAULT_BACKOFF_MS: Final = (Backoff().initial_ms, Backoff().max_ms, Backoff().jitter_ms)
"""`commands.Backoff()`; jobs that use it store None (nothing to encode)."""

ErrorInfo = tuple[str, str]
"""(kind, message)."""

HistoryRecord = tuple[int, str, str | None, str, str, int, int | None, str | None]
"""(at_ms, event, from_status, to_status, actor, epoch, fencing_token, detail)."""


class JobLease:
    """The current grant of a claimed or running job."""

    __slots__ = ("worker_id", "epoch", "fencing_token", "expires_at_ms", "lease_ms")

    def __init__(
        self, worker_id: str, epoch: int, fencing_token: int, expires_at_ms: int, lease_ms: int
    ) -> None:
        self.worker_id = worker_id
        self.epoch = epoch
        self.fencing_token = fencing_token
        self.expires_at_ms = expires_at_ms
        self.lease_ms = lease_ms


class Attempt:
    """One grant of a job to a worker, from claim to its outcome."""

    __slots__ = (
        "number",
        "worker_id",
        "epoch",
        "fencing_token",
        "claimed_at_ms",
        "started_at_ms",
        "ended_at_ms",
        "outcome",
        "error",
    )

    def __init__(
        self,
        number: int,
        worker_id: str,
        epoch: int,
        fencing_token: int,
        claimed_at_ms: int,
        started_at_ms: int | None = None,
        ended_at_ms: int | None = None,
        outcome: str | None = None,
        error: ErrorInfo | None = None,
    ) -> None:
        self.number = number
        self.worker_id = worker_id
        self.epoch = epoch
        self.fencing_token = fencing_token
        self.claimed_at_ms = claimed_at_ms
        self.started_at_ms = started_at_ms
        self.ended_at_ms = ended_at_ms
        self.outcome = outcome
        self.error = error


class StoredEffect:
    """An effects-ledger record; the owning job is implied by where it is stored."""

    __slots__ = ("key", "fencing_token", "epoch", "result", "recorded_at_ms")

    def __init__(
        self, key: str, fencing_token: int, epoch: int, result: bytes, recorded_at_ms: int
    ) -> None:
        self.key = key
        self.fencing_token = fencing_token
        self.epoch = epoch
        self.result = result
        self.recorded_at_ms = recorded_at_ms


JOB_FIELDS: Final = (
    "id",
    "queue",
    "tenant",
    "status",
    "priority",
    "payload",
    "idempotency_key",
    "ordering_key",
    "correlation_id",
    "labels",
    "created_at_ms",
    "updated_at_ms",
    "run_at_ms",
    "next_run_at_ms",
    "max_attempts",
    "attempts_made",
    "cancel_requested",
    "lease",
    "result",
    "last_error",
    "schedule_id",
    "workflow_id",
    "step",
    "attempts",
    "deadline_at_ms",
    "backoff",
    "lease_ms",
    "seq",
    "created_epoch",
    "fingerprint",
    "history",
    "effects",
    "kind",
)
"""Every slot of Job, in constructor (and snapshot) order. `kind` (cluster
version 8) is last: a snapshot chunk or a packed row whose jobs have none
leaves it out, so states without kinds encode as before (`codec`)."""


class Job:
    """A stored job. See the api.md Job object for the meaning of each field.

    `attempts_made` is the counter checked against `max_attempts`: it counts
    attempts that ran (completed, failed, or expired while running) since the
    job was submitted or last replayed. `attempts` keeps every grant, including
    leases that expired before the handler started.
    `next_run_at_ms` is when a waiting job becomes runnable, when a pending job
    became runnable, and None for leased and finished jobs.
    `seq` is the submission order (a state-wide counter).
    `history` holds every transition after submission (the submission itself
    is derived from the job's fields); `effects` the ledger records this job
    wrote. Both stay None until first needed, to keep queued jobs small.
    `kind` names the handler a worker runs it with (None: the default one);
    it never changes.
    """

    __slots__ = JOB_FIELDS

    def __init__(
        self,
        id: str,
        queue: str,
        tenant: str,
        status: str,
        priority: int,
        payload: bytes,
        idempotency_key: str | None,
        ordering_key: str | None,
        correlation_id: str | None,
        labels: tuple[tuple[str, str], ...],
        created_at_ms: int,
        updated_at_ms: int,
        run_at_ms: int,
        next_run_at_ms: int | None,
        max_attempts: int,
        attempts_made: int,
        cancel_requested: bool,
        lease: JobLease | None,
        result: bytes | None,
        last_error: ErrorInfo | None,
        schedule_id: str | None,
        workflow_id: str | None,
        step: str | None,
        attempts: tuple[Attempt, ...],
        deadline_at_ms: int | None,
        backoff: BackoffMs | None,
        lease_ms: int,
        seq: int,
        created_epoch: int,
        fingerprint: bytes | None,
        history: list[HistoryRecord] | None,
        effects: list[StoredEffect] | None,
        kind: str | None = None,
    ) -> None:
        self.id = id
        self.queue = queue
        self.tenant = tenant
        self.status = status
        self.priority = priority
        self.payload = payload
        self.idempotency_key = idempotency_key
        self.ordering_key = ordering_key
        self.correlation_id = correlation_id
        self.labels = labels
        self.created_at_ms = created_at_ms
        self.updated_at_ms = updated_at_ms
        self.run_at_ms = run_at_ms
        self.next_run_at_ms = next_run_at_ms
        self.max_attempts = max_attempts
        self.attempts_made = attempts_made
        self.cancel_requested = cancel_requested
        self.lease = lease
        self.result = result
        self.last_error = last_error
        self.schedule_id = schedule_id
        self.workflow_id = workflow_id
        self.step = step
        self.attempts = attempts
        self.deadline_at_ms = deadline_at_ms
        self.backoff = backoff
        self.lease_ms = lease_ms
        self.seq = seq
        self.created_epoch = created_epoch
        self.fingerprint = fingerprint
        self.history = history
        self.effects = effects
        self.kind = kind

    def __lt__(self, other: Job) -> bool:
        # Heap entries end with the job; two entries compare their jobs only
        # when their keys tie, which happens for duplicates of one job.
        return self.seq < other.seq

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, queue={self.queue!r}, status={self.status!r})"


class JobColumns:
    """Jobs in submission order with the columns that rebuilding the indexes
    reads (`state.rebuild_indexes`), so that it need not visit every job: at
    a million jobs each pass over the job objects costs a tenth of a second
    in cache misses. A snapshot decoder fills the columns as it builds the
    jobs; `from_jobs` reads them off the objects. `marked` are the jobs with
    a deadline, an idempotency key or effects; `ordered` those with an
    ordering key; `kinded` those with a kind."""

    __slots__ = (
        "jobs", "ids", "statuses", "queues", "tenants",
        "priorities", "seqs", "marked", "ordered", "kinded",
    )  # fmt: skip

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.ids: list[str] = []
        self.statuses: list[str] = []
        self.queues: list[str] = []
        self.tenants: list[str] = []
        self.priorities: list[int] = []
        self.seqs: list[int] = []
        self.marked: list[Job] = []
        self.ordered: list[Job] = []
        self.kinded: list[Job] = []

    @classmethod
    def from_jobs(cls, jobs: list[Job]) -> JobColumns:
        columns = cls()
        columns.jobs = jobs
        for name in ("ids", "statuses", "queues", "tenants", "priorities", "seqs"):
            setattr(columns, name, list(map(_COLUMN_GETTERS[name], jobs)))
        columns.marked = [
            job
            for job in jobs
            if job.deadline_at_ms is not None or job.idempotency_key is not None or job.effects
        ]
        columns.ordered = [job for job in jobs if job.ordering_key is not None]
        columns.kinded = [job for job in jobs if job.kind is not None]
        return columns


def uniform(column: Sequence[object]) -> bool:
    """Whether every element is the first (a C loop; identical objects compare
    at pointer speed, and decoded columns share their objects)."""
    return not column or column.count(column[0]) == len(column)


def count_values(column: list[K]) -> dict[K, int]:
    """`Counter(column)` in first-seen order. A column of a few distinct
    values (statuses, queue names) is counted by C loops, one per value."""
    if not column:
        return {}
    if uniform(column):
        return {column[0]: len(column)}
    distinct = set(column)
    if len(distinct) > _FEW_VALUES:
        return Counter(column)
    return {value: column.count(value) for value in sorted(distinct, key=column.index)}


_FEW_VALUES: Final = 16


def count_pairs(first: list[K], second: list[V]) -> dict[tuple[K, V], int]:
    """`Counter(zip(first, second))` in first-seen order, without a tuple per
    element when either column is uniform (in a snapshot one usually is)."""
    if second and uniform(second):
        only = second[0]
        return {(key, only): count for key, count in count_values(first).items()}
    if first and uniform(first):
        head = first[0]
        return {(head, value): count for value, count in count_values(second).items()}
    return Counter(zip(first, second, strict=True))


_COLUMN_GETTERS: Final = {
    "ids": attrgetter("id"),
    "statuses": attrgetter("status"),
    "queues": attrgetter("queue"),
    "tenants": attrgetter("tenant"),
    "priorities": attrgetter("priority"),
    "seqs": attrgetter("seq"),
}
