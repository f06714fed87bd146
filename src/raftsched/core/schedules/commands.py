"""The commands of recurring schedules."""

from __future__ import annotations

from dataclasses import dataclass

from raftsched.core.kernel.commands import Command, JobSpec


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
class CreateSchedule(Command):
    """Create a schedule; the same spec again returns the existing one."""

    spec: ScheduleSpec


@dataclass(frozen=True, slots=True)
class UpdateSchedule(Command):
    """Replace a schedule's spec; the next occurrence is recomputed from now,
    the occurrence records, buffer and running jobs are kept."""

    spec: ScheduleSpec


@dataclass(frozen=True, slots=True)
class DeleteSchedule(Command):
    schedule_id: str


@dataclass(frozen=True, slots=True)
class PauseSchedule(Command):
    schedule_id: str


@dataclass(frozen=True, slots=True)
class ResumeSchedule(Command):
    """Occurrences that fell while paused are not fired; the next one after now is."""

    schedule_id: str


@dataclass(frozen=True, slots=True)
class TriggerSchedule(Command):
    """An occurrence now, under the overlap policy, outside the calendar."""

    schedule_id: str


@dataclass(frozen=True, slots=True)
class BackfillSchedule(Command):
    """The calendar's occurrences in [from_ms, to_ms], decided now in order
    under `overlap` (the schedule's own policy when None)."""

    schedule_id: str
    from_ms: int
    to_ms: int
    overlap: str | None = None
