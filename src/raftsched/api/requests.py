"""What every handler does with its request: find the node, read the body,
propose a command, make a read linearizable.

Handler modules import these from here, never from `api.app` or from each
other: `app` assembles the handlers, so it sits above them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from aiohttp import web

from raftsched.api import jsonbody
from raftsched.api.errors import ApiError, from_rejection, invalid
from raftsched.api.principal import principal_of
from raftsched.api.validation import require_object
from raftsched.core import COMMAND_VERSIONS
from raftsched.core.kernel.commands import Audited, Command
from raftsched.core.kernel.results import Rejected
from raftsched.limits import ACTOR_CHARS_MAX
from raftsched.node.proposer import NotCommitted, OutcomeUnknown
from raftsched.node.view import NodeView
from raftsched.shards import CURSORS_HEADER

NODE: web.AppKey[NodeView] = web.AppKey("node")
# The cluster version from which operator commands are proposed `Audited`.
AUDITED_SINCE = COMMAND_VERSIONS[Audited]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
R = TypeVar("R")


def node_of(request: web.Request) -> NodeView:
    return request.app[NODE]


# Set once a request's body was read (aiohttp keeps the bytes, but says it
# can read no more): a node of several shards reads a submission's body to
# place it, then its handler reads it again.
_BODY_READ = web.RequestKey("raftsched_body_read", bool)


def has_body(request: web.Request) -> bool:
    return request.can_read_body or request.get(_BODY_READ, False)


async def read_body(request: web.Request) -> bytes | None:
    """The request's body, read once however often asked; None without one."""
    if not has_body(request):
        return None
    raw = await request.read()
    request[_BODY_READ] = True
    return raw


async def read_json(request: web.Request) -> Any:
    raw = await read_body(request)
    if raw is None:
        raise invalid("body", "a JSON body is required")
    try:
        return jsonbody.loads(raw)
    except jsonbody.JsonError as error:
        raise invalid("body", f"not valid JSON: {error}") from None


async def optional_body(request: web.Request) -> Mapping[str, Any]:
    """The JSON object of a request whose body may be left out (then `{}`)."""
    if not has_body(request):
        return {}
    return require_object(await read_json(request))


def actor(request: web.Request, default: str) -> str:
    """Who asked for an operator action, as history and the audit trail record
    it: the caller's token (name and id). Only while authentication is off
    (no token) is the `Raftsched-Actor` header honoured, as before tokens
    existed, and `default` used without it."""
    principal = principal_of(request)
    if principal.authenticated:
        return principal.actor[:ACTOR_CHARS_MAX]
    return request.headers.get("Raftsched-Actor", "").strip()[:ACTOR_CHARS_MAX] or default


def body_bytes(request: web.Request) -> int:
    """What the request's body counts against the proposer's byte bound."""
    return request.content_length or 0


async def propose(
    request: web.Request, command: Command, expect: type[R], size_bytes: int = 0
) -> R:
    """Propose one command for the request and return its result, which the
    core answers with an `expect` unless it rejects the command; a rejection
    is raised as its HTTP error (`errors.from_rejection`)."""
    result = await node_of(request).propose(command, size_bytes)
    if isinstance(result, Rejected):
        raise from_rejection(result)
    assert isinstance(result, expect), result
    return result


def audited(request: web.Request, command: Command, default_actor: str = "api") -> Command:
    """An operator command as the node should propose it: wrapped in
    `Audited` (so the audit trail records who asked) once the cluster version
    in force is at least the one that introduced it; bare before, so that a
    replica of the previous release never meets a command it cannot decode."""
    if node_of(request).cluster_version() < AUDITED_SINCE:
        return command
    return Audited(actor(request, default_actor), command)


async def propose_audited(
    request: web.Request,
    command: Command,
    expect: type[R],
    size_bytes: int = 0,
    default_actor: str = "api",
) -> R:
    """`propose` for an operator command: audited (see `audited`). The
    answer is the inner command's."""
    return await propose(request, audited(request, command, default_actor), expect, size_bytes)


def cursors_wanted(request: web.Request) -> bool:
    """Whether a list's answer should name the cursor after each item: a
    node of several shards asks each shard so (`Raftsched-Cursors: each`),
    to merge their pages and continue each where its part ended."""
    return request.headers.get(CURSORS_HEADER) == "each"


def consistency(request: web.Request) -> str:
    value = request.query.get("consistency", "linearizable")
    if value not in ("linearizable", "stale"):
        raise invalid("consistency", "must be linearizable or stale")
    return value


async def prepare_read(request: web.Request) -> dict[str, str]:
    """Make a read linearizable (leader + barrier) unless the caller asked for a
    stale one; returns headers for the response."""
    node = node_of(request)
    if consistency(request) == "stale":
        with node.reading():
            return {"Raftsched-Applied-Index": str(node.status().applied_index)}
    try:
        await node.barrier()
    except (OutcomeUnknown, NotCommitted):
        # A read changes nothing, so an unconfirmed barrier is simply unavailability.
        raise ApiError(
            "unavailable",
            "leadership could not be confirmed; retry shortly",
            headers={"Retry-After": "1"},
        ) from None
    return {}
