"""The commands of jobs: submit, the worker protocol, operator actions, flow control."""

from __future__ import annotations

from dataclasses import dataclass

from raftsched.core.kernel.commands import Command, FailureKind, JobSpec


@dataclass(frozen=True, slots=True)
class SubmitJobs(Command):
    """Submit one or more jobs (at most 1,000), committed together.

    `job_ids[i]` is the identifier drawn by the proposer for `specs[i]`; it is
    used only if the spec creates a new job (an idempotent repeat returns the
    original job instead). Each spec succeeds or is rejected on its own.
    """

    specs: tuple[JobSpec, ...]
    job_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimJobs(Command):
    """Grant up to `max_jobs` leases from `queues`, highest priority first, then oldest.

    `lease_ms` overrides each job's own lease duration when given.
    """

    worker_id: str
    queues: tuple[str, ...]
    max_jobs: int
    lease_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ClaimJobsOfKinds(ClaimJobs):
    """A claim of only the jobs a worker has handlers for (since cluster
    version 8): `kinds` is (kind, max_jobs) pairs, the kind None standing
    for jobs without one; of each kind at most its `max_jobs` (a worker's
    per-kind concurrency; 0: none now), of all together at most `max_jobs`, of any other
    kind none, unless the kind "*" (`OTHER_KINDS`) is among them: it stands
    for every job no other pair names (a worker that dead-letters what it
    cannot run). Otherwise exactly a `ClaimJobs` (its reconciliations too,
    which are routed by queue, not kind)."""

    kinds: tuple[tuple[str | None, int], ...] = ()


@dataclass(frozen=True, slots=True)
class StartJob(Command):
    """The worker is about to run the handler: `claimed -> running`."""

    job_id: str
    fencing_token: int


@dataclass(frozen=True, slots=True)
class HeartbeatJob(Command):
    """Extend the lease to now + `extend_ms` (or the lease's own duration)."""

    job_id: str
    fencing_token: int
    extend_ms: int | None = None
    progress: bytes | None = None


@dataclass(frozen=True, slots=True)
class CompleteJob(Command):
    job_id: str
    fencing_token: int
    result: bytes = b"\xc0"


@dataclass(frozen=True, slots=True)
class FailJob(Command):
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
class CancelJob(Command):
    job_id: str
    reason: str = ""
    actor: str = "api"


@dataclass(frozen=True, slots=True)
class ReplayJob(Command):
    """Operator action: a `dead_letter` job becomes `pending` again, audited."""

    job_id: str
    reason: str = ""
    actor: str = "operator"


@dataclass(frozen=True, slots=True)
class RecordEffect(Command):
    """First-writer-wins record in the effects ledger, fenced by the lease token."""

    key: str
    job_id: str
    fencing_token: int
    result: bytes = b"\xc0"


@dataclass(frozen=True, slots=True)
class Configure(Command):
    """Cluster-wide settings that live in the replicated state."""

    retention_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ConfigureWheel(Command):
    """The time wheel's settings (`kernel.wheel`): jobs due beyond now +
    `horizon_ms` are packed in buckets `bucket_ms` wide. Since version 7."""

    horizon_ms: int
    bucket_ms: int


# -- Workflows, the outbox and webhook subscriptions (issue 6) -----------------


@dataclass(frozen=True, slots=True)
class SetQueue(Command):
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
class PauseQueue(Command):
    """Pause (no claims) or resume a queue, keeping its other settings."""

    queue: str
    paused: bool


@dataclass(frozen=True, slots=True)
class SetTenant(Command):
    """Replace a tenant's settings: fair-share weight, concurrency limit
    (jobs claimed or running at once) and maximum queued jobs."""

    tenant: str
    weight: int = 1
    concurrency_limit: int | None = None
    max_queued: int | None = None


# -- Reconciliation of unknown outcomes (issue 17; since cluster version 5) ----


@dataclass(frozen=True, slots=True)
class SetUnknownPolicy(Command):
    """Set a queue's or a tenant's default `on_unknown` ("retry" or
    "reconcile"), for jobs that do not name their own. `scope` is "queue" or
    "tenant"; "retry" removes the setting (it is the default)."""

    scope: str
    name: str
    on_unknown: str


