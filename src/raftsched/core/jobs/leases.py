"""The worker protocol: claim, start, heartbeat, complete, fail.

Everything after a claim is fenced: only the job's current lease token is
accepted, and any other token is `lease_lost` with nothing changed.
"""

from __future__ import annotations

from raftsched.core.jobs.commands import (
    ClaimJobs,
    ClaimJobsOfKinds,
    CompleteJob,
    FailJob,
    HeartbeatJob,
    StartJob,
)
from raftsched.core.jobs.flow_claim import Selector
from raftsched.core.jobs.lifecycle import (
    allowed,
    end_attempt,
    invalid_state,
    lease_inputs,
    retry_or_dead_letter,
    transition,
)
from raftsched.core.jobs.reconcile import grant_reconciliations, heartbeat_reconciliation
from raftsched.core.jobs.reconcile_book import reconciles
from raftsched.core.kernel.feature import Context
from raftsched.core.kernel.model import (
    CANCEL,
    CLAIM,
    COMPLETE,
    DEAD_LETTER_EVENT,
    OUTCOME_CANCELLED,
    OUTCOME_FAILED,
    OUTCOME_SUCCEEDED,
    OUTCOME_UNKNOWN,
    RUNNING,
    START,
    SUCCEEDED,
    Attempt,
    Job,
    JobLease,
)
from raftsched.core.kernel.results import (
    LEASE_LOST,
    NOT_FOUND,
    Claimed,
    Completed,
    Failed,
    HeartbeatAccepted,
    Lease,
    Rejected,
    Started,
    stale_epoch,
)
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.shard import next_fencing_token
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import (
    CLAIM_JOBS_MAX,
    CLAIM_KINDS_MAX,
    CLAIM_QUEUES_MAX,
    FAILURE_KINDS,
    LEASE_MS_MAX,
    LEASE_MS_MIN,
    OTHER_KINDS,
    TIME_MS_MAX,
    U32_MAX,
    check_bytes,
    check_int,
    check_kind,
    check_name,
    check_optional_int,
    check_text,
    check_token,
    invalid,
)


def not_found(job_id: str) -> Rejected:
    return Rejected(NOT_FOUND, f"no job {job_id}", {"job_id": job_id})


def lease_lost(job: Job) -> Rejected:
    return Rejected(
        LEASE_LOST,
        "the fencing token is not this job's current lease token",
        {"job_id": job.id, "status": job.status},
    )


def current_lease(state: State, job_id: str, token: int) -> tuple[Job, JobLease] | Rejected:
    """The job and its lease, when `token` is the job's current one."""
    rejected = check_name(job_id, "job_id") or check_token(token)
    if rejected is not None:
        return rejected
    job = state.jobs.get(job_id)
    if job is None:
        return not_found(job_id)
    lease = job.lease
    if lease is None or lease.fencing_token != token:
        return lease_lost(job)
    return job, lease


def apply_claim(state: State, command: ClaimJobs, context: Context) -> Claimed | Rejected:
    stale, savepoint = context.stale, context.savepoint
    if stale:
        return stale_epoch(state.epoch)
    rejected = _check_claim(command)
    if rejected is not None:
        return rejected
    kinds = None
    if type(command) is ClaimJobsOfKinds:
        rejected = _check_kinds(command.kinds, command.max_jobs)
        if rejected is not None:
            return rejected
        kinds = dict(command.kinds)
    # Flow control decides which jobs (flow_claim): queue gates, the reserved
    # high-priority share, weighted fair sharing among tenants; with kinds,
    # among the jobs of those kinds only.
    # Open reconciliations first: each holds a job until it is answered.
    leases = grant_reconciliations(state, command, command.max_jobs, savepoint)
    selector = Selector(state, command.queues, savepoint, kinds)
    for _ in range(command.max_jobs - len(leases)):
        job = _pop_best(selector)
        if job is None:
            break
        lease_ms = job.lease_ms if command.lease_ms is None else command.lease_ms
        leases.append(_grant(state, job, command.worker_id, lease_ms, savepoint))
    selector.finish()
    return Claimed(tuple(leases))


