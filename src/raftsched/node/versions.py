"""Rolling upgrades, the node's part: what each member understands, and the gate.

Theory of operation (the core's part is `core.kernel.cluster_version`). Every node
answers `GET /v1/time` with its `version`: the release it runs and the
highest command version its code understands. Every `POLL_PERIOD_S` each
node asks its peers, so `GET /v1/cluster` can name every member's version.
A node of release 0.1.0 answers without one: it understands version 1.

The leader raises the replicated cluster version only from a poll in which
every member answered: to the lowest version any of them understands, when
that is above the version in force. A member that does not answer (down,
partitioned, restarting) holds the version where it is; so does one member
still on the old release.

The gate: `check_allowed` refuses a command whose version is above the
cluster version in force on this replica (`UpgradeRequired`, which the API
answers 409 `invalid_state`, "upgrade every node first"). The node runs it
on every proposal (`Node.propose`, `Node.submit_all`), so nothing that an
old replica could not decode reaches the log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import raftsched
from raftsched.core import (
    COMMAND_VERSION_MAX,
    COMMAND_VERSIONS,
    REGISTRY,
    command_version,
    needs_upgrade,
    newest_kind,
    newest_spec_field,
)
from raftsched.core.kernel.cluster_version import CLUSTER_VERSION_DEFAULT, cluster_version
from raftsched.core.kernel.commands import Command, JobSpec
from raftsched.core.kernel.state import State

POLL_PERIOD_S: Final = 5.0
POLL_TIMEOUT_S: Final = 1.0
UPGRADE_FIRST: Final = "upgrade every node first"


@dataclass(frozen=True, slots=True)
class NodeVersion:
    release: str | None  # None: a node of release 0.1.0, which does not say
    command_version_max: int

    def as_json(self) -> dict[str, Any]:
        return {"release": self.release, "command_version_max": self.command_version_max}


THIS_NODE: Final = NodeVersion(raftsched.__version__, COMMAND_VERSION_MAX)


def from_answer(body: object) -> NodeVersion:
    """A peer's version from its `GET /v1/time` answer (ValueError if it is not one)."""
    if not isinstance(body, dict) or "wall_ms" not in body:
        raise ValueError("not an answer of GET /v1/time")
    version = body.get("version")
    if version is None:
        return NodeVersion(None, CLUSTER_VERSION_DEFAULT)
    if not isinstance(version, dict):
        raise ValueError("version is not an object")
    release = version.get("release")
    understood = version.get("command_version_max")
    if type(understood) is not int or understood < 1:
        raise ValueError("command_version_max is not a positive integer")
    return NodeVersion(release if isinstance(release, str) else None, understood)


class UpgradeRequired(Exception):
    """A command needs a newer cluster version than the one in force;
    nothing was proposed. `command_kind` names the kind that needs it (the
    inner one of an `Audited` operator command); `field`, the job spec field
    that needs it, when one does (`kind` in a submission, say)."""

    def __init__(self, command: Command, needed: int, in_force: int) -> None:
        super().__init__(UPGRADE_FIRST)
        self.command_kind = newest_kind(command)
        self.field = newest_spec_field(command)
        self.needed = needed
        self.in_force = in_force


def gated(commands: Iterable[Command]) -> list[Command]:
    """The commands that any cluster version does not already allow: only
    these need `check_allowed` (and the state it reads).

    Every request's command passes here. `command_version` walks a command's
    fields for job specs (3.7-6.9 us for a start, complete or claim); a kind
    that is `plain` cannot hold one, so its commands are let through
    without the walk."""
    return [
        command
        for command in commands
        if not plain(type(command)) and command_version(command) > CLUSTER_VERSION_DEFAULT
    ]


def plain(kind: type) -> bool:
    """Whether every command of `kind` passes any cluster version, whatever
    its fields: the kind is as old as the cluster (CLUSTER_VERSION_DEFAULT),
    no later version added fields to it (`CommandKind.tail`), and its
    fields' types cannot hold a job spec (whose version-5 fields raise a
    command's version, `cluster_version.command_version`) nor another
    command (`Audited`). Decided once per kind, from its type hints;
    anything the hints leave open counts as not plain, so its commands are
    walked as before."""
    found = _PLAIN.get(kind)
    if found is None:
        found = _PLAIN[kind] = (
            COMMAND_VERSIONS.get(kind) == CLUSTER_VERSION_DEFAULT
            and kind not in REGISTRY.command_tails
            and not _may_hold_spec(kind, 0)
        )
    return found


_PLAIN: dict[type, bool] = {}
_SCALARS: Final = frozenset({str, int, float, bool, bytes, type(None)})


def _may_hold_spec(hint: object, depth: int) -> bool:
    """Whether a value of type `hint` could be or contain a `JobSpec` or a
    `Command` (True when unsure)."""
    if hint in _SCALARS:
        return False
    origin = typing.get_origin(hint)
    if origin is Literal:
        return False
    if origin in (tuple, frozenset, typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(hint) if arg is not Ellipsis]
        return any(_may_hold_spec(arg, depth + 1) for arg in args)
    if (
        isinstance(hint, type)
        and dataclasses.is_dataclass(hint)
        and hint is not JobSpec
        and (depth == 0 or not issubclass(hint, Command))
        and depth < 5
    ):
        try:
            hints = typing.get_type_hints(hint)
        except Exception:
            return True
        return any(_may_hold_spec(field_hint, depth + 1) for field_hint in hints.values())
    return True


def check_allowed(state: State, commands: Iterable[Command]) -> None:
    """Raise `UpgradeRequired` for the first command that needs a newer
    cluster version than `state` has."""
    for command in commands:
        if needs_upgrade(state, command):
            raise UpgradeRequired(command, command_version(command), cluster_version(state))


Fetch = Callable[[str], Awaitable[object]]


class PeerVersions:
    """What this node heard from each peer in its last poll."""

    def __init__(self, peer_urls: Mapping[str, str]) -> None:
        self._peer_urls = dict(peer_urls)
        self.peer_urls = tuple(self._peer_urls.values())
        # node id -> its version, or None when it did not answer the last poll.
        self.heard: dict[str, NodeVersion | None] = dict.fromkeys(peer_urls)

    def set_peers(self, peer_urls: Mapping[str, str]) -> None:
        """The members changed (node.membership): poll these from now on."""
        self._peer_urls = dict(peer_urls)
        self.heard = {node_id: self.heard.get(node_id) for node_id in peer_urls}

    async def poll(self, fetch: Fetch) -> None:
        """Ask every peer at once; one that does not answer in time is unknown."""
        ids = sorted(self._peer_urls)
        answers = await asyncio.gather(
            *(self._ask(fetch, self._peer_urls[node_id]) for node_id in ids)
        )
        self.heard = dict(zip(ids, answers, strict=True))

    @staticmethod
    async def _ask(fetch: Fetch, url: str) -> NodeVersion | None:
        try:
            return from_answer(await asyncio.wait_for(fetch(url), POLL_TIMEOUT_S))
        except Exception:
            return None

    def version_to_raise(self, in_force: int) -> int | None:
        """The cluster version every member (this node too) understands, if
        every peer answered the last poll and it is above `in_force`."""
        understood = [THIS_NODE.command_version_max]
        for version in self.heard.values():
            if version is None:
                return None
            understood.append(version.command_version_max)
        lowest = min(understood)
        return lowest if lowest > in_force else None
