"""Schedule commands: create, update, delete, pause, resume, trigger, backfill.

Each handler validates everything first and then mutates, registering undo
actions on the savepoint, so a rejected command changes nothing. See
`schedules_model` for the records and `schedules_fire` for how occurrences
are decided.
"""

from __future__ import annotations

from typing import Final

from raftsched.core.kernel.feature import Context
from raftsched.core.kernel.results import (
    IDEMPOTENCY_CONFLICT,
    NOT_FOUND,
    OccurrenceDecided,
    Rejected,
    ScheduleBackfilled,
    ScheduleSaved,
)
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import (
    TIME_MS_MAX,
    check_int,
    check_name,
    check_optional_int,
    check_spec,
    invalid,
)
from raftsched.core.schedules import calendar
from raftsched.core.schedules.commands import (
    BackfillSchedule,
    CreateSchedule,
    DeleteSchedule,
    PauseSchedule,
    ResumeSchedule,
    ScheduleSpec,
    TriggerSchedule,
    UpdateSchedule,
)
from raftsched.core.schedules.fire import capture, decide, following_ms, set_next
from raftsched.core.schedules.model import (
    BACKFILLED,
    TRIGGERED,
    Schedule,
    add_totals,
    book,
    push_timer,
    releasable,
)

OVERLAP_POLICIES: Final = frozenset(
    {"skip", "buffer_one", "buffer_all", "allow_all", "cancel_other"}
)
CATCHUP_POLICIES: Final = frozenset({"skip", "latest", "all"})
SCHEDULES_MAX: Final = 1_000_000
INTERVAL_MS_MIN: Final = 1_000
CRON_CHARS_MAX: Final = 200
CATCHUP_MAX_RUNS_MAX: Final = 1_000
BACKFILL_OCCURRENCES_MAX: Final = 1_000


def check_schedule(spec: object) -> Rejected | None:
    """Everything a ScheduleSpec must satisfy. Field names are the API's."""
    if type(spec) is not ScheduleSpec:
        return invalid("spec", "must be a ScheduleSpec")
    return (
        check_name(spec.id, "id")
        or _check_job(spec)
        or _check_calendar(spec)
        or check_optional_int(spec.start_at_ms, "start_at", 0, TIME_MS_MAX)
        or check_optional_int(spec.end_at_ms, "end_at", 0, TIME_MS_MAX)
        or _check_range(spec)
        or check_int(spec.jitter_ms, "jitter_s", 0, TIME_MS_MAX)
        or _check_policies(spec)
    )


def _check_job(spec: ScheduleSpec) -> Rejected | None:
    rejected = check_spec(spec.job)
    if rejected is not None:
        field = rejected.details.get("field", "job")
        return invalid(f"job.{field}", rejected.message)
    job = spec.job
    if job.idempotency_key is not None:
        return invalid("job.idempotency_key", "each occurrence's key is derived from it")
    if job.run_at_ms is not None or job.delay_ms is not None:
        return invalid("job.run_at", "an occurrence's job runs when the occurrence fires")
    return None


def _check_calendar(spec: ScheduleSpec) -> Rejected | None:
    if (spec.cron is None) == (spec.interval_ms is None):
        return invalid("cron", "give exactly one of cron and interval_s")
    if spec.interval_ms is not None:
        return check_int(spec.interval_ms, "interval_s", INTERVAL_MS_MIN, TIME_MS_MAX)
    if type(spec.cron) is not str or len(spec.cron) > CRON_CHARS_MAX:
        return invalid("cron", f"must be a string of at most {CRON_CHARS_MAX} chars")
    if type(spec.timezone) is not str:
        return invalid("timezone", "must be an IANA time zone name")
    try:
        calendar.check_cron(spec.cron)
    except calendar.CalendarError as error:
        return invalid("cron", str(error))
    try:
        calendar.zone(spec.timezone)
    except calendar.CalendarError as error:
        return invalid("timezone", str(error))
    return None


