"""`/v1/events` (the outbox, long-polled) and `/v1/subscriptions` (webhooks).

Scope (api.scope): a caller scoped to some tenants gets only the events
that name one of its tenants (an event without a tenant, recorded before
cluster version 3, is left out); `last_seq` and `first_seq` stay the
outbox's own, so a consumer's cursor moves exactly as before. A
subscription delivers every tenant's events, so subscriptions need a caller
who sees every tenant (403 otherwise).

A subscription is a webhook (`url`, `secret`) or, with a `sink`, a broker
relay's (docs/relays.md); `tenants` and `key_field` apply to both. A broker
URL's password is never shown. Its views carry the relay's lag, read from
the answering replica and clock, and whether the relay's last attempt
reached its broker or receiver, which only the leader knows (null from a
follower, or before the relay tried).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from raftsched.api import scope
from raftsched.api.errors import ApiError, invalid
from raftsched.api.jsonbody import json_response
from raftsched.api.principal import Principal, principal_of
from raftsched.api.render import time_or_none
from raftsched.api.requests import node_of, prepare_read, propose_audited, read_json
from raftsched.api.validation import (
    path_id,
    query_integer,
    query_number,
    reject_unknown,
    require_object,
    string,
)
from raftsched.core.events.commands import CreateSubscription, DeleteSubscription, RetryParked
from raftsched.core.events.sinks import (
    KEY_FIELD_CHARS_MAX,
    SINK_KINDS,
    SINK_OPTIONS,
    TENANTS_MAX,
    Sink,
    check_sink,
    make_sink,
    redacted,
)
from raftsched.core.events.subscriptions import (
    SECRET_CHARS_MAX,
    TYPES_MAX,
    URL_CHARS_MAX,
    Subscription,
    oldest_undelivered_at_ms,
    subscriptions,
)
from raftsched.core.kernel import outbox
from raftsched.core.kernel.outbox import EVENT_TYPE_CHARS_MAX, OutboxEvent, decode_data
from raftsched.core.kernel.results import Ack, ParkedRetried, SubscriptionCreated
from raftsched.core.kernel.state import State
from raftsched.limits import EVENTS_LIMIT_MAX, WAIT_S_MAX
from raftsched.node.relay_status import RelayStatus, age_s, lag_events
from raftsched.node.sink_libraries import missing_extra
from raftsched.node.webhook_targets import TargetPolicy
from raftsched.timefmt import format_ms

routes = web.RouteTableDef()
# This node's webhook target policy (`--webhook-allow-*`, node/webhook_targets.py).
WEBHOOK_TARGETS: web.AppKey[TargetPolicy] = web.AppKey("webhook_targets", TargetPolicy)
# This node's relays (node/relay_status.py): their connection state. Absent
# from an app without a deliverer (some unit tests): `connected` is null.
RELAY_STATUS: web.AppKey[RelayStatus] = web.AppKey("relay_status", RelayStatus)


def event_json(event: OutboxEvent) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "type": event.type,
        "at": format_ms(event.at_ms),
        "data": decode_data(event),
    }


EVENTS_QUERY = frozenset({"after", "types", "wait_s", "limit", "consistency"})


def check_events_query(query: Mapping[str, str]) -> tuple[float, int, list[str] | None]:
    """Check `GET /v1/events`'s query but `after` (400 naming the field):
    its wait, page size and types. A node of several shards checks it
    before it asks any shard, and reads its own kind of `after`."""
    reject_unknown(query, EVENTS_QUERY)
    wait_s = query_number(query, "wait_s", 0, WAIT_S_MAX) or 0.0
    limit = query_integer(query, "limit", 1, EVENTS_LIMIT_MAX, default=100)
    assert limit is not None
    types = [t for t in query.get("types", "").split(",") if t] or None
    return wait_s, limit, types


@routes.get("/v1/events")
async def list_events(request: web.Request) -> web.Response:
    """Events with seq > `after`, waiting up to `wait_s` for the first one."""
    query = request.query
    wait_s, limit, types = check_events_query(query)
    after = query_integer(query, "after", 0, 2**63 - 1, default=0)
    assert after is not None
    body, headers = await events_answer(request, after, types, limit, wait_s)
    return json_response(body, headers=headers)


async def events_answer(
    request: web.Request, after: int, types: list[str] | None, limit: int, wait_s: float
) -> tuple[dict[str, Any], dict[str, str]]:
    """The events of this group's outbox after `after`, as `GET /v1/events`
    answers them, waiting up to `wait_s` for the first one."""
    headers = await prepare_read(request)
    node = node_of(request)
    principal = principal_of(request)
    deadline = time.monotonic() + wait_s
    while True:
        # Wait on the event for the *next* applied entry before reading, so
        # that an entry applied between the read and the wait is not missed.
        changed = node.changed()
        with node.reading() as state:
            if principal.tenants is None:
                found = outbox.events_after(state, after, types, limit)
            else:
                found = scoped_events(principal, state, after, types, limit)
            body = {
                "events": [event_json(event) for event in found],
                "last_seq": outbox.last_seq(state),
                "first_seq": outbox.first_held_seq(state),
            }
        remaining = deadline - time.monotonic()
        if found or remaining <= 0:
            return body, headers
        await changed.wait_s(remaining)


def scoped_events(
    principal: Principal, state: State, after: int, types: list[str] | None, limit: int
) -> list[OutboxEvent]:
    """Up to `limit` events after `after` that the caller may see. Like a
    type filter, it reads past the events it leaves out, page by page."""
    found: list[OutboxEvent] = []
    while len(found) < limit:
        page = outbox.events_after(state, after, types, limit)
        if not page:
            break
        found.extend(scope.filter_events(principal, page))
        after = page[-1].seq
    return found[:limit]


# -- subscriptions ----------------------------------------------------------------


def _subscriptions_scope(request: web.Request) -> None:
    scope.require_all_tenants(request, "a subscription")


def subscription_json(
    state: State, sub: Subscription, now_ms: int, connected: bool | None, full: bool = False
) -> dict[str, Any]:
    """`sub` as the API shows it; `now_ms` is the answering node's clock
    (its lag), `connected` its relay's (None: unknown here)."""
    oldest_ms = oldest_undelivered_at_ms(state, sub)
    body: dict[str, Any] = {
        "id": sub.id,
        "url": sub.url,
        "types": list(sub.types),
        "created_at": format_ms(sub.created_at_ms),
        "cursor_seq": sub.cursor,
        "oldest_undelivered_at": time_or_none(oldest_ms),
        "parked_count": len(sub.parked),
        "parked_dropped": sub.parked_dropped,
        "lag_events": lag_events(state, sub),
        "lag_s": age_s(oldest_ms, now_ms),
        "connected": connected,
    }
    # Since cluster version 10, shown only when set: a webhook's answer is as before.
    if sub.sink is not None:
        body["sink"] = redacted(sub.sink)
    if sub.tenants:
        body["tenants"] = list(sub.tenants)
    if sub.key_field is not None:
        body["key_field"] = sub.key_field
    if full:
        body["parked"] = [
            {
                "event": event_json(item.event),
                "attempts": item.attempts,
                "error": item.error,
                "parked_at": format_ms(item.parked_at_ms),
                "retry": item.retry,
            }
            for item in sub.parked.values()
        ]
    return body


