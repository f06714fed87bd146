"""API tokens: replicated records, their section and their commands.

A token names a role and a scope (tenants, queues; `"*"` means all) and
holds only the SHA-256 of its secret. Secrets are 32 random bytes, so a
fast hash is enough: nothing can be guessed from it.

Authentication is on from the moment the state holds an unrevoked admin
token (`auth_enabled`). The last unrevoked admin token cannot be revoked, so
once on, authentication never turns itself off.

`last_used_at_ms` is coarse on purpose: the leader notes uses in memory and
proposes at most one `TouchTokens` a minute (see `node.auth`).

The `tokens` section is optional: a state without tokens encodes exactly as
release 0.2.0 did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from raftsched.core.auth.commands import BootstrapAdmin, CreateToken, RevokeToken, TouchTokens
from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.feature import Context
from raftsched.core.kernel.results import (
    INVALID_STATE,
    NOT_FOUND,
    Ack,
    Rejected,
    TokenSaved,
)
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import (
    NAME_CHARS_MAX,
    TIME_MS_MAX,
    check_int,
    check_name,
    check_optional_int,
    invalid,
)

TOKENS: Final = "tokens"
ROLES: Final = ("admin", "operator", "submitter", "worker", "viewer")
ADMIN: Final = "admin"
ALL: Final = "*"
TOKENS_MAX: Final = 10_000
SCOPE_MAX: Final = 100
SECRET_HASH_BYTES: Final = 32
TOKEN_ID_PREFIX: Final = "tok_"
TOUCH_MAX: Final = 10_000


class Token:
    __slots__ = (
        "id",
        "name",
        "role",
        "tenants",
        "queues",
        "secret_hash",
        "created_at_ms",
        "expires_at_ms",
        "revoked_at_ms",
        "last_used_at_ms",
    )

    def __init__(
        self,
        id: str,
        name: str,
        role: str,
        tenants: tuple[str, ...],
        queues: tuple[str, ...],
        secret_hash: bytes,
        created_at_ms: int,
        expires_at_ms: int | None,
        revoked_at_ms: int | None = None,
        last_used_at_ms: int | None = None,
    ) -> None:
        self.id = id
        self.name = name
        self.role = role
        self.tenants = tenants
        self.queues = queues
        self.secret_hash = secret_hash
        self.created_at_ms = created_at_ms
        self.expires_at_ms = expires_at_ms
        self.revoked_at_ms = revoked_at_ms
        self.last_used_at_ms = last_used_at_ms

    def valid_at(self, now_ms: int) -> bool:
        """Neither revoked nor expired at `now_ms`."""
        if self.revoked_at_ms is not None:
            return False
        return self.expires_at_ms is None or now_ms < self.expires_at_ms

    def row(self) -> list[Any]:
        return [
            self.id,
            self.name,
            self.role,
            list(self.tenants),
            list(self.queues),
            self.secret_hash,
            self.created_at_ms,
            self.expires_at_ms,
            self.revoked_at_ms,
            self.last_used_at_ms,
        ]


class Tokens:
    """The section: tokens by id (creation order) and the id of each hash."""

    __slots__ = ("by_id", "by_hash")

    def __init__(self) -> None:
        self.by_id: dict[str, Token] = {}
        self.by_hash: dict[bytes, str] = {}

    def add(self, token: Token) -> None:
        self.by_id[token.id] = token
        self.by_hash[token.secret_hash] = token.id

    def remove(self, token: Token) -> None:
        del self.by_id[token.id]
        del self.by_hash[token.secret_hash]


def tokens(state: State) -> Tokens:
    found: Tokens = state.sections[TOKENS]
    return found


def get_token(state: State, token_id: str) -> Token | None:
    return tokens(state).by_id.get(token_id)


def find_by_hash(state: State, secret_hash: bytes) -> Token | None:
    token_id = tokens(state).by_hash.get(secret_hash)
    return None if token_id is None else tokens(state).by_id[token_id]


def list_tokens(state: State) -> list[Token]:
    return list(tokens(state).by_id.values())


def active_admins(state: State) -> list[Token]:
    return [t for t in tokens(state).by_id.values() if t.role == ADMIN and t.revoked_at_ms is None]


def auth_enabled(state: State) -> bool:
    """Whether requests must carry a token: the state holds an unrevoked admin token."""
    return any(t.role == ADMIN and t.revoked_at_ms is None for t in tokens(state).by_id.values())


# -- validation ----------------------------------------------------------------


def _check_id(value: object) -> Rejected | None:
    rejected = check_name(value, "token_id")
    if rejected is None and not str(value).startswith(TOKEN_ID_PREFIX):
        return invalid("token_id", f"token_id must start with {TOKEN_ID_PREFIX}")
    return rejected


def _check_scope(values: object, field: str) -> Rejected | None:
    if type(values) is not tuple or not values or len(values) > SCOPE_MAX:
        return invalid(field, f"{field} must be a list of 1 to {SCOPE_MAX} names")
    for value in values:
        rejected = check_name(value, field)
        if rejected is not None:
            return rejected
    if len(set(values)) != len(values):
        return invalid(field, f"{field} must not repeat a name")
    if ALL in values and len(values) != 1:
        return invalid(field, f'{field}: "*" means all and stands alone')
    return None


def _check_hash(value: object) -> Rejected | None:
    if type(value) is not bytes or len(value) != SECRET_HASH_BYTES:
        return invalid("secret_hash", "secret_hash must be 32 bytes (SHA-256)")
    return None


def _check_create(state: State, command: CreateToken) -> Rejected | None:
    for rejected in (
        _check_id(command.token_id),
        check_name(command.name, "name", NAME_CHARS_MAX),
        None if command.role in ROLES else invalid("role", f"role must be one of {ROLES}"),
        _check_scope(command.tenants, "tenants"),
        _check_scope(command.queues, "queues"),
        _check_hash(command.secret_hash),
        check_optional_int(command.expires_at_ms, "expires_at", 0, TIME_MS_MAX),
    ):
        if rejected is not None:
            return rejected
    if command.expires_at_ms is not None and command.expires_at_ms <= state.now_ms:
        return invalid("expires_at", "expires_at must be in the future")
    return None


# -- commands ---------------------------------------------------------------------


def _create(state: State, token: Token, context: Context) -> TokenSaved | Rejected:
    section = tokens(state)
    if token.id in section.by_id:
        return Rejected(INVALID_STATE, f"token {token.id} exists", {"token_id": token.id})
    if token.secret_hash in section.by_hash:
        return Rejected(INVALID_STATE, "a token with this secret exists", {"field": "secret"})
    if len(section.by_id) >= TOKENS_MAX:
        return Rejected(INVALID_STATE, f"at most {TOKENS_MAX} tokens", {"tokens_max": TOKENS_MAX})
    section.add(token)
    context.savepoint.on_rollback(lambda: section.remove(token))
    return TokenSaved(token.id, True)


def apply_create_token(
    state: State, command: CreateToken, context: Context
) -> TokenSaved | Rejected:
    rejected = _check_create(state, command)
    if rejected is not None:
        return rejected
    token = Token(
        command.token_id,
        command.name,
        command.role,
        command.tenants,
        command.queues,
        command.secret_hash,
        state.now_ms,
        command.expires_at_ms,
    )
    return _create(state, token, context)


def apply_bootstrap_admin(
    state: State, command: BootstrapAdmin, context: Context
) -> TokenSaved | Rejected:
    for rejected in (
        _check_id(command.token_id),
        check_name(command.name, "name", NAME_CHARS_MAX),
        _check_hash(command.secret_hash),
    ):
        if rejected is not None:
            return rejected
    existing = find_by_hash(state, command.secret_hash)
    if existing is not None and existing.role == ADMIN and existing.revoked_at_ms is None:
        return TokenSaved(existing.id, False)  # a repeat: the same file, the same token
    if auth_enabled(state):
        return Rejected(INVALID_STATE, "the cluster already has an admin token", {})
    token = Token(
        command.token_id, command.name, ADMIN, (ALL,), (ALL,), command.secret_hash,
        state.now_ms, None,
    )  # fmt: skip
    return _create(state, token, context)


def apply_revoke_token(
    state: State, command: RevokeToken, context: Context
) -> TokenSaved | Rejected:
    rejected = _check_id(command.token_id)
    if rejected is not None:
        return rejected
    token = get_token(state, command.token_id)
    if token is None:
        return Rejected(NOT_FOUND, f"no token {command.token_id}", {"token_id": command.token_id})
    if token.revoked_at_ms is not None:
        return TokenSaved(token.id, False)
    if token.role == ADMIN and len(active_admins(state)) == 1:
        return Rejected(
            INVALID_STATE,
            "the last admin token cannot be revoked; create another admin token first",
            {"token_id": token.id},
        )
    token.revoked_at_ms = state.now_ms
    context.savepoint.on_rollback(lambda: setattr(token, "revoked_at_ms", None))
    return TokenSaved(token.id, True)


def apply_touch_tokens(state: State, command: TouchTokens, context: Context) -> Ack | Rejected:
    ids = command.token_ids
    if type(ids) is not tuple or len(ids) > TOUCH_MAX:
        return invalid("token_ids", f"token_ids must be a list of at most {TOUCH_MAX} ids")
    rejected = check_int(command.used_at_ms, "used_at", 0, TIME_MS_MAX)
    if rejected is not None:
        return rejected
    for token_id in ids:
        if type(token_id) is not str:
            return invalid("token_ids", "token_ids must be strings")
    used_at_ms = min(command.used_at_ms, state.now_ms)  # never a use in the future
    section = tokens(state)
    for token_id in ids:  # unknown ids (a token since... never removed) are skipped
        token = section.by_id.get(token_id)
        if token is None:
            continue
        before = token.last_used_at_ms
        if before is not None and before >= used_at_ms:
            continue
        token.last_used_at_ms = used_at_ms
        context.savepoint.on_rollback(_restore_last_used(token, before))
    return Ack()


def _restore_last_used(token: Token, before: int | None) -> Callable[[], None]:
    def restore() -> None:
        token.last_used_at_ms = before

    return restore


# -- the section -----------------------------------------------------------------


def _at_default(state: State) -> bool:
    return not tokens(state).by_id


def _encode(state: State) -> Any:
    return [token.row() for token in tokens(state).by_id.values()]


def _strs(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(type(v) is str for v in value):
        raise CodecError("a token's scope is a list of names")
    return tuple(value)


def _optional_int(value: object) -> int | None:
    if value is not None and type(value) is not int:
        raise CodecError("expected an integer or nil")
    return value


def _decode(state: State, data: Any) -> None:
    section = Tokens()
    if type(data) not in (list, tuple):
        raise CodecError("the tokens section is a list")
    for row in data:
        if type(row) not in (list, tuple) or len(row) != 10:
            raise CodecError("a token is a row of 10 fields")
        (token_id, name, role, tenants, queues, secret_hash, created, expires, revoked, used) = row
        if type(token_id) is not str or type(name) is not str or type(role) is not str:
            raise CodecError("a token's id, name and role are strings")
        if type(secret_hash) is not bytes or type(created) is not int:
            raise CodecError("a token's hash is bytes and its creation an integer")
        section.add(
            Token(
                token_id,
                name,
                role,
                _strs(tenants),
                _strs(queues),
                secret_hash,
                created,
                _optional_int(expires),
                _optional_int(revoked),
                _optional_int(used),
            )  # fmt: skip
        )
    state.sections[TOKENS] = section


def check(state: State) -> list[str]:
    """Invariants: unique ids and hashes, the hash index matches the records."""
    section = tokens(state)
    problems: list[str] = []
    hashes = [token.secret_hash for token in section.by_id.values()]
    if len(set(hashes)) != len(hashes):
        problems.append("two tokens share a secret hash")
    for token_id, token in section.by_id.items():
        if token.id != token_id:
            problems.append(f"token {token.id} filed under {token_id}")
        if section.by_hash.get(token.secret_hash) != token.id:
            problems.append(f"token {token.id} missing from the hash index")
        if token.role not in ROLES:
            problems.append(f"token {token.id} has an unknown role {token.role}")
    if len(section.by_hash) != len(section.by_id):
        problems.append("the hash index holds tokens that do not exist")
    return problems


SECTION: Final = Section(TOKENS, Tokens, _encode, _decode, at_default=_at_default)
