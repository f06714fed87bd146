"""API tokens: `/v1/tokens` (admin) and `/v1/whoami` (any valid token).

A secret is drawn here (node.auth.new_secret), answered once by the create,
and only its SHA-256 is proposed. Reads of tokens are linearizable (leader
and barrier) unless `consistency=stale`; a revocation is a committed write.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web

from raftsched.api.errors import ApiError, invalid
from raftsched.api.jsonbody import json_response
from raftsched.api.principal import ALL, ANONYMOUS, principal_of
from raftsched.api.requests import node_of, prepare_read, propose_audited, read_json
from raftsched.api.validation import (
    instant_ms,
    path_id,
    reject_unknown,
    require_object,
    string,
)
from raftsched.core.auth.commands import CreateToken, RevokeToken
from raftsched.core.auth.tokens import ROLES, SCOPE_MAX, Token, get_token, list_tokens
from raftsched.core.kernel.results import TokenSaved
from raftsched.node.auth import hash_secret, new_secret
from raftsched.timefmt import format_ms

routes = web.RouteTableDef()

CREATE_FIELDS = frozenset({"name", "role", "tenants", "queues", "expires_at"})


def render_token(token: Token) -> dict[str, Any]:
    """A token as the API shows it: never its secret, nor the secret's hash."""

    def at(ms: int | None) -> str | None:
        return None if ms is None else format_ms(ms)

    return {
        "id": token.id,
        "name": token.name,
        "role": token.role,
        "tenants": list(token.tenants),
        "queues": list(token.queues),
        "created_at": format_ms(token.created_at_ms),
        "expires_at": at(token.expires_at_ms),
        "revoked_at": at(token.revoked_at_ms),
        "last_used_at": at(token.last_used_at_ms),
    }


def _scope(body: Any, name: str) -> tuple[str, ...]:
    value = body.get(name, [ALL])
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= SCOPE_MAX
        or not all(isinstance(item, str) and 0 < len(item) <= 200 for item in value)
    ):
        raise invalid(name, f'must be a list of 1 to {SCOPE_MAX} names, or ["*"]')
    if len(set(value)) != len(value):
        raise invalid(name, "must not repeat a name")
    if ALL in value and len(value) != 1:
        raise invalid(name, '"*" means all and stands alone')
    return tuple(value)


def _token_json(request: web.Request, token_id: str) -> dict[str, Any]:
    with node_of(request).reading() as state:
        token = get_token(state, token_id)
        if token is None:
            raise ApiError("not_found", f"no token {token_id}", {"token_id": token_id})
        return render_token(token)


@routes.post("/v1/tokens")
async def create_token(request: web.Request) -> web.Response:
    body = require_object(await read_json(request))
    reject_unknown(body, CREATE_FIELDS)
    name = string(body, "name", required=True)
    role = string(body, "role", required=True)
    assert name is not None and role is not None
    if role not in ROLES:
        raise invalid("role", f"must be one of {', '.join(ROLES)}")
    tenants = _scope(body, "tenants")
    queues = _scope(body, "queues")
    expires_at_ms = instant_ms(body, "expires_at")
    node = node_of(request)
    if expires_at_ms is not None and expires_at_ms <= node.now_ms():
        raise invalid("expires_at", "must be in the future")
    secret = new_secret()
    command = CreateToken(
        node.new_id("tok"), name, role, tenants, queues, hash_secret(secret), expires_at_ms
    )
    saved = await propose_audited(request, command, TokenSaved)
    return json_response(
        {"token": _token_json(request, saved.token_id), "secret": secret}, status=201
    )


@routes.get("/v1/tokens")
async def get_tokens(request: web.Request) -> web.Response:
    reject_unknown(request.query, frozenset({"consistency"}))
    headers = await prepare_read(request)
    with node_of(request).reading() as state:
        tokens: Sequence[Token] = list_tokens(state)
        body = {"tokens": [render_token(token) for token in tokens]}
    return json_response(body, headers=headers)


@routes.get("/v1/tokens/{token_id}")
async def get_one_token(request: web.Request) -> web.Response:
    reject_unknown(request.query, frozenset({"consistency"}))
    headers = await prepare_read(request)
    token_id = path_id(request.match_info["token_id"], "token_id")
    return json_response({"token": _token_json(request, token_id)}, headers=headers)


@routes.delete("/v1/tokens/{token_id}")
async def revoke_token(request: web.Request) -> web.Response:
    token_id = path_id(request.match_info["token_id"], "token_id")
    if not token_id.startswith("tok_"):
        raise ApiError("not_found", f"no token {token_id}", {"token_id": token_id})
    await propose_audited(request, RevokeToken(token_id), TokenSaved)
    return json_response({"token": _token_json(request, token_id)})


@routes.get("/v1/whoami")
async def whoami(request: web.Request) -> web.Response:
    """The caller's token; while authentication is off, the anonymous admin."""
    principal = principal_of(request)
    if principal is ANONYMOUS or principal.token_id is None:
        return json_response(
            {
                "token": None,
                "principal": {"name": principal.name, "role": str(principal.role)},
                "auth": "off",
            }
        )
    return json_response({"token": _token_json(request, principal.token_id), "auth": "on"})
