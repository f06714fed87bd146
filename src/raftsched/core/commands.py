"""Commands: what the leader proposes and every replica applies, in log order.

Commands are frozen, slotted dataclasses with imperative names. They carry
everything the core needs that is not already in the state: identifiers,
random draws and request data. Time and epoch are stamped once per Raft entry
by the leader (see `Entry`), so that a group-committed batch of commands shares
one clock reading and one term.

Durations are integer milliseconds (`*_ms`), instants are integer
milliseconds since the Unix epoch (`*_at_ms`). Opaque user data (payloads,
results, progress) is canonical msgpack bytes: the core stores and returns it
but never looks inside, which keeps memory per job small and the encoding
exact.

Each command has a stable integer tag in `raftsched.core.codec`; a tag is
never reused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FailureKind = Literal["transient", "permanent", "unknown", "cancelled"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry delay `d_n = min(max_ms, initial_ms * 2**n) + U(0, jitter_ms)`."""

    initial_ms: int = 1_000
    max_ms: int = 300_000
    jitter_ms: int = 1_000


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job as a client asked for it (already validated for types by the API).

    `run_at_ms` and `delay_ms` exclude each other; neither means "now".
    `deadline_ms` is a duration from submission bounding the job's whole life.
    `labels` is a tuple of (key, value) pairs sorted by key, so equal requests
    encode equally.
    """

    queue: str
    tenant: str = "default"
    payload: bytes = b"\xc0"  # msgpack nil
    priority: int = 0
    run_at_ms: int | None = None
    delay_ms: int | None = None
    max_attempts: int = 5
    backoff: Backoff = Backoff()
    lease_ms: int = 30_000
    deadline_ms: int | None = None
    idempotency_key: str | None = None
    ordering_key: str | None = None
    correlation_id: str | None = None
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class SubmitJobs:
    """Submit one or more jobs (at most 1,000), committed together.

    `job_ids[i]` is the identifier drawn by the proposer for `specs[i]`; it is
    used only if the spec creates a new job (an idempotent repeat returns the
    original job instead). Each spec succeeds or is rejected on its own.
    """

    specs: tuple[JobSpec, ...]
    job_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimJobs:
    """Grant up to `max_jobs` leases from `queues`, highest priority first, then oldest.

    `lease_ms` overrides each job's own lease duration when given.
    """

    worker_id: str
    queues: tuple[str, ...]
    max_jobs: int
    lease_ms: int | None = None


@dataclass(frozen=True, slots=True)
class StartJob:
    """The worker is about to run the handler: `claimed -> running`."""

    job_id: str
    fencing_token: int


@dataclass(frozen=True, slots=True)
class HeartbeatJob:
    """Extend the lease to now + `extend_ms` (or the lease's own duration)."""

    job_id: str
    fencing_token: int
    extend_ms: int | None = None
    progress: bytes | None = None


@dataclass(frozen=True, slots=True)
class CompleteJob:
    job_id: str
    fencing_token: int
    result: bytes = b"\xc0"


@dataclass(frozen=True, slots=True)
class FailJob:
    """Report a failed attempt.

    `random_u32` is a uniform draw in [0, 2**32) made by the proposer; the
    core scales it into the job's backoff jitter.
    """

    job_id: str
    fencing_token: int
    kind: FailureKind
    message: str = ""
    retry_after_ms: int | None = None
    random_u32: int = 0


@dataclass(frozen=True, slots=True)
class CancelJob:
    job_id: str
    reason: str = ""
    actor: str = "api"


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """Operator action: a `dead_letter` job becomes `pending` again, audited."""

    job_id: str
    reason: str = ""
    actor: str = "operator"


@dataclass(frozen=True, slots=True)
class RecordEffect:
    """First-writer-wins record in the effects ledger, fenced by the lease token."""

    key: str
    job_id: str
    fencing_token: int
    result: bytes = b"\xc0"


@dataclass(frozen=True, slots=True)
class Tick:
    """Let time pass: due jobs become runnable, leases expire, deadlines and
    retention are enforced. Proposed by the leader only when the core says
    something is due. `seed` feeds the jitter of retries this tick causes.
    `max_items` bounds the work one tick does; the rest waits for the next.
    """

    seed: int = 0
    max_items: int = 10_000


@dataclass(frozen=True, slots=True)
class TakeOver:
    """The first command a new leader proposes. Applying any entry of a higher
    epoch performs the takeover; this command exists so that a new leader
    commits an entry of its term at once (and learns its commit index)."""


@dataclass(frozen=True, slots=True)
class Barrier:
    """A no-op entry: once applied, every read that arrived before it was
    proposed can be answered linearizably from the local state."""


@dataclass(frozen=True, slots=True)
class Configure:
    """Cluster-wide settings that live in the replicated state."""

    retention_ms: int | None = None


@dataclass(frozen=True, slots=True)
class RaiseClusterVersion:
    """Let commands up to `version` be proposed: the leader proposes it once
    every member runs code that understands them (see core.cluster_version)."""

    version: int


# -- Workflows, the outbox and webhook subscriptions (issue 6) -----------------


@dataclass(frozen=True, slots=True)
class ConfigureOutbox:
    """How long events are kept after every subscriber has them, and how many
    events the outbox holds at most (beyond that the oldest are dropped)."""

    retention_ms: int | None = None
    events_max: int | None = None


@dataclass(frozen=True, slots=True)
class CreateSubscription:
    """A webhook subscription; delivery starts after the newest event so far.
    The secret signs deliveries and is replicated so that any leader can sign."""

    subscription_id: str
    url: str
    types: tuple[str, ...] = ()
    secret: str = ""


@dataclass(frozen=True, slots=True)
class DeleteSubscription:
    subscription_id: str


@dataclass(frozen=True, slots=True)
class AckDelivery:
    """The leader delivered (or parked) every matching event up to `through_seq`."""

    subscription_id: str
    through_seq: int


@dataclass(frozen=True, slots=True)
class ParkDelivery:
    """After `attempts` failures an event is set aside for this subscription,
    with the last error, instead of being retried forever."""

    subscription_id: str
    seq: int
    attempts: int
    error: str = ""


@dataclass(frozen=True, slots=True)
class RetryParked:
    """Operator action: deliver this subscription's parked events again."""

    subscription_id: str


@dataclass(frozen=True, slots=True)
class AckParked:
    """A parked event that was retried has now been delivered."""

    subscription_id: str
    seq: int


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One workflow step: its job, the steps it waits for, and an optional
    compensating job that undoes it when the workflow fails."""

    name: str
    job: JobSpec
    depends_on: tuple[str, ...] = ()
    compensation: JobSpec | None = None


@dataclass(frozen=True, slots=True)
class SubmitWorkflow:
    """Start a workflow. Step job ids derive from `workflow_id` inside the core.

    `on_failure` is `fail_fast` (stop at the first failed step) or `continue`
    (steps that do not depend on a failed step still run).
    """

    workflow_id: str
    steps: tuple[StepSpec, ...]
    tenant: str = "default"
    idempotency_key: str | None = None
    timeout_ms: int | None = None
    on_failure: str = "fail_fast"
    compensate_on_cancel: bool = True


@dataclass(frozen=True, slots=True)
class CancelWorkflow:
    workflow_id: str
    reason: str = ""
    actor: str = "api"


# -- Flow control: queues and tenants (issue 7) ----------------------------------


@dataclass(frozen=True, slots=True)
class SetQueue:
    """Replace a queue's flow settings (PUT semantics: None means no limit).

    `rate_limit_milli_per_s` is the token bucket's refill in tokens per 1,000
    seconds (so that 0.5/s is exact); `burst` its capacity in tokens. The
    circuit is off when `circuit_window` is None. Changing the rate or burst
    refills the bucket.
    """

    queue: str
    paused: bool = False
    rate_limit_milli_per_s: int | None = None
    burst: int | None = None
    concurrency_limit: int | None = None
    circuit_window: int | None = None
    circuit_probe_ms: int = 5_000


@dataclass(frozen=True, slots=True)
class PauseQueue:
    """Pause (no claims) or resume a queue, keeping its other settings."""

    queue: str
    paused: bool


@dataclass(frozen=True, slots=True)
class SetTenant:
    """Replace a tenant's settings: fair-share weight, concurrency limit
    (jobs claimed or running at once) and maximum queued jobs."""

    tenant: str
    weight: int = 1
    concurrency_limit: int | None = None
    max_queued: int | None = None


# -- Recurring schedules (issue 5) -------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A recurring schedule as a client asked for it (see `core.schedules`).

    Exactly one of `cron` (5 fields, or 6 with seconds first, evaluated in
    `timezone`) and `interval_ms` (elapsed time). `job` is the template of
    the job each occurrence creates; its idempotency key, run_at and delay
    must be unset (each occurrence's key is derived from the occurrence).
    `overlap`: skip | buffer_one | buffer_all | allow_all | cancel_other.
    `catchup_policy`: skip | latest | all, for occurrences missed by more
    than `catchup_grace_ms` or superseded by a later one.
    """

    id: str
    job: JobSpec
    cron: str | None = None
    interval_ms: int | None = None
    timezone: str = "UTC"
    start_at_ms: int | None = None
    end_at_ms: int | None = None
    jitter_ms: int = 0
    overlap: str = "skip"
    catchup_policy: str = "latest"
    catchup_window_ms: int = 3_600_000
    catchup_max_runs: int = 10
    catchup_grace_ms: int = 30_000
    paused: bool = False


@dataclass(frozen=True, slots=True)
class CreateSchedule:
    """Create a schedule; the same spec again returns the existing one."""

    spec: ScheduleSpec


@dataclass(frozen=True, slots=True)
class UpdateSchedule:
    """Replace a schedule's spec; the next occurrence is recomputed from now,
    the occurrence records, buffer and running jobs are kept."""

    spec: ScheduleSpec


@dataclass(frozen=True, slots=True)
class DeleteSchedule:
    schedule_id: str


@dataclass(frozen=True, slots=True)
class PauseSchedule:
    schedule_id: str


@dataclass(frozen=True, slots=True)
class ResumeSchedule:
    """Occurrences that fell while paused are not fired; the next one after now is."""

    schedule_id: str


@dataclass(frozen=True, slots=True)
class TriggerSchedule:
    """An occurrence now, under the overlap policy, outside the calendar."""

    schedule_id: str


@dataclass(frozen=True, slots=True)
class BackfillSchedule:
    """The calendar's occurrences in [from_ms, to_ms], decided now in order
    under `overlap` (the schedule's own policy when None)."""

    schedule_id: str
    from_ms: int
    to_ms: int
    overlap: str | None = None


Command = (
    SubmitJobs
    | ClaimJobs
    | StartJob
    | HeartbeatJob
    | CompleteJob
    | FailJob
    | CancelJob
    | ReplayJob
    | RecordEffect
    | Tick
    | TakeOver
    | Barrier
    | Configure
    | RaiseClusterVersion
    | ConfigureOutbox
    | CreateSubscription
    | DeleteSubscription
    | AckDelivery
    | ParkDelivery
    | RetryParked
    | AckParked
    | SubmitWorkflow
    | CancelWorkflow
    | SetQueue
    | PauseQueue
    | SetTenant
    | CreateSchedule
    | UpdateSchedule
    | DeleteSchedule
    | PauseSchedule
    | ResumeSchedule
    | TriggerSchedule
    | BackfillSchedule
)


@dataclass(frozen=True, slots=True)
class Entry:
    """One Raft log entry: a batch of commands stamped by the leader that
    proposed it. `now_ms` is that leader's clock; the core never lets
    replicated time run backwards. `epoch` is that leader's Raft term."""

    epoch: int
    now_ms: int
    commands: tuple[Command, ...]
