"""The transactional outbox: events appended by the command that made them.

The outbox is the kernel's: every feature reports its transitions here
(`emit`), as every job records its history. What consumers do with it
(subscriptions, deliveries, retention trimming, `ConfigureOutbox`) is the
events feature's (`raftsched.core.events`).

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
msgpack bytes so that an event costs one tuple and one bytes object. Every
event names the tenant whose data it reports (`data["tenant"]`), so that the
events API can leave other tenants' events out for a scoped caller. The one
event type that did not (`schedule.missed`) names it from cluster version
`EVENT_TENANT_SINCE` on; an event without a tenant is shown only to callers
who see every tenant.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from typing import Any, Final, NamedTuple

import msgpack

from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State

OUTBOX: Final = "outbox"
DEFAULT_OUTBOX_RETENTION_MS: Final = 24 * 3600 * 1000
DEFAULT_EVENTS_MAX: Final = 100_000
EVENTS_MAX_MAX: Final = 10_000_000
EVENT_TYPE_CHARS_MAX: Final = 100
# Compact the event list once this many trimmed slots sit before the head.
_COMPACT_AFTER: Final = 4096
# The cluster version from which every event carries its tenant.
EVENT_TENANT_SINCE: Final = 3


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


def outbox(state: State) -> Outbox:
    box: Outbox = state.sections[OUTBOX]
    return box


def emit(state: State, event_type: str, data: dict[str, Any], savepoint: Savepoint) -> None:
    """Append one event, stamped with replicated time, in the current command."""
    box: Outbox = state.sections[OUTBOX]
    seq = box.next_seq
    box.next_seq = seq + 1
    box.events.append(OutboxEvent(seq, event_type, state.now_ms, msgpack.packb(data)))
    savepoint.on_rollback(lambda: _undo_emit(box, seq))
    if len(box.events) - box.head > box.events_max:
        box.dropped += 1
        advance_head(box, savepoint)


def _undo_emit(box: Outbox, seq: int) -> None:
    box.events.pop()
    box.next_seq = seq


def advance_head(box: Outbox, savepoint: Savepoint) -> None:
    """Drop the head event (undoably); compact the list now and then."""
    events, head = box.events, box.head
    box.head = head + 1
    if head + 1 >= _COMPACT_AFTER and (head + 1) * 2 >= len(events):
        box.events, box.head = events[head + 1 :], 0
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


SECTION: Final = Section(OUTBOX, Outbox, _encode, _decode)
