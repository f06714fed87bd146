"""Who is asking: the principal a request acts as.

The authentication middleware (issue 15) puts the caller's `Principal` on
the request; handlers ask `principal_of(request)` what it may see and do. Until
a cluster's first admin token is committed, authentication is off and every
request acts as `ANONYMOUS`, an admin over every tenant and queue, exactly as
every request did before tokens existed.

This module only describes the caller. Which permission each route needs,
and how a bearer secret becomes a principal, live with the middleware.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Final

from aiohttp import web


class Role(enum.StrEnum):
    """The roles of `docs/api.md`, most powerful first."""

    ADMIN = "admin"
    OPERATOR = "operator"
    SUBMITTER = "submitter"
    WORKER = "worker"
    VIEWER = "viewer"


# `tenants: ["*"]` / `queues: ["*"]` in a token record.
ALL: Final = "*"


@dataclass(frozen=True, slots=True)
class Principal:
    """The identity a request acts as, and its scope."""

    # None for ANONYMOUS (authentication is off).
    token_id: str | None
    name: str
    role: Role
    # None means every tenant (`["*"]`); otherwise exactly these.
    tenants: frozenset[str] | None
    # None means every queue (`["*"]`); otherwise exactly these.
    queues: frozenset[str] | None

    @property
    def authenticated(self) -> bool:
        return self.token_id is not None

    @property
    def all_tenants(self) -> bool:
        return self.tenants is None

    def sees_tenant(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants

    def may_use_queue(self, queue: str) -> bool:
        return self.queues is None or queue in self.queues

    @property
    def actor(self) -> str:
        """How history and the audit trail name this caller: the token's
        name and id (never a request header)."""
        if self.token_id is None:
            return self.name
        return f"{self.name} ({self.token_id})"


ANONYMOUS: Final = Principal(
    token_id=None, name="anonymous", role=Role.ADMIN, tenants=None, queues=None
)

_PRINCIPAL_KEY: Final = web.RequestKey("principal", Principal)


def set_principal(request: web.Request, principal: Principal) -> None:
    """Called once per request by the authentication middleware."""
    request[_PRINCIPAL_KEY] = principal


def principal_of(request: web.Request) -> Principal:
    """The caller of `request`; `ANONYMOUS` while authentication is off."""
    principal: Principal = request.get(_PRINCIPAL_KEY, ANONYMOUS)
    return principal


def principal_if_set(request: web.Request) -> Principal | None:
    """The principal authentication put on `request`, or None (a public
    route, or no check made)."""
    principal: Principal | None = request.get(_PRINCIPAL_KEY)
    return principal


# -- between a node process and its shard processes (docs/shards.md) -----------


def encode_principal(principal: Principal) -> str:
    """The principal as the node process tells a shard process (ASCII JSON)."""
    return json.dumps(
        {
            "token_id": principal.token_id,
            "name": principal.name,
            "role": str(principal.role),
            "tenants": None if principal.tenants is None else sorted(principal.tenants),
            "queues": None if principal.queues is None else sorted(principal.queues),
        },
        separators=(",", ":"),
    )


def decode_principal(text: str) -> Principal:
    """`encode_principal`'s principal; ValueError if `text` is not one."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("not an object")
    token_id, name = raw.get("token_id"), raw.get("name")
    if not (token_id is None or isinstance(token_id, str)) or not isinstance(name, str):
        raise ValueError("token_id or name is not a string")
    return Principal(
        token_id=token_id,
        name=name,
        role=Role(str(raw.get("role"))),
        tenants=_names(raw.get("tenants")),
        queues=_names(raw.get("queues")),
    )


def _names(value: object) -> frozenset[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError("not a list of names")
    return frozenset(value)
