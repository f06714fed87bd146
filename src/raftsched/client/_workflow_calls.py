"""Calls for workflows, the outbox (events), webhook subscriptions and the
audit trail.

Reads change nothing, so they are marked safe to repeat after an unknown outcome.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from raftsched.client._calls import (
    Call,
    Consistency,
    JsonObject,
    Response,
    _field,
    _json_object,
    _query,
    _segment,
)


def submit_workflow(request: Mapping[str, Any]) -> Call[JsonObject]:
    body = dict(request)
    keyed = body.get("idempotency_key") is not None
    return Call("POST", "/v1/workflows", _field("workflow"), body=body, retry_unknown=keyed)


def get_workflow(workflow_id: str, consistency: Consistency | None) -> Call[JsonObject]:
    path = f"/v1/workflows/{_segment(workflow_id)}"
    return Call("GET", path, _field("workflow"), _query(consistency), retry_unknown=True)


def list_workflows(
    status: str | None, tenant: str | None, limit: int | None, consistency: Consistency | None
) -> Call[JsonObject]:
    query = _query(consistency, status=status, tenant=tenant, limit=limit)
    return Call("GET", "/v1/workflows", _json_object, query, retry_unknown=True)


def workflow_history(workflow_id: str, consistency: Consistency | None) -> Call[list[JsonObject]]:
    path = f"/v1/workflows/{_segment(workflow_id)}/history"
    return Call("GET", path, _field("events"), _query(consistency), retry_unknown=True)


def cancel_workflow(workflow_id: str, reason: str | None) -> Call[JsonObject]:
    path = f"/v1/workflows/{_segment(workflow_id)}/cancel"
    body = {} if reason is None else {"reason": reason}
    # Cancelling twice is harmless: the second answers the same status.
    return Call("POST", path, _field("workflow"), body=body, retry_unknown=True)


def events(
    after: int | str,
    types: Sequence[str] | None,
    wait_s: float | None,
    limit: int | None,
    consistency: Consistency | None,
) -> Call[JsonObject]:
    joined = ",".join(types) if types else None
    query = _query(consistency, after=after, types=joined, wait_s=wait_s, limit=limit)
    return Call(
        "GET", "/v1/events", _json_object, query, retry_unknown=True, extra_timeout_s=wait_s or 0.0
    )


def audit(
    actor: str | None,
    kind: str | None,
    limit: int | None,
    cursor: str | None,
    consistency: Consistency | None,
) -> Call[JsonObject]:
    query = _query(consistency, actor=actor, kind=kind, limit=limit, cursor=cursor)
    return Call("GET", "/v1/audit", _json_object, query, retry_unknown=True)


def create_subscription(
    url: str, secret: str, types: Sequence[str], subscription_id: str | None
) -> Call[JsonObject]:
    body: JsonObject = {"url": url, "secret": secret, "types": list(types)}
    if subscription_id is not None:
        body["id"] = subscription_id
    keyed = subscription_id is not None
    return Call("POST", "/v1/subscriptions", _field("subscription"), body=body, retry_unknown=keyed)


def create_broker_subscription(
    sink: Mapping[str, Any],
    types: Sequence[str],
    subscription_id: str | None,
    tenants: Sequence[str] | None,
    key_field: str | None,
) -> Call[JsonObject]:
    body: JsonObject = {"sink": dict(sink), "types": list(types)}
    if subscription_id is not None:
        body["id"] = subscription_id
    if tenants is not None:
        body["tenants"] = list(tenants)
    if key_field is not None:
        body["key_field"] = key_field
    keyed = subscription_id is not None
    return Call("POST", "/v1/subscriptions", _field("subscription"), body=body, retry_unknown=keyed)


def list_subscriptions(consistency: Consistency | None) -> Call[list[JsonObject]]:
    return Call(
        "GET", "/v1/subscriptions", _field("subscriptions"), _query(consistency), retry_unknown=True
    )


def get_subscription(subscription_id: str, consistency: Consistency | None) -> Call[JsonObject]:
    path = f"/v1/subscriptions/{_segment(subscription_id)}"
    return Call("GET", path, _field("subscription"), _query(consistency), retry_unknown=True)


def _no_body(response: Response) -> None:
    return None


def delete_subscription(subscription_id: str) -> Call[None]:
    path = f"/v1/subscriptions/{_segment(subscription_id)}"
    return Call("DELETE", path, _no_body, retry_unknown=True)


def retry_parked(subscription_id: str) -> Call[JsonObject]:
    path = f"/v1/subscriptions/{_segment(subscription_id)}/retry"
    return Call("POST", path, _json_object, body={}, retry_unknown=True)


# --- API tokens (issue 15) ---------------------------------------------------------


def create_token(
    name: str,
    role: str,
    tenants: Sequence[str],
    queues: Sequence[str],
    expires_at: str | None,
) -> Call[JsonObject]:
    """`{"token": Token, "secret": "rsk_..."}`. Never repeated after an unknown
    outcome: a repeat would make a second token."""
    body: JsonObject = {
        "name": name,
        "role": role,
        "tenants": list(tenants),
        "queues": list(queues),
        "expires_at": expires_at,
    }
    return Call("POST", "/v1/tokens", _json_object, body=body, retry_unknown=False)


def list_tokens(consistency: Consistency | None) -> Call[list[JsonObject]]:
    return Call("GET", "/v1/tokens", _field("tokens"), _query(consistency), retry_unknown=True)


def get_token(token_id: str, consistency: Consistency | None) -> Call[JsonObject]:
    path = f"/v1/tokens/{_segment(token_id)}"
    return Call("GET", path, _field("token"), _query(consistency), retry_unknown=True)


def revoke_token(token_id: str) -> Call[JsonObject]:
    path = f"/v1/tokens/{_segment(token_id)}"
    return Call("DELETE", path, _field("token"), retry_unknown=True)


def whoami() -> Call[JsonObject]:
    return Call("GET", "/v1/whoami", _json_object, retry_unknown=True)
