"""node/auth.py: secrets, the admin token file, the record of token use."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from raftsched.node.auth import (
    MINUTE_MS,
    AdminTokenFileError,
    TokenUses,
    hash_secret,
    looks_like_secret,
    new_secret,
    read_admin_secret,
    read_or_create_admin_secret,
)


def test_a_secret_is_rsk_and_43_base64url_characters_of_32_random_bytes() -> None:
    secrets = {new_secret() for _ in range(100)}
    assert len(secrets) == 100
    for secret in secrets:
        assert secret.startswith("rsk_") and len(secret) == 47 and looks_like_secret(secret)
    assert not looks_like_secret("rsk_short")
    assert not looks_like_secret("Bearer rsk_" + "a" * 43)
    assert len(hash_secret(next(iter(secrets)))) == 32


def test_the_admin_file_is_written_0600_once_and_never_replaced(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "admin.token"
    assert read_admin_secret(path) is None
    secret, written = read_or_create_admin_secret(path)
    assert written and looks_like_secret(secret)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == secret + "\n"
    again, written = read_or_create_admin_secret(path)
    assert again == secret and not written
    assert [p.name for p in path.parent.iterdir()] == ["admin.token"]  # no temporary left


def test_a_file_without_a_secret_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "admin.token"
    path.write_text("hunter2\n")
    with pytest.raises(AdminTokenFileError) as refused:
        read_or_create_admin_secret(path)
    assert "hunter2" not in str(refused.value)


def test_uses_are_recorded_to_the_minute_at_most_once_a_minute() -> None:
    uses = TokenUses()
    t0 = 10 * MINUTE_MS + 1_234
    assert uses.due(t0) is None  # nothing used
    uses.note("tok_a", t0)
    uses.note("tok_b", t0 + 5)
    assert uses.due(t0 + 10) == (("tok_a", "tok_b"), 10 * MINUTE_MS)
    uses.proposed(("tok_a", "tok_b"), t0 + 10)
    uses.note("tok_a", t0 + 20_000)  # the same minute: nothing new
    assert uses.due(t0 + 70_000) is None
    uses.note("tok_a", t0 + MINUTE_MS)
    assert uses.due(t0 + 30_000) is None  # less than a minute since the last proposal
    assert uses.due(t0 + MINUTE_MS + 10) == (("tok_a",), 11 * MINUTE_MS)
