"""The cluster version: which command kinds every replica can decode.

Theory of operation. Each command kind carries the version that introduced it
(`codec.COMMAND_VERSIONS`); each node's code understands commands up to
`codec.COMMAND_VERSION_MAX`. During a rolling upgrade some replicas run the
previous release, and an entry they cannot decode would stop them (see
`node.machine`). So a command is proposed only when its version is at most
the replicated cluster version, which the leader raises with
`RaiseClusterVersion` once every member reports that it understands the new
version (`node.versions`). The version only goes up: a member that is later
replaced by an older release is an operator error that the halting replica
reports, never a silent divergence.

The version lives in the `cluster_version` section, which is optional: at
its default (1, the first release's commands) it is not encoded at all, so a
state that never raised the version keeps the bytes and the digest that
release 0.1.0 gave it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from raftsched.core.kernel.codec import COMMAND_VERSION_MAX, COMMAND_VERSIONS, CodecError
from raftsched.core.kernel.commands import Command, RaiseClusterVersion
from raftsched.core.kernel.results import INVALID_REQUEST, Ack, Rejected
from raftsched.core.kernel.sections import Section, register
from raftsched.core.kernel.state import State

CLUSTER_VERSION: Final = "cluster_version"
# What a cluster of the first release runs, and what a state that does not
# name its cluster version holds.
CLUSTER_VERSION_DEFAULT: Final = 1


@dataclass(slots=True)
class ClusterVersion:
    version: int = CLUSTER_VERSION_DEFAULT


def cluster_version(state: State) -> int:
    """The highest command version that may be proposed."""
    record: ClusterVersion = state.sections[CLUSTER_VERSION]
    return record.version


def command_version(command: Command) -> int:
    """The version that introduced the command's kind."""
    return COMMAND_VERSIONS[type(command)]


def needs_upgrade(state: State, command: Command) -> bool:
    """Whether proposing `command` must wait until every node is upgraded.

    `RaiseClusterVersion` never waits: it is what opens the gate, and the
    leader proposes it only once every member understands its version."""
    if type(command) is RaiseClusterVersion:
        return False
    return command_version(command) > cluster_version(state)


def apply_raise_cluster_version(state: State, command: RaiseClusterVersion) -> Ack | Rejected:
    """Raise the cluster version to `command.version`; a lower one changes
    nothing (a retried or late proposal), a version this code does not know
    is refused (the proposer's code is newer than this replica's)."""
    version = command.version
    if type(version) is not int or not 1 <= version <= COMMAND_VERSION_MAX:
        return Rejected(
            INVALID_REQUEST,
            f"cluster version must be from 1 to {COMMAND_VERSION_MAX}",
            {"field": "version"},
        )
    record: ClusterVersion = state.sections[CLUSTER_VERSION]
    record.version = max(record.version, version)
    return Ack()


def check(state: State) -> list[str]:
    """Invariants of the section."""
    version = cluster_version(state)
    if type(version) is not int or version < CLUSTER_VERSION_DEFAULT:
        return [f"cluster version {version!r} is below {CLUSTER_VERSION_DEFAULT}"]
    return []


def _at_default(state: State) -> bool:
    return cluster_version(state) == CLUSTER_VERSION_DEFAULT


def _encode(state: State) -> Any:
    return cluster_version(state)


def _decode(state: State, data: Any) -> None:
    if type(data) is not int or data < CLUSTER_VERSION_DEFAULT:
        raise CodecError("the cluster version is a positive integer")
    state.sections[CLUSTER_VERSION] = ClusterVersion(data)


SECTION: Final = register(
    Section(CLUSTER_VERSION, ClusterVersion, _encode, _decode, at_default=_at_default)
)
