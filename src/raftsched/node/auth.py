"""API tokens, the node's part: secrets, the admin token file, token use.

Secrets are `rsk_` + 43 characters: base64url of 32 random bytes. Only their
SHA-256 is replicated (core.auth.tokens); 256 random bits make a fast hash
the right one, since nothing can be guessed from it. Each replica looks a
presented secret up in its own state's hash index, so a revocation is in
force on a node as soon as that node applies it.

First start (`--admin-token-file`): while the cluster has no admin token and
its version allows tokens (3), the leader proposes `BootstrapAdmin` with the
file's secret, generating the secret and writing the file (mode 0600,
atomically, never over an existing file) when it is absent.

`last_used_at` is coarse and batched: the leader notes each use in memory
to the minute and proposes at most one `TouchTokens` a minute, naming only
the tokens whose last use moved on. Uses seen only by followers (stale
reads) are not recorded.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
from pathlib import Path
from typing import Final

SECRET_PREFIX: Final = "rsk_"
SECRET_BYTES: Final = 32
_SECRET_RE: Final = re.compile(r"^rsk_[A-Za-z0-9_-]{43,200}$")
TOUCH_PERIOD_MS: Final = 60_000
MINUTE_MS: Final = 60_000
ADMIN_TOKEN_NAME: Final = "admin"


def new_secret() -> str:
    raw = base64.urlsafe_b64encode(os.urandom(SECRET_BYTES)).rstrip(b"=").decode("ascii")
    return SECRET_PREFIX + raw


def looks_like_secret(text: str) -> bool:
    return _SECRET_RE.match(text) is not None


def hash_secret(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8")).digest()


class AdminTokenFileError(Exception):
    """The admin token file cannot be read or does not hold a secret."""


def read_admin_secret(path: Path) -> str | None:
    """The secret in `path`, or None when the file does not exist."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise AdminTokenFileError(f"cannot read {path}: {error.strerror}") from None
    if not looks_like_secret(text):
        raise AdminTokenFileError(f"{path} does not hold a token secret (rsk_...)")
    return text


def read_or_create_admin_secret(path: Path) -> tuple[str, bool]:
    """The file's secret, writing a new one (mode 0600) when it is absent;
    True when this call wrote it. Never overwrites: a file that appears
    meanwhile (another node sharing the path) wins and is read."""
    existing = read_admin_secret(path)
    if existing is not None:
        return existing, False
    secret = new_secret()
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(secret + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, 0o600)
        try:
            os.link(temp, path)  # fails if the file exists: never replace one
        except FileExistsError:
            found = read_admin_secret(path)
            if found is None:
                raise AdminTokenFileError(f"{path} vanished while it was written") from None
            return found, False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return secret, True


class TokenUses:
    """The leader's in-memory record of which tokens were used, to the minute."""

    def __init__(self) -> None:
        self._used: dict[str, int] = {}  # token id -> minute (ms) of its last use
        self._proposed: dict[str, int] = {}  # what the last TouchTokens recorded
        self._last_touch_ms = 0

    def note(self, token_id: str, now_ms: int) -> None:
        self._used[token_id] = now_ms - now_ms % MINUTE_MS

    def due(self, now_ms: int) -> tuple[tuple[str, ...], int] | None:
        """The tokens to touch and the time to record, at most once a minute."""
        if now_ms - self._last_touch_ms < TOUCH_PERIOD_MS:
            return None
        moved = tuple(
            sorted(tid for tid, at in self._used.items() if self._proposed.get(tid, -1) < at)
        )
        if not moved:
            return None
        return moved, max(self._used[tid] for tid in moved)

    def proposed(self, token_ids: tuple[str, ...], now_ms: int) -> None:
        self._last_touch_ms = now_ms
        for token_id in token_ids:
            self._proposed[token_id] = self._used[token_id]
        # Forget what was recorded, so the record stays the size of a minute's use.
        for token_id in token_ids:
            if self._used.get(token_id) == self._proposed[token_id]:
                del self._used[token_id]
        if len(self._proposed) > 100_000:
            self._proposed.clear()
