"""The cluster's identity: its id and each member's incarnation.

Theory of operation. A Raft node that lost its data directory has forgotten
its term and the vote it cast in it. Coming back under the same node id it
could vote again in a term it already voted in and help elect a second
leader. So every data directory carries a random *incarnation*, made when it
was created (`raftsched.identity`), and the replicated state records the
incarnation each member runs under (`RecordIncarnation`, proposed by the
leader the first time it hears from a member). Peers refuse the Raft
messages of a node whose incarnation differs from the recorded one
(`node.identity`); such a node rejoins only as a new member (removed, which
forgets its incarnation, then added again).

The cluster id is drawn once, by the first leader that finds the state
without one (`SetClusterId`); a node whose data directory names another
cluster is refused the same way. A restored backup keeps the backed-up
cluster's state byte for byte (its digest is the backup's) and is renamed
by the new cluster's first leader: `SetClusterId(new, previous=old)` applies
only while the state still holds `old`, and forgets the old cluster's
incarnations (they named other processes).

Identifiers are drawn by the proposer, never here. The section is optional:
a state that never had an id (every state of releases up to 0.3.0) keeps its
bytes and digest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.commands import ForgetIncarnation, RecordIncarnation, SetClusterId
from raftsched.core.kernel.results import INVALID_REQUEST, INVALID_STATE, Ack, Rejected
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State

if TYPE_CHECKING:
    from raftsched.core.kernel.feature import Context

IDENTITY: Final = "identity"
# Cluster ids, node ids and incarnations: short, printable, safe in a file
# name and a log line.
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# A bound on the recorded members (a cluster has three to five; membership
# changes come and go).
MEMBERS_MAX: Final = 64


@dataclass(slots=True)
class Identity:
    cluster_id: str | None = None
    # node id -> the incarnation it runs under
    incarnations: dict[str, str] = field(default_factory=dict)


def identity(state: State) -> Identity:
    record: Identity = state.sections[IDENTITY]
    return record


def cluster_id(state: State) -> str | None:
    return identity(state).cluster_id


def incarnations(state: State) -> dict[str, str]:
    """The recorded incarnations by node id (do not change the result)."""
    return identity(state).incarnations


def valid_name(value: object) -> bool:
    return type(value) is str and _NAME.fullmatch(value) is not None


def _invalid(field_name: str, what: str) -> Rejected:
    return Rejected(
        INVALID_REQUEST,
        f"{what} must be 1 to 64 letters, digits, '_', '.' or '-'",
        {"field": field_name},
    )


def apply_set_cluster_id(state: State, command: SetClusterId, context: Context) -> Ack | Rejected:
    if not valid_name(command.cluster_id):
        return _invalid("cluster_id", "a cluster id")
    if command.previous is not None and not valid_name(command.previous):
        return _invalid("previous", "a cluster id")
    record = identity(state)
    if record.cluster_id == command.cluster_id:
        return Ack()  # a repeated proposal
    if record.cluster_id != command.previous:
        return Rejected(
            INVALID_STATE,
            f"the cluster is already named {record.cluster_id}",
            {"cluster_id": record.cluster_id},
        )
    before_id, before_incarnations = record.cluster_id, record.incarnations

    def undo() -> None:
        record.cluster_id, record.incarnations = before_id, before_incarnations

    context.savepoint.on_rollback(undo)
    record.cluster_id = command.cluster_id
    if command.previous is not None:
        # A restored state: the old cluster's members were other processes.
        record.incarnations = {}
        for hook in state.hooks.on_renamed:  # the member directory (core.membership)
            hook(state, context.savepoint)
    return Ack()


def apply_record_incarnation(
    state: State, command: RecordIncarnation, context: Context
) -> Ack | Rejected:
    if not valid_name(command.node_id):
        return _invalid("node_id", "a node id")
    if not valid_name(command.incarnation):
        return _invalid("incarnation", "an incarnation")
    record = identity(state)
    known = record.incarnations.get(command.node_id)
    if known == command.incarnation:
        return Ack()
    if known is not None:
        return Rejected(
            INVALID_STATE,
            f"node {command.node_id} runs under incarnation {known}: a node whose data "
            "directory was lost rejoins only as a new member (remove, then add it)",
            {"node_id": command.node_id, "incarnation": known},
        )
    if len(record.incarnations) >= MEMBERS_MAX:
        return Rejected(INVALID_STATE, f"at most {MEMBERS_MAX} members are recorded")

    def undo() -> None:
        record.incarnations.pop(command.node_id, None)

    context.savepoint.on_rollback(undo)
    record.incarnations[command.node_id] = command.incarnation
    return Ack()


def apply_forget_incarnation(
    state: State, command: ForgetIncarnation, context: Context
) -> Ack | Rejected:
    if not valid_name(command.node_id):
        return _invalid("node_id", "a node id")
    forget(state, command.node_id, context)
    return Ack()


def forget(state: State, node_id: str, context: Context) -> None:
    """Drop `node_id`'s incarnation (a member removed from the cluster):
    for a membership change's own handler to call as well."""
    record = identity(state)
    known = record.incarnations.pop(node_id, None)
    if known is not None:
        context.savepoint.on_rollback(lambda: record.incarnations.__setitem__(node_id, known))


def check(state: State) -> list[str]:
    record = identity(state)
    problems = []
    if record.cluster_id is not None and not valid_name(record.cluster_id):
        problems.append(f"cluster id {record.cluster_id!r} is not a valid name")
    for node_id, incarnation in record.incarnations.items():
        if not (valid_name(node_id) and valid_name(incarnation)):
            problems.append(f"incarnation record {node_id!r}: {incarnation!r} is not valid")
    if record.incarnations and record.cluster_id is None:
        problems.append("incarnations are recorded in a cluster without an id")
    return problems


def _at_default(state: State) -> bool:
    record = identity(state)
    return record.cluster_id is None and not record.incarnations


def _encode(state: State) -> Any:
    record = identity(state)
    return [record.cluster_id, sorted(record.incarnations.items())]


def _decode(state: State, data: Any) -> None:
    try:
        cluster, pairs = data
        members = {str(node_id): str(incarnation) for node_id, incarnation in pairs}
    except (TypeError, ValueError) as error:
        raise CodecError(f"the identity section is [cluster_id, pairs]: {error}") from error
    if cluster is not None and type(cluster) is not str:
        raise CodecError("the cluster id is a string or nil")
    state.sections[IDENTITY] = Identity(cluster, members)


SECTION: Final = Section(IDENTITY, Identity, _encode, _decode, at_default=_at_default)
