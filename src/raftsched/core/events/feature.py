"""The events feature: what consumers do with the kernel's outbox, namely
webhook subscriptions, their deliveries and parked events, and trimming."""

from __future__ import annotations

from typing import Final

from raftsched.core.events import audit, outbox_retention, sinks, subscriptions
from raftsched.core.events.commands import (
    AckDelivery,
    AckParked,
    ConfigureOutbox,
    CopySubscription,
    CreateSubscription,
    DeleteSubscription,
    ParkDelivery,
    RetryParked,
)
from raftsched.core.kernel import shard
from raftsched.core.kernel.feature import CommandKind, Feature, FieldKind, TickWork

# A subscription's fields since cluster version 10 (docs/relays.md): optional,
# encoded only when set (`CommandKind.tail`).
_LATER_FIELDS: Final = ("sink?", "tenants?", "str?")

FEATURE: Final = Feature(
    name="events",
    sections=(subscriptions.SECTION,),
    # Tags 40-49.
    commands=(
        CommandKind(ConfigureOutbox, 40, ("int?", "int?"), outbox_retention.apply_configure_outbox),
        CommandKind(
            CreateSubscription,
            41,
            ("str", "str", "strs", "str", *_LATER_FIELDS),
            subscriptions.apply_create_subscription,
            audit=audit.CREATE,
            tail=len(_LATER_FIELDS),
            tail_since=sinks.SINK_VERSION,
        ),
        CommandKind(
            DeleteSubscription,
            42,
            ("str",),
            subscriptions.apply_delete_subscription,
            audit=audit.DELETE,
        ),
        CommandKind(AckDelivery, 43, ("str", "int"), subscriptions.apply_ack_delivery),
        CommandKind(
            ParkDelivery, 44, ("str", "int", "int", "str"), subscriptions.apply_park_delivery
        ),
        CommandKind(
            RetryParked, 45, ("str",), subscriptions.apply_retry_parked, audit=audit.RETRY_PARKED
        ),
        CommandKind(AckParked, 46, ("str", "int"), subscriptions.apply_ack_parked),
        # A data shard's copy of group 0's subscription (docs/shards.md).
        CommandKind(
            CopySubscription,
            47,
            ("str", "str", "strs", "str", "int", *_LATER_FIELDS),
            subscriptions.apply_copy_subscription,
            since=shard.SHARD_VERSION,
            tail=len(_LATER_FIELDS),
            tail_since=sinks.SINK_VERSION,
        ),
    ),
    field_kinds=(
        FieldKind("sink?", sinks.encode_sink, sinks.decode_sink),
        FieldKind("tenants?", sinks.encode_tenants, sinks.decode_tenants),
    ),
    tick=(TickWork(70, outbox_retention.trim),),
    next_due_ms=outbox_retention.next_due_ms,
    check=subscriptions.check,
)
