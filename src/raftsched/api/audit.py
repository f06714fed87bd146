"""`GET /v1/audit`: the replicated audit trail of operator actions, newest first.

Each entry names who acted (the token's name and id; while authentication
is off, the `Raftsched-Actor` header or a default), what kind of action on
which target, the tenant it touched and a short detail. A caller scoped to
some tenants sees only their entries; an entry of no tenant (queue settings,
subscriptions) only a caller of every tenant sees (api.scope).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from raftsched.api.errors import invalid
from raftsched.api.jsonbody import json_response
from raftsched.api.principal import principal_of
from raftsched.api.requests import node_of, prepare_read
from raftsched.api.validation import query_integer, reject_unknown
from raftsched.core.kernel.audit import AuditEntry, audit_entries
from raftsched.limits import LIST_LIMIT_MAX
from raftsched.timefmt import format_ms

routes = web.RouteTableDef()


def entry_json(entry: AuditEntry) -> dict[str, Any]:
    return {
        "seq": entry.seq,
        "at": format_ms(entry.at_ms),
        "actor": entry.actor,
        "kind": entry.kind,
        "target": entry.target,
        "tenant": entry.tenant,
        "detail": entry.detail,
    }


@routes.get("/v1/audit")
async def list_audit(request: web.Request) -> web.Response:
    query = request.query
    reject_unknown(query, frozenset({"actor", "kind", "limit", "cursor", "consistency"}))
    limit = query_integer(query, "limit", 1, LIST_LIMIT_MAX, default=50)
    assert limit is not None
    cursor = query.get("cursor")
    if cursor is not None and not (cursor.isascii() and cursor.isdigit() and len(cursor) < 20):
        raise invalid("cursor", "not a cursor this API returned")
    headers = await prepare_read(request)
    principal = principal_of(request)
    with node_of(request).reading() as state:
        found, next_seq = audit_entries(
            state,
            actor=query.get("actor") or None,
            kind=query.get("kind") or None,
            tenants=principal.tenants,
            limit=limit,
            before_seq=None if cursor is None else int(cursor),
        )
    body = {
        "entries": [entry_json(entry) for entry in found],
        "next_cursor": None if next_seq is None else str(next_seq),
    }
    return json_response(body, headers=headers)
