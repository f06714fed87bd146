"""Shared by the brokers' test drivers (`<kind>_support.py`): what a consumer
received, and where a broker's ports come from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raftsched.testing import free_port

__all__ = ["Received", "free_port"]


@dataclass(frozen=True)
class Received:
    id: str  # the event id (evt_<seq> / evt<k>_<seq>)
    type: str
    seq: int
    tenant: str
    key: str
    shard: int
    body: dict[str, Any]  # the JSON body (the webhook envelope)