def _check_claim(command: ClaimJobs) -> Rejected | None:
    queues = command.queues
    if type(queues) is not tuple or not 1 <= len(queues) <= CLAIM_QUEUES_MAX:
        return invalid("queues", f"claim from 1 to {CLAIM_QUEUES_MAX} queues")
    for queue in queues:
        rejected = check_name(queue, "queues")
        if rejected is not None:
            return rejected
    return (
        check_name(command.worker_id, "worker_id")
        or check_int(command.max_jobs, "max_jobs", 1, CLAIM_JOBS_MAX)
        or check_optional_int(command.lease_ms, "lease", LEASE_MS_MIN, LEASE_MS_MAX)
    )


def _check_kinds(kinds: object, max_jobs: int) -> Rejected | None:
    """1 to CLAIM_KINDS_MAX distinct (kind, None or "*", 0 to max_jobs) pairs
    (0: none of that kind, which also keeps "*" from taking it)."""
    if type(kinds) is not tuple or not 1 <= len(kinds) <= CLAIM_KINDS_MAX:
        return invalid("kinds", f"claim from 1 to {CLAIM_KINDS_MAX} kinds")
    for pair in kinds:
        if type(pair) is not tuple or len(pair) != 2:
            return invalid("kinds", "each kind is a (kind, max_jobs) pair")
        kind, most = pair
        named = kind is None or kind == OTHER_KINDS
        rejected = (None if named else check_kind(kind, "kinds")) or check_int(
            most, "kinds", 0, max_jobs
        )
        if rejected is not None:
            return rejected
    if len({kind for kind, _ in kinds}) != len(kinds):
        return invalid("kinds", "each kind at most once")
    return None


def _pop_best(selector: Selector) -> Job | None:
    """The next job to grant: the best candidate across the claimed queues
    under their limits and shares; None when no queue offers one."""
    return selector.pop()


def _grant(state: State, job: Job, worker_id: str, lease_ms: int, savepoint: Savepoint) -> Lease:
    savepoint.touch(job)
    now_ms = state.now_ms
    epoch = state.epoch
    token = next_fencing_token(state)
    expires_at_ms = now_ms + lease_ms
    number = len(job.attempts) + 1
    runnable_since_ms = job.next_run_at_ms  # when a pending job became runnable
    job.lease = JobLease(worker_id, epoch, token, expires_at_ms, lease_ms)
    job.attempts = (*job.attempts, Attempt(number, worker_id, epoch, token, now_ms))
    job.next_run_at_ms = None
    transition(state, job, CLAIM, worker_id, savepoint, token)  # into the lease heap
    return Lease(
        job.id,
        number,
        epoch,
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
        lease_inputs(state, job),
        runnable_since_ms,
    )


def apply_start(state: State, command: StartJob, context: Context) -> Started | Rejected:
    savepoint = context.savepoint
    found = current_lease(state, command.job_id, command.fencing_token)
    if isinstance(found, Rejected):
        return found
    job, lease = found
    if not allowed(job, START):
        return invalid_state(job, START)
    if job.status != RUNNING:  # a repeated start changes nothing
        savepoint.touch(job)
        job.attempts[-1].started_at_ms = state.now_ms
        transition(state, job, START, lease.worker_id, savepoint, lease.fencing_token)
    return Started(job.id, lease.expires_at_ms)


def apply_heartbeat(
    state: State, command: HeartbeatJob, context: Context
) -> HeartbeatAccepted | Rejected:
    savepoint = context.savepoint
    rejected = check_optional_int(command.extend_ms, "extend", 1, LEASE_MS_MAX) or (
        None if command.progress is None else check_bytes(command.progress, "progress")
    )
    if rejected is not None:
        return rejected
    found = current_lease(state, command.job_id, command.fencing_token)
    if isinstance(found, Rejected):
        return heartbeat_reconciliation(state, command, savepoint) or found
    job, lease = found
    extend_ms = lease.lease_ms if command.extend_ms is None else command.extend_ms
    # Never shorten a lease: the lease heap relies on expiries only growing.
    expires_at_ms = max(lease.expires_at_ms, state.now_ms + extend_ms)
    if expires_at_ms != lease.expires_at_ms:
        savepoint.touch(job)
        lease.expires_at_ms = expires_at_ms
    return HeartbeatAccepted(job.id, expires_at_ms, job.cancel_requested)


