"""Commands from clients and operators: cancel, replay, effects, configure."""

from __future__ import annotations

from raftsched.core.jobs.commands import (
    CancelJob,
    Configure,
    ConfigureWheel,
    RecordEffect,
    ReplayJob,
    ReplayReconciled,
)
from raftsched.core.jobs.leases import current_lease, not_found
from raftsched.core.jobs.lifecycle import allowed, invalid_state, transition
from raftsched.core.jobs.reconcile_book import awaits_reconciliation
from raftsched.core.kernel import wheel
from raftsched.core.kernel.feature import Context
from raftsched.core.kernel.model import (
    CANCEL,
    CANCELLED,
    LEASED_STATUSES,
    REPLAY,
    REQUEST_CANCEL,
    Job,
    StoredEffect,
)
from raftsched.core.kernel.results import (
    INVALID_STATE,
    Ack,
    CancelAccepted,
    Effect,
    EffectRecorded,
    Rejected,
    Replayed,
)
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import (
    KEY_CHARS_MAX,
    TIME_MS_MAX,
    check_bytes,
    check_int,
    check_name,
    check_optional_int,
    check_text,
    invalid,
)


def _find(state: State, job_id: str) -> Job | Rejected:
    rejected = check_name(job_id, "job_id")
    if rejected is not None:
        return rejected
    job = state.jobs.get(job_id)
    return not_found(job_id) if job is None else job


def apply_cancel(state: State, command: CancelJob, context: Context) -> CancelAccepted | Rejected:
    return cancel_job(state, command, context.savepoint)


def cancel_job(state: State, command: CancelJob, savepoint: Savepoint) -> CancelAccepted | Rejected:
    """CancelJob, also for workflows and schedules cancelling their jobs."""
    rejected = check_text(command.reason, "reason") or check_name(command.actor, "actor")
    if rejected is not None:
        return rejected
    job = _find(state, command.job_id)
    if isinstance(job, Rejected):
        return job
    reason = command.reason or None
    if job.status in LEASED_STATUSES:
        # The worker learns of it on its next heartbeat and stops cooperatively.
        if not job.cancel_requested:
            savepoint.touch(job)
            job.cancel_requested = True
            lease = job.lease
            token = None if lease is None else lease.fencing_token
            transition(state, job, REQUEST_CANCEL, command.actor, savepoint, token, reason)
        return CancelAccepted(job.id, job.status, cancel_requested=True)
    if not allowed(job, CANCEL):
        return invalid_state(job, CANCEL)
    savepoint.touch(job)
    transition(state, job, CANCEL, command.actor, savepoint, None, reason)
    return CancelAccepted(job.id, CANCELLED, cancel_requested=job.cancel_requested)


def apply_replay(state: State, command: ReplayJob, context: Context) -> Replayed | Rejected:
    savepoint = context.savepoint
    rejected = check_text(command.reason, "reason") or check_name(command.actor, "actor")
    if rejected is not None:
        return rejected
    job = _find(state, command.job_id)
    if isinstance(job, Rejected):
        return job
    if not allowed(job, REPLAY):
        return invalid_state(job, REPLAY)
    if awaits_reconciliation(state, job):
        return Rejected(
            INVALID_STATE,
            "its last attempt's outcome is unknown and was never reconciled: "
            "reconcile it first, or replay it with reconciled and a reason",
            {"status": job.status, "event": REPLAY, "reason": "unreconciled"},
        )
    return _replay(state, job, command.actor, command.reason or None, savepoint)


def apply_replay_reconciled(
    state: State, command: ReplayReconciled, context: Context
) -> Replayed | Rejected:
    """A replay with the operator's word that the unknown outcome was
    reconciled by hand (any dead letter may be replayed so)."""
    rejected = check_text(command.reason, "reason") or check_name(command.actor, "actor")
    if rejected is not None:
        return rejected
    if not command.reason.strip():
        return invalid("reason", "a reconciled replay needs a reason")
    job = _find(state, command.job_id)
    if isinstance(job, Rejected):
        return job
    if not allowed(job, REPLAY):
        return invalid_state(job, REPLAY)
    detail = f"reconciled by operator: {command.reason}"
    return _replay(state, job, command.actor, detail, context.savepoint)


