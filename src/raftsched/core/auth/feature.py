"""The auth feature: API tokens (issue 15). Imports only the kernel."""

from __future__ import annotations

from typing import Final

from raftsched.core.auth import audit, tokens
from raftsched.core.auth.commands import BootstrapAdmin, CreateToken, RevokeToken, TouchTokens
from raftsched.core.kernel.feature import CommandKind, Feature

FEATURE: Final = Feature(
    name="auth",
    sections=(tokens.SECTION,),
    # Tags 70-79; every one introduced by cluster version 3.
    commands=(
        CommandKind(
            CreateToken,
            70,
            ("str", "str", "str", "strs", "strs", "bytes", "int?"),
            tokens.apply_create_token,
            since=3,
            audit=audit.CREATE,
        ),
        CommandKind(
            RevokeToken, 71, ("str",), tokens.apply_revoke_token, since=3, audit=audit.REVOKE
        ),
        CommandKind(
            BootstrapAdmin, 72, ("str", "str", "bytes"), tokens.apply_bootstrap_admin, since=3
        ),
        CommandKind(TouchTokens, 73, ("strs", "int"), tokens.apply_touch_tokens, since=3),
    ),
    check=tokens.check,
)
