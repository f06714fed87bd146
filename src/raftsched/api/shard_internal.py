"""A shard process's internal routes: what its node process asks of it to
bring the shard in line with group 0 (docs/shards.md, section 4;
`node.shard_settings`).

- `POST /v1/internal/shard/view` `{"queues": [...], "tenants": [...],
  "digest": ...}`: this replica's view (`node.shard_view.view`): whether it
  leads, its shard identity and cluster version, its quotas, its settings
  and subscriptions (secrets only as SHA-256; left out when their digest is
  the one given), and the demand of the named queues and tenants. Read
  from the replica as it is (a stale read).
- `POST /v1/internal/shard/propose` `{"commands": [...]}`: proposes the
  commands (only the kinds `node.shard_view.ALIGNING` lists: settings,
  subscriptions and the shard's quotas) one after the other, as the node's
  own duties do, and answers each one's outcome; 503 `no_leader` when this
  replica does not lead.

Both exist only in a shard process, whose one listener is the Unix socket
its node process talks to (mode 0600), and both need the node's key
(`shards.internal_key`, a MAC under the cluster secret) in
`Raftsched-Internal-Key`: a node process has no such route, so a client's
request never reaches them, and the node strips the header from what it
forwards.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any, Final

from aiohttp import web

from raftsched.api.errors import ApiError, invalid
from raftsched.api.jsonbody import json_response
from raftsched.api.requests import node_of, read_json
from raftsched.api.validation import require_object
from raftsched.core.kernel.results import Rejected
from raftsched.node.proposer import NotCommitted, NotLeader, OutcomeUnknown
from raftsched.node.shard_view import command_from_json, view
from raftsched.node.versions import UpgradeRequired
from raftsched.shards import INTERNAL_KEY_HEADER, INTERNAL_PREFIX

# Not the public API (no client reaches them): not `routes`, nor in openapi.json.
internal_routes = web.RouteTableDef()

INTERNAL_KEY: Final = web.AppKey("internal_key", str)
# Names a view may ask the demand of, and commands one request may carry.
VIEW_NAMES_MAX: Final = 8_192
COMMANDS_MAX: Final = 256


def admit_internal(request: web.Request) -> bool:
    """For a request under `/v1/internal/`: True once its key is the node's
    (else 401); False for any other route."""
    if not request.path.startswith(INTERNAL_PREFIX):
        return False
    presented = request.headers.get(INTERNAL_KEY_HEADER, "")
    expected = request.app.get(INTERNAL_KEY)
    if not expected or not hmac.compare_digest(presented.encode(), expected.encode()):
        raise ApiError("unauthenticated", "a shard process's internal routes are its node's")
    return True


def _names(body: Mapping[str, Any], field: str) -> list[str]:
    value = body.get(field, [])
    if not isinstance(value, list) or len(value) > VIEW_NAMES_MAX:
        raise invalid(field, f"{field} is a list of at most {VIEW_NAMES_MAX} names")
    if not all(isinstance(name, str) for name in value):
        raise invalid(field, f"{field} is a list of names")
    return value


@internal_routes.post("/v1/internal/shard/view")
async def shard_view(request: web.Request) -> web.Response:
    body = require_object(await read_json(request))
    queues, tenants = _names(body, "queues"), _names(body, "tenants")
    known = body.get("digest")
    if known is not None and not isinstance(known, str):
        raise invalid("digest", "digest is a string")
    node = node_of(request)
    leader = node.is_leader
    with node.reading() as state:
        answer = view(state, leader=leader, queues=queues, tenants=tenants, known_digest=known)
    return json_response(answer)


@internal_routes.post("/v1/internal/shard/propose")
async def shard_propose(request: web.Request) -> web.Response:
    body = require_object(await read_json(request))
    raw = body.get("commands")
    if not isinstance(raw, list) or len(raw) > COMMANDS_MAX:
        raise invalid("commands", f"commands is a list of at most {COMMANDS_MAX}")
    try:
        commands = [command_from_json(item) for item in raw]
    except (ValueError, TypeError) as error:
        raise invalid("commands", str(error)) from None
    node = node_of(request)
    if not node.is_leader:
        raise ApiError("no_leader", "this replica of the shard does not lead it")
    outcomes: list[dict[str, Any]] = []
    for command in commands:
        try:
            result = await node.propose(command, bounded=False)
        except NotLeader:
            raise ApiError("no_leader", "this replica of the shard no longer leads it") from None
        except UpgradeRequired as refused:
            outcomes.append({"ok": False, "code": "upgrade_first", "message": str(refused)})
            continue
        except (NotCommitted, OutcomeUnknown) as error:
            outcomes.append({"ok": False, "code": "outcome_unknown", "message": repr(error)})
            break  # the next pass reads the shard again
        if isinstance(result, Rejected):
            outcomes.append({"ok": False, "code": result.code, "message": result.message})
        else:
            outcomes.append({"ok": True})
    return json_response({"outcomes": outcomes})
