"""How schedule commands appear in the audit trail (`kernel.audit`): the
schedule's id and the tenant of its job template."""

from __future__ import annotations

from typing import Any, Final

from raftsched.core.kernel.feature import Audit, AuditSubject
from raftsched.core.kernel.state import State
from raftsched.core.schedules.commands import BackfillSchedule, CreateSchedule, UpdateSchedule
from raftsched.core.schedules.model import book


def _tenant(state: State, schedule_id: object) -> str | None:
    schedule = book(state).schedules.get(schedule_id) if type(schedule_id) is str else None
    return None if schedule is None else schedule.spec.job.tenant


def _saved(state: State, command: CreateSchedule | UpdateSchedule) -> AuditSubject:
    spec = command.spec
    when = spec.cron if spec.cron is not None else f"every {spec.interval_ms} ms"
    return AuditSubject(spec.id, spec.job.tenant, f"{when} queue={spec.job.queue}")


def _by_id(state: State, command: Any) -> AuditSubject:
    return AuditSubject(command.schedule_id, _tenant(state, command.schedule_id))


def _backfill(state: State, command: BackfillSchedule) -> AuditSubject:
    detail = f"from_ms={command.from_ms} to_ms={command.to_ms}"
    return AuditSubject(command.schedule_id, _tenant(state, command.schedule_id), detail)


CREATE: Final = Audit("schedule.create", _saved)
UPDATE: Final = Audit("schedule.update", _saved)
DELETE: Final = Audit("schedule.delete", _by_id)
PAUSE: Final = Audit("schedule.pause", _by_id)
RESUME: Final = Audit("schedule.resume", _by_id)
TRIGGER: Final = Audit("schedule.trigger", _by_id)
BACKFILL: Final = Audit("schedule.backfill", _backfill)