@dataclass(frozen=True, slots=True)
class ReconcileJob(Command):
    """A reconcile handler's decision on a `reconciling` job, fenced by the
    reconciliation lease's token.

    `decision` is "happened" (complete the job with `result` and record
    `effects`, (key, result) pairs, first writer wins), "did_not_happen"
    (retry the job as its next attempt; `random_u32` feeds the backoff
    jitter) or "cannot_tell" (dead-letter it as `unreconciled`). `reason` is
    the evidence the handler gives, kept in the job's history.
    """

    job_id: str
    fencing_token: int
    decision: str
    result: bytes = b"\xc0"
    effects: tuple[tuple[str, bytes], ...] = ()
    reason: str = ""
    random_u32: int = 0


@dataclass(frozen=True, slots=True)
class ReplayReconciled(Command):
    """Operator action: replay a dead letter whose last attempt's outcome is
    unknown and was never reconciled, stating (in `reason`, required) that
    its effect was reconciled by hand. A plain `ReplayJob` of such a job is
    refused: it could repeat an effect that happened."""

    job_id: str
    reason: str
    actor: str = "operator"


@dataclass(frozen=True, slots=True)
class RequestReconcile(Command):
    """Operator action: send an unreconciled dead letter back to its
    reconcilers (`dead_letter -> reconciling`), so that a reconcile decision
    settles it instead of the operator's word."""

    job_id: str
    reason: str = ""
    actor: str = "operator"


# -- Lease batches (issue 18; since cluster version 6) -------------------------


@dataclass(frozen=True, slots=True)
class LeaseBatch(Command):
    """A worker's lease operations and its next claim as one command
    (jobs.lease_batch): each of `ops` (StartJob, HeartbeatJob, CompleteJob,
    FailJob or ReconcileJob) is applied in order exactly as if it came
    alone, then `claim`, if any, so that the jobs just finished free their
    slots for it. Nested commands hold no commands (one level only)."""

    ops: tuple[Command, ...]
    claim: ClaimJobs | None = None


# -- Shards (issue 21; since cluster version 9) ---------------------------------

QueueQuotaRow = tuple[str, int | None, int | None, int | None]
"""(queue, concurrency_limit, rate_limit_milli_per_s, burst); None: the setting."""
TenantQuotaRow = tuple[str, int | None, int | None]
"""(tenant, concurrency_limit, max_queued); None: the setting."""


@dataclass(frozen=True, slots=True)
class SetShardQuotas(Command):
    """This shard's quotas of the cluster-wide flow limits, all of one
    rebalance round (jobs.quota_book): they replace the shard's quotas
    whole, and flow control enforces a limit's quota where one is given,
    else the setting.

    `round` grows with every round (say, group 0's replicated time); an
    older round than the shard's is refused, the same one again is a repeat.
    `queues` and `tenants` are in ascending order of name, each at most
    4,096 rows; a row gives at least one quota, a queue's rate
    (`rate_limit_milli_per_s`, tokens per 1,000 s, as `SetQueue`'s) together
    with its burst. Quotas may be 0 (a shard with no share of the limit).
    """

    round: int
    queues: tuple[QueueQuotaRow, ...] = ()
    tenants: tuple[TenantQuotaRow, ...] = ()


@dataclass(frozen=True, slots=True)
class PlanShardQuotas(Command):
    """Group 0's record of one shard's quotas for one rebalance round
    (jobs.quota_plans, docs/shards.md section 4): group 0's leader splits
    the flow limits over the shards and records each shard's part here; the
    node that hosts shard `shard`'s leader proposes it there as that shard's
    `SetShardQuotas` (same round, same rows). Rows and rounds are checked as
    `SetShardQuotas`' are; a round older than the shard's plan is refused,
    the same one again is a repeat. Accepted once the group has recorded its
    shard identity (`SetShard`), for a shard below its count."""

    shard: int
    round: int
    queues: tuple[QueueQuotaRow, ...] = ()
    tenants: tuple[TenantQuotaRow, ...] = ()


# -- Recurring schedules (issue 5) -------------------------------------------------
