"""Tick: the one command through which time-driven work happens.

The leader proposes `Tick` when `next_due_ms` says something is due. The work
itself belongs to the features (`Feature.tick`): each step runs in rank order
within what is left of the Tick's `max_items` budget, so the order is the
registry's, the same on every replica:

    10 expire leases, 20 enforce deadlines, 30 due jobs become runnable (jobs),
    40 schedules fire, 50 purge finished jobs (jobs), 60 workflow timeouts and
    retention (workflows), 70 outbox trim (events)
"""

from __future__ import annotations

from raftsched.core.kernel.commands import Tick
from raftsched.core.kernel.feature import TICKED_COUNTS, Context, Registry
from raftsched.core.kernel.results import Rejected, Ticked, stale_epoch
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import TICK_ITEMS_MAX, U64_MAX, check_int


def apply_tick(state: State, command: Tick, context: Context) -> Ticked | Rejected:
    if context.stale:
        return stale_epoch(state.epoch)
    rejected = check_int(command.seed, "seed", 0, U64_MAX) or check_int(
        command.max_items, "max_items", 1, TICK_ITEMS_MAX
    )
    if rejected is not None:
        return rejected
    budget = command.max_items
    counts = dict.fromkeys(TICKED_COUNTS, 0)
    for work in context.registry.tick_work:
        done = work.run(state, budget, command, context)
        budget -= done
        if work.reports is not None:
            counts[work.reports] = done
    due_ms = next_due_ms(state, context.registry)
    more = due_ms is not None and due_ms <= state.now_ms
    return Ticked(**counts, more=more)


def next_due_ms(state: State, registry: Registry) -> int | None:
    """When the next time-driven thing is due, or None when nothing is waiting.

    The leader proposes a Tick once replicated time reaches this. Features
    only drop stale heap entries (derived data) here, so it must run where
    `apply` runs (same thread or lock), but it never changes the encoded state.
    """
    earliest: int | None = None
    for feature_due_ms in registry.next_due:
        due_ms = feature_due_ms(state)
        if due_ms is not None and (earliest is None or due_ms < earliest):
            earliest = due_ms
    return earliest
