"""Cluster status, health, readiness, metrics and the OpenAPI description."""

from __future__ import annotations

import asyncio
import json
from importlib import resources
from typing import Any

from aiohttp import web

from raftsched.api import scope
from raftsched.api.jsonbody import json_response
from raftsched.api.membership import cluster_membership, peer_statuses, pending_nodes
from raftsched.api.requests import node_of
from raftsched.api.shard_routing import SHARD_ROUTER, ShardRouter
from raftsched.core.events.subscriptions import subscriptions
from raftsched.core.jobs.queries import packed_count
from raftsched.core.jobs.quota_book import quotas_of
from raftsched.core.kernel import shard as core_shard
from raftsched.node.metrics import CONTENT_TYPE
from raftsched.node.shard_view import settings_digest, settings_of
from raftsched.node.sink_libraries import missing_extra
from raftsched.node.versions import THIS_NODE
from raftsched.node.view import NodeView
from raftsched.shards import SHARD_HEADER

# How long /readyz waits for this replica to apply what was committed when the
# request arrived: a replica that is applying gets there in milliseconds.
READY_CATCH_UP_S = 1.0

routes = web.RouteTableDef()


@routes.get("/v1/cluster")
async def cluster(request: web.Request) -> web.Response:
    node = node_of(request)
    status = node.status()
    leader = node.leader()
    urls = node.http_urls
    statuses = peer_statuses(node, status)
    nodes = [
        {
            "id": node.node_id,
            "raft_address": node.raft_address,
            "http_url": node.http_url,
            "role": status.role,
            "reachable": True,
            "match_index": None,
            "version": THIS_NODE.as_json(),
            "status": "removed" if node.removed else "member",
        }
    ]
    for peer in status.peers:
        heard = node.peer_version(peer.id)
        role = "leader" if leader is not None and leader.id == peer.id else "follower"
        nodes.append(
            {
                "id": peer.id,
                "raft_address": peer.raft_address,
                "http_url": urls.get(peer.id),
                "role": role if peer.reachable else "unknown",
                "reachable": peer.reachable,
                "match_index": peer.match_index,
                "version": None if heard is None else heard.as_json(),
                "status": statuses[peer.id],
            }
        )
    nodes += pending_nodes(request, status)
    membership = cluster_membership(request, status)
    body: dict[str, Any] = {
        "node_id": node.node_id,
        "leader": None if leader is None else {"id": leader.id, "http_url": leader.http_url},
        "term": status.term,
        "commit_index": status.commit_index,
        "applied_index": status.applied_index,
        "cluster_version": node.cluster_version(),
        "cluster_id": node.cluster_id(),
        "shard_identity": _shard_identity(node),
        "shard_settings": _shard_settings(node),
        "nodes": nodes,
        "membership": membership,
        "sinks_unavailable": sinks_unavailable(node),
    }
    router = request.app.get(SHARD_ROUTER)
    if router is not None:  # a node of several shards (docs/shards.md)
        shards = await router.cluster_shards(request)
        body["shards"] = shards
        if SHARD_HEADER not in request.headers:
            body["group_cluster_version"] = body["cluster_version"]
            body["cluster_version"] = lowest_cluster_version(shards)
            membership["shards_behind"] = shards_behind(router, shards)
    return json_response(body)


def sinks_unavailable(node: NodeView) -> list[dict[str, str]]:
    """The broker subscriptions of this node's group that it cannot relay:
    their sink's client library, an optional extra, is not installed here
    (docs/relays.md, section 1). While it leads, their events wait (nothing
    is parked) and its relay logs it once at error level; a follower names
    them too, for the day it leads. In a node of several shards, group 0's
    subscriptions are every shard's (each shard holds a copy of each) and
    its shard processes share its libraries."""
    with node.reading() as state:
        kinds = [(sub.id, sub.sink.kind) for sub in subscriptions(state).values() if sub.sink]
    found = []
    for sub_id, kind in kinds:
        extra = missing_extra(kind)
        if extra is not None:
            found.append({"subscription": sub_id, "kind": kind, "extra": extra})
    return found


def shards_behind(router: ShardRouter, shards: list[dict[str, Any]]) -> list[int]:
    """The shards whose members are not yet group 0's (docs/shards.md,
    section 5): a membership change is done when this is empty. A shard
    that does not answer is behind as far as this node can tell."""
    wanted = router.wanted_members()
    if wanted is None:
        return []
    return [
        entry["shard"]
        for entry in shards[1:]
        if entry.get("members") is None or set(entry["members"]) != set(wanted)
    ]


def lowest_cluster_version(shards: list[dict[str, Any]]) -> int:
    """The cluster version of a cluster of several shards (docs/shards.md,
    section 5): the lowest of its groups', as this node's replicas know
    them. A shard whose process does not answer (`down`) has no version
    here and is left out; group 0's is always known. Each group still gates
    its own commands by its own version."""
    versions = [entry.get("cluster_version") for entry in shards]
    return min(version for version in versions if type(version) is int)