def _connected(request: web.Request) -> Callable[[str], bool | None]:
    relays = request.app.get(RELAY_STATUS)
    return (lambda _: None) if relays is None else relays.connected


def _read_subscription(request: web.Request, subscription_id: str) -> dict[str, Any]:
    node = node_of(request)
    connected = _connected(request)
    now_ms = node.now_ms()
    with node.reading() as state:
        sub = subscriptions(state).get(subscription_id)
        if sub is None:
            raise ApiError("not_found", f"no subscription {subscription_id}")
        return subscription_json(state, sub, now_ms, connected(sub.id), full=True)


WEBHOOK_FIELDS = frozenset({"id", "url", "types", "secret", "sink", "tenants", "key_field"})
BROKER_FIELDS = frozenset({"id", "types", "sink", "tenants", "key_field"})


@routes.post("/v1/subscriptions")
async def create_subscription(request: web.Request) -> web.Response:
    _subscriptions_scope(request)
    body = require_object(await read_json(request))
    sink = _sink(body.get("sink"))
    if sink is None:
        reject_unknown(body, WEBHOOK_FIELDS)
        url, secret = await _webhook(request, body)
    else:
        reject_unknown(body, BROKER_FIELDS)
        url, secret = "", ""
    types = body.get("types")
    if types is None:
        types = []
    if (
        not isinstance(types, list)
        or len(types) > TYPES_MAX
        or not all(isinstance(t, str) and 0 < len(t) <= EVENT_TYPE_CHARS_MAX for t in types)
    ):
        raise invalid("types", f"must be a list of at most {TYPES_MAX} event types")
    tenants = _tenants(body.get("tenants"))
    key_field = string(body, "key_field", length_max=KEY_FIELD_CHARS_MAX)
    subscription_id = string(body, "id") or node_of(request).new_id("sub")
    command = CreateSubscription(
        subscription_id, url, tuple(sorted(set(types))), secret, sink, tenants, key_field
    )
    result = await propose_audited(request, command, SubscriptionCreated)
    answer = {"subscription": _read_subscription(request, subscription_id)}
    return json_response(answer, status=201 if result.created else 200)