def _check_range(spec: ScheduleSpec) -> Rejected | None:
    start, end = spec.start_at_ms, spec.end_at_ms
    if start is not None and end is not None and end < start:
        return invalid("end_at", "must not be before start_at")
    return None


def _check_policies(spec: ScheduleSpec) -> Rejected | None:
    if spec.overlap not in OVERLAP_POLICIES:
        return invalid("overlap", f"must be one of {', '.join(sorted(OVERLAP_POLICIES))}")
    if spec.catchup_policy not in CATCHUP_POLICIES:
        return invalid("catchup.policy", "must be skip, latest or all")
    if type(spec.paused) is not bool:
        return invalid("paused", "must be a boolean")
    return (
        check_int(spec.catchup_window_ms, "catchup.window_s", 0, TIME_MS_MAX)
        or check_int(spec.catchup_max_runs, "catchup.max_runs", 1, CATCHUP_MAX_RUNS_MAX)
        or check_int(spec.catchup_grace_ms, "catchup.grace_s", 0, TIME_MS_MAX)
    )


def not_found(schedule_id: str) -> Rejected:
    return Rejected(NOT_FOUND, f"no schedule {schedule_id}", {"schedule_id": schedule_id})


def _find(state: State, schedule_id: object) -> Schedule | Rejected:
    rejected = check_name(schedule_id, "schedule_id")
    if rejected is not None:
        return rejected
    assert isinstance(schedule_id, str)
    found = book(state).schedules.get(schedule_id)
    return not_found(schedule_id) if found is None else found


# -- handlers ---------------------------------------------------------------------


def apply_create(
    state: State, command: CreateSchedule, context: Context
) -> ScheduleSaved | Rejected:
    savepoint = context.savepoint
    spec = command.spec
    rejected = check_schedule(spec)
    if rejected is not None:
        return rejected
    schedules = book(state)
    existing = schedules.schedules.get(spec.id)
    if existing is not None:
        if existing.spec == spec:
            return ScheduleSaved(spec.id, created=False)
        return Rejected(
            IDEMPOTENCY_CONFLICT,
            f"schedule {spec.id} exists with a different definition",
            {"field": "id", "schedule_id": spec.id},
        )
    if len(schedules.schedules) >= SCHEDULES_MAX:
        return invalid("id", f"at most {SCHEDULES_MAX} schedules")
    schedule = Schedule(spec, schedules.next_seq, state.now_ms)
    schedule.anchor_ms = state.now_ms if spec.start_at_ms is None else spec.start_at_ms
    next_seq = schedules.next_seq

    def undo() -> None:
        schedules.schedules.pop(spec.id, None)
        schedules.next_seq = next_seq

    savepoint.on_rollback(undo)
    schedules.next_seq += 1
    schedules.schedules[spec.id] = schedule
    set_next(state, schedule, following_ms(schedule, state.now_ms))
    return ScheduleSaved(spec.id, created=True)


def apply_update(
    state: State, command: UpdateSchedule, context: Context
) -> ScheduleSaved | Rejected:
    savepoint = context.savepoint
    spec = command.spec
    rejected = check_schedule(spec)
    if rejected is not None:
        return rejected
    schedule = _find(state, spec.id)
    if isinstance(schedule, Rejected):
        return schedule
    capture(savepoint, state, schedule)
    old = schedule.spec
    schedule.spec = spec
    schedule.paused = spec.paused
    schedule.updated_at_ms = state.now_ms
    if spec.start_at_ms is not None:
        schedule.anchor_ms = spec.start_at_ms
    elif old.interval_ms != spec.interval_ms or old.start_at_ms is not None:
        schedule.anchor_ms = state.now_ms
    schedule.hold_until_ms = None
    schedule.catchup_runs = 0
    set_next(state, schedule, following_ms(schedule, state.now_ms))
    _maybe_ready(state, schedule)
    return ScheduleSaved(spec.id, created=False)


