"""The dashboard: its page and files, the aggregate reads it polls, and the
cross-origin rules that let a page served by one node talk to the leader.

Routes:
- `GET /` and `GET /static/{name}`: the single-page app (no build step; the
  files ship in the package); `GET /static/vendor/{name}`: the charting
  library it draws with (uPlot, static/vendor/README.md says which version).
- `GET /v1/overview`: everything the on-call view shows, from this node's
  replica and memory (so it answers on any node, with or without a leader).
- `GET /v1/time`: this node's wall clock and version; the leader uses it to
  measure skew, every node to learn its peers' versions (node.versions).

Why CORS: reads on a follower and all writes are redirected to the leader,
and a browser will not follow a redirect to another origin (another port is
another origin) without CORS headers. The dashboard therefore sends its
requests straight to the leader's advertised URL, and every node allows
exactly the origins of the cluster's advertised URLs, never `*`.

Audit: a write by an authenticated caller, or (while authentication is off)
one that carries `Raftsched-Actor` (the dashboard sends `Raftsched-Actor:
dashboard`), gets an `audit:` log line with the actor, method, path, status
and request id, besides the replicated audit trail (`GET /v1/audit`) and the
job history record that cancel and replay keep.

Scope: the overview mixes every tenant's figures (status counts, queues,
dead letters, stuck jobs, errors, per-queue counters), so it needs a caller
who sees every tenant (403 otherwise); a scoped viewer's page reads the
scoped routes (`/v1/jobs`, `/v1/tenants`, ...) instead.
"""

from __future__ import annotations

import logging
import re
from importlib import resources
from typing import Any, Final
from urllib.parse import urlsplit

from aiohttp import web

from raftsched import core
from raftsched.api import render, scope
from raftsched.api.errors import ApiError
from raftsched.api.jsonbody import json_response
from raftsched.api.membership import peer_statuses
from raftsched.api.permissions import Permission, permission_for
from raftsched.api.principal import principal_of
from raftsched.api.requests import actor, node_of
from raftsched.api.shard_routing import SHARD_ROUTER
from raftsched.api.validation import query_integer, reject_unknown
from raftsched.core.jobs.reconcile_book import awaits_reconciliation
from raftsched.limits import OVERVIEW_ERRORS_MAX
from raftsched.node import metrics as families
from raftsched.node.observability import wall_ms
from raftsched.node.versions import THIS_NODE
from raftsched.node.view import NodeView
from raftsched.timefmt import format_ms

log = logging.getLogger("raftsched.audit")

routes = web.RouteTableDef()

STATIC_NAME = re.compile(r"^[A-Za-z0-9_-]+\.(html|js|css|svg)$")
# Vendored files keep their own names (`uPlot.iife.min.js`): dots inside, never
# a leading one, never a slash.
VENDOR_NAME = re.compile(r"^[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.(js|css)$")
CONTENT_TYPES = {
    "html": "text/html",
    "js": "text/javascript",
    "css": "text/css",
    "svg": "image/svg+xml",
}
DEAD_LETTERS_SHOWN = 20
ERRORS_SHOWN = 50
CORS_ALLOWED_HEADERS = "Content-Type, Raftsched-Actor, X-Request-Id, Authorization"
CORS_EXPOSED_HEADERS = "X-Request-Id, Raftsched-Leader, Raftsched-Applied-Index, Retry-After"


def _static_text(*parts: str) -> str:
    return resources.files("raftsched").joinpath("static", *parts).read_text("utf-8")


def _static_response(name: str, folder: str | None = None) -> web.Response:
    match = (STATIC_NAME if folder is None else VENDOR_NAME).match(name)
    if match is None:
        raise ApiError("not_found", f"no file {name}")
    try:
        text = _static_text(name) if folder is None else _static_text(folder, name)
    except (FileNotFoundError, IsADirectoryError):
        raise ApiError("not_found", f"no file {name}") from None
    return web.Response(
        text=text,
        content_type=CONTENT_TYPES[match.group(1)],
        charset="utf-8",
        # The page polls live data; the files themselves are small. Revalidate
        # so that an upgraded node never serves a stale app.
        headers={"Cache-Control": "no-cache"},  # the rest: api/headers.py
    )


