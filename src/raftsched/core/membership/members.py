"""The member directory: who the coordinators are, as every replica knows it.

Theory of operation. pysyncobj's own membership entries carry only a Raft
address, but every node must know each member's id and HTTP URL (redirects,
version polls, `GET /v1/cluster`) and a removed node must be able to learn
that it was removed. So a change of membership is first a core command,
committed like any other entry, journaled, fsynced and kept in every
snapshot (this section), and only then the Raft configuration change that
the leader derives from it (`node.membership`). The directory is the
membership the cluster wants; pysyncobj's configuration follows it, one
change at a time.

A cluster started from `--peer` flags has an empty directory: nodes use
their flags until the first change, which records every member it knew of
(`known`) together with the change. From then on the directory is the truth
and the flags are only where a restarted node starts looking.

`removed` remembers the ids removed and not added again since, with the
Raft address each had: a removed node that applies its own removal stops
serving and stops standing for election, and its peers drop vote requests
from that address (unless a member uses it now). Adding the id again (a
node that lost its data directory rejoins as a new member) takes it off.

The section is optional: a cluster that never changed its membership keeps
the bytes and digest of release 0.3.0.
"""

from __future__ import annotations

from typing import Any, Final

from raftsched.core.kernel import identity
from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.feature import Context, FieldKind
from raftsched.core.kernel.results import INVALID_STATE, NOT_FOUND, Ack, Rejected
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import NAME_CHARS_MAX, check_name, invalid
from raftsched.core.membership.commands import AddMember, Member, RemoveMember

MEMBERS: Final = "members"
# Raft clusters of more than a handful of voters only get slower; nine is
# beyond any deployment this scheduler is meant for.
MEMBERS_MAX: Final = 9
REMOVED_MAX: Final = 1_000
URL_CHARS_MAX: Final = 2_000
ADDRESS_CHARS_MAX: Final = NAME_CHARS_MAX


class Membership:
    """The section: members by id (in the order they joined), the removed
    ids (with the Raft address each had), and how many changes were applied."""

    __slots__ = ("by_id", "removed", "changes")

    def __init__(self) -> None:
        self.by_id: dict[str, Member] = {}
        self.removed: dict[str, str] = {}
        self.changes = 0


def membership(state: State) -> Membership:
    found: Membership = state.sections[MEMBERS]
    return found


def members(state: State) -> tuple[Member, ...]:
    """The replicated directory; empty until the first change."""
    return tuple(membership(state).by_id.values())


def is_removed(state: State, node_id: str) -> bool:
    return node_id in membership(state).removed


def removed_members(state: State) -> dict[str, str]:
    """Removed ids (not added again) with the Raft address each had."""
    return dict(membership(state).removed)


def removed_addresses(state: State) -> frozenset[str]:
    """The Raft addresses of removed nodes that no member uses now."""
    section = membership(state)
    in_use = {member.raft_address for member in section.by_id.values()}
    return frozenset(section.removed.values()) - in_use


def changes_applied(state: State) -> int:
    return membership(state).changes


# -- validation ----------------------------------------------------------------


def check_address(value: object, field: str) -> Rejected | None:
    """HOST:PORT with a port from 1 to 65535."""
    rejected = check_name(value, field, ADDRESS_CHARS_MAX)
    if rejected is not None:
        return rejected
    host, sep, port = str(value).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return invalid(field, f"{field} must be HOST:PORT")
    return None


def check_url(value: object, field: str) -> Rejected | None:
    rejected = check_name(value, field, URL_CHARS_MAX)
    if rejected is not None:
        return rejected
    if not str(value).startswith(("http://", "https://")):
        return invalid(field, f"{field} must be an http:// or https:// URL")
    return None


def check_member(member: object, field: str = "") -> Rejected | None:
    if type(member) is not Member:
        return invalid(field or "known", "a member is (id, raft_address, http_url)")
    for rejected in (
        check_name(member.node_id, field + "id"),
        check_address(member.raft_address, field + "raft_address"),
        check_url(member.http_url, field + "http_url"),
    ):
        if rejected is not None:
            return rejected
    return None


def _check_known(known: object) -> Rejected | None:
    if type(known) is not tuple or len(known) > MEMBERS_MAX:
        return invalid("known", f"known must be a list of at most {MEMBERS_MAX} members")
    for member in known:
        rejected = check_member(member, "known.")
        if rejected is not None:
            return rejected
    ids = [member.node_id for member in known]
    addresses = [member.raft_address for member in known]
    if len(set(ids)) != len(ids) or len(set(addresses)) != len(addresses):
        return invalid("known", "known members must have distinct ids and addresses")
    return None


def _directory(state: State, known: tuple[Member, ...]) -> dict[str, Member]:
    """The directory a change starts from: the replicated one, or (before the
    first change) the members the proposer knew."""
    section = membership(state)
    if section.by_id or section.changes:
        return dict(section.by_id)
    return {member.node_id: member for member in known}


def _conflict(directory: dict[str, Member], new: Member) -> Rejected | None:
    for member in directory.values():
        if member.node_id == new.node_id:
            return Rejected(
                INVALID_STATE,
                f"node {new.node_id} is already a member",
                {"reason": "duplicate_id", "id": new.node_id},
            )
        if member.raft_address == new.raft_address:
            return Rejected(
                INVALID_STATE,
                f"raft address {new.raft_address} is already member {member.node_id}'s",
                {"reason": "duplicate_address", "id": member.node_id},
            )
        if member.http_url == new.http_url:
            return Rejected(
                INVALID_STATE,
                f"http url {new.http_url} is already member {member.node_id}'s",
                {"reason": "duplicate_http_url", "id": member.node_id},
            )
    if len(directory) >= MEMBERS_MAX:
        return Rejected(
            INVALID_STATE, f"at most {MEMBERS_MAX} members", {"members_max": MEMBERS_MAX}
        )
    return None


