"""The aiohttp application: middlewares, leader routing, and the route tables.

The helpers handlers share (the node of a request, reading the body, read
consistency) are in `api.requests`; this module only assembles the handlers.

Every handler either answers from this node or raises: `ApiError` (rendered
with the stable error body), `NotLeader` (a 307 to the leader, keeping method
and body, or 503 `no_leader` when none is known), `OutcomeUnknown` (504:
the command may yet commit; retry with the same key or token), or
`UpgradeRequired` (409 `invalid_state`: the command needs a newer cluster
version than the one in force; nothing was proposed).
"""

from __future__ import annotations

import itertools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from raftsched.api import (
    audit,
    backup,
    cluster,
    dashboard,
    events,
    headers,
    jobs,
    leases,
    membership,
    queues,
    reconciliation,
    schedules,
    shard_internal,
    stats,
    tokens,
    wheel,
    workflows,
)
from raftsched.api.auth import (
    CATCH_UPS,
    LIMITER,
    CatchUpFirst,
    CatchUps,
    FailureLimiter,
    authorize,
    authorize_from_node,
    catch_up,
)
from raftsched.api.errors import ApiError, from_proposal_error
from raftsched.api.requests import NODE, Handler, node_of
from raftsched.api.server_spans import server_span_middleware
from raftsched.api.shard_routing import SHARD_ROUTER, ShardRouter, redirect_location
from raftsched.limits import AUTH_FAILURES_PER_MINUTE
from raftsched.logs import REQUEST_ID
from raftsched.node.lease_ops import PROPOSAL_ERRORS
from raftsched.node.proposer import NotLeader
from raftsched.node.relay_status import RelayStatus
from raftsched.node.view import NodeView
from raftsched.node.webhook_targets import TargetPolicy

log = logging.getLogger("raftsched.api")

# A request body larger than this is answered 413 (NodeConfig.max_body_bytes).
MAX_BODY_BYTES: web.AppKey[int] = web.AppKey("max_body_bytes")


def leader_redirect(request: web.Request) -> web.Response:
    node = node_of(request)
    leader = node.leader()
    # Redirect only to a leader this node can reach: right after a leader dies
    # its followers still name it until the election, and a redirect to a
    # dead node would only send the client round in circles.
    if (
        leader is None
        or leader.id == node.node_id
        or leader.http_url is None
        or not node.peer_reachable(leader.id)
    ):
        raise ApiError(
            "no_leader", "no leader is known; retry shortly", headers={"Retry-After": "1"}
        )
    location = redirect_location(request, leader.http_url)
    return web.Response(
        status=307,
        headers={"Location": location, "Raftsched-Leader": leader.id},
        text=json.dumps({"leader": {"id": leader.id, "http_url": leader.http_url}}),
        content_type="application/json",
    )


# Request ids need to be unique, not unguessable: a per-process random
# prefix and a counter (uuid4 costs a getrandom syscall per request). They
# label log lines and answers and never enter a command, so they are not
# drawn through the node's Draws (node/draws.py), which is for what is proposed.
_REQUEST_ID_PREFIX = uuid.uuid4().hex[:16]
_request_ids = itertools.count(1)


def _new_request_id() -> str:
    return f"{_REQUEST_ID_PREFIX}{next(_request_ids):016x}"


Route = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