def apply_delete(
    state: State, command: DeleteSchedule, context: Context
) -> ScheduleSaved | Rejected:
    savepoint = context.savepoint
    schedule = _find(state, command.schedule_id)
    if isinstance(schedule, Rejected):
        return schedule
    schedules = book(state)

    def undo() -> None:
        schedules.schedules[schedule.id] = schedule
        ordered = sorted(schedules.schedules.values(), key=lambda each: each.seq)
        schedules.schedules = {each.id: each for each in ordered}
        push_timer(state, schedule)
        add_totals(schedules, schedule.counts, 1)

    savepoint.on_rollback(undo)
    del schedules.schedules[schedule.id]
    add_totals(schedules, schedule.counts, -1)
    schedules.ready.discard(schedule.id)
    return ScheduleSaved(schedule.id, created=False)


def apply_pause(state: State, command: PauseSchedule, context: Context) -> ScheduleSaved | Rejected:
    savepoint = context.savepoint
    schedule = _find(state, command.schedule_id)
    if isinstance(schedule, Rejected):
        return schedule
    if not schedule.paused:
        capture(savepoint, state, schedule)
        schedule.paused = True
        schedule.hold_until_ms = None
        schedule.updated_at_ms = state.now_ms
        schedule.due_ms = None
    return ScheduleSaved(schedule.id, created=False)


def apply_resume(
    state: State, command: ResumeSchedule, context: Context
) -> ScheduleSaved | Rejected:
    savepoint = context.savepoint
    schedule = _find(state, command.schedule_id)
    if isinstance(schedule, Rejected):
        return schedule
    if schedule.paused:
        capture(savepoint, state, schedule)
        schedule.paused = False
        schedule.catchup_runs = 0
        schedule.updated_at_ms = state.now_ms
        set_next(state, schedule, following_ms(schedule, state.now_ms))
        _maybe_ready(state, schedule)
    return ScheduleSaved(schedule.id, created=False)


def _maybe_ready(state: State, schedule: Schedule) -> None:
    if releasable(state, schedule):
        book(state).ready.add(schedule.id)


def apply_trigger(
    state: State, command: TriggerSchedule, context: Context
) -> OccurrenceDecided | Rejected:
    savepoint = context.savepoint
    schedule = _find(state, command.schedule_id)
    if isinstance(schedule, Rejected):
        return schedule
    capture(savepoint, state, schedule)
    return decide(
        state, schedule, state.now_ms, TRIGGERED, schedule.spec.overlap, savepoint, "manual trigger"
    )


def apply_backfill(
    state: State, command: BackfillSchedule, context: Context
) -> ScheduleBackfilled | Rejected:
    savepoint = context.savepoint
    schedule = _find(state, command.schedule_id)
    if isinstance(schedule, Rejected):
        return schedule
    overlap = schedule.spec.overlap if command.overlap is None else command.overlap
    rejected = (
        check_int(command.from_ms, "from", 0, TIME_MS_MAX)
        or check_int(command.to_ms, "to", command.from_ms, state.now_ms)
        or (None if overlap in OVERLAP_POLICIES else invalid("overlap", "unknown policy"))
    )
    if rejected is not None:
        return rejected
    nominals = backfill_occurrences(schedule, command.from_ms, command.to_ms)
    if nominals is None:
        return invalid("from", f"the range holds more than {BACKFILL_OCCURRENCES_MAX} occurrences")
    capture(savepoint, state, schedule)
    decisions = tuple(
        decide(state, schedule, nominal_ms, BACKFILLED, overlap, savepoint, "backfill")
        for nominal_ms in nominals
    )
    return ScheduleBackfilled(schedule.id, decisions)


def backfill_occurrences(schedule: Schedule, from_ms: int, to_ms: int) -> list[int] | None:
    """The calendar's occurrences in [from_ms, to_ms], or None if too many."""
    found: list[int] = []
    nominal_ms = following_ms(schedule, from_ms - 1)
    while nominal_ms is not None and nominal_ms <= to_ms:
        if len(found) == BACKFILL_OCCURRENCES_MAX:
            return None
        found.append(nominal_ms)
        nominal_ms = following_ms(schedule, nominal_ms)
    return found
