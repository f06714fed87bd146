"""The node's part of the cluster's identity (the core's is `core.kernel.identity`).

Theory of operation. Every Raft message this node sends carries its stamp,
(cluster id or None, node id, incarnation), from its data directory's
identity file (`raftsched.identity`). Every stamped message it receives
passes `IdentityGate.admits` on the tick thread before pysyncobj sees it:

- a sender whose cluster id differs from this node's (both known) holds
  another cluster's data: refused (reason `cluster`);
- a sender whose incarnation differs from the one the replicated state
  recorded for its node id came back with a lost or replaced data
  directory: refused (reason `incarnation`). Its vote, its acknowledgement
  and its candidacy all count for nothing, so it cannot help elect a second
  leader in a term it already voted in.

A message without a stamp (a node of release 0.3.0, during a rolling
upgrade) is admitted: such a cluster has no id yet and records nothing,
since the commands that would need every node to decode them wait for the
cluster version (4). Refused messages are counted
(`raftsched_raft_messages_refused_total`) and logged at most once a minute
per sender and reason.

The refused node learns it from its peers' `GET /v1/time` answers, which
carry their identity and the incarnations they hold (`PeerIdentity`): when a
majority of the cluster says it is another cluster, or that its node id
runs under another incarnation, it logs why and exits (`refusal`), with
`EXIT_FOREIGN_DATA` or `EXIT_INCARNATION_REFUSED`. A minority never makes a
node exit: a healthy node that sees one foreign peer keeps running.

The leader records what it learns (`leader_duties`): the cluster id when the
state has none (drawn at random, or the one a restored data directory was
given), then each member's incarnation as first heard in an admitted
message.

Recorded incarnations count only while the state's cluster id is the one
this data directory belongs to (`effective_incarnations`). A restored
cluster starts from a state that still names the old cluster and its
members' incarnations; until its first leader renames it (which forgets
them) its new members must not refuse each other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from raftsched.core.kernel import identity as core_identity
from raftsched.core.kernel.commands import Command, RecordIncarnation, SetClusterId
from raftsched.core.kernel.state import State
from raftsched.identity import (
    EXIT_FOREIGN_DATA,
    EXIT_INCARNATION_REFUSED,
    NodeIdentity,
    new_id,
)
from raftsched.node.metrics import NodeMetrics

log = logging.getLogger("raftsched.node")

REFUSAL_LOG_PERIOD_S: Final = 60.0
RUNBOOK: Final = "docs/operations.md, 'A node whose data directory was lost'"
FOREIGN_RUNBOOK: Final = "docs/operations.md, 'A data directory of another cluster'"


def effective_incarnations(state: State, mine: NodeIdentity) -> Mapping[str, str]:
    """The incarnations this node holds its peers to (see the module doc)."""
    cluster = core_identity.cluster_id(state)
    if cluster is None or (mine.cluster_id is not None and mine.cluster_id != cluster):
        return {}
    return core_identity.incarnations(state)


class IdentityGate:
    """Stamps outgoing Raft messages and admits incoming ones (the
    `raft.MessageGate` of this node). `admits` runs on the tick thread, the
    only thread that changes the state, so it reads the state unlocked."""

    def __init__(
        self, mine: NodeIdentity, state: Callable[[], State], metrics: NodeMetrics
    ) -> None:
        self._state = state
        self._metrics = metrics
        self._logged_at: dict[tuple[str, str], float] = {}
        # node id -> incarnation, from admitted messages (for the leader to record).
        self.heard: dict[str, str] = {}
        self.identity = mine

    @property
    def identity(self) -> NodeIdentity:
        return self._identity

    @identity.setter
    def identity(self, mine: NodeIdentity) -> None:
        self._identity = mine
        self._stamp = (mine.cluster_id, mine.node_id, mine.incarnation)

    def stamp(self) -> object:
        return self._stamp

    def admits(self, stamp: object) -> bool:
        if not (
            isinstance(stamp, tuple)
            and len(stamp) == 3
            and all(isinstance(part, str) for part in stamp[1:])
            and (stamp[0] is None or isinstance(stamp[0], str))
        ):
            return self._refuse("?", "malformed", f"a malformed identity stamp {stamp!r}")
        cluster, node_id, incarnation = stamp
        mine = self._identity
        if cluster is not None and mine.cluster_id is not None and cluster != mine.cluster_id:
            return self._refuse(
                node_id,
                "cluster",
                f"its data directory belongs to cluster {cluster}, this one is "
                f"{mine.cluster_id} ({FOREIGN_RUNBOOK})",
            )
        known = effective_incarnations(self._state(), mine).get(node_id)
        if known is not None and known != incarnation:
            return self._refuse(
                node_id,
                "incarnation",
                f"it runs under incarnation {incarnation} but the cluster recorded {known}: "
                f"its data directory was lost or replaced, and with it the votes it cast; "
                f"it may rejoin only as a new member ({RUNBOOK})",
            )
        if self.heard.get(node_id) != incarnation:
            self.heard[node_id] = incarnation
        return True

    def _refuse(self, node_id: str, reason: str, why: str) -> bool:
        self._metrics.series(self._metrics.raft_messages_refused, reason).inc()
        now = time.monotonic()
        key = (node_id, reason)
        if now - self._logged_at.get(key, -REFUSAL_LOG_PERIOD_S) >= REFUSAL_LOG_PERIOD_S:
            self._logged_at[key] = now
            log.warning("refusing Raft messages from node %s: %s", node_id, why)
        return False


# -- what the peers say (GET /v1/time) ----------------------------------------


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    cluster_id: str | None
    node_id: str
    incarnation: str
    # The incarnations that peer holds its own peers to.
    incarnations: Mapping[str, str]


def as_json(mine: NodeIdentity, state: State) -> dict[str, Any]:
    """This node's part of its `GET /v1/time` answer."""
    return {
        "cluster_id": mine.cluster_id,
        "node_id": mine.node_id,
        "incarnation": mine.incarnation,
        "incarnations": dict(effective_incarnations(state, mine)),
    }


