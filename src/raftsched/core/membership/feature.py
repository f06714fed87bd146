"""The membership feature: the member directory (issue 16). Imports only the kernel."""

from __future__ import annotations

from typing import Final

from raftsched.core.kernel.feature import Audit, AuditSubject, CommandKind, Feature
from raftsched.core.kernel.state import State
from raftsched.core.membership import members
from raftsched.core.membership.commands import AddMember, RemoveMember


def _add(state: State, command: AddMember) -> AuditSubject:
    return AuditSubject(str(command.node_id), None, f"{command.raft_address} {command.http_url}")


def _remove(state: State, command: RemoveMember) -> AuditSubject:
    return AuditSubject(str(command.node_id), None, None)


FEATURE: Final = Feature(
    name="membership",
    sections=(members.SECTION,),
    # Tags 93-99 (90-92 are the cluster's identity, core.kernel.builtin);
    # every one introduced by cluster version 4.
    commands=(
        CommandKind(
            AddMember,
            93,
            ("str", "str", "str", "members"),
            members.apply_add_member,
            since=4,
            audit=Audit("cluster.add_node", _add),
        ),
        CommandKind(
            RemoveMember,
            94,
            ("str", "members"),
            members.apply_remove_member,
            since=4,
            audit=Audit("cluster.remove_node", _remove),
        ),
    ),
    field_kinds=(members.MEMBERS_FIELD,),
    check=members.check,
    on_renamed=members.forget_on_rename,
)
