"""The commands of the outbox and webhook subscriptions."""

from __future__ import annotations

from dataclasses import dataclass

from raftsched.core.events.sinks import Sink
from raftsched.core.kernel.commands import Command


@dataclass(frozen=True, slots=True)
class ConfigureOutbox(Command):
    """How long events are kept after every subscriber has them, and how many
    events the outbox holds at most (beyond that the oldest are dropped)."""

    retention_ms: int | None = None
    events_max: int | None = None


@dataclass(frozen=True, slots=True)
class CreateSubscription(Command):
    """A webhook subscription; delivery starts after the newest event so far.
    The secret signs deliveries and is replicated so that any leader can sign.

    Since cluster version 10 (`sinks.SINK_VERSION`, encoded only when set): a
    `sink` makes it a broker relay's (then `url` and `secret` are empty),
    `tenants` keeps the events of those tenants only, and `key_field` names
    the payload field a message's key comes from (docs/relays.md)."""

    subscription_id: str
    url: str
    types: tuple[str, ...] = ()
    secret: str = ""
    sink: Sink | None = None
    tenants: tuple[str, ...] | None = None
    key_field: str | None = None


@dataclass(frozen=True, slots=True)
class CopySubscription(Command):
    """A data shard's copy of a subscription group 0 records (docs/shards.md,
    "Events and subscriptions"; since cluster version 9): the same id, URL,
    types and secret, and group 0's `created_at_ms`. Delivery starts after
    the last event this shard held from before that moment, so its events
    from the subscription's creation on are delivered even though the copy
    is made a moment later. Proposed by the node hosting the shard's leader.
    The sink, tenants and key field as `CreateSubscription`'s (since version 10)."""

    subscription_id: str
    url: str
    types: tuple[str, ...]
    secret: str
    created_at_ms: int
    sink: Sink | None = None
    tenants: tuple[str, ...] | None = None
    key_field: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteSubscription(Command):
    subscription_id: str


@dataclass(frozen=True, slots=True)
class AckDelivery(Command):
    """The leader delivered (or parked) every matching event up to `through_seq`."""

    subscription_id: str
    through_seq: int


@dataclass(frozen=True, slots=True)
class ParkDelivery(Command):
    """After `attempts` failures an event is set aside for this subscription,
    with the last error, instead of being retried forever."""

    subscription_id: str
    seq: int
    attempts: int
    error: str = ""


@dataclass(frozen=True, slots=True)
class RetryParked(Command):
    """Operator action: deliver this subscription's parked events again."""

    subscription_id: str


@dataclass(frozen=True, slots=True)
class AckParked(Command):
    """A parked event that was retried has now been delivered."""

    subscription_id: str
    seq: int