def from_answer(body: object) -> PeerIdentity | None:
    """A peer's identity from its `GET /v1/time` answer; None from a node of
    an earlier release (or an answer that is not one)."""
    raw = body.get("identity") if isinstance(body, dict) else None
    if not isinstance(raw, dict):
        return None
    cluster, node_id, incarnation = (
        raw.get("cluster_id"),
        raw.get("node_id"),
        raw.get("incarnation"),
    )
    members = raw.get("incarnations")
    if not (
        (cluster is None or isinstance(cluster, str))
        and isinstance(node_id, str)
        and isinstance(incarnation, str)
        and isinstance(members, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in members.items())
    ):
        return None
    return PeerIdentity(cluster, node_id, incarnation, members)


@dataclass(frozen=True, slots=True)
class Refusal:
    exit_status: int
    message: str


def refusal(
    mine: NodeIdentity, peers: Mapping[str, PeerIdentity | None], cluster_size: int
) -> Refusal | None:
    """Whether a majority of the cluster refuses this node: it names another
    cluster, or holds this node id to another incarnation."""
    majority = cluster_size // 2 + 1
    heard = [peer for peer in peers.values() if peer is not None and peer.cluster_id is not None]
    if mine.cluster_id is not None:
        others: dict[str, list[str]] = {}
        for peer in heard:
            if peer.cluster_id != mine.cluster_id:
                others.setdefault(str(peer.cluster_id), []).append(peer.node_id)
        for cluster, names in sorted(others.items()):
            if len(names) >= majority:
                return Refusal(
                    EXIT_FOREIGN_DATA,
                    f"this node's data directory belongs to cluster {mine.cluster_id}, but "
                    f"its peers {', '.join(sorted(names))} (a majority) are cluster {cluster}: "
                    f"it was started with another cluster's data and will not take part "
                    f"({FOREIGN_RUNBOOK})",
                )
    holding = [
        (peer.node_id, peer.incarnations[mine.node_id])
        for peer in heard
        if (mine.cluster_id is None or peer.cluster_id == mine.cluster_id)
        and peer.incarnations.get(mine.node_id, mine.incarnation) != mine.incarnation
    ]
    if len(holding) >= majority:
        recorded = sorted({incarnation for _, incarnation in holding})
        return Refusal(
            EXIT_INCARNATION_REFUSED,
            f"the cluster refuses node {mine.node_id}: its peers "
            f"{', '.join(sorted(name for name, _ in holding))} recorded it under incarnation "
            f"{', '.join(recorded)}, and this data directory is incarnation {mine.incarnation} "
            f"(new or replaced). The node that voted under this id has lost its votes; it "
            f"rejoins only as a new member: remove it, wipe this data directory, add it again "
            f"({RUNBOOK})",
        )
    return None


# -- what the leader records ---------------------------------------------------


def leader_duties(
    state: State, mine: NodeIdentity, heard: Mapping[str, str], members: Iterable[str]
) -> list[Command]:
    """The identity commands the leader should propose now (none once the
    cluster is named and every member heard from is recorded)."""
    cluster = core_identity.cluster_id(state)
    if cluster is None:
        return [SetClusterId(mine.cluster_id or new_id("clu"))]
    if mine.cluster_id is not None and cluster != mine.cluster_id:
        if mine.restored_from == cluster:
            return [SetClusterId(mine.cluster_id, previous=cluster)]
        return []  # not ours to rename; `refusal` and the gate deal with it
    recorded = core_identity.incarnations(state)
    incarnations = {**heard, mine.node_id: mine.incarnation}
    return [
        RecordIncarnation(node_id, incarnations[node_id])
        for node_id in sorted(set(members) & set(incarnations))
        if node_id not in recorded
    ]
