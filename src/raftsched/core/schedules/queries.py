"""Reading schedules: lookups for the API and metrics, and the invariants."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from itertools import islice

from raftsched.core.kernel.state import State
from raftsched.core.schedules.model import (
    BUFFER_MAX,
    RECORDS_KEPT,
    OccurrenceRecord,
    Schedule,
    book,
    releasable,
    running,
)


def get_schedule(state: State, schedule_id: str) -> Schedule | None:
    return book(state).schedules.get(schedule_id)


def list_schedules(
    state: State, limit: int, after_id: str | None = None, tenants: frozenset[str] | None = None
) -> tuple[list[Schedule], str | None]:
    """Schedules in id order, `limit` at a time; the cursor is the last id.
    `tenants` (None: all) bounds them by their job template's tenant."""
    schedules = book(state).schedules
    ids = sorted(schedules) if after_id is None else sorted(k for k in schedules if k > after_id)
    if tenants is not None:
        ids = [k for k in ids if schedules[k].spec.job.tenant in tenants]
    page = [schedules[schedule_id] for schedule_id in ids[:limit]]
    cursor = page[-1].id if len(ids) > limit else None
    return page, cursor


def count_schedules(state: State) -> int:
    return len(book(state).schedules)


def iter_schedules(state: State) -> Iterator[Schedule]:
    return iter(book(state).schedules.values())


def occurrences(schedule: Schedule, limit: int) -> list[OccurrenceRecord]:
    """Newest decision first."""
    return list(islice(reversed(schedule.records), limit))


def occurrence_totals(state: State) -> dict[str, int]:
    """Decisions (and `missed:<reason>`) summed over every stored schedule."""
    return {key: count for key, count in book(state).totals.items() if count}


def first_schedules(state: State, count: int) -> list[Schedule]:
    """The first `count` schedules by id (bounded metric labels)."""
    schedules = book(state).schedules
    return [schedules[schedule_id] for schedule_id in heapq.nsmallest(count, schedules)]


def is_running(state: State, schedule: Schedule) -> bool:
    return running(state, schedule)


def check(state: State) -> list[str]:
    """The schedules' invariants (see `schedules_model`)."""
    problems: list[str] = []
    schedules = book(state)
    timers = {(id(schedule), key) for key, _, schedule in schedules.timers}
    previous_seq = 0
    expected: dict[str, int] = {}
    for schedule in schedules.schedules.values():
        for key, count in schedule.counts.items():
            expected[key] = expected.get(key, 0) + count
    if expected != occurrence_totals(state):
        problems.append("schedule occurrence totals disagree with the schedules")
    for schedule_id, schedule in schedules.schedules.items():
        where = f"schedule {schedule_id}"
        if schedule.id != schedule_id or schedule.spec.id != schedule_id:
            problems.append(f"{where}: stored under the wrong id")
        if schedule.seq <= previous_seq or schedule.seq >= schedules.next_seq:
            problems.append(f"{where}: out of creation order")
        previous_seq = schedule.seq
        _check_one(state, schedule, timers, problems)
    return problems


def _check_one(
    state: State, schedule: Schedule, timers: set[tuple[int, int]], problems: list[str]
) -> None:
    where = f"schedule {schedule.id}"
    if schedule.paused and schedule.due_ms is not None:
        problems.append(f"{where}: paused with a timer")
    if schedule.due_ms is not None and (id(schedule), schedule.due_ms) not in timers:
        problems.append(f"{where}: due at {schedule.due_ms} but not in the timer heap")
    if (schedule.next_nominal_ms is None) != (schedule.next_fire_ms is None):
        problems.append(f"{where}: next nominal and fire time disagree")
    nominal, fire = schedule.next_nominal_ms, schedule.next_fire_ms
    if nominal is not None and fire is not None and fire < nominal:
        problems.append(f"{where}: fires before its nominal time")
    if not schedule.paused and nominal is not None and schedule.due_ms is None:
        problems.append(f"{where}: an occurrence is pending but no timer is set")
    if len(schedule.records) > RECORDS_KEPT or len(schedule.buffer) > BUFFER_MAX:
        problems.append(f"{where}: records or buffer over their bound")
    if releasable(state, schedule) and schedule.id not in book(state).ready:
        problems.append(f"{where}: a buffered occurrence can start but is not marked ready")
    if len(set(schedule.active)) != len(schedule.active):
        problems.append(f"{where}: a job listed twice as running")
