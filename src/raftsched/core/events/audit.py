"""How subscription commands appear in the audit trail (`kernel.audit`).
Subscriptions see every tenant's events, so their entries name no tenant
(only readers of every tenant see them); the secret is never recorded."""

from __future__ import annotations

from typing import Any, Final

from raftsched.core.events.commands import CreateSubscription
from raftsched.core.events.sinks import Sink
from raftsched.core.kernel.feature import Audit, AuditSubject
from raftsched.core.kernel.state import State


def _create(state: State, command: CreateSubscription) -> AuditSubject:
    types = ",".join(command.types) if type(command.types) is tuple else ""
    sink = command.sink
    if sink is None:  # a webhook: as before version 10
        return AuditSubject(command.subscription_id, None, f"{command.url} types={types or '*'}")
    # A broker's options may hold a password: only the sink's kind is recorded.
    kind = sink.kind if type(sink) is Sink and type(sink.kind) is str else "?"
    return AuditSubject(command.subscription_id, None, f"sink={kind[:32]} types={types or '*'}")


def _by_id(state: State, command: Any) -> AuditSubject:
    return AuditSubject(command.subscription_id, None)


CREATE: Final = Audit("subscription.create", _create)
DELETE: Final = Audit("subscription.delete", _by_id)
RETRY_PARKED: Final = Audit("subscription.retry_parked", _by_id)