def _replay(
    state: State, job: Job, actor: str, detail: str | None, savepoint: Savepoint
) -> Replayed:
    savepoint.touch(job)
    # The attempt budget restarts; the attempts themselves stay on record. The
    # deadline is dropped: it has usually passed, and the operator decided
    # that the job should run.
    job.attempts_made = 0
    job.cancel_requested = False
    job.deadline_at_ms = None
    job.next_run_at_ms = state.now_ms
    transition(state, job, REPLAY, actor, savepoint, None, detail)
    return Replayed(job.id)


def apply_record_effect(
    state: State, command: RecordEffect, context: Context
) -> EffectRecorded | Rejected:
    savepoint = context.savepoint
    rejected = check_name(command.key, "key", KEY_CHARS_MAX) or check_bytes(
        command.result, "result"
    )
    if rejected is not None:
        return rejected
    existing = state.effects.get(command.key)
    found = current_lease(state, command.job_id, command.fencing_token)
    if isinstance(found, Rejected):
        # A record retried after it committed (its answer lost, its lease since
        # ended) returns the recorded effect: the same job and token wrote it.
        if existing is not None:
            owner, stored = existing
            if owner.id == command.job_id and stored.fencing_token == command.fencing_token:
                return EffectRecorded(public_effect(owner, stored), replayed=True)
        return found
    job, lease = found
    # First writer wins. A later attempt of the same job (with a newer token)
    # gets the effect its predecessor recorded instead of repeating it.
    if existing is not None:
        return EffectRecorded(public_effect(*existing), replayed=True)
    effect = StoredEffect(
        command.key, lease.fencing_token, state.epoch, command.result, state.now_ms
    )
    savepoint.touch(job)
    if job.effects is None:
        job.effects = [effect]
    else:
        job.effects.append(effect)
    state.effects[command.key] = (job, effect)
    return EffectRecorded(public_effect(job, effect), replayed=False)


def public_effect(job: Job, effect: StoredEffect) -> Effect:
    return Effect(
        effect.key,
        job.id,
        effect.fencing_token,
        effect.epoch,
        effect.result,
        effect.recorded_at_ms,
    )


def apply_configure(state: State, command: Configure, context: Context) -> Ack | Rejected:
    rejected = check_optional_int(command.retention_ms, "retention", 0, TIME_MS_MAX)
    if rejected is not None:
        return rejected
    if command.retention_ms is not None:
        state.retention_ms = command.retention_ms
    return Ack()


def apply_configure_wheel(
    state: State, command: ConfigureWheel, context: Context
) -> Ack | Rejected:
    """Set the time wheel's horizon and bucket width. The width can change
    only while nothing is packed (buckets are numbered by it)."""
    rejected = check_int(command.horizon_ms, "horizon_ms", 0, wheel.HORIZON_MS_MAX) or check_int(
        command.bucket_ms, "bucket_ms", wheel.BUCKET_MS_MIN, wheel.BUCKET_MS_MAX
    )
    if rejected is not None:
        return rejected
    record = wheel.wheel_of(state)
    if command.bucket_ms != record.bucket_ms and record.buckets:
        return Rejected(
            INVALID_STATE,
            "the bucket width can change only while no job is packed",
            {"field": "bucket_ms"},
        )
    before = (record.horizon_ms, record.bucket_ms)

    def undo() -> None:
        record.horizon_ms, record.bucket_ms = before

    context.savepoint.on_rollback(undo)
    record.horizon_ms, record.bucket_ms = command.horizon_ms, command.bucket_ms
    return Ack()