def _request_middleware(
    admit: Callable[[web.Request], None], route: Route | None = None
) -> Middleware:
    @web.middleware
    async def request_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every request's one middleware: its id, its duration in the HTTP
        histogram, and (in `_answer`, which renders what they raise) the checks
        before its handler: a removed node's refusal, authentication; in a
        node of several shards, the shard that answers (api.shard_routing).

        One layer rather than three: aiohttp calls each middleware through a
        partial and a coroutine of its own, about a microsecond a layer."""
        request_id = request.headers.get("X-Request-Id") or _new_request_id()
        REQUEST_ID.set(request_id)  # log lines made while handling it carry it
        started = time.perf_counter()
        status = 500
        try:
            response = await _answer(request, handler, admit, route)
            status = response.status
            if not response.prepared:  # a shard's streamed answer carries the id
                response.headers["X-Request-Id"] = request_id
            return response
        finally:
            resource = request.match_info.route.resource
            route_name = resource.canonical if resource is not None else "unmatched"
            metrics = node_of(request).metrics
            metrics.series(metrics.http_seconds, request.method, route_name, str(status)).observe(
                time.perf_counter() - started
            )

    return request_middleware


async def _on_response_prepare(request: web.Request, response: web.StreamResponse) -> None:
    # One hook for every answer's headers, CORS and security: each hook is a
    # coroutine the signal awaits on every response (a few µs a request).
    dashboard.add_cors_headers(request, response)
    headers.add_security_headers(request, response)


# What a removed node still answers: its health, why it is not ready, the
# cluster as it last knew it, and its metrics.
REMOVED_NODE_ROUTES = frozenset({"/healthz", "/readyz", "/v1/cluster", "/metrics", "/v1/time"})


def _removed_node() -> ApiError:
    return ApiError(
        "unavailable",
        "this node was removed from the cluster and serves no more; use another member",
        {"reason": "node_removed"},
    )


request_middleware = _request_middleware(lambda request: _admit(request))


def _admit(request: web.Request) -> None:
    """The checks before a handler, in order: a node removed from the cluster
    serves no more (node.membership); then authentication (api.auth)."""
    if node_of(request).removed and request.path not in REMOVED_NODE_ROUTES:
        raise _removed_node()
    authorize(request)


def _admit_from_node(request: web.Request) -> None:
    """`_admit` in a shard process: its node process authenticated the
    caller (api.auth.authorize_from_node), or the node asks itself, with its
    key, on an internal route (api.shard_internal)."""
    if node_of(request).removed and request.path not in REMOVED_NODE_ROUTES:
        raise _removed_node()
    if shard_internal.admit_internal(request):
        return
    authorize_from_node(request)


async def _answer(
    request: web.Request,
    handler: Handler,
    admit: Callable[[web.Request], None] | None = None,
    route: Route | None = None,
) -> web.StreamResponse:
    """The handler's answer, or the error response for what it, or `admit`
    before it, raised; with `route`, the answer of the shard the request is
    for. A CORS preflight is answered before `admit`: it carries no token."""
    try:
        if request.method == "OPTIONS":
            preflight = dashboard.cors_preflight(request)
            if preflight is not None:
                return preflight
        if admit is not None:
            try:
                admit(request)
            except CatchUpFirst:  # a token this replica may not have applied yet (api.auth)
                await catch_up(request)
                admit(request)
        if route is not None:
            return await route(request, handler)
        return await handler(request)
    except ApiError as error:
        return error.response()
    except NotLeader:
        try:
            return leader_redirect(request)
        except ApiError as error:
            return error.response()
    except PROPOSAL_ERRORS as error:
        return from_proposal_error(error).response()
    except web.HTTPRequestEntityTooLarge as error:
        # The limit, so that a client that batches (the worker's lease
        # batches) can split what it sends to fit.
        limit = {"max_body_bytes": request.app[MAX_BODY_BYTES]}
        return ApiError("payload_too_large", str(error.text or "body too large"), limit).response()
    except web.HTTPNotFound:
        return ApiError("not_found", f"no route for {request.path}").response()
    except web.HTTPMethodNotAllowed as error:
        return ApiError(
            "method_not_allowed",
            f"{request.method} is not allowed on {request.path}",
            headers={"Allow": ", ".join(sorted(error.allowed_methods))},
        ).response()
    except web.HTTPException:
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return ApiError("internal_error", "internal error").response()


def create_app(
    node: NodeView,
    *,
    max_body_bytes: int,
    webhook_targets: TargetPolicy | None = None,
    auth_failures_per_minute: int = AUTH_FAILURES_PER_MINUTE,
    traced: bool = False,
    shard_router: ShardRouter | None = None,
    shard_process: bool = False,
    internal_key: str | None = None,
    relay_status: RelayStatus | None = None,
) -> web.Application:
    """The application of a node; with `shard_router`, of a node of several
    shards, which routes requests to them; with `shard_process`, of a shard
    process, which takes the principal its node process names and answers
    its node's internal requests made with `internal_key`. `relay_status`
    is its leader's relays' (node.relay_status), for the subscription views."""
    # The one middleware renders the ApiErrors (401, 403, 429, 503) that
    # the checks before a handler raise, and times them. With `traced`
    # (tracing.enabled()), a server span goes around it (api.server_spans);
    # without, a request costs nothing for tracing.
    if shard_process:
        middlewares = [_request_middleware(_admit_from_node)]
    elif shard_router is not None:
        middlewares = [_request_middleware(_admit, shard_router.route)]
    else:
        middlewares = [request_middleware]
    if traced:
        middlewares.insert(0, server_span_middleware)
    app = web.Application(middlewares=middlewares, client_max_size=max_body_bytes)
    app[NODE] = node
    app[MAX_BODY_BYTES] = max_body_bytes
    if shard_router is not None:
        app[SHARD_ROUTER] = shard_router
        app.on_startup.append(shard_router.on_startup)
        app.on_cleanup.append(shard_router.on_cleanup)
    app[LIMITER] = FailureLimiter(failures_max=auth_failures_per_minute)
    app[CATCH_UPS] = CatchUps()
    app[events.WEBHOOK_TARGETS] = webhook_targets or TargetPolicy()
    if relay_status is not None:
        app[events.RELAY_STATUS] = relay_status
    if shard_process and internal_key:
        app[shard_internal.INTERNAL_KEY] = internal_key
        app.add_routes(shard_internal.internal_routes)
    app.add_routes(jobs.routes)
    app.add_routes(leases.routes)
    app.add_routes(cluster.routes)
    app.add_routes(membership.routes)
    app.add_routes(backup.routes)
    app.add_routes(workflows.routes)
    app.add_routes(events.routes)
    app.add_routes(audit.routes)
    app.add_routes(reconciliation.routes)
    app.add_routes(tokens.routes)
    app.add_routes(wheel.routes)
    app.add_routes(stats.routes)
    dashboard.setup(app)
    app.on_response_prepare.append(_on_response_prepare)
    schedules.setup(app, node)
    queues.setup(app, node)
    return app