async def _webhook(request: web.Request, body: Mapping[str, Any]) -> tuple[str, str]:
    """A webhook's checked url and secret."""
    url = string(body, "url", required=True, length_max=URL_CHARS_MAX)
    assert url is not None
    if not url.startswith(("http://", "https://")):
        raise invalid("url", "must be an http:// or https:// URL")
    refused = await request.app[WEBHOOK_TARGETS].check_url(url)
    if refused is not None:
        raise ApiError(
            "invalid_request",
            f"url: not an allowed webhook target: {refused}",
            {"field": "url", "reason": "forbidden_target"},
        )
    secret = string(body, "secret", required=True, length_max=SECRET_CHARS_MAX)
    assert secret is not None
    return url, secret


def _sink(raw: object) -> Sink | None:
    """The request's broker sink; None for a webhook (no `sink`, or kind
    `webhook`). 400 naming the field for a malformed one, 422
    `sink_unavailable` when this node lacks the kind's client library."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise invalid("sink", "must be a JSON object")
    kind = raw.get("kind")
    if kind == "webhook":
        if set(raw) != {"kind"}:
            raise invalid("sink", "a webhook sink has only its kind (url and secret are top-level)")
        return None
    if not isinstance(kind, str) or kind not in SINK_OPTIONS:
        raise invalid("sink.kind", f"must be one of webhook, {', '.join(SINK_KINDS)}")
    options = {name: value for name, value in raw.items() if name != "kind"}
    for name, value in options.items():
        if name not in SINK_OPTIONS[kind]:
            raise invalid(f"sink.{name}", f"a {kind} sink has no option {name}")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise invalid(f"sink.{name}", "must be a string or an integer")
    sink = make_sink(kind, options)
    rejected = check_sink(sink)
    if rejected is not None:
        field = str(rejected.details.get("field", "sink"))
        raise ApiError("invalid_request", rejected.message, {"field": field})
    extra = missing_extra(kind)
    if extra is not None:
        raise ApiError(
            "sink_unavailable",
            f"this node lacks the {kind} client library: install raftsched[{extra}]",
            {"field": "sink.kind", "extra": extra},
        )
    return sink


def _tenants(raw: object) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if (
        not isinstance(raw, list)
        or len(raw) > TENANTS_MAX
        or not all(isinstance(t, str) and 0 < len(t) <= 256 for t in raw)
    ):
        raise invalid("tenants", f"must be a list of at most {TENANTS_MAX} tenant names")
    return tuple(sorted(set(raw))) or None


@routes.get("/v1/subscriptions")
async def list_subscriptions(request: web.Request) -> web.Response:
    reject_unknown(request.query, frozenset({"consistency"}))
    _subscriptions_scope(request)
    headers = await prepare_read(request)
    node = node_of(request)
    connected = _connected(request)
    now_ms = node.now_ms()
    with node.reading() as state:
        found = [
            subscription_json(state, sub, now_ms, connected(sub.id))
            for sub in subscriptions(state).values()
        ]
    return json_response({"subscriptions": found}, headers=headers)


@routes.get("/v1/subscriptions/{subscription_id}")
async def get_subscription(request: web.Request) -> web.Response:
    _subscriptions_scope(request)
    headers = await prepare_read(request)
    subscription_id = path_id(request.match_info["subscription_id"], "subscription_id")
    return json_response(
        {"subscription": _read_subscription(request, subscription_id)}, headers=headers
    )


@routes.delete("/v1/subscriptions/{subscription_id}")
async def delete_subscription(request: web.Request) -> web.Response:
    _subscriptions_scope(request)
    subscription_id = path_id(request.match_info["subscription_id"], "subscription_id")
    await propose_audited(request, DeleteSubscription(subscription_id), Ack)
    return web.Response(status=204)


@routes.post("/v1/subscriptions/{subscription_id}/retry")
async def retry_parked(request: web.Request) -> web.Response:
    """Operator action: deliver the subscription's parked events once more."""
    _subscriptions_scope(request)
    subscription_id = path_id(request.match_info["subscription_id"], "subscription_id")
    result = await propose_audited(request, RetryParked(subscription_id), ParkedRetried)
    return json_response({"retried": result.count})
