"""`/v1/queues` and `/v1/tenants`: flow-control settings and what they hold back.

PUT replaces the settings (an omitted limit means none). Pause and resume
change only `paused`. Reads show the settings with the live figures: depth,
running, oldest runnable age, tokens, circuit, throttled and blocked keys.

Scope (api.scope): a queue is shared by every tenant, and its figures and
settings (depth, tokens, circuit, blocked keys, pausing it) mix them, so the
queue routes need a caller who sees every tenant (403 otherwise). A tenant's
figures are its own: a scoped caller lists only its tenants, and another
tenant is `404 not_found` to it, read or written.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from raftsched.api import scope
from raftsched.api.errors import ApiError, invalid
from raftsched.api.jsonbody import json_response
from raftsched.api.principal import principal_of
from raftsched.api.requests import node_of, prepare_read, propose_audited, read_json
from raftsched.api.validation import (
    ON_UNKNOWN_POLICIES,
    boolean,
    choice,
    integer,
    number,
    path_id,
    reject_unknown,
    require_object,
    seconds_ms,
)
from raftsched.core.jobs.commands import PauseQueue, SetQueue, SetTenant, SetUnknownPolicy
from raftsched.core.jobs.flow import (
    CIRCUIT_WINDOW_MAX,
    CIRCUIT_WINDOW_MIN,
    LIMIT_MAX,
    RATE_MILLI_MAX,
    WEIGHT_MAX,
)
from raftsched.core.jobs.flow_queries import (
    QueueView,
    TenantView,
    queue_names,
    queue_view,
    tenant_names,
    tenant_view,
)
from raftsched.core.jobs.reconcile_book import book_of
from raftsched.core.kernel.results import Ack
from raftsched.limits import METRIC_SERIES_MAX, PROBE_S_MAX, PROBE_S_MIN, RATE_PER_S_MIN
from raftsched.node import metrics as families
from raftsched.node.metrics import NodeMetrics, Samples
from raftsched.node.versions import check_allowed
from raftsched.node.view import NodeView
from raftsched.timefmt import format_ms

routes = web.RouteTableDef()

QUEUE_FIELDS = frozenset(
    {
        "paused",
        "rate_limit_per_s",
        "burst",
        "concurrency_limit",
        "circuit_window",
        "circuit_probe_interval_s",
        "on_unknown",
    }
)
TENANT_FIELDS = frozenset({"weight", "concurrency_limit", "max_queued", "on_unknown"})
PROBE_MS_DEFAULT = 5_000


def parse_queue(name: str, value: object) -> SetQueue:
    body = require_object(value)
    reject_unknown(body, QUEUE_FIELDS)
    paused = boolean(body, "paused", False)
    # The range is checked before scaling, so no rate can overflow to infinity.
    rate = number(
        body, "rate_limit_per_s", RATE_PER_S_MIN, RATE_MILLI_MAX / 1000, unit="claims per second"
    )
    rate_milli = None if rate is None else max(1, round(rate * 1000))
    burst = integer(body, "burst", 1, LIMIT_MAX)
    if burst is not None and rate_milli is None:
        raise invalid("burst", "a burst needs rate_limit_per_s")
    probe_ms = seconds_ms(body, "circuit_probe_interval_s", PROBE_S_MIN, PROBE_S_MAX)
    return SetQueue(
        name,
        paused,
        rate_milli,
        burst,
        integer(body, "concurrency_limit", 0, LIMIT_MAX),
        integer(body, "circuit_window", CIRCUIT_WINDOW_MIN, CIRCUIT_WINDOW_MAX),
        PROBE_MS_DEFAULT if probe_ms is None else probe_ms,
    )


def parse_tenant(name: str, value: object) -> SetTenant:
    body = require_object(value)
    reject_unknown(body, TENANT_FIELDS)
    weight = integer(body, "weight", 1, WEIGHT_MAX)
    return SetTenant(
        name,
        1 if weight is None else weight,
        integer(body, "concurrency_limit", 0, LIMIT_MAX),
        integer(body, "max_queued", 0, LIMIT_MAX),
    )


def render_queue(view: QueueView, now_ms: int) -> dict[str, Any]:
    oldest = view.oldest_runnable_at_ms
    body: dict[str, Any] = {
        "name": view.name,
        "depth": view.depth,
        "running": view.running,
        "oldest_runnable_at": None if oldest is None else format_ms(oldest),
        "oldest_runnable_age_s": None if oldest is None else max(0, now_ms - oldest) / 1000,
        "paused": view.paused,
        "rate_limit_per_s": None
        if view.rate_limit_milli_per_s is None
        else view.rate_limit_milli_per_s / 1000,
        "burst": view.burst,
        "tokens": view.tokens,
        "concurrency_limit": view.concurrency_limit,
        "circuit": None
        if view.circuit_window is None
        else {
            "window": view.circuit_window,
            "probe_interval_s": view.circuit_probe_ms / 1000,
            "open": view.circuit_open,
            "recent_failures": view.circuit_failures,
            "recent_outcomes": view.circuit_outcomes,
        },
        "throttled": view.throttled,
        "blocked_keys": view.blocked_keys,
        "on_unknown": view.on_unknown,
        "reconciling": view.reconciling,
    }
    if view.blocked:
        body["blocked"] = [
            {"tenant": tenant, "ordering_key": key, "job_id": job_id}
            for tenant, key, job_id in view.blocked
        ]
    return body


def render_tenant(view: TenantView) -> dict[str, Any]:
    return {
        "name": view.name,
        "weight": view.weight,
        "concurrency_limit": view.concurrency_limit,
        "max_queued": view.max_queued,
        "queued": view.queued,
        "running": view.running,
        "throttled": view.throttled,
        "on_unknown": view.on_unknown,
    }


def _queue_json(request: web.Request, name: str, with_blocked: bool) -> dict[str, Any]:
    node = node_of(request)
    now_ms = node.now_ms()
    with node.reading() as state:
        return render_queue(queue_view(state, name, now_ms, with_blocked), now_ms)


def _tenant_json(request: web.Request, name: str) -> dict[str, Any]:
    with node_of(request).reading() as state:
        return render_tenant(tenant_view(state, name))


def _queues_scope(request: web.Request) -> None:
    scope.require_all_tenants(request, "a queue")


def _tenant_scope(request: web.Request, name: str) -> None:
    """Another tenant's settings are as absent to a scoped caller."""
    if not scope.visible_tenant(principal_of(request), name):
        raise ApiError("not_found", f"no tenant {name}")


