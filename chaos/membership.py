"""The nemesis's membership operations: add, remove and replace a node
through the admin API (docs/api.md, "Membership (admin)"), each request an
operation in the nemesis history (`member_add`, `member_remove`), and the
waits around them.

A change the API refuses is a definite `fail` with its reason
(`change_in_progress`: retried a few times; `quorum_at_risk`: skipped;
`cluster_version`/"upgrade every node first" while a member still runs the
previous release: expected, recorded as such). A request whose answer was
lost (`info`) is resolved by asking the leader whether the change is in its
membership, and that resolution is noted (`member_outcome`) so that the
checker knows what the cluster should end with.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from chaos.cluster import NsCluster, NsNode
from chaos.history import Recorder
from chaos.httpops import Outcome, Session
from raftsched.testing import http_json

MEMBERSHIP_VERSION: Final = 4  # the cluster version of AddMember/RemoveMember
RETRIES_MAX: Final = 4
RETRY_PAUSE_S: Final = 2.0
SETTLE_S: Final = 60.0
REQUEST_BUDGET_S: Final = 30.0
RESOLVE_S: Final = 30.0  # how long a lost answer's resolution asks the leader, each round
RESOLVE_ROUNDS: Final = 3
REQUEST_SEND_TIMEOUT_S: Final = 15.0  # the API waits up to 10 s for the configuration


def view(cluster: NsCluster, node_id: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    return cluster.cluster_view(node_id, timeout_s=timeout_s)


def leader_view(cluster: NsCluster) -> dict[str, Any] | None:
    leader = cluster.leader_id()
    return None if leader is None else view(cluster, leader)


def settled_leader_view(cluster: NsCluster) -> dict[str, Any] | None:
    """The leader's view once everything committed before is applied there.

    A change whose answer was lost when leadership moved may still be in the
    new leader's log, uncommitted: Raft commits an earlier term's entries
    only with the new term's first one. A linearizable read makes the leader
    commit a barrier of its own term first, so afterwards the change is
    either applied in its view or can never commit. Without it the nemesis
    once noted a removal as refused that committed a moment later."""
    leader = cluster.leader_id()
    if leader is None:
        return None
    try:
        status, _, _ = http_json(
            "GET",
            cluster.nodes[leader].http_url + "/v1/jobs?limit=1&consistency=linearizable",
            timeout_s=5.0,
            context=cluster.ssl_context,
            token=cluster.admin_token,
        )
    except OSError:
        return None
    return view(cluster, leader) if status == 200 else None


def _already(outcome: Outcome, request: str) -> bool | None:
    """A repeated change refused as already done: whether the node is a
    member (an add: it is; a removal: it is not), else None."""
    if outcome.kind != "fail":
        return None
    if request == "remove" and outcome.status == 404:
        return False
    if request == "add" and outcome.status == 409 and _reason(outcome) == "duplicate_id":
        return True
    return None


def _evidence(found: dict[str, Any] | None) -> dict[str, Any] | None:
    """What of the leader's view a lost answer was resolved by, for the
    history: who answered, in which term at which index, its nodes and its
    membership (a resolution the end state contradicts can be read back)."""
    if found is None:
        return None
    return {
        "node_id": found.get("node_id"),
        "term": found.get("term"),
        "commit_index": found.get("commit_index"),
        "applied_index": found.get("applied_index"),
        "leader": (found.get("leader") or {}).get("id"),
        "nodes": [
            {key: node.get(key) for key in ("id", "raft_address", "role", "status")}
            for node in found.get("nodes", [])
        ],
        "membership": found.get("membership"),
    }


def members_in(found: dict[str, Any]) -> list[str]:
    """The ids a /v1/cluster answer lists as members (any status but removed)."""
    return sorted(n["id"] for n in found.get("nodes", []) if n.get("status") != "removed")


def settled(cluster: NsCluster) -> bool:
    """The leader reports no change in progress and every node a plain
    member; sharded, also no shard behind group 0's members and none with a
    change of its own in progress (`view_settled`)."""
    return view_settled(leader_view(cluster))


def view_settled(found: dict[str, Any] | None) -> bool:
    """`settled` of one `GET /v1/cluster` answer (the leader's)."""
    if found is None:
        return False
    membership = found.get("membership") or {}
    # A node of the previous release reports no status (no membership changes).
    statuses = {n.get("status", "member") for n in found.get("nodes", [])}
    if membership.get("change") is not None or not statuses <= {"member"}:
        return False
    return not shards_unsettled(found)


def shards_unsettled(found: dict[str, Any]) -> dict[str, Any]:
    """What keeps a sharded cluster's change from being done, as one node's
    `GET /v1/cluster` tells it (docs/shards.md section 5): the shards whose
    members are not group 0's yet (`membership.shards_behind`, which lists a
    shard whose process does not answer too), and those with a change of
    their own in progress. Empty when settled, and for one shard."""
    shards = found.get("shards")
    if not shards:
        return {}
    unsettled: dict[str, Any] = {}
    behind = (found.get("membership") or {}).get("shards_behind")
    if behind is None or behind:
        unsettled["shards_behind"] = behind
    changing = {
        str(entry["shard"]): entry.get("membership_change")
        for entry in shards[1:]
        if entry.get("membership_change") is not None
    }
    if changing:
        unsettled["shard_changes"] = changing
    return unsettled


def wait_settled(cluster: NsCluster, stop: threading.Event, timeout_s: float = SETTLE_S) -> bool:
    """Until `settled`, at most `timeout_s` (sharded: every group has the
    change before the next fault starts)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if settled(cluster):
            return True
        if stop.wait(0.5):
            return settled(cluster)
    return False


def unsettled_detail(cluster: NsCluster) -> dict[str, Any]:
    """Why the leader's view is not settled (for the record of a change
    that did not settle in time)."""
    found = leader_view(cluster)
    if found is None:
        return {"leader_view": None}
    membership = found.get("membership") or {}
    statuses = {n["id"]: n.get("status") for n in found.get("nodes", [])}
    return {
        "change": membership.get("change"),
        "statuses": {i: s for i, s in statuses.items() if s not in (None, "member")},
        **shards_unsettled(found),
    }


def cluster_version(cluster: NsCluster, wait_s: float = 10.0) -> int | None:
    """The leader's cluster version, waiting up to `wait_s` for a leader
    (None if there is none by then)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = leader_view(cluster)
        if found is not None:
            version = found.get("cluster_version")
            return None if version is None else int(version)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.5)


