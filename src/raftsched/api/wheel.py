"""The time wheel's settings (`core.kernel.wheel`, cluster version 7):
`GET /v1/wheel` and `PUT /v1/wheel`."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from raftsched.api import scope
from raftsched.api.errors import invalid
from raftsched.api.jsonbody import json_response
from raftsched.api.requests import node_of, prepare_read, propose_audited, read_json
from raftsched.api.validation import reject_unknown, require_object, seconds_ms
from raftsched.core.jobs.commands import ConfigureWheel
from raftsched.core.kernel import wheel
from raftsched.core.kernel.results import Ack
from raftsched.core.kernel.state import State

routes = web.RouteTableDef()

_FIELDS = frozenset({"horizon_s", "bucket_s"})


def _wheel_json(state: State) -> dict[str, Any]:
    record = wheel.wheel_of(state)
    return {
        "horizon_s": record.horizon_ms / 1000,
        "bucket_s": record.bucket_ms / 1000,
        "packed_jobs": record.size,
        "buckets": len(record.buckets),
    }


@routes.get("/v1/wheel")
async def get_wheel(request: web.Request) -> web.Response:
    reject_unknown(request.query, frozenset({"consistency"}))
    scope.require_all_tenants(request, "the time wheel")  # it counts every tenant's jobs
    headers = await prepare_read(request)
    with node_of(request).reading() as state:
        body = _wheel_json(state)
    return json_response({"wheel": body}, headers=headers)


@routes.put("/v1/wheel")
async def put_wheel(request: web.Request) -> web.Response:
    scope.require_all_tenants(request, "the time wheel")
    body = require_object(await read_json(request))
    reject_unknown(body, _FIELDS)
    horizon_ms = seconds_ms(body, "horizon_s", 0, wheel.HORIZON_MS_MAX / 1000)
    bucket_ms = seconds_ms(body, "bucket_s", wheel.BUCKET_MS_MIN / 1000, wheel.BUCKET_MS_MAX / 1000)
    if horizon_ms is None:
        raise invalid("horizon_s", "is required")
    if bucket_ms is None:
        raise invalid("bucket_s", "is required")
    await propose_audited(request, ConfigureWheel(horizon_ms, bucket_ms), Ack)
    with node_of(request).reading() as state:
        answer = _wheel_json(state)
    return json_response({"wheel": answer})
