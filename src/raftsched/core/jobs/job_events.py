"""What a job's final transition tells the rest of the core.

`lifecycle.finish` calls `job_finished` in the command that made the job
final: it appends the job's event to the outbox and lets the job's workflow
advance. Workflows plug in here (`on_workflow_job`, `on_lease_inputs`) so
that the low-level job modules need not import them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from raftsched.core.events.outbox import emit
from raftsched.core.kernel.model import CANCELLED, DEAD_LETTER, SUCCEEDED, Job
from raftsched.core.kernel.state import State

JOB_EVENT_TYPES: Final = {
    SUCCEEDED: "job.succeeded",
    DEAD_LETTER: "job.dead_lettered",
    CANCELLED: "job.cancelled",
}

_workflow_job: list[Callable[[State, Job], None]] = []
_lease_inputs: list[Callable[[State, Job], bytes | None]] = []


def on_workflow_job(hook: Callable[[State, Job], None]) -> None:
    _workflow_job.append(hook)


def on_lease_inputs(hook: Callable[[State, Job], bytes | None]) -> None:
    _lease_inputs.append(hook)


def job_event_data(job: Job) -> dict[str, Any]:
    """Small on purpose: ids and names, never the payload or result."""
    data: dict[str, Any] = {
        "job_id": job.id,
        "queue": job.queue,
        "tenant": job.tenant,
        "attempts": job.attempts_made,
    }
    if job.workflow_id is not None:
        data["workflow_id"] = job.workflow_id
        data["step"] = job.step
    if job.schedule_id is not None:
        data["schedule_id"] = job.schedule_id
    if job.correlation_id is not None:
        data["correlation_id"] = job.correlation_id
    if job.status != SUCCEEDED and job.last_error is not None:
        data["error_kind"] = job.last_error[0]
    return data


def job_finished(state: State, job: Job) -> None:
    event_type = JOB_EVENT_TYPES.get(job.status)
    if event_type is not None:
        emit(state, event_type, job_event_data(job))
    if job.workflow_id is not None:
        for hook in _workflow_job:
            hook(state, job)


def lease_inputs(state: State, job: Job) -> bytes | None:
    """The `inputs` a lease of this job carries (workflow steps only)."""
    if job.workflow_id is None:
        return None
    for hook in _lease_inputs:
        return hook(state, job)
    return None
