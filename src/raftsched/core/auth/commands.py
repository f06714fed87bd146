"""The commands of API tokens (tags 70-79, all since cluster version 3)."""

from __future__ import annotations

from dataclasses import dataclass

from raftsched.core.kernel.commands import Command


@dataclass(frozen=True, slots=True)
class CreateToken(Command):
    """A new token. The proposer draws `token_id` and the secret; only the
    secret's SHA-256 (`secret_hash`, 32 bytes) reaches the log."""

    token_id: str
    name: str
    role: str
    tenants: tuple[str, ...]
    queues: tuple[str, ...]
    secret_hash: bytes
    expires_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class RevokeToken(Command):
    """Revoke a token; a repeat changes nothing. The last unrevoked admin
    token cannot be revoked (that would lock every caller out)."""

    token_id: str


@dataclass(frozen=True, slots=True)
class BootstrapAdmin(Command):
    """The cluster's first admin token, from `--admin-token-file`: created
    only while no unrevoked admin token exists. The same secret hash again
    answers the token it made; another one once an admin exists is refused."""

    token_id: str
    name: str
    secret_hash: bytes


@dataclass(frozen=True, slots=True)
class TouchTokens(Command):
    """The leader's coarse record of recent use: these tokens were used up to
    `used_at_ms` (minute granularity, at most one such command a minute)."""

    token_ids: tuple[str, ...]
    used_at_ms: int