def on_unknown_change(
    request: web.Request, scope_name: str, name: str, body: object
) -> SetUnknownPolicy | None:
    """The `on_unknown` default a PUT asks for, as a command when it differs
    from the one in force. Unlike the limits, an absent `on_unknown` keeps
    the one in force: a PUT that only meant to change a rate (or the
    dashboard's pause) must never silently drop a queue's reconciliation,
    which would let unknown outcomes be retried into double effects.
    Checked against the cluster version before anything is proposed, so a
    PUT is never half-applied; a PUT that changes nothing here needs no
    upgrade."""
    wanted = choice(require_object(body), "on_unknown", ON_UNKNOWN_POLICIES)
    if wanted is None:
        return None
    node = node_of(request)
    with node.reading() as state:
        book = book_of(state)
        defaults = book.queues if scope_name == "queue" else book.tenants
        if defaults.get(name, "retry") == wanted:
            return None
        command = SetUnknownPolicy(scope_name, name, wanted)
        check_allowed(state, [command])
    return command


@routes.put("/v1/queues/{name}")
async def put_queue(request: web.Request) -> web.Response:
    name = path_id(request.match_info["name"], "name")
    _queues_scope(request)
    body = await read_json(request)
    command = parse_queue(name, body)
    policy = on_unknown_change(request, "queue", name, body)
    await propose_audited(request, command, Ack)
    if policy is not None:
        await propose_audited(request, policy, Ack)
    return json_response({"queue": _queue_json(request, name, True)})


@routes.post("/v1/queues/{name}/pause")
async def pause_queue(request: web.Request) -> web.Response:
    name = path_id(request.match_info["name"], "name")
    _queues_scope(request)
    await propose_audited(request, PauseQueue(name, True), Ack)
    return json_response({"queue": _queue_json(request, name, True)})


@routes.post("/v1/queues/{name}/resume")
async def resume_queue(request: web.Request) -> web.Response:
    name = path_id(request.match_info["name"], "name")
    _queues_scope(request)
    await propose_audited(request, PauseQueue(name, False), Ack)
    return json_response({"queue": _queue_json(request, name, True)})


@routes.get("/v1/queues")
async def list_queues(request: web.Request) -> web.Response:
    reject_unknown(request.query, frozenset({"consistency"}))
    _queues_scope(request)
    headers = await prepare_read(request)
    node = node_of(request)
    now_ms = node.now_ms()
    with node.reading() as state:
        views = [queue_view(state, name, now_ms) for name in queue_names(state)]
    body = {"queues": [render_queue(view, now_ms) for view in views]}
    return json_response(body, headers=headers)


