"""How the jobs feature's operator commands appear in the audit trail
(`kernel.audit`): what each acts on, whose tenant, and a short detail."""

from __future__ import annotations

from typing import Final

from raftsched.core.jobs.commands import (
    CancelJob,
    ConfigureWheel,
    PauseQueue,
    ReplayJob,
    ReplayReconciled,
    RequestReconcile,
    SetQueue,
    SetTenant,
    SetUnknownPolicy,
)
from raftsched.core.kernel.feature import Audit, AuditSubject
from raftsched.core.kernel.state import State


def _job_subject(state: State, job_id: str, reason: str) -> AuditSubject:
    job = state.jobs.get(job_id) if type(job_id) is str else None
    return AuditSubject(job_id, None if job is None else job.tenant, reason or None)


def _cancel(state: State, command: CancelJob) -> AuditSubject:
    return _job_subject(state, command.job_id, command.reason)


def _replay(state: State, command: ReplayJob) -> AuditSubject:
    return _job_subject(state, command.job_id, command.reason)


def _replay_reconciled(state: State, command: ReplayReconciled) -> AuditSubject:
    return _job_subject(state, command.job_id, f"reconciled: {command.reason}")


def _request_reconcile(state: State, command: RequestReconcile) -> AuditSubject:
    return _job_subject(state, command.job_id, command.reason)


def _limit(name: str, value: object) -> str | None:
    return None if value is None else f"{name}={value}"


def _set_queue(state: State, command: SetQueue) -> AuditSubject:
    settings = [
        "paused" if command.paused else None,
        _limit("rate_limit_milli_per_s", command.rate_limit_milli_per_s),
        _limit("burst", command.burst),
        _limit("concurrency_limit", command.concurrency_limit),
        _limit("circuit_window", command.circuit_window),
    ]
    detail = " ".join(item for item in settings if item) or "no limits"
    return AuditSubject(command.queue, None, detail)


def _pause_queue(state: State, command: PauseQueue) -> AuditSubject:
    return AuditSubject(command.queue, None, "paused" if command.paused else "resumed")


def _set_tenant(state: State, command: SetTenant) -> AuditSubject:
    settings = [
        f"weight={command.weight}",
        _limit("concurrency_limit", command.concurrency_limit),
        _limit("max_queued", command.max_queued),
    ]
    detail = " ".join(item for item in settings if item)
    return AuditSubject(command.tenant, command.tenant, detail)


def _set_unknown_policy(state: State, command: SetUnknownPolicy) -> AuditSubject:
    tenant = command.name if command.scope == "tenant" else None
    return AuditSubject(command.name, tenant, f"{command.scope} on_unknown={command.on_unknown}")


def _configure_wheel(state: State, command: ConfigureWheel) -> AuditSubject:
    detail = f"horizon_ms={command.horizon_ms} bucket_ms={command.bucket_ms}"
    return AuditSubject("wheel", None, detail)


CANCEL: Final = Audit("job.cancel", _cancel)
REPLAY: Final = Audit("job.replay", _replay)
SET_QUEUE: Final = Audit("queue.set", _set_queue)
PAUSE_QUEUE: Final = Audit("queue.pause", _pause_queue)
SET_TENANT: Final = Audit("tenant.set", _set_tenant)
SET_UNKNOWN_POLICY: Final = Audit("on_unknown.set", _set_unknown_policy)
REPLAY_RECONCILED: Final = Audit("job.replay_reconciled", _replay_reconciled)
REQUEST_RECONCILE: Final = Audit("job.reconcile", _request_reconcile)
CONFIGURE_WHEEL: Final = Audit("wheel.configure", _configure_wheel)
