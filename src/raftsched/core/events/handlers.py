"""Dispatch of the outbox and subscription commands (called from `apply`)."""

from __future__ import annotations

from typing import assert_never

from raftsched.core.events import subscriptions as subs
from raftsched.core.events.commands import (
    AckDelivery,
    AckParked,
    ConfigureOutbox,
    CreateSubscription,
    DeleteSubscription,
    ParkDelivery,
    RetryParked,
)
from raftsched.core.events.outbox import apply_configure_outbox
from raftsched.core.kernel.results import Result
from raftsched.core.kernel.state import State

EventsCommand = (
    ConfigureOutbox
    | CreateSubscription
    | DeleteSubscription
    | AckDelivery
    | ParkDelivery
    | RetryParked
    | AckParked
)


def apply(state: State, command: EventsCommand) -> Result:
    match command:
        case ConfigureOutbox():
            return apply_configure_outbox(state, command)
        case CreateSubscription():
            return subs.apply_create_subscription(state, command)
        case DeleteSubscription():
            return subs.apply_delete_subscription(state, command)
        case AckDelivery():
            return subs.apply_ack_delivery(state, command)
        case ParkDelivery():
            return subs.apply_park_delivery(state, command)
        case RetryParked():
            return subs.apply_retry_parked(state, command)
        case AckParked():
            return subs.apply_ack_parked(state, command)
        case _:
            assert_never(command)
