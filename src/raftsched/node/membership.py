"""Membership changes, the node's part: the directory, the leader's driver, retiring.

Theory of operation (the core's part is `core.membership.members`). A change
is two entries. First the core command (`AddMember`, `RemoveMember`), which
records the intent in the replicated directory: every node learns each
member's HTTP URL from it, and a removed node learns that it was removed.
Then the Raft configuration change, which the leader derives from the
directory: `Driver` compares the directory with pysyncobj's configuration
and proposes the one difference, one change at a time (`RaftNode.
change_membership`). A leader that fails between the two leaves the
directory ahead of the configuration; the next leader's driver finishes the
change. So the directory is what the cluster wants and pysyncobj's
configuration follows it.

Safety rules, as etcd's strict reconfiguration check has them:

- One change at a time: a request while the directory and the configuration
  differ, while a configuration entry is uncommitted, or while a member this
  leader added has not caught up (its match index has not reached the
  commit index the add committed at) answers 409 `invalid_state`.
  pysyncobj has no learners: a new member counts towards the majority the
  moment its entry is appended, and until it has the log a 3-node cluster
  grown to 4 needs 3 of its first 3. Refusing the next change until it has
  caught up keeps a second change from stacking on that risk.
- An add needs as many reachable voters (this leader and the peers it hears
  from) as the grown cluster's majority; a remove needs the remaining
  members' majority reachable. Otherwise the change could leave the cluster
  without a majority (409 `invalid_state`, reason `quorum_at_risk`).
- Removing a follower: the driver waits (up to `REMOVE_NOTICE_S`) until the
  follower has the `RemoveMember` entry and has heard that it committed, so
  that it learns it was removed and retires before pysyncobj stops talking
  to it.
- Removing the leader: pysyncobj cannot remove its own leader. The leader
  retires (`RaftNode.retire`): it hands leadership to its most caught-up
  follower and never stands again; the new leader's driver removes it.

A node that finds itself removed in its caught-up replica retires and stops
serving (the API answers 503 `unavailable`, reason `node_removed`; `/readyz`
503). Its peers drop its vote requests (`RaftNode.refuse_votes_from`), and
once pysyncobj dropped it, its connections are closed unread: it never
raises the cluster's term again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from raftsched.config import Peer
from raftsched.core.kernel.state import State
from raftsched.core.membership.commands import Member
from raftsched.core.membership.members import (
    changes_applied,
    is_removed,
    members,
    removed_addresses,
    removed_members,
)
from raftsched.raft import RaftNode, RaftStatus

log = logging.getLogger("raftsched.node.membership")

# How often the leader's driver compares the directory with the configuration.
DRIVE_PERIOD_S: Final = 0.1
# How long a removed follower is given to learn of its removal before the
# configuration drops it (it usually takes one heartbeat, 0.1 s).
REMOVE_NOTICE_S: Final = 2.0
# How long after a follower has the RemoveMember entry the driver waits for
# the commit to reach it too (a heartbeat period and some).
COMMIT_NOTICE_S: Final = 0.3


def majority(voters: int) -> int:
    return voters // 2 + 1


@dataclass(frozen=True, slots=True)
class Change:
    """The membership change in progress, as `GET /v1/cluster` shows it."""

    kind: str  # "add" | "remove"
    node_id: str
    raft_address: str
    http_url: str | None
    # "configuring": the Raft configuration does not follow the directory yet;
    # "catching_up": the new member is in the configuration, without the log.
    phase: str

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "id": self.node_id,
            "raft_address": self.raft_address,
            "http_url": self.http_url,
            "phase": self.phase,
        }


class Directory:
    """Who the members are as this node knows them: the replicated directory
    once the cluster has changed its membership, else the start-up flags."""

    def __init__(self, self_member: Member, peers: tuple[Peer, ...]) -> None:
        self.self_member = self_member
        self.flags = (self_member, *(Member(p.id, p.raft_address, p.http_url) for p in peers))
        self.members: tuple[Member, ...] = self.flags
        self.replicated = False
        self.removed_here = False  # this node was removed
        self.refused: frozenset[str] = frozenset()
        self.removed: dict[str, str] = {}  # removed id -> its Raft address
        self._changes_seen = -1

    def moved(self, state: State) -> bool:
        """Whether `refresh` of this (our own) state could find a change."""
        return changes_applied(state) != self._changes_seen

    def refresh(self, state: State, *, ours: bool = True) -> bool:
        """Read the replicated directory (caller holds the state); whether it
        changed. `ours=False`: the state is a restored one that still names
        the old cluster, whose directory lists the old cluster's machines;
        until the new cluster renames it (which drops that directory) the
        flags are the members."""
        changes = changes_applied(state) if ours else 0
        if changes == self._changes_seen:
            return False
        self._changes_seen = changes
        if not changes:
            self.members, self.replicated = self.flags, False
            self.removed_here, self.refused, self.removed = False, frozenset(), {}
            return True
        self.members = members(state)
        self.replicated = True
        self.removed_here = is_removed(state, self.self_member.node_id)
        self.refused = removed_addresses(state)
        self.removed = removed_members(state)
        return True

    def by_id(self) -> dict[str, Member]:
        return {member.node_id: member for member in self.members}

    def http_urls(self) -> dict[str, str]:
        urls = {member.node_id: member.http_url for member in self.members}
        urls.setdefault(self.self_member.node_id, self.self_member.http_url)
        return urls

    def peer_urls(self) -> dict[str, str]:
        urls = self.http_urls()
        urls.pop(self.self_member.node_id, None)
        return urls

    def ids_by_address(self) -> dict[str, str]:
        return {member.raft_address: member.node_id for member in self.members}

    def names_by_address(self) -> dict[str, str]:
        """Members' and removed nodes' ids by Raft address (members win)."""
        names = {address: node_id for node_id, address in self.removed.items()}
        return names | self.ids_by_address()


class ChangeRefused(Exception):
    """A change that must not start now; `reason` is the API's detail."""

    def __init__(self, message: str, reason: str, details: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.reason = reason
        self.details = dict(details or {})


class NodeState(Protocol):
    """What the driver needs of its node."""

    @property
    def is_leader(self) -> bool: ...

    def status(self) -> RaftStatus: ...


class Driver:
    """The leader's side: checks a change before it is proposed, makes the
    Raft configuration follow the directory, and says what is in progress."""

    def __init__(self, raft: RaftNode, directory: Directory, loop: asyncio.AbstractEventLoop):
        self.raft = raft
        self.directory = directory
        self.loop = loop
        # Held while a request's change is proposed and configured.
        self.request_lock = asyncio.Lock()
        self._pending: asyncio.Future[str | None] | None = None  # a configuration entry
        self._pending_change: tuple[str, str] | None = None  # (action, address)
        # Members this leader added that have not caught up: id -> commit
        # index they must reach.
        self._catching_up: dict[str, int] = {}
        self._remove_seen: dict[str, tuple[float, int]] = {}  # address -> (when, commit)
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    # -- leadership -----------------------------------------------------------

    def start(self, term: int) -> None:
        self.stop()
        self._catching_up.clear()
        self._remove_seen.clear()
        self._task = self.loop.create_task(self._drive(term))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def close(self) -> None:
        self.stop()

    def wake(self) -> None:
        self._wake.set()

    # -- what is in progress --------------------------------------------------

    def change(self, status: RaftStatus) -> Change | None:
        """The change in progress as this node sees it (the leader knows
        best: only it knows whether a new member has caught up)."""
        wanted = self.directory.by_id()
        configured = {peer.raft_address: peer.id for peer in status.peers}
        configured[self.raft.raft_address] = self.raft.node_id
        if not self.directory.replicated:
            return None
        for member in wanted.values():
            if member.raft_address not in configured:
                return Change(
                    "add", member.node_id, member.raft_address, member.http_url, "configuring"
                )
        ids = self.directory.ids_by_address()
        for address, node_id in sorted(configured.items()):
            if address not in ids:
                return Change("remove", node_id, address, None, "configuring")
        self._forget_caught_up(status)
        for node_id in sorted(self._catching_up):
            joined = wanted.get(node_id)
            if joined is not None:
                return Change("add", node_id, joined.raft_address, joined.http_url, "catching_up")
        return None

    def joining(self, status: RaftStatus) -> list[str]:
        """Ids of members this leader added that have not caught up yet."""
        self._forget_caught_up(status)
        return sorted(self._catching_up)

    def _forget_caught_up(self, status: RaftStatus) -> None:
        if status.role != "leader":
            self._catching_up.clear()
            return
        match = {peer.id: peer.match_index for peer in status.peers}
        for node_id, target in list(self._catching_up.items()):
            index = match.get(node_id)
            if node_id not in match or (index is not None and index >= target):
                del self._catching_up[node_id]

    # -- checks before a change is proposed -----------------------------------

    def check_can_change(self, status: RaftStatus) -> None:
        if self._pending is not None:
            raise ChangeRefused(
                "a membership change is in progress; one change at a time",
                "change_in_progress",
            )
        change = self.change(status)
        if change is not None:
            raise ChangeRefused(
                "a membership change is in progress; one change at a time",
                "change_in_progress",
                {"change": change.as_json()},
            )

    def check_quorum_for_add(self, status: RaftStatus) -> None:
        voters = 1 + len(status.peers)
        reachable = 1 + sum(1 for peer in status.peers if peer.reachable)
        if reachable < majority(voters + 1):
            raise ChangeRefused(
                f"adding a member would need {majority(voters + 1)} of {voters + 1} voters, "
                f"and only {reachable} are reachable; bring the others back (or remove a dead "
                "one) first",
                "quorum_at_risk",
                {"reachable": reachable, "voters": voters},
            )

    def check_quorum_for_remove(self, status: RaftStatus, node_id: str) -> None:
        remaining = [peer for peer in status.peers if peer.id != node_id]
        voters = len(remaining) + (0 if node_id == self.raft.node_id else 1)
        reachable = sum(1 for peer in remaining if peer.reachable)
        reachable += 0 if node_id == self.raft.node_id else 1
        if voters and reachable < majority(voters):
            raise ChangeRefused(
                f"after the removal {majority(voters)} of {voters} voters are needed and only "
                f"{reachable} are reachable",
                "quorum_at_risk",
                {"reachable": reachable, "voters": voters},
            )

    # -- waiting for a request's change ---------------------------------------

    async def wait_configured(self, address: str, adding: bool, timeout_s: float) -> bool:
        """Wait until the configuration has (or, removing, lacks) the Raft
        address; whether it did within `timeout_s`."""
        deadline = self.loop.time() + timeout_s
        while self.loop.time() < deadline:
            status = self.raft.status()
            addresses = {peer.raft_address for peer in status.peers}
            present = address in addresses or address == self.raft.raft_address
            if present == adding and self._pending is None:
                return True
            if address == self.raft.raft_address and status.role != "leader":
                return True  # handed over; the next leader removes this node
            await asyncio.sleep(0.05)
        return False

    # -- the driver -----------------------------------------------------------

    async def _drive(self, term: int) -> None:
        while True:
            self._wake.clear()
            try:
                await self._step()
            except Exception:
                log.exception("membership driver step failed; trying again")
                await asyncio.sleep(1.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), DRIVE_PERIOD_S)

    async def _step(self) -> None:
        if self._pending is not None or not self.directory.replicated:
            return
        status = self.raft.status()
        if status.role != "leader" or self.raft.retired:
            return
        wanted = self.directory.ids_by_address()
        configured = {peer.raft_address: peer for peer in status.peers}
        for address in sorted(set(configured) - set(wanted)):
            if self._removal_noticed(address, configured[address].reachable, status):
                await self._configure("remove", address, configured[address].id, status)
            return
        for address in sorted(set(wanted) - set(configured) - {self.raft.raft_address}):
            await self._configure("add", address, wanted[address], status)
            return

    def _removal_noticed(self, address: str, reachable: bool, status: RaftStatus) -> bool:
        """Whether a follower being removed has had its chance to learn it."""
        now = time.monotonic()
        seen_at, commit_index = self._remove_seen.setdefault(address, (now, status.commit_index))
        if not reachable or now - seen_at >= REMOVE_NOTICE_S:
            return True
        match = next((p.match_index for p in status.peers if p.raft_address == address), None)
        return match is not None and match >= commit_index and now - seen_at >= COMMIT_NOTICE_S

    async def _configure(self, action: str, address: str, node_id: str, status: RaftStatus) -> None:
        future: asyncio.Future[str | None] = self.loop.create_future()

        def done(error: str | None) -> None:
            self.loop.call_soon_threadsafe(_settle, future, error)

        self._pending = future
        self._pending_change = (action, address)
        log.info("raft configuration: %s %s (%s)", action, node_id, address)
        try:
            self.raft.change_membership(action, address, done)
            error = await future
        finally:
            self._pending = None
            self._pending_change = None
        if error is not None:
            # Denied while an earlier change or this term's first entry is
            # uncommitted: the next step tries again.
            log.info(
                "raft configuration %s %s not committed (%s); trying again", action, node_id, error
            )
            await asyncio.sleep(0.2)
            return
        self._remove_seen.pop(address, None)
        log.info("raft configuration committed: %s %s", action, node_id)
        if action == "add":
            self._catching_up[node_id] = self.raft.status().commit_index


def _settle(future: asyncio.Future[str | None], error: str | None) -> None:
    if not future.done():
        future.set_result(error)
