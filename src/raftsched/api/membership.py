"""Membership (admin): `POST /v1/cluster/nodes`, `DELETE /v1/cluster/nodes/{id}`.

Writes go to the leader (a follower redirects). The leader checks that no
other change is in progress and that the change keeps a majority reachable
(`node.membership.Driver`), proposes the core command (`AddMember`,
`RemoveMember`; cluster version 4, so a mixed cluster answers 409
"upgrade every node first"), and answers 202 once the Raft configuration
follows it, or, removing itself, once it has handed leadership over.
`status` in the answer says how far the change got within
`CONFIGURE_TIMEOUT_S`: `configured`, `handed_over`, or `configuring` (the
record is committed and the leader's driver carries on).
"""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from raftsched.api.errors import ApiError, invalid
from raftsched.api.jsonbody import json_response
from raftsched.api.requests import node_of, propose_audited, read_json
from raftsched.api.validation import path_id, reject_unknown, require_object, string
from raftsched.core.kernel.results import Ack
from raftsched.core.membership.commands import AddMember, Member, RemoveMember
from raftsched.core.membership.members import check_address, check_url
from raftsched.node.membership import ChangeRefused
from raftsched.node.proposer import NotLeader
from raftsched.node.view import NodeView
from raftsched.raft import RaftStatus

routes = web.RouteTableDef()

ADD_FIELDS: Final = frozenset({"id", "raft_address", "http_url"})
# How long a request waits for the Raft configuration to follow the record.
CONFIGURE_TIMEOUT_S: Final = 10.0


def _refused(error: ChangeRefused) -> ApiError:
    return ApiError("invalid_state", str(error), {"reason": error.reason, **error.details})


def _in_progress() -> ApiError:
    return ApiError(
        "invalid_state",
        "a membership change is in progress; one change at a time",
        {"reason": "change_in_progress"},
    )


def _known(request: web.Request) -> tuple[Member, ...]:
    """What the first change records besides itself (core.membership)."""
    directory = node_of(request).directory
    return () if directory.replicated else tuple(directory.members)


def _change(kind: str, member: Member, status: str) -> dict[str, Any]:
    return {
        "change": {
            "kind": kind,
            "id": member.node_id,
            "raft_address": member.raft_address,
            "http_url": member.http_url,
            "status": status,
        }
    }


def cluster_membership(request: web.Request, status: RaftStatus) -> dict[str, Any]:
    """`GET /v1/cluster`'s `membership`: the change in progress, the members
    that joined and have not caught up, the directory's members not in the
    Raft configuration yet, and whether this node was removed."""
    node = node_of(request)
    driver = node.membership
    change = driver.change(status)
    configured = {peer.id for peer in status.peers} | {node.node_id}
    return {
        "change": None if change is None else change.as_json(),
        "joining": driver.joining(status),
        "pending": sorted(set(node.directory.by_id()) - configured),
        "recorded": node.directory.replicated,
        "removed": node.removed,
    }


def peer_statuses(node: NodeView, status: RaftStatus) -> dict[str, str]:
    """Each peer's membership status by id: "joining" (added, without the log
    yet), "removing" (out of the directory, still in the Raft
    configuration) or "member"."""
    joining = set(node.membership.joining(status))
    members = node.directory.by_id()

    def one(peer_id: str) -> str:
        if members and peer_id not in members:
            return "removing"
        return "joining" if peer_id in joining else "member"

    return {peer.id: one(peer.id) for peer in status.peers}


def pending_nodes(request: web.Request, status: RaftStatus) -> list[dict[str, Any]]:
    """Members of the directory that the Raft configuration lacks (being added)."""
    node = node_of(request)
    configured = {peer.id for peer in status.peers} | {node.node_id}
    return [
        {
            "id": member.node_id,
            "raft_address": member.raft_address,
            "http_url": member.http_url,
            "role": "unknown",
            "reachable": False,
            "match_index": None,
            "version": None,
            "status": "adding",
        }
        for member in node.directory.members
        if member.node_id not in configured
    ]


@routes.post("/v1/cluster/nodes")
async def add_node(request: web.Request) -> web.Response:
    body = require_object(await read_json(request))
    reject_unknown(body, ADD_FIELDS)
    node_id = path_id(string(body, "id", required=True) or "", "id")
    raft_address = string(body, "raft_address", required=True) or ""
    http_url = (string(body, "http_url", required=True, length_max=2000) or "").rstrip("/")
    for rejected in (check_address(raft_address, "raft_address"), check_url(http_url, "http_url")):
        if rejected is not None:
            raise invalid(str(rejected.details["field"]), rejected.message)
    node = node_of(request)
    if not node.is_leader:
        raise NotLeader()
    driver = node.membership
    if driver.request_lock.locked():
        raise _in_progress()
    member = Member(node_id, raft_address, http_url)
    async with driver.request_lock:
        status = node.status()
        try:
            driver.check_can_change(status)
            driver.check_quorum_for_add(status)
        except ChangeRefused as error:
            raise _refused(error) from None
        command = AddMember(node_id, raft_address, http_url, _known(request))
        await propose_audited(request, command, Ack)
        driver.wake()
        done = await driver.wait_configured(raft_address, True, CONFIGURE_TIMEOUT_S)
    return json_response(
        _change("add", member, "configured" if done else "configuring"), status=202
    )


@routes.delete("/v1/cluster/nodes/{node_id}")
async def remove_node(request: web.Request) -> web.Response:
    node_id = path_id(request.match_info["node_id"], "id")
    node = node_of(request)
    if not node.is_leader:
        raise NotLeader()
    member = node.directory.by_id().get(node_id)
    if member is None:
        raise ApiError("not_found", f"node {node_id} is not a member", {"id": node_id})
    driver = node.membership
    if driver.request_lock.locked():
        raise _in_progress()
    async with driver.request_lock:
        status = node.status()
        try:
            driver.check_can_change(status)
            driver.check_quorum_for_remove(status, node_id)
        except ChangeRefused as error:
            raise _refused(error) from None
        await propose_audited(request, RemoveMember(node_id, _known(request)), Ack)
        driver.wake()
        done = await driver.wait_configured(member.raft_address, False, CONFIGURE_TIMEOUT_S)
    if node_id == node.node_id:
        outcome = "handed_over" if done else "configuring"
    else:
        outcome = "configured" if done else "configuring"
    return json_response(_change("remove", member, outcome), status=202)
