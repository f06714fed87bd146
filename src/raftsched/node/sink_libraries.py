"""Which broker sinks this node can relay to: each sink's client library is
an optional extra (`raftsched[redis]`, ...), so the core install stays small
(docs/relays.md, section 1)."""

from __future__ import annotations

from importlib.util import find_spec
from typing import Final

# sink kind -> (the module its relay imports, the extra that installs it)
SINK_LIBRARIES: Final = {
    "nats": ("nats", "nats"),
    "rabbitmq": ("aio_pika", "rabbitmq"),
    "redis": ("redis", "redis"),
}


def missing_extra(kind: str) -> str | None:
    """The extra to install for sinks of `kind`, when its library is missing."""
    found = SINK_LIBRARIES.get(kind)
    if found is None:
        return None
    module, extra = found
    return None if find_spec(module) is not None else extra
