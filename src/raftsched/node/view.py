"""The node as the layers above it see it: two narrow protocols.

`api/` and the webhook deliverer are written against these, not against
`service.Node`: what they may ask of the node is listed here, and nothing
else (its Raft adapter, proposer, clock or configuration) is in reach.
`StateView` is what the webhook deliverer needs; `NodeView` adds what the
HTTP API needs. `service.Node` satisfies both, which mypy checks where the
process hands the node to them (`raftsched.process`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from raftsched import core
from raftsched.core.kernel.commands import Command
from raftsched.core.kernel.results import Lease, Rejected, Result
from raftsched.node.backup import Backups
from raftsched.node.change import Change
from raftsched.node.membership import Directory, Driver
from raftsched.node.metrics import NodeMetrics
from raftsched.node.observability import Observer
from raftsched.node.series import SeriesRing
from raftsched.node.versions import NodeVersion, UpgradeRequired
from raftsched.raft import Halt, RaftStatus


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    id: str
    http_url: str | None


class StateView(Protocol):
    """The replicated state, its changes, and proposing while leader."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def metrics(self) -> NodeMetrics: ...

    def reading(self) -> AbstractContextManager[core.State]:
        """Hold the state still while the caller reads it."""
        ...

    def changed(self) -> Change:
        """Set at the next applied entry or leadership change (node.change)."""
        ...

    def now_ms(self) -> int:
        """The leader clock: the time a command proposed now is stamped with."""
        ...

    async def propose(
        self, command: Command, size_bytes: int = 0, *, bounded: bool = True
    ) -> Result: ...


class NodeView(StateView, Protocol):
    """Everything the HTTP API asks of its node."""

    @property
    def node_id(self) -> str: ...

    @property
    def http_url(self) -> str:
        """This node's advertised HTTP URL."""
        ...

    @property
    def raft_address(self) -> str: ...

    @property
    def http_urls(self) -> Mapping[str, str]:
        """Every member's advertised HTTP URL (this node's too), by node id."""
        ...

    @property
    def observer(self) -> Observer: ...

    @property
    def series(self) -> SeriesRing:
        """This node's hour of per-queue figures for the dashboard's charts."""
        ...

    def status(self) -> RaftStatus: ...

    def leader(self) -> LeaderInfo | None: ...

    def peer_reachable(self, node_id: str) -> bool: ...

    def digest(self) -> tuple[str, int]:
        """The state digest and the applied index it was taken at."""
        ...

    # Rolling upgrades (node.versions).

    def cluster_version(self) -> int:
        """The cluster version in force on this replica."""
        ...

    def peer_version(self, node_id: str) -> NodeVersion | None:
        """What the peer answered this node's last version poll, or None."""
        ...

    @property
    def halted(self) -> Halt | None:
        """Where and why this replica stopped applying, or None."""
        ...

    @property
    def disk_full(self) -> str | None:
        """The file this node found no room to write, while there is none."""
        ...

    # Membership (node.membership).

    @property
    def directory(self) -> Directory:
        """The members as this node knows them."""
        ...

    @property
    def membership(self) -> Driver:
        """The leader's side of membership changes."""
        ...

    @property
    def removed(self) -> bool:
        """This node was removed from the cluster: it serves no more."""
        ...

    # The cluster's identity (node.identity).

    def cluster_id(self) -> str | None:
        """The cluster this node belongs to; None until its first leader named it."""
        ...

    @property
    def shards(self) -> int:
        """S, the cluster's number of data shards (docs/shards.md); 1 for a
        cluster without shards."""
        ...

    def identity_json(self) -> dict[str, Any]:
        """This node's identity as `GET /v1/time` tells its peers."""
        ...

    @property
    def backups(self) -> Backups:
        """Backups of this replica, written by a forked child (node.backup)."""
        ...

    # Identifiers and random numbers for commands come from the node's
    # `node.draws.Draws`, through these methods only.

    def new_id(self, prefix: str) -> str:
        """A new identifier, `<prefix>_` and 26 characters sortable by time."""
        ...

    def new_ids(self, prefix: str, count: int) -> tuple[str, ...]:
        """`count` new identifiers, in the order they sort (a batch's)."""
        ...

    def random_u32(self) -> int:
        """Uniform in [0, 2**32), for a command that carries a draw (FailJob)."""
        ...

    async def barrier(self) -> None: ...

    async def catch_up(self, timeout_s: float) -> bool:
        """Wait, at most `timeout_s`, until this replica has applied what
        the leader had committed when the call was made (node.read_index);
        True once it has."""
        ...

    # API tokens (node.auth).

    def auth_enabled(self) -> bool:
        """Whether requests must carry a token (the replica holds an admin token)."""
        ...

    def note_token_use(self, token_id: str) -> None:
        """Record (coarsely, as leader) that a token was used (node.auth)."""
        ...

    def submit_all(
        self, commands: Sequence[Command], size_bytes: int = 0
    ) -> list[asyncio.Future[Result]]: ...

    async def claim(
        self,
        worker_id: str,
        queues: tuple[str, ...],
        max_jobs: int,
        wait_s: float,
        lease_ms: int | None,
        kinds: tuple[tuple[str | None, int], ...] | None = None,
        gone: Callable[[], bool] = ...,
    ) -> list[Lease] | Rejected: ...

    def claim_wait_s(
        self, queues: tuple[str, ...], kinds: Mapping[str | None, int] | None = None
    ) -> float | None:
        """0 when a claim of `queues` (of `kinds` only, None: any job) would
        be granted a job now, the seconds until only time stands in the way
        no more, or None (wait for a change)."""
        ...

    def refused_for_version(self, command: Command) -> UpgradeRequired | None:
        """Why `command` may not be proposed yet (its version is above the
        cluster's), or None."""
        ...
