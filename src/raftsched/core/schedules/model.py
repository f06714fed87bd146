"""Schedules as replicated records: the `schedules` state section.

Theory of operation
-------------------
A schedule stores its spec and where its calendar stands: `next_nominal_ms`
(the next occurrence not yet decided; None when the calendar has ended),
`next_fire_ms` (that occurrence plus its deterministic jitter), and `due_ms`,
when Tick must next look at it (the fire time, or a catch-up pacing hold;
None while paused or ended). Every decided occurrence appends a record
`(nominal_ms, decided_at_ms, decision, job_id, reason)`; the newest
`RECORDS_KEPT` per schedule are kept.

`active` lists the jobs this schedule created that were not yet seen final:
the overlap policies ask whether any of them is still unfinished (a job whose
status is final, or that was purged, has ended its run; an expired lease that
ends in a retry has not). `buffer` holds occurrences waiting for the running
job to end, as `(nominal_ms, kind)`.

Two indexes are derived and rebuilt on decode:

- `timers`: a heap of (due_ms, seq, schedule) with lazy deletion; an entry is
  valid only while the schedule is stored and its `due_ms` equals the key.
  Tick cost therefore grows with the schedules due, not the schedules stored.
- `ready`: ids of schedules whose buffer may be released because a job of
  theirs just ended. An entry is acted on only if the schedule is unpaused,
  has a buffer and no unfinished job, so stale entries change nothing; on
  decode it is rebuilt as exactly the schedules for which that holds, and
  every way a schedule can come to satisfy it adds it live.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Final

from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.model import FINAL_STATUSES, Job
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State
from raftsched.core.schedules.codec import decode_schedule, schedule_row
from raftsched.core.schedules.commands import ScheduleSpec

SCHEDULES: Final = "schedules"
RECORDS_KEPT: Final = 1_000
BUFFER_MAX: Final = 1_000

# Decisions (api.md).
FIRED: Final = "fired"
SKIPPED_OVERLAP: Final = "skipped_overlap"
MISSED: Final = "missed"
BUFFERED: Final = "buffered"
TRIGGERED: Final = "triggered"
BACKFILLED: Final = "backfilled"
DECISIONS: Final = (FIRED, SKIPPED_OVERLAP, MISSED, BUFFERED, TRIGGERED, BACKFILLED)

OccurrenceRecord = tuple[int, int, str, str | None, str | None]
"""(nominal_ms, decided_at_ms, decision, job_id, reason)."""

_SCALARS: Final = (
    "spec",
    "paused",
    "updated_at_ms",
    "anchor_ms",
    "next_nominal_ms",
    "next_fire_ms",
    "due_ms",
    "hold_until_ms",
    "catchup_runs",
    "last_fired_at_ms",
    "last_lag_ms",
    "lag_ms_total",
    "lag_count",
)


class Schedule:
    __slots__ = (
        "id",
        "seq",
        "created_at_ms",
        *_SCALARS,
        "active",
        "buffer",
        "records",
        "counts",
    )

    def __init__(self, spec: ScheduleSpec, seq: int, now_ms: int) -> None:
        self.id = spec.id
        self.seq = seq
        self.created_at_ms = now_ms
        self.spec = spec
        self.paused = spec.paused
        self.updated_at_ms = now_ms
        self.anchor_ms = now_ms
        self.next_nominal_ms: int | None = None
        self.next_fire_ms: int | None = None
        self.due_ms: int | None = None
        self.hold_until_ms: int | None = None
        self.catchup_runs = 0
        self.last_fired_at_ms: int | None = None
        self.last_lag_ms: int | None = None
        self.lag_ms_total = 0
        self.lag_count = 0
        self.active: list[str] = []
        self.buffer: list[tuple[int, str]] = []
        self.records: deque[OccurrenceRecord] = deque(maxlen=RECORDS_KEPT)
        # decision -> count, and "missed:<reason code>" -> count.
        self.counts: dict[str, int] = {}

    def __lt__(self, other: Schedule) -> bool:
        return self.seq < other.seq

    def __repr__(self) -> str:
        return f"Schedule(id={self.id!r}, next={self.next_nominal_ms})"


class ScheduleBook:
    """The section object: schedules in creation order, and derived indexes."""

    __slots__ = ("schedules", "next_seq", "timers", "ready", "totals")

    def __init__(self) -> None:
        self.schedules: dict[str, Schedule] = {}
        self.next_seq = 1
        self.timers: list[tuple[int, int, Schedule]] = []
        self.ready: set[str] = set()
        # Derived: the sum of every stored schedule's `counts` (for metrics,
        # so that a scrape does not walk 100,000 schedules).
        self.totals: dict[str, int] = {}


def add_totals(schedules: ScheduleBook, counts: dict[str, int], sign: int) -> None:
    totals = schedules.totals
    for key, count in counts.items():
        totals[key] = totals.get(key, 0) + sign * count


def book(state: State) -> ScheduleBook:
    found: ScheduleBook = state.sections[SCHEDULES]
    return found


def job_unfinished(state: State, job_id: str) -> bool:
    job = state.jobs.get(job_id)
    return job is not None and job.status not in FINAL_STATUSES


def running(state: State, schedule: Schedule) -> bool:
    return any(job_unfinished(state, job_id) for job_id in schedule.active)


def releasable(state: State, schedule: Schedule) -> bool:
    """A buffered occurrence may start now."""
    return bool(schedule.buffer) and not schedule.paused and not running(state, schedule)


def is_stored(state: State, schedule: Schedule) -> bool:
    return book(state).schedules.get(schedule.id) is schedule


def push_timer(state: State, schedule: Schedule) -> None:
    if schedule.due_ms is not None:
        heapq.heappush(book(state).timers, (schedule.due_ms, schedule.seq, schedule))


def settle_timers(state: State) -> tuple[int, int, Schedule] | None:
    """The earliest valid timer entry, dropping stale ones above it."""
    schedules = book(state)
    heap = schedules.timers
    while heap:
        top = heap[0]
        schedule = top[2]
        if schedules.schedules.get(schedule.id) is schedule and schedule.due_ms == top[0]:
            return top
        heapq.heappop(heap)
    return None


def mark_buffer_releasable(state: State, job: Job, savepoint: Savepoint) -> None:
    """on_job_finished: a run of this schedule ended, so its buffered
    occurrence may be started by the next Tick. Only derived data changes here."""
    schedule_id = job.schedule_id
    if schedule_id is None:
        return
    schedules = book(state)
    schedule = schedules.schedules.get(schedule_id)
    if schedule is not None and schedule.buffer and job.id in schedule.active:
        schedules.ready.add(schedule_id)


# -- encoding -------------------------------------------------------------------


def _encode(state: State) -> Any:
    schedules = book(state)
    return [schedules.next_seq, [_row(schedule) for schedule in schedules.schedules.values()]]


def _row(schedule: Schedule) -> list[Any]:
    return [
        schedule.id,
        schedule.seq,
        schedule.created_at_ms,
        schedule_row(schedule.spec),
        *(getattr(schedule, name) for name in _SCALARS[1:]),
        schedule.active,
        [list(item) for item in schedule.buffer],
        [list(record) for record in schedule.records],
        sorted(schedule.counts.items()),
    ]


def _decode(state: State, data: Any) -> None:
    if type(data) is not tuple or len(data) != 2:
        raise CodecError("schedules section is [next_seq, rows]")
    schedules = ScheduleBook()
    schedules.next_seq = data[0]
    for row in data[1]:
        schedule = _from_row(row)
        schedules.schedules[schedule.id] = schedule
        if schedule.due_ms is not None:
            schedules.timers.append((schedule.due_ms, schedule.seq, schedule))
    heapq.heapify(schedules.timers)
    state.sections[SCHEDULES] = schedules
    for schedule in schedules.schedules.values():
        add_totals(schedules, schedule.counts, 1)
        if releasable(state, schedule):
            schedules.ready.add(schedule.id)


def _from_row(row: Any) -> Schedule:
    if type(row) is not tuple or len(row) != 4 + len(_SCALARS) - 1 + 4:
        raise CodecError("a schedule row has the wrong length")
    schedule_id, seq, created_at_ms, spec_row = row[:4]
    schedule = Schedule(decode_schedule(spec_row), seq, created_at_ms)
    if schedule.id != schedule_id:
        raise CodecError("schedule row id does not match its spec")
    scalars = row[4 : 4 + len(_SCALARS) - 1]
    for name, value in zip(_SCALARS[1:], scalars, strict=True):
        setattr(schedule, name, value)
    active, buffer, records, counts = row[4 + len(_SCALARS) - 1 :]
    schedule.active = list(active)
    schedule.buffer = [(int(nominal), str(kind)) for nominal, kind in buffer]
    schedule.records.extend(tuple(record) for record in records)
    schedule.counts = dict(counts)
    return schedule


SECTION: Final = Section(SCHEDULES, ScheduleBook, _encode, _decode)
