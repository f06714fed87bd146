"""The schedules feature: recurring jobs from cron or interval calendars."""

from __future__ import annotations

from typing import Final

from raftsched.core.kernel.feature import CommandKind, Feature, JobFinishedHook, TickWork
from raftsched.core.schedules import audit, fire, handlers, model, queries
from raftsched.core.schedules.codec import SCHEDULE_FIELD
from raftsched.core.schedules.commands import (
    BackfillSchedule,
    CreateSchedule,
    DeleteSchedule,
    PauseSchedule,
    ResumeSchedule,
    TriggerSchedule,
    UpdateSchedule,
)

FEATURE: Final = Feature(
    name="schedules",
    sections=(model.SECTION,),
    # Tags 20-39.
    commands=(
        CommandKind(CreateSchedule, 20, ("schedule",), handlers.apply_create, audit=audit.CREATE),
        CommandKind(UpdateSchedule, 21, ("schedule",), handlers.apply_update, audit=audit.UPDATE),
        CommandKind(DeleteSchedule, 22, ("str",), handlers.apply_delete, audit=audit.DELETE),
        CommandKind(PauseSchedule, 23, ("str",), handlers.apply_pause, audit=audit.PAUSE),
        CommandKind(ResumeSchedule, 24, ("str",), handlers.apply_resume, audit=audit.RESUME),
        CommandKind(TriggerSchedule, 25, ("str",), handlers.apply_trigger, audit=audit.TRIGGER),
        CommandKind(
            BackfillSchedule,
            26,
            ("str", "int", "int", "str?"),
            handlers.apply_backfill,
            audit=audit.BACKFILL,
        ),
    ),
    field_kinds=(SCHEDULE_FIELD,),
    tick=(TickWork(40, fire.fire_due),),
    next_due_ms=fire.next_due_ms,
    check=queries.check,
    on_job_finished=(JobFinishedHook(40, model.mark_buffer_releasable),),
)
