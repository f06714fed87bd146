"""The outbox event a job's final transition emits (`job.succeeded`, ...).

`emit_job_event` is the jobs feature's first `on_job_finished` hook: it runs
in the command that made the job final, so the event exists exactly when the
transition committed.
"""

from __future__ import annotations

from typing import Any, Final

from raftsched.core.kernel.model import CANCELLED, DEAD_LETTER, SUCCEEDED, Job
from raftsched.core.kernel.outbox import emit
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.state import State

JOB_EVENT_TYPES: Final = {
    SUCCEEDED: "job.succeeded",
    DEAD_LETTER: "job.dead_lettered",
    CANCELLED: "job.cancelled",
}


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
    if job.kind is not None:  # only set since cluster version 8: older events keep their bytes
        data["kind"] = job.kind
    if job.status != SUCCEEDED and job.last_error is not None:
        data["error_kind"] = job.last_error[0]
    return data


def emit_job_event(state: State, job: Job, savepoint: Savepoint) -> None:
    event_type = JOB_EVENT_TYPES.get(job.status)
    if event_type is not None:
        emit(state, event_type, job_event_data(job), savepoint)
