"""The outbox's limits as the events feature keeps them: `ConfigureOutbox`
(retention, events_max), trimming events past retention that every
subscriber has, and when that is next due.

The outbox itself (its records, `emit`, its encoding and reads) is the
kernel's (`kernel.outbox`), because every feature appends to it.
"""

from __future__ import annotations

from raftsched.core.events.commands import ConfigureOutbox
from raftsched.core.events.subscriptions import lowest_cursor
from raftsched.core.kernel.commands import Tick
from raftsched.core.kernel.feature import Context
from raftsched.core.kernel.outbox import EVENTS_MAX_MAX, Outbox, advance_head, outbox
from raftsched.core.kernel.results import Ack, Rejected
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import TIME_MS_MAX, check_optional_int


def apply_configure_outbox(
    state: State, command: ConfigureOutbox, context: Context
) -> Ack | Rejected:
    rejected = check_optional_int(
        command.retention_ms, "retention", 0, TIME_MS_MAX
    ) or check_optional_int(command.events_max, "events_max", 1, EVENTS_MAX_MAX)
    if rejected is not None:
        return rejected
    box = outbox(state)
    old = (box.retention_ms, box.events_max)
    context.savepoint.on_rollback(lambda: _set_limits(box, *old))
    _set_limits(
        box,
        box.retention_ms if command.retention_ms is None else command.retention_ms,
        box.events_max if command.events_max is None else command.events_max,
    )
    return Ack()


def _set_limits(box: Outbox, retention_ms: int, events_max: int) -> None:
    box.retention_ms, box.events_max = retention_ms, events_max


def trim(state: State, budget: int, command: Tick, context: Context) -> int:
    """Tick step: drop events past retention that every subscriber has.
    An event above the lowest delivery cursor is still owed to somebody."""
    box = outbox(state)
    floor = lowest_cursor(state)
    done = 0
    while done < budget:
        first = box.first()
        if first is None or first.at_ms + box.retention_ms > state.now_ms:
            break
        if floor is not None and first.seq > floor:
            break
        advance_head(box, context.savepoint)
        done += 1
    return done


def next_due_ms(state: State) -> int | None:
    box = outbox(state)
    first = box.first()
    if first is None:
        return None
    floor = lowest_cursor(state)
    if floor is not None and first.seq > floor:
        return None  # waits for a delivery, not for time
    return first.at_ms + box.retention_ms
