"""The transactional outbox: events appended by the command that made them.

Rules
-----
1. An event is appended by the same command that makes the transition it
   reports (`emit`), so an event exists exactly when its transition committed.
   A rolled-back command takes its events with it (savepoint undo).
2. Sequence numbers start at 1, strictly increase and are never reused, even
   after events are trimmed: `next_seq` is part of the encoded section.
3. The outbox is bounded. Events leave it in seq order from the head, either
   trimmed (retention passed and every subscription's delivery cursor is past
   them) or, when it holds `events_max` events, dropped to make room. A drop
   is counted in `dropped` and reported by the events API as a gap; the
   commands that emit are never refused, because refusing a job's completion
   for want of room to report it would stop payments, not protect them.

Event data is small plain data (ids, queue, tenant, status), stored as
msgpack bytes so that an event costs one tuple and one bytes object.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable
from typing import Any, Final, NamedTuple

import msgpack

from raftsched.core.events.commands import ConfigureOutbox
from raftsched.core.kernel import savepoint as savepoints
from raftsched.core.kernel.results import Ack, Rejected
from raftsched.core.kernel.sections import Section, register
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import TIME_MS_MAX, check_optional_int

OUTBOX: Final = "outbox"
DEFAULT_OUTBOX_RETENTION_MS: Final = 24 * 3600 * 1000
DEFAULT_EVENTS_MAX: Final = 100_000
EVENTS_MAX_MAX: Final = 10_000_000
EVENT_TYPE_CHARS_MAX: Final = 100
# Compact the event list once this many trimmed slots sit before the head.
_COMPACT_AFTER: Final = 4096


class OutboxEvent(NamedTuple):
    seq: int
    type: str
    at_ms: int
    data: bytes  # msgpack map


class Outbox:
    """The events still held, oldest first: `events[head:]`."""

    __slots__ = ("events", "head", "next_seq", "dropped", "retention_ms", "events_max")

    def __init__(self) -> None:
        self.events: list[OutboxEvent] = []
        self.head = 0
        self.next_seq = 1
        self.dropped = 0  # events dropped unread because the outbox was full
        self.retention_ms: int = DEFAULT_OUTBOX_RETENTION_MS
        self.events_max: int = DEFAULT_EVENTS_MAX

    def __len__(self) -> int:
        return len(self.events) - self.head

    def first(self) -> OutboxEvent | None:
        return self.events[self.head] if self.head < len(self.events) else None


# Sources of the lowest delivery cursor (subscriptions register one). An event
# above any floor is still owed to somebody and is not trimmed.
_floors: list[Callable[[State], int | None]] = []


def register_floor(floor: Callable[[State], int | None]) -> None:
    _floors.append(floor)


def outbox(state: State) -> Outbox:
    box: Outbox = state.sections[OUTBOX]
    return box


def emit(state: State, event_type: str, data: dict[str, Any]) -> None:
    """Append one event, stamped with replicated time, in the current command."""
    box: Outbox = state.sections[OUTBOX]
    seq = box.next_seq
    box.next_seq = seq + 1
    box.events.append(OutboxEvent(seq, event_type, state.now_ms, msgpack.packb(data)))
    savepoint = savepoints.current(state)
    if savepoint is not None:
        savepoint.on_rollback(lambda: _undo_emit(box, seq))
    if len(box.events) - box.head > box.events_max:
        box.dropped += 1
        _advance_head(state, box)


def _undo_emit(box: Outbox, seq: int) -> None:
    box.events.pop()
    box.next_seq = seq


def _advance_head(state: State, box: Outbox) -> None:
    """Drop the head event (undoably); compact the list now and then."""
    events, head = box.events, box.head
    box.head = head + 1
    savepoint = savepoints.current(state)
    if head + 1 >= _COMPACT_AFTER and (head + 1) * 2 >= len(events):
        box.events, box.head = events[head + 1 :], 0
        if savepoint is not None:
            savepoint.on_rollback(lambda: _restore(box, events, head))
    elif savepoint is not None:
        savepoint.on_rollback(lambda: _restore(box, events, head))


def _restore(box: Outbox, events: list[OutboxEvent], head: int) -> None:
    box.events, box.head = events, head


# -- queries ------------------------------------------------------------------


def type_matches(types: frozenset[str] | None, event_type: str) -> bool:
    """No filter matches all; `job.*` matches every type starting `job.`."""
    if not types or event_type in types:
        return True
    return any(t.endswith("*") and event_type.startswith(t[:-1]) for t in types)


def events_after(
    state: State, after_seq: int, types: Iterable[str] | None = None, limit: int = 100
) -> list[OutboxEvent]:
    """Up to `limit` held events with seq > after_seq, of the given types."""
    box: Outbox = state.sections[OUTBOX]
    wanted = frozenset(types) if types else None
    events = box.events
    start = bisect_right(events, after_seq, lo=box.head, key=lambda event: event.seq)
    found: list[OutboxEvent] = []
    for index in range(start, len(events)):
        event = events[index]
        if wanted is None or type_matches(wanted, event.type):
            found.append(event)
            if len(found) >= limit:
                break
    return found


def last_seq(state: State) -> int:
    """The seq of the newest event ever emitted (0 before the first)."""
    return outbox(state).next_seq - 1


def first_held_seq(state: State) -> int:
    """The oldest seq still held; a consumer behind it has missed events."""
    first = outbox(state).first()
    return outbox(state).next_seq if first is None else first.seq


def decode_data(event: OutboxEvent) -> dict[str, Any]:
    data: dict[str, Any] = msgpack.unpackb(event.data)
    return data


# -- commands and time ----------------------------------------------------------


def apply_configure_outbox(state: State, command: ConfigureOutbox) -> Ack | Rejected:
    rejected = check_optional_int(
        command.retention_ms, "retention", 0, TIME_MS_MAX
    ) or check_optional_int(command.events_max, "events_max", 1, EVENTS_MAX_MAX)
    if rejected is not None:
        return rejected
    box = outbox(state)
    old = (box.retention_ms, box.events_max)
    savepoint = savepoints.current(state)
    if savepoint is not None:
        savepoint.on_rollback(lambda: _set_limits(box, *old))
    _set_limits(
        box,
        box.retention_ms if command.retention_ms is None else command.retention_ms,
        box.events_max if command.events_max is None else command.events_max,
    )
    return Ack()


def _set_limits(box: Outbox, retention_ms: int, events_max: int) -> None:
    box.retention_ms, box.events_max = retention_ms, events_max


def _delivered_floor(state: State) -> int | None:
    floors = [floor for floor in (source(state) for source in _floors) if floor is not None]
    return min(floors) if floors else None


def trim(state: State, budget: int) -> int:
    """Tick phase: drop events past retention that every subscriber has."""
    box = outbox(state)
    floor = _delivered_floor(state)
    done = 0
    while done < budget:
        first = box.first()
        if first is None or first.at_ms + box.retention_ms > state.now_ms:
            break
        if floor is not None and first.seq > floor:
            break
        _advance_head(state, box)
        done += 1
    return done


def next_due_ms(state: State) -> int | None:
    box = outbox(state)
    first = box.first()
    if first is None:
        return None
    floor = _delivered_floor(state)
    if floor is not None and first.seq > floor:
        return None  # waits for a delivery, not for time
    return first.at_ms + box.retention_ms


def check(state: State) -> list[str]:
    """Invariants of the outbox section."""
    box = outbox(state)
    problems: list[str] = []
    held = box.events[box.head :]
    for earlier, later in zip(held, held[1:], strict=False):
        if later.seq != earlier.seq + 1:
            problems.append(f"outbox: seq {later.seq} follows {earlier.seq}")
        if later.at_ms < earlier.at_ms:
            problems.append(f"outbox: event {later.seq} is older than {earlier.seq}")
    if held and held[-1].seq != box.next_seq - 1:
        problems.append("outbox: next_seq is not one above the newest event")
    if held and held[-1].at_ms > state.now_ms:
        problems.append("outbox: event from the future")
    if len(held) > box.events_max:
        problems.append("outbox: holds more than events_max events")
    return problems


# -- encoding -------------------------------------------------------------------


def _encode(state: State) -> Any:
    box = outbox(state)
    rows = [list(event) for event in box.events[box.head :]]
    return [box.next_seq, box.dropped, box.retention_ms, box.events_max, rows]


def _decode(state: State, data: Any) -> None:
    next_seq, dropped, retention_ms, events_max, rows = data
    box = Outbox()
    box.next_seq, box.dropped = next_seq, dropped
    box.retention_ms, box.events_max = retention_ms, events_max
    names: dict[str, str] = {}
    box.events = [
        OutboxEvent(seq, names.setdefault(event_type, event_type), at_ms, payload)
        for seq, event_type, at_ms, payload in rows
    ]
    state.sections[OUTBOX] = box


SECTION: Final = register(Section(OUTBOX, Outbox, _encode, _decode))
