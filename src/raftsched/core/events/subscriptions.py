"""Webhook subscriptions and their replicated delivery cursors.

The leader delivers events (node/webhooks.py) and records progress here with
commands, so that a new leader resumes where the old one stopped:

- `cursor` is the seq up to which every matching event was delivered or
  parked. `AckDelivery` only moves it forward; a repeat changes nothing.
- An event that failed `attempts` times is parked: copied out of the outbox
  into the subscription with its last error (`ParkDelivery`), so that the
  outbox can still be trimmed past it. At most `PARKED_MAX` are kept per
  subscription; beyond that the oldest copy is dropped and counted.
- A subscription may have a broker `sink` (docs/relays.md; else it is a
  webhook), a `tenants` filter and a `key_field` (since cluster version 10,
  encoded only when set, so that older states keep their bytes).
- `RetryParked` (an operator action) marks every parked event for one more
  round of delivery; `AckParked` removes one that then arrived, and a new
  `ParkDelivery` of it parks it again with the new error.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Final, NamedTuple

from raftsched.core.events.commands import (
    AckDelivery,
    AckParked,
    CopySubscription,
    CreateSubscription,
    DeleteSubscription,
    ParkDelivery,
    RetryParked,
)
from raftsched.core.events.sinks import (
    Sink,
    check_key_field,
    check_sink,
    check_tenants,
    decode_sink,
    encode_sink,
)
from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.feature import Context
from raftsched.core.kernel.outbox import (
    EVENT_TYPE_CHARS_MAX,
    OutboxEvent,
    decode_data,
    events_after,
    last_seq,
    outbox,
    type_matches,
)
from raftsched.core.kernel.results import (
    IDEMPOTENCY_CONFLICT,
    NOT_FOUND,
    Ack,
    ParkedRetried,
    Rejected,
    SubscriptionCreated,
)
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import (
    TEXT_CHARS_MAX,
    TIME_MS_MAX,
    TOKEN_MAX,
    check_int,
    check_name,
    check_text,
    invalid,
)

SUBSCRIPTIONS: Final = "subscriptions"
SUBSCRIPTIONS_MAX: Final = 100
PARKED_MAX: Final = 1_000
TYPES_MAX: Final = 50
URL_CHARS_MAX: Final = 2_000
SECRET_CHARS_MAX: Final = 256
ERROR_CHARS_MAX: Final = 1_000


class Parked(NamedTuple):
    event: OutboxEvent
    attempts: int
    error: str
    parked_at_ms: int
    retry: bool  # an operator asked for another round of delivery


class Subscription:
    __slots__ = (
        "id",
        "url",
        "types",
        "secret",
        "created_at_ms",
        "cursor",
        "parked",
        "parked_dropped",
        "sink",
        "tenants",
        "key_field",
    )

    def __init__(
        self,
        id: str,
        url: str,
        types: tuple[str, ...],
        secret: str,
        created_at_ms: int,
        cursor: int,
        sink: Sink | None = None,
        tenants: tuple[str, ...] | None = None,
        key_field: str | None = None,
    ) -> None:
        self.id = id
        self.url = url
        self.types = types
        self.secret = secret
        self.created_at_ms = created_at_ms
        self.cursor = cursor
        self.parked: dict[int, Parked] = {}
        self.parked_dropped = 0
        self.sink = sink
        self.tenants = tenants
        self.key_field = key_field

    def matches(self, event_type: str) -> bool:
        return type_matches(frozenset(self.types), event_type)

    def later_fields(self) -> tuple[Sink | None, tuple[str, ...] | None, str | None]:
        """What cluster version 10 added: (sink, tenants, key_field)."""
        return (self.sink, self.tenants, self.key_field)

    def takes_tenant_of(self, event: OutboxEvent) -> bool:
        """Whether the `tenants` filter lets `event` through (an event
        without a tenant only when there is no filter)."""
        if not self.tenants:
            return True
        tenant = decode_data(event).get("tenant")
        return tenant in self.tenants


def subscriptions(state: State) -> dict[str, Subscription]:
    found: dict[str, Subscription] = state.sections[SUBSCRIPTIONS]
    return found


def _undo(savepoint: Savepoint, action: Any) -> None:
    savepoint.on_rollback(action)


def _find(state: State, subscription_id: str) -> Subscription | Rejected:
    rejected = check_name(subscription_id, "subscription_id")
    if rejected is not None:
        return rejected
    found = subscriptions(state).get(subscription_id)
    if found is None:
        return Rejected(
            NOT_FOUND, f"no subscription {subscription_id}", {"subscription_id": subscription_id}
        )
    return found


# -- commands -------------------------------------------------------------------


def _check_create(command: CreateSubscription | CopySubscription) -> Rejected | None:
    rejected = check_tenants(command.tenants) or check_key_field(command.key_field)
    if rejected is not None:
        return rejected
    if command.sink is not None:
        rejected = check_sink(command.sink)
        if rejected is not None:
            return rejected
        if command.url != "" or command.secret != "":
            return invalid("url", "a broker sink's subscription has no webhook url or secret")
        return _check_types(command) or check_name(command.subscription_id, "subscription_id")
    url = command.url
    if (
        type(url) is not str
        or len(url) > URL_CHARS_MAX
        or not url.startswith(("http://", "https://"))
    ):
        return invalid("url", "url must be an http:// or https:// URL")
    return (
        _check_types(command)
        or check_name(command.subscription_id, "subscription_id")
        or check_name(command.secret, "secret", SECRET_CHARS_MAX)
    )


def _check_types(command: CreateSubscription | CopySubscription) -> Rejected | None:
    types = command.types
    if type(types) is not tuple or len(types) > TYPES_MAX:
        return invalid("types", f"types must be at most {TYPES_MAX} event types")
    for event_type in types:
        rejected = check_name(event_type, "types", EVENT_TYPE_CHARS_MAX)
        if rejected is not None:
            return rejected
    return None


def _later_fields(
    command: CreateSubscription | CopySubscription,
) -> tuple[Sink | None, tuple[str, ...] | None, str | None]:
    """The command's version-10 fields as a subscription keeps them (an
    empty tenants filter is none)."""
    return (command.sink, command.tenants or None, command.key_field)


def apply_create_subscription(
    state: State, command: CreateSubscription, context: Context
) -> SubscriptionCreated | Rejected:
    savepoint = context.savepoint
    rejected = _check_create(command)
    if rejected is not None:
        return rejected
    table = subscriptions(state)
    existing = table.get(command.subscription_id)
    if existing is not None:
        if (existing.url, existing.types, existing.secret, existing.later_fields()) == (
            command.url,
            command.types,
            command.secret,
            _later_fields(command),
        ):
            return SubscriptionCreated(existing.id, False, existing.cursor)
        return Rejected(
            IDEMPOTENCY_CONFLICT,
            "this subscription id exists with a different request",
            {"field": "subscription_id"},
        )
    if len(table) >= SUBSCRIPTIONS_MAX:
        return invalid("subscription_id", f"at most {SUBSCRIPTIONS_MAX} subscriptions")
    cursor = last_seq(state)
    table[command.subscription_id] = Subscription(
        command.subscription_id,
        command.url,
        tuple(sorted(set(command.types))),
        command.secret,
        state.now_ms,
        cursor,
        *_later_fields(command),
    )
    _undo(savepoint, lambda: table.pop(command.subscription_id, None))
    return SubscriptionCreated(command.subscription_id, True, cursor)


def apply_copy_subscription(
    state: State, command: CopySubscription, context: Context
) -> SubscriptionCreated | Rejected:
    """A shard's copy of group 0's subscription (see `CopySubscription`): a
    repeat is answered as a repeated create is; delivery starts after the
    last held event from before `created_at_ms`."""
    rejected = _check_create(command) or check_int(
        command.created_at_ms, "created_at_ms", 0, TIME_MS_MAX
    )
    if rejected is not None:
        return rejected
    table = subscriptions(state)
    existing = table.get(command.subscription_id)
    if existing is not None:
        same = (
            existing.url,
            existing.types,
            existing.secret,
            existing.created_at_ms,
            existing.later_fields(),
        ) == (
            command.url,
            tuple(sorted(set(command.types))),
            command.secret,
            command.created_at_ms,
            _later_fields(command),
        )
        if same:
            return SubscriptionCreated(existing.id, False, existing.cursor)
        return Rejected(
            IDEMPOTENCY_CONFLICT,
            "this subscription id exists with a different request",
            {"field": "subscription_id"},
        )
    if len(table) >= SUBSCRIPTIONS_MAX:
        return invalid("subscription_id", f"at most {SUBSCRIPTIONS_MAX} subscriptions")
    box = outbox(state)
    events = box.events
    first_new = bisect_left(
        events, command.created_at_ms, lo=box.head, key=lambda event: event.at_ms
    )
    cursor = last_seq(state) if first_new == len(events) else events[first_new].seq - 1
    table[command.subscription_id] = Subscription(
        command.subscription_id,
        command.url,
        tuple(sorted(set(command.types))),
        command.secret,
        command.created_at_ms,
        cursor,
        *_later_fields(command),
    )
    _undo(context.savepoint, lambda: table.pop(command.subscription_id, None))
    return SubscriptionCreated(command.subscription_id, True, cursor)


def apply_delete_subscription(
    state: State, command: DeleteSubscription, context: Context
) -> Ack | Rejected:
    savepoint = context.savepoint
    found = _find(state, command.subscription_id)
    if isinstance(found, Rejected):
        return found
    table = subscriptions(state)
    before = dict(table)
    del table[found.id]
    _undo(savepoint, lambda: _restore_table(table, before))
    return Ack()


def _restore_table(table: dict[str, Subscription], before: dict[str, Subscription]) -> None:
    table.clear()
    table.update(before)  # keeps the insertion (and so the encoding) order


def apply_ack_delivery(state: State, command: AckDelivery, context: Context) -> Ack | Rejected:
    savepoint = context.savepoint
    found = _find(state, command.subscription_id)
    if isinstance(found, Rejected):
        return found
    rejected = check_int(command.through_seq, "through_seq", 0, last_seq(state))
    if rejected is not None:
        return rejected
    if command.through_seq > found.cursor:
        old = found.cursor
        found.cursor = command.through_seq
        _undo(savepoint, lambda: setattr(found, "cursor", old))
    return Ack()


def _held_event(state: State, seq: int) -> OutboxEvent | None:
    found = events_after(state, seq - 1, None, 1)
    return found[0] if found and found[0].seq == seq else None


def apply_park_delivery(state: State, command: ParkDelivery, context: Context) -> Ack | Rejected:
    savepoint = context.savepoint
    found = _find(state, command.subscription_id)
    if isinstance(found, Rejected):
        return found
    rejected = (
        check_int(command.seq, "seq", 1, TOKEN_MAX)
        or check_int(command.attempts, "attempts", 0, TOKEN_MAX)
        or check_text(command.error, "error", TEXT_CHARS_MAX)
    )
    if rejected is not None:
        return rejected
    parked = found.parked
    previous = parked.get(command.seq)
    if previous is None and command.seq <= found.cursor:
        return Ack()  # delivered or parked before: a repeated command
    event = previous.event if previous is not None else _held_event(state, command.seq)
    if event is None:
        return Rejected(NOT_FOUND, f"event {command.seq} is not in the outbox", {"field": "seq"})
    before, dropped = dict(parked), found.parked_dropped
    _undo(savepoint, lambda: _restore_parked(found, before, dropped))
    error = command.error[:ERROR_CHARS_MAX]
    parked.pop(command.seq, None)  # re-parked entries move to the end
    parked[command.seq] = Parked(event, command.attempts, error, state.now_ms, False)
    while len(parked) > PARKED_MAX:
        del parked[min(parked)]
        found.parked_dropped += 1
    return Ack()


def _restore_parked(found: Subscription, parked: dict[int, Parked], dropped: int) -> None:
    found.parked, found.parked_dropped = parked, dropped


def apply_retry_parked(
    state: State, command: RetryParked, context: Context
) -> ParkedRetried | Rejected:
    savepoint = context.savepoint
    found = _find(state, command.subscription_id)
    if isinstance(found, Rejected):
        return found
    before, dropped = found.parked, found.parked_dropped
    _undo(savepoint, lambda: _restore_parked(found, before, dropped))
    found.parked = {seq: item._replace(retry=True) for seq, item in before.items()}
    return ParkedRetried(found.id, len(before))


def apply_ack_parked(state: State, command: AckParked, context: Context) -> Ack | Rejected:
    savepoint = context.savepoint
    found = _find(state, command.subscription_id)
    if isinstance(found, Rejected):
        return found
    rejected = check_int(command.seq, "seq", 1, TOKEN_MAX)
    if rejected is not None:
        return rejected
    if command.seq in found.parked:
        before, dropped = dict(found.parked), found.parked_dropped
        del found.parked[command.seq]
        _undo(savepoint, lambda: _restore_parked(found, before, dropped))
    return Ack()


# -- queries --------------------------------------------------------------------


def pending_events(state: State, subscription: Subscription, limit: int) -> list[OutboxEvent]:
    """Matching events after the cursor, oldest first (of its types, and of
    its tenants when it names some)."""
    types = subscription.types or None
    if not subscription.tenants:
        return events_after(state, subscription.cursor, types, limit)
    found: list[OutboxEvent] = []
    after = subscription.cursor
    while len(found) < limit:
        page = events_after(state, after, types, limit)
        if not page:
            break
        found.extend(event for event in page if subscription.takes_tenant_of(event))
        after = page[-1].seq
    return found[:limit]


def oldest_undelivered_at_ms(state: State, subscription: Subscription) -> int | None:
    found = pending_events(state, subscription, 1)
    return found[0].at_ms if found else None


def lowest_cursor(state: State) -> int | None:
    """The lowest delivery cursor: the outbox keeps every event above it."""
    table = subscriptions(state)
    return min((sub.cursor for sub in table.values()), default=None)


def check(state: State) -> list[str]:
    problems: list[str] = []
    newest = last_seq(state)
    for sub in subscriptions(state).values():
        if not 0 <= sub.cursor <= newest:
            problems.append(f"subscription {sub.id}: cursor {sub.cursor} beyond the outbox")
        if len(sub.parked) > PARKED_MAX:
            problems.append(f"subscription {sub.id}: too many parked events")
        for seq, item in sub.parked.items():
            if item.event.seq != seq or seq > newest:
                problems.append(f"subscription {sub.id}: parked event {seq} is wrong")
    return problems


# -- encoding -------------------------------------------------------------------


def _encode(state: State) -> Any:
    return [_encode_one(sub) for sub in subscriptions(state).values()]


def _encode_one(sub: Subscription) -> list[Any]:
    row = [
        sub.id,
        sub.url,
        list(sub.types),
        sub.secret,
        sub.created_at_ms,
        sub.cursor,
        sub.parked_dropped,
        [
            [list(item.event), item.attempts, item.error, item.parked_at_ms, item.retry]
            for item in sub.parked.values()
        ],
    ]
    if sub.later_fields() != (None, None, None):  # since version 10; else as before
        tenants = None if sub.tenants is None else list(sub.tenants)
        row.append([encode_sink(sub.sink), tenants, sub.key_field])
    return row


def _decode(state: State, rows: Any) -> None:
    table: dict[str, Subscription] = {}
    for row in rows:
        if len(row) not in (8, 9):
            raise CodecError("a subscription has 8 or 9 fields")
        sub_id, url, types, secret, created_at_ms, cursor, dropped, parked = row[:8]
        sink, tenants, key_field = row[8] if len(row) == 9 else (None, None, None)
        sub = Subscription(
            sub_id,
            url,
            tuple(types),
            secret,
            created_at_ms,
            cursor,
            decode_sink(sink),
            None if tenants is None else tuple(tenants),
            key_field,
        )
        sub.parked_dropped = dropped
        for event, attempts, error, parked_at_ms, retry in parked:
            stored = OutboxEvent(*event)
            sub.parked[stored.seq] = Parked(stored, attempts, error, parked_at_ms, retry)
        table[sub_id] = sub
    state.sections[SUBSCRIPTIONS] = table


SECTION: Final = Section(SUBSCRIPTIONS, dict, _encode, _decode)