def _reason(outcome: Outcome) -> str:
    error = outcome.body.get("error")
    if not isinstance(error, dict):
        return outcome.error or ""
    details = error.get("details") or {}
    reason = details.get("reason") if isinstance(details, dict) else None
    return str(reason or error.get("message") or error.get("code"))


class Changes:
    """One membership request at a time, recorded in the nemesis history."""

    def __init__(self, cluster: NsCluster, history: Recorder, stop: threading.Event) -> None:
        self.cluster = cluster
        self.history = history
        self.stop = stop

    def _session(self) -> Session:
        return Session(self.cluster.member_urls())

    def _request(self, f: str, method: str, path: str, body: Any, value: dict[str, Any]) -> Outcome:
        version = cluster_version(self.cluster)
        op = self.history.invoke(f, {**value, "cluster_version_seen": version})
        outcome = self._session().call(
            method, path, body, idempotent=False, budget_s=REQUEST_BUDGET_S,
            send_timeout_s=REQUEST_SEND_TIMEOUT_S,
        )  # fmt: skip
        self.history.complete(
            op, outcome.kind, f,
            {"status": outcome.status, "body": outcome.body, "error": outcome.error,
             "reason": _reason(outcome) if outcome.kind != "ok" else None},
        )  # fmt: skip
        return outcome

    def _retrying(
        self, f: str, method: str, path: str, body: Any, value: dict[str, Any]
    ) -> Outcome:
        """Retried while another change is in progress (expected: one at a time)."""
        outcome = self._request(f, method, path, body, value)
        for _ in range(RETRIES_MAX):
            if outcome.kind != "fail" or _reason(outcome) != "change_in_progress":
                break
            if self.stop.wait(RETRY_PAUSE_S):
                break
            wait_settled(self.cluster, self.stop, 10.0)
            outcome = self._request(f, method, path, body, value)
        return outcome

    def add(self, node: NsNode) -> bool:
        """Ask to add `node`; whether it is a member now (info resolved)."""
        body = {"id": node.id, "raft_address": node.raft_address, "http_url": node.http_url}
        outcome = self._retrying("member_add", "POST", "/v1/cluster/nodes", body, dict(body))
        if outcome.kind == "info":
            return self._settle_lost(
                node.id, "add", lambda: self._request(
                    "member_add", "POST", "/v1/cluster/nodes", body, dict(body)
                ),
            )  # fmt: skip
        return outcome.kind == "ok"

    def remove(self, node_id: str) -> bool:
        """Ask to remove `node_id`; whether it is removed now (info resolved)."""
        path = f"/v1/cluster/nodes/{node_id}"
        outcome = self._retrying("member_remove", "DELETE", path, None, {"id": node_id})
        if outcome.kind == "info":
            return not self._settle_lost(
                node_id, "remove",
                lambda: self._request("member_remove", "DELETE", path, None, {"id": node_id}),
            )  # fmt: skip
        return outcome.kind == "ok"

    def _settle_lost(self, node_id: str, request: str, again: Callable[[], Outcome]) -> bool:
        """A change whose answer was lost: whether `node_id` is a member now.

        Asked of the leader (`_resolve`). While no leader answers (an election
        storm can outlast the wait), the request is made again, as an
        operator would: a repeat of a change that committed is refused as
        already done (the node is, or is not, a member: definite), and one
        that did not commit is made now. What stays unknown is noted as
        `member: None`, and the checker judges that node by no side: it
        was not assumed to have taken effect (a SEED=7 sharded run once
        assumed a removal that no log held)."""
        for attempt in range(RESOLVE_ROUNDS):
            member = self._resolve(node_id, request)
            if member is not None:
                return member
            if attempt == RESOLVE_ROUNDS - 1 or self.stop.is_set():
                break
            wait_settled(self.cluster, self.stop, SETTLE_S)
            outcome = again()
            done = _already(outcome, request)
            if done is not None:
                self.history.note(
                    "member_outcome",
                    {"id": node_id, "member": done, "request": request, "view": "repeat refused"},
                )
                return done
            if outcome.kind == "ok":
                return request == "add"
            if outcome.kind == "fail" and _reason(outcome) != "change_in_progress":
                break  # refused for another reason: unknown, as it was
        self.history.note(
            "member_outcome", {"id": node_id, "member": None, "request": request, "view": None}
        )
        return request != "add"

    def _resolve(self, node_id: str, request: str) -> bool | None:
        """Whether `node_id` is in the leader's membership, asked until a
        leader answers (at most `RESOLVE_S`); noted, for the checker. None
        when no leader answered."""
        deadline = time.monotonic() + RESOLVE_S
        while time.monotonic() < deadline:
            found = settled_leader_view(self.cluster)
            if found is not None:
                member = node_id in members_in(found)
                self.history.note(
                    "member_outcome",
                    {"id": node_id, "member": member, "request": request, "view": _evidence(found)},
                )
                return member
            if self.stop.wait(0.5):
                break
        return None

    def retire(self, node: NsNode) -> None:
        """A removed node that kept running: note what it says of itself
        (removed, its term) beside the members' term, then stop it, as an
        operator would (docs/operations.md)."""
        own = view(self.cluster, node.id) if node.alive else None
        members = leader_view(self.cluster)
        self.history.note(
            "retired",
            {
                "node": node.id,
                "answered": own is not None,
                "removed": None if own is None else (own.get("membership") or {}).get("removed"),
                "term": None if own is None else own.get("term"),
                "members_term": None if members is None else members.get("term"),
            },
        )
        self.stop_with_shards(node, signal.SIGTERM)

    def stop_with_shards(self, node: NsNode, signum: int) -> None:
        """Stop a node that leaves the cluster (removed, or the victim of a
        replacement); sharded, note its shard processes and those that
        outlived it (`shard_processes_gone`: checker 13 wants none)."""
        found = self.cluster.kill_with_shards(node.id, signum)
        if self.cluster.shards > 1:
            self.history.note("shard_processes_gone", {"node": node.id, **found})

    def ready(self, node: NsNode, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                status, _, _ = http_json("GET", node.http_url + "/readyz", timeout_s=2)
            except OSError:
                status = 0
            if status == 200:
                return True
            if self.stop.wait(0.5):
                return False
        return False