def apply_complete(state: State, command: CompleteJob, context: Context) -> Completed | Rejected:
    savepoint = context.savepoint
    rejected = check_bytes(command.result, "result")
    if rejected is not None:
        return rejected
    found = current_lease(state, command.job_id, command.fencing_token)
    if isinstance(found, Rejected):
        return _replayed_completion(state, command) or found
    job, lease = found
    savepoint.touch(job)
    end_attempt(state, job, OUTCOME_SUCCEEDED, None, savepoint, counted=True)
    job.result = command.result
    transition(state, job, COMPLETE, lease.worker_id, savepoint, lease.fencing_token)
    return Completed(job.id, command.result, replayed=False)


def _replayed_completion(state: State, command: CompleteJob) -> Completed | None:
    """A repeated completion by the attempt that succeeded gets the original
    result. Only by that attempt: a job that a reconciliation completed
    (`happened`) kept its unknown attempt last, whose lease had expired; the
    late complete of that attempt lost its lease (409 lease_lost)."""
    job = state.jobs.get(command.job_id) if type(command.job_id) is str else None
    if job is None or job.status != SUCCEEDED or not job.attempts:
        return None
    last = job.attempts[-1]
    if last.fencing_token != command.fencing_token or last.outcome != OUTCOME_SUCCEEDED:
        return None
    return Completed(job.id, job.result if job.result is not None else b"\xc0", replayed=True)


def apply_fail(state: State, command: FailJob, context: Context) -> Failed | Rejected:
    savepoint = context.savepoint
    rejected = _check_fail(command)
    if rejected is not None:
        return rejected
    found = current_lease(state, command.job_id, command.fencing_token)
    if isinstance(found, Rejected):
        return _repeated_fail(state, command) or found
    job, lease = found
    error = (command.kind, command.message)
    actor, token = lease.worker_id, lease.fencing_token
    detail = f"{command.kind}: {command.message}" if command.message else command.kind
    savepoint.touch(job)
    job.last_error = error
    if command.kind == "cancelled" or job.cancel_requested:
        end_attempt(state, job, OUTCOME_CANCELLED, error, savepoint, counted=True)
        transition(state, job, CANCEL, actor, savepoint, token, detail)
    elif command.kind == "permanent":
        end_attempt(state, job, OUTCOME_FAILED, error, savepoint, counted=True)
        transition(state, job, DEAD_LETTER_EVENT, actor, savepoint, token, detail)
    elif command.kind == "unknown" and reconciles(state, job):
        end_attempt(state, job, OUTCOME_FAILED, error, savepoint, counted=True)
        transition(state, job, OUTCOME_UNKNOWN, actor, savepoint, token, detail)
    else:
        end_attempt(state, job, OUTCOME_FAILED, error, savepoint, counted=True)
        retry_or_dead_letter(
            state, job, actor, token, detail, command.random_u32, savepoint, command.retry_after_ms
        )
    return Failed(job.id, job.status, job.next_run_at_ms)


def _repeated_fail(state: State, command: FailJob) -> Failed | None:
    """A fail retried after its first delivery committed (the answer was lost)
    returns where that fail left the job, as a repeated complete does: the
    attempt that carried this token already ended by a fail of the same kind."""
    job = state.jobs.get(command.job_id)
    if job is None:
        return None
    for attempt in reversed(job.attempts):
        if attempt.fencing_token == command.fencing_token:
            ended_by_fail = attempt.outcome in (OUTCOME_FAILED, OUTCOME_CANCELLED)
            same_kind = attempt.error is not None and attempt.error[0] == command.kind
            if ended_by_fail and same_kind:
                return Failed(job.id, job.status, job.next_run_at_ms)
            return None
    return None


def _check_fail(command: FailJob) -> Rejected | None:
    if type(command.kind) is not str or command.kind not in FAILURE_KINDS:
        return invalid("kind", "kind is transient, permanent, unknown or cancelled")
    return (
        check_text(command.message, "message")
        or check_optional_int(command.retry_after_ms, "retry_after", 0, TIME_MS_MAX)
        or check_int(command.random_u32, "random_u32", 0, U32_MAX)
    )
