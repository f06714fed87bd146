"""How token changes appear in the audit trail (`kernel.audit`): the token
acted on, its name and role, never its secret or hash. Tokens belong to no
tenant, so only all-tenant readers see these entries."""

from __future__ import annotations

from typing import Final

from raftsched.core.auth.commands import CreateToken, RevokeToken
from raftsched.core.auth.tokens import get_token
from raftsched.core.kernel.feature import Audit, AuditSubject
from raftsched.core.kernel.state import State


def _names(values: object) -> str:
    # Described before the command is validated: any value may arrive here.
    if not isinstance(values, tuple):
        return "?"
    return ",".join(str(value) for value in values)


def _create(state: State, command: CreateToken) -> AuditSubject:
    scope = f"tenants={_names(command.tenants)} queues={_names(command.queues)}"
    return AuditSubject(str(command.token_id), None, f"{command.name} {command.role} {scope}")


def _revoke(state: State, command: RevokeToken) -> AuditSubject:
    token = get_token(state, command.token_id) if type(command.token_id) is str else None
    return AuditSubject(str(command.token_id), None, None if token is None else token.name)


CREATE: Final = Audit("token.create", _create)
REVOKE: Final = Audit("token.revoke", _revoke)