def _replace(
    state: State, directory: dict[str, Member], removed: dict[str, str], context: Context
) -> None:
    section = membership(state)
    before = (section.by_id, section.removed, section.changes)

    def restore() -> None:
        section.by_id, section.removed, section.changes = before

    context.savepoint.on_rollback(restore)
    section.by_id = directory
    section.removed = removed
    section.changes += 1


def forget_on_rename(state: State, savepoint: Savepoint) -> None:
    """A restored state renamed to its new cluster: the directory named the
    old cluster's machines. The new cluster starts from its nodes' flags,
    as any cluster does before its first change."""
    section = membership(state)
    before = (section.by_id, section.removed, section.changes)

    def restore() -> None:
        section.by_id, section.removed, section.changes = before

    savepoint.on_rollback(restore)
    section.by_id, section.removed, section.changes = {}, {}, 0


# -- commands ---------------------------------------------------------------------


def apply_add_member(state: State, command: AddMember, context: Context) -> Ack | Rejected:
    new = Member(command.node_id, command.raft_address, command.http_url)
    for rejected in (check_member(new), _check_known(command.known)):
        if rejected is not None:
            return rejected
    directory = _directory(state, command.known)
    rejected = _conflict(directory, new)
    if rejected is not None:
        return rejected
    removed = dict(membership(state).removed)
    removed.pop(new.node_id, None)
    directory[new.node_id] = new
    _replace(state, directory, removed, context)
    return Ack()


def apply_remove_member(state: State, command: RemoveMember, context: Context) -> Ack | Rejected:
    for rejected in (check_name(command.node_id, "id"), _check_known(command.known)):
        if rejected is not None:
            return rejected
    directory = _directory(state, command.known)
    if command.node_id not in directory:
        return Rejected(
            NOT_FOUND, f"node {command.node_id} is not a member", {"id": command.node_id}
        )
    if len(directory) == 1:
        return Rejected(
            INVALID_STATE,
            "the last member cannot be removed",
            {"reason": "last_member", "id": command.node_id},
        )
    removed = dict(membership(state).removed)
    if len(removed) >= REMOVED_MAX:
        del removed[next(iter(removed))]  # forget the longest removed; bounded
    removed[command.node_id] = directory.pop(command.node_id).raft_address
    _replace(state, directory, removed, context)
    # Its incarnation goes with it: added back under the same id (on a new
    # data directory), it is a new member and is recorded afresh.
    identity.forget(state, command.node_id, context)
    return Ack()


# -- codec ------------------------------------------------------------------------


def _member_row(member: Member) -> list[str]:
    return [member.node_id, member.raft_address, member.http_url]


def _decode_member(row: object) -> Member:
    if not isinstance(row, list | tuple) or len(row) != 3:
        raise CodecError("a member is a row of 3 strings")
    node_id, raft_address, http_url = row
    if type(node_id) is not str or type(raft_address) is not str or type(http_url) is not str:
        raise CodecError("a member is a row of 3 strings")
    return Member(node_id, raft_address, http_url)


def _encode_members(value: Any) -> Any:
    return [_member_row(member) for member in value]


def _decode_members(data: object) -> tuple[Member, ...]:
    if not isinstance(data, list | tuple):
        raise CodecError("members are a list")
    return tuple(_decode_member(row) for row in data)


MEMBERS_FIELD: Final = FieldKind("members", _encode_members, _decode_members)


def _at_default(state: State) -> bool:
    section = membership(state)
    return not section.by_id and not section.removed and section.changes == 0


def _encode(state: State) -> Any:
    section = membership(state)
    return [
        [_member_row(member) for member in section.by_id.values()],
        [[node_id, address] for node_id, address in section.removed.items()],
        section.changes,
    ]


def _decode(state: State, data: Any) -> None:
    if type(data) not in (list, tuple) or len(data) != 3:
        raise CodecError("the members section is [members, removed, changes]")
    rows, removed, changes = data
    if not isinstance(removed, list | tuple) or not all(
        isinstance(row, list | tuple) and len(row) == 2 and all(type(v) is str for v in row)
        for row in removed
    ):
        raise CodecError("removed members are a list of [id, raft address]")
    if type(changes) is not int or changes < 0:
        raise CodecError("the count of membership changes is a natural number")
    section = Membership()
    for member in _decode_members(rows):
        section.by_id[member.node_id] = member
    section.removed = {node_id: address for node_id, address in removed}
    section.changes = changes
    state.sections[MEMBERS] = section


def check(state: State) -> list[str]:
    """Invariants: ids are filed under themselves, ids and addresses are
    unique, nobody is both a member and removed, the bounds hold."""
    section = membership(state)
    problems: list[str] = []
    for node_id, member in section.by_id.items():
        if member.node_id != node_id:
            problems.append(f"member {member.node_id} filed under {node_id}")
        if node_id in section.removed:
            problems.append(f"member {node_id} is also recorded as removed")
    addresses = [member.raft_address for member in section.by_id.values()]
    if len(set(addresses)) != len(addresses):
        problems.append("two members share a raft address")
    if len(section.by_id) > MEMBERS_MAX or len(section.removed) > REMOVED_MAX:
        problems.append("the member directory exceeds its bounds")
    if section.by_id and section.changes == 0:
        problems.append("members recorded without a change")
    return problems


SECTION: Final = Section(MEMBERS, Membership, _encode, _decode, at_default=_at_default)