def _shard_identity(node: NodeView) -> dict[str, int] | None:
    """The shard this group recorded it is (`SetShard`, docs/shards.md), or
    None: a one-shard cluster, or a group that has not recorded it yet."""
    with node.reading() as state:
        recorded = core_shard.identity(state)
    return None if recorded is None else {"index": recorded[0], "count": recorded[1]}


def _shard_settings(node: NodeView) -> dict[str, object] | None:
    """What a group of a sharded cluster holds of the settings group 0
    records (node.shard_settings): a digest of its queue and tenant settings
    and subscriptions (a shard is in line when its digest is group 0's) and
    the round of its quotas; None before it recorded its shard."""
    with node.reading() as state:
        if core_shard.identity(state) is None:
            return None
        digest = settings_digest(settings_of(state))
        quota_round = quotas_of(state).round
    return {"digest": digest, "quota_round": quota_round}


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok", "node_id": node_of(request).node_id})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    """Ready when a leader is known and this replica has applied everything
    up to the commit index it knew of when the request arrived (the
    leader's, as the leader last told it; see RaftStatus).

    Under a steady write load the applied index trails the known commit
    index by an entry for a few milliseconds at a time (the leader announces
    a commit before it applies it), so comparing the two at one instant
    answered 503 on healthy nodes. A replica that is applying gets up to
    `READY_CATCH_UP_S` to reach that index; one that cannot is not ready.

    A replica that stopped applying at an entry it cannot decode is never
    ready, and says where and why (`halted`); one whose disk is full is not
    ready until there is room, and names the file (`disk_full`). A node of
    several shards is ready only when each of its shard processes' replicas
    is too, and names those that are not (`shards_not_ready`); each group of
    such a node is ready only once it has recorded which shard it is
    (`shard_identity: null` until then).
    """
    node = node_of(request)
    if node.removed:
        status = node.status()
        body: dict[str, object] = {
            "ready": False,
            "removed": True,
            "leader_id": status.leader_id,
            "commit_index": status.commit_index,
            "applied_index": status.applied_index,
        }
        return json_response(body, status=503)
    halted = node.halted
    if halted is not None:
        status = node.status()
        body = {
            "ready": False,
            "leader_id": status.leader_id,
            "commit_index": status.commit_index,
            "applied_index": status.applied_index,
            "halted": {"index": halted.index, "reason": halted.reason},
        }
        return json_response(body, status=503)
    status = node.status()
    # A follower's own commit index stops at the end of its log: one being
    # sent a snapshot, or the entries after one, would look caught up by it.
    # The leader's commit index, as the leader last said it, is the target.
    target = max(status.commit_index, status.leader_commit_index or 0)
    deadline = asyncio.get_running_loop().time() + READY_CATCH_UP_S
    while status.leader_id is not None and status.applied_index < target:
        remaining_s = deadline - asyncio.get_running_loop().time()
        if remaining_s <= 0:
            break
        await node.changed().wait_s(remaining_s)
        status = node.status()
    # A full disk: this node acknowledges no write until there is room
    # (docs/operations.md, "Disk full"); a load balancer should go elsewhere.
    disk_full = node.disk_full
    ready = status.leader_id is not None and status.applied_index >= target and not disk_full
    body = {
        "ready": ready,
        "leader_id": status.leader_id,
        "commit_index": status.commit_index,
        "applied_index": status.applied_index,
        # Whether requests need a bearer token on this replica (node.auth).
        "auth": "on" if node.auth_enabled() else "off",
    }
    if disk_full:
        body["disk_full"] = disk_full
    if node.shards > 1 and _shard_identity(node) is None:
        # A group of a sharded cluster that has not recorded its shard yet
        # (`SetShard`, cluster version 9) still runs at a lower version and
        # refuses what needs it: not ready (docs/shards.md).
        ready = False
        body["ready"] = False
        body["shard_identity"] = None
    router = request.app.get(SHARD_ROUTER)
    if router is not None:
        # A node of several shards is ready when every local replica is.
        not_ready = await router.not_ready()
        if not_ready:
            ready = False
            body["ready"] = False
            body["shards_not_ready"] = not_ready
    return json_response(body, status=200 if ready else 503)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    """Every tenant's and queue's series: only for callers of every tenant."""
    scope.require_all_tenants(request, "/metrics")
    return web.Response(
        body=node_of(request).metrics.render(),
        headers={"Content-Type": CONTENT_TYPE, "X-Content-Type-Options": "nosniff"},
    )


@routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    text = resources.files("raftsched").joinpath("static/openapi.json").read_text("utf-8")
    return json_response(json.loads(text))


@routes.get("/v1/debug/digest")
async def digest(request: web.Request) -> web.Response:
    """The state digest and applied index of this replica, for convergence checks."""
    node = node_of(request)
    value, applied = node.digest()
    with node.reading() as state:
        packed = packed_count(state)
    return json_response(
        {"node_id": node.node_id, "digest": value, "applied_index": applied, "packed_jobs": packed}
    )