@routes.get("/")
async def index(request: web.Request) -> web.Response:
    return _static_response("index.html")


@routes.get("/static/{name}")
async def static_file(request: web.Request) -> web.Response:
    return _static_response(request.match_info["name"])


@routes.get("/static/vendor/{name}")
async def vendor_file(request: web.Request) -> web.Response:
    return _static_response(request.match_info["name"], "vendor")


@routes.get("/v1/time")
async def node_time(request: web.Request) -> web.Response:
    node = node_of(request)
    status = node.status()
    body = {
        "node_id": node.node_id,
        "wall_ms": wall_ms(),
        "version": THIS_NODE.as_json(),
        # Who this node is to its peers (node.identity): ids, never a secret.
        "identity": node.identity_json(),
        # A follower that meets a token it does not know asks the leader
        # how far to catch up before it calls it unknown (node.read_index).
        "role": status.role,
        "term": status.term,
        "commit_index": status.commit_index,
    }
    router = request.app.get(SHARD_ROUTER)
    if router is not None:
        # How many data shards (docs/shards.md): a worker whose token may not
        # read /v1/cluster learns here which shards to poll.
        body["shards"] = router.count
    return json_response(body)


@routes.get("/v1/overview")
async def overview(request: web.Request) -> web.Response:
    reject_unknown(request.query, frozenset({"errors"}))
    scope.require_all_tenants(request, "the overview")
    errors_shown = query_integer(
        request.query, "errors", 0, OVERVIEW_ERRORS_MAX, default=ERRORS_SHOWN
    )
    assert errors_shown is not None
    node = node_of(request)
    body = {
        "node": _node_json(node),
        **_state_json(node),
        "stuck_jobs": _stuck_json(node),
        "stuck_after_s": node.observer.stuck_after_ms / 1000,
        "recent_errors": node.observer.errors_json(errors_shown),
        "leader_history": node.observer.history_json(),
        "clock_skew": node.observer.skew_json(),
        "counters": _counters(node),
        "outbox_lag": node.observer.outbox_lag(),
    }
    headers = {"Raftsched-Applied-Index": str(body["node"]["applied_index"])}
    return json_response(body, headers=headers)


def _node_json(node: NodeView) -> dict[str, Any]:
    status = node.status()
    leader = node.leader()
    urls = node.http_urls
    statuses = peer_statuses(node, status)
    peers = [
        {
            "id": peer.id,
            "http_url": urls.get(peer.id),
            "reachable": peer.reachable,
            "match_index": peer.match_index,
            "role": "leader" if leader is not None and leader.id == peer.id else "follower",
            "status": statuses[peer.id],
        }
        for peer in status.peers
    ]
    change = node.membership.change(status)
    return {
        "id": node.node_id,
        "http_url": node.http_url,
        "role": status.role,
        "term": status.term,
        "commit_index": status.commit_index,
        "applied_index": status.applied_index,
        "leader": None if leader is None else {"id": leader.id, "http_url": leader.http_url},
        "peers": peers,
        "wall_ms": wall_ms(),
        # Membership (node.membership): the change in progress, and whether
        # this node was removed.
        "membership_change": None if change is None else change.as_json(),
        "removed": node.removed,
    }


def _state_json(node: NodeView) -> dict[str, Any]:
    with node.reading() as state:
        now_ms = state.now_ms
        queues = []
        for name, stats in core.queue_stats(state).items():
            oldest = stats.oldest_runnable_at_ms
            queues.append(
                {
                    "name": name,
                    "depth": stats.depth,
                    "running": stats.running,
                    "oldest_runnable_age_s": None
                    if oldest is None
                    else max(0, now_ms - oldest) / 1000,
                }
            )
        dead, _ = core.list_jobs(state, status="dead_letter", limit=DEAD_LETTERS_SHOWN)
        return {
            "now": format_ms(now_ms) if now_ms else None,
            "epoch": state.epoch,
            "status_counts": core.status_counts(state),
            "queues": queues,
            "dead_letters": [
                {
                    "id": job.id,
                    "queue": job.queue,
                    "kind": job.kind,
                    "updated_at": format_ms(job.updated_at_ms),
                    "attempts_made": job.attempts_made,
                    "last_error": render.job(job)["last_error"],
                    # Its effect may have happened: replay only with the
                    # operator's word (docs/reconciliation.md).
                    "unreconciled": awaits_reconciliation(state, job),
                }
                for job in dead
            ],
        }


