"""Flow-control calls: queues and tenants (`/v1/queues`, `/v1/tenants`).

Settings are replaced whole (PUT) and pause/resume set one flag, so every
write here is safe to repeat after an unknown outcome.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from raftsched.client._calls import Call, Consistency, JsonObject, _field, _query, _segment


def set_queue(name: str, settings: Mapping[str, Any]) -> Call[JsonObject]:
    path = f"/v1/queues/{_segment(name)}"
    return Call("PUT", path, _field("queue"), body=dict(settings), retry_unknown=True)


def pause_queue(name: str, paused: bool) -> Call[JsonObject]:
    action = "pause" if paused else "resume"
    path = f"/v1/queues/{_segment(name)}/{action}"
    return Call("POST", path, _field("queue"), body={}, retry_unknown=True)


def get_queue(name: str, consistency: Consistency | None) -> Call[JsonObject]:
    return Call(
        "GET",
        f"/v1/queues/{_segment(name)}",
        _field("queue"),
        _query(consistency),
        retry_unknown=True,
    )


def list_queues(consistency: Consistency | None) -> Call[list[JsonObject]]:
    return Call("GET", "/v1/queues", _field("queues"), _query(consistency), retry_unknown=True)


def set_tenant(name: str, settings: Mapping[str, Any]) -> Call[JsonObject]:
    path = f"/v1/tenants/{_segment(name)}"
    return Call("PUT", path, _field("tenant"), body=dict(settings), retry_unknown=True)


def get_tenant(name: str, consistency: Consistency | None) -> Call[JsonObject]:
    return Call(
        "GET",
        f"/v1/tenants/{_segment(name)}",
        _field("tenant"),
        _query(consistency),
        retry_unknown=True,
    )


def list_tenants(consistency: Consistency | None) -> Call[list[JsonObject]]:
    return Call("GET", "/v1/tenants", _field("tenants"), _query(consistency), retry_unknown=True)