@routes.get("/v1/queues/{name}")
async def get_queue(request: web.Request) -> web.Response:
    reject_unknown(request.query, frozenset({"consistency"}))
    _queues_scope(request)
    headers = await prepare_read(request)
    name = path_id(request.match_info["name"], "name")
    with node_of(request).reading() as state:
        if name not in queue_names(state):
            raise ApiError("not_found", f"no queue {name}: no jobs and no settings")
    return json_response({"queue": _queue_json(request, name, True)}, headers=headers)


@routes.put("/v1/tenants/{name}")
async def put_tenant(request: web.Request) -> web.Response:
    name = path_id(request.match_info["name"], "name")
    _tenant_scope(request, name)
    body = await read_json(request)
    command = parse_tenant(name, body)
    policy = on_unknown_change(request, "tenant", name, body)
    await propose_audited(request, command, Ack)
    if policy is not None:
        await propose_audited(request, policy, Ack)
    return json_response({"tenant": _tenant_json(request, name)})


@routes.get("/v1/tenants")
async def list_tenants(request: web.Request) -> web.Response:
    reject_unknown(request.query, frozenset({"consistency"}))
    headers = await prepare_read(request)
    principal = principal_of(request)
    with node_of(request).reading() as state:
        names = tenant_names(state)
        if principal.tenants is not None:
            names = [name for name in names if name in principal.tenants]
        views = [tenant_view(state, name) for name in names]
    return json_response({"tenants": [render_tenant(v) for v in views]}, headers=headers)


@routes.get("/v1/tenants/{name}")
async def get_tenant(request: web.Request) -> web.Response:
    reject_unknown(request.query, frozenset({"consistency"}))
    headers = await prepare_read(request)
    name = path_id(request.match_info["name"], "name")
    _tenant_scope(request, name)
    # Every tenant exists with the default settings; unknown ones show zeros.
    return json_response({"tenant": _tenant_json(request, name)}, headers=headers)


# -- metrics -----------------------------------------------------------------------

# Label sets stay bounded: at most METRIC_SERIES_MAX queues and tenants (the
# busiest by queued jobs) get series of their own; the rest are summed under "_other".
OTHER = "_other"
TENANT_FAMILIES = {
    "queued": families.TENANT_QUEUED,
    "running": families.TENANT_RUNNING,
    "throttled": families.TENANT_THROTTLED,
}
QUEUE_FAMILIES = {
    "queued": families.FLOW_QUEUE_QUEUED,
    "running": families.FLOW_QUEUE_RUNNING,
    "throttled": families.FLOW_QUEUE_THROTTLED,
    "blocked_keys": families.FLOW_QUEUE_BLOCKED_KEYS,
    "circuit_open": families.FLOW_QUEUE_CIRCUIT_OPEN,
}


def setup(app: web.Application, node: NodeView) -> None:
    app.add_routes(routes)
    metrics: NodeMetrics = node.metrics
    metrics.sample_together(tuple(TENANT_FAMILIES.values()), lambda: _tenant_samples(node))
    metrics.sample_together(tuple(QUEUE_FAMILIES.values()), lambda: _queue_samples(node))


def _bounded(samples: dict[str, float], ranking: dict[str, float]) -> Samples:
    keep = set(sorted(ranking, key=lambda name: (-ranking[name], name))[:METRIC_SERIES_MAX])
    out: dict[str, float] = {}
    for name, value in samples.items():
        label = name if name in keep else OTHER
        out[label] = out.get(label, 0.0) + value
    return [((name,), value) for name, value in out.items()]


def _tenant_samples(node: NodeView) -> dict[str, Samples]:
    with node.reading() as state:
        views = [tenant_view(state, name) for name in tenant_names(state)]
    ranking = {view.name: float(view.queued) for view in views}
    return {
        family.name: _bounded({view.name: float(getattr(view, what)) for view in views}, ranking)
        for what, family in TENANT_FAMILIES.items()
    }


def _queue_value(view: Any, what: str) -> float:
    if what == "queued":
        return float(view.depth)
    if what == "circuit_open":
        return 1.0 if view.circuit_open else 0.0
    return float(getattr(view, what))


def _queue_samples(node: NodeView) -> dict[str, Samples]:
    now_ms = node.now_ms()
    with node.reading() as state:
        views = [queue_view(state, name, now_ms) for name in queue_names(state)]
    ranking = {view.name: float(view.depth) for view in views}
    return {
        family.name: _bounded({view.name: _queue_value(view, what) for view in views}, ranking)
        for what, family in QUEUE_FAMILIES.items()
    }