def _stuck_json(node: NodeView) -> list[dict[str, Any]]:
    stuck = node.observer.stuck_jobs()
    for item in stuck:
        item["started_at"] = format_ms(int(item.pop("started_at_ms")))
    return stuck


def _counters(node: NodeView) -> dict[str, dict[str, float]]:
    """Per-queue totals this node proposed, for the page to turn into rates."""
    metrics = node.metrics
    totals: dict[str, dict[str, float]] = {}
    for name, family in (
        ("submitted", families.JOBS_SUBMITTED),
        ("succeeded", families.JOBS_SUCCEEDED),
        ("retried", families.JOB_RETRIES),
    ):
        for labels, value in sorted(metrics.totals(family).items()):
            totals.setdefault(labels[0], {})[name] = value
    for labels, value in sorted(metrics.totals(families.JOB_FAILURES).items()):
        entry = totals.setdefault(labels[0], {})
        entry["failed"] = entry.get("failed", 0.0) + value
    return totals


# -- cross-origin requests from the dashboard -------------------------------


def _origin(url: str | None) -> str | None:
    if not url:
        return None
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else None


def allowed_origins(node: NodeView) -> frozenset[str]:
    urls = node.http_urls.values()  # this node's and every peer's
    return frozenset(origin for origin in map(_origin, urls) if origin is not None)


def cors_preflight(request: web.Request) -> web.Response | None:
    """The answer to a CORS preflight from the dashboard on another node
    (`OPTIONS` with `Origin` and `Access-Control-Request-Method`), or None
    for any other request. Asked before authentication: a preflight carries
    no token."""
    origin = request.headers.get("Origin")
    if origin is None or "Access-Control-Request-Method" not in request.headers:
        return None
    if origin not in allowed_origins(node_of(request)):
        raise ApiError("forbidden", f"origin {origin} is not a node of this cluster")
    return web.Response(
        status=204,
        headers={
            "Access-Control-Allow-Methods": "GET, POST, PUT, DELETE",
            "Access-Control-Allow-Headers": CORS_ALLOWED_HEADERS,
            "Access-Control-Max-Age": "600",
        },
    )


# Writes an operator makes (cancel, replay, settings, tokens): each gets an
# info line naming who asked. Submits and the worker protocol do not: one
# line per job operation would cost every request and drown the log.
OPERATOR_ACTIONS: Final = frozenset({Permission.CANCEL, Permission.OPERATE, Permission.TOKENS})


def _operator_action(request: web.Request) -> bool:
    resource = request.match_info.route.resource
    if resource is None:
        return False
    if permission_for(request.method, resource.canonical) not in OPERATOR_ACTIONS:
        return False
    return principal_of(request).authenticated or "Raftsched-Actor" in request.headers


def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Let the dashboard on another node of this cluster read the answer;
    log an operator action labelled with `Raftsched-Actor` (auth off)."""
    origin = request.headers.get("Origin")
    if origin is not None and origin in allowed_origins(node_of(request)):
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = CORS_EXPOSED_HEADERS
        response.headers["Vary"] = "Origin"
    if request.method in ("POST", "PUT", "DELETE") and _operator_action(request):
        log.info(
            "audit: %s %s -> %d",
            request.method,
            request.path,
            response.status,
            extra={
                "actor": actor(request, "api"),
                "method": request.method,
                "path": request.path,
                "status": response.status,
                "request_id": response.headers.get("X-Request-Id"),
            },
        )


def setup(app: web.Application) -> None:
    """Add the dashboard's routes (its preflight answers and CORS headers are
    given by `api.app`, with every request's)."""
    app.add_routes(routes)
