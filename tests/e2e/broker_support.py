"""What every broker's test driver (`tests/e2e/<kind>_support.py`) shares:
the rows a broker kept (`Received`) and the ports its server listens on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raftsched import testing


@dataclass(frozen=True)
class Received:
    id: str  # the event id (evt_<seq> / evt<k>_<seq>)
    type: str
    seq: int
    tenant: str
    key: str
    shard: int
    body: dict[str, Any]  # the JSON body (the webhook envelope)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now on `host`, from the test ports (below the ephemeral
    range, so that nothing takes it while the broker is down for a restart)."""
    return testing.free_port(host)
