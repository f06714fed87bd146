"""`GET /v1/stats/series`: the last hour of a queue's or the cluster's figures,
in 5 s buckets, for the dashboard's charts (node.series keeps them).

Answered by the node that receives it, from its own memory, never
redirected: every node keeps the series of its own replica, and counts by
replicated time, so every node's answer agrees (docs/observability.md,
"Charts"). Scope: a queue's figures mix every tenant's jobs, as the queue
routes' do, so the series need a caller who sees every tenant (403 otherwise).
"""

from __future__ import annotations

from aiohttp import web

from raftsched.api import scope
from raftsched.api.errors import ApiError
from raftsched.api.jsonbody import json_response
from raftsched.api.requests import node_of
from raftsched.api.validation import path_id, query_integer, reject_unknown
from raftsched.node.series import PERIOD_MS, WINDOW_S

routes = web.RouteTableDef()

WINDOW_S_MIN = PERIOD_MS // 1000


@routes.get("/v1/stats/series")
async def stats_series(request: web.Request) -> web.Response:
    query = request.query
    reject_unknown(query, frozenset({"queue", "window_s"}))
    queue = query.get("queue")
    if queue is not None:
        path_id(queue, "queue")
    window_s = query_integer(query, "window_s", WINDOW_S_MIN, WINDOW_S, default=WINDOW_S)
    assert window_s is not None
    scope.require_all_tenants(request, "a queue's series")
    node = node_of(request)
    window = node.series.read(queue, window_s)
    if window is None:
        raise ApiError(
            "not_found",
            f"no series for queue {queue}: it has had no job in the last hour, or "
            "every series is taken (see queues)",
            {"queue": queue},
        )
    body = {
        "node_id": node.node_id,
        "queue": window.queue,
        "period_s": window.period_s,
        "sampling_since": window.sampling_since,
        "queues": window.queues,
        "at": window.at,
        **window.values,
    }
    headers = {"Raftsched-Applied-Index": str(node.status().applied_index)}
    return json_response(body, headers=headers)
