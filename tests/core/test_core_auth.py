"""API tokens in the core: create, bootstrap, revoke, touch, the optional section."""

from __future__ import annotations

import hashlib

import msgpack
import pytest
from core_support import T0, Cluster

from raftsched.core import decode_state, encode_state
from raftsched.core.auth.commands import BootstrapAdmin, CreateToken, RevokeToken, TouchTokens
from raftsched.core.auth.tokens import (
    TOKENS,
    auth_enabled,
    find_by_hash,
    get_token,
    list_tokens,
)
from raftsched.core.kernel.commands import RaiseClusterVersion
from raftsched.core.kernel.results import Ack, Rejected, TokenSaved


def h(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def bootstrapped() -> Cluster:
    cluster = Cluster()
    cluster.one(RaiseClusterVersion(3))
    assert cluster.one(BootstrapAdmin("tok_admin", "admin", h("rsk_a"))) == TokenSaved(
        "tok_admin", True
    )
    return cluster


def create(cluster: Cluster, token_id: str, role: str = "viewer", **kw: object) -> object:
    fields: dict[str, object] = {
        "name": token_id,
        "role": role,
        "tenants": ("*",),
        "queues": ("*",),
        "secret_hash": h(f"rsk_{token_id}"),
    }
    fields.update(kw)
    return cluster.one(CreateToken(token_id, **fields))  # type: ignore[arg-type]


def test_a_state_without_tokens_has_auth_off_and_keeps_its_bytes() -> None:
    cluster = Cluster()
    cluster.submit()
    assert not auth_enabled(cluster.state)
    names = [name for name, _ in msgpack.unpackb(encode_state(cluster.state))[7]]
    assert TOKENS not in names


def test_bootstrap_turns_auth_on_and_is_idempotent_for_the_same_secret() -> None:
    cluster = bootstrapped()
    assert auth_enabled(cluster.state)
    token = get_token(cluster.state, "tok_admin")
    assert token is not None and token.role == "admin" and token.tenants == ("*",)
    assert token.created_at_ms == T0
    before = cluster.digest()
    # The same file on another node, or a retried proposal: the same token.
    assert cluster.one(BootstrapAdmin("tok_other", "admin", h("rsk_a"))) == TokenSaved(
        "tok_admin", False
    )
    # A different secret once an admin exists: refused, nothing changes.
    result = cluster.one(BootstrapAdmin("tok_other", "admin", h("rsk_b")))
    assert isinstance(result, Rejected) and result.code == "invalid_state"
    assert cluster.digest() == before


def test_create_stores_only_the_hash_and_indexes_it() -> None:
    cluster = bootstrapped()
    assert create(cluster, "tok_s", "submitter", tenants=("acme",)) == TokenSaved("tok_s", True)
    found = find_by_hash(cluster.state, h("rsk_tok_s"))
    assert found is not None and found.id == "tok_s" and found.tenants == ("acme",)
    data = encode_state(cluster.state)
    assert b"rsk_tok_s" not in data
    assert [t.id for t in list_tokens(cluster.state)] == ["tok_admin", "tok_s"]


@pytest.mark.parametrize(
    "change",
    [
        {"role": "root"},
        {"tenants": ()},
        {"tenants": ("*", "acme")},
        {"queues": ("a", "a")},
        {"secret_hash": b"short"},
        {"name": ""},
        {"expires_at_ms": T0 - 1},
    ],
)
def test_bad_creates_are_refused_and_change_nothing(change: dict[str, object]) -> None:
    cluster = bootstrapped()
    before = cluster.digest()
    result = create(cluster, "tok_x", **change)
    assert isinstance(result, Rejected) and result.code == "invalid_request", result
    assert cluster.digest() == before


def test_ids_and_hashes_are_unique() -> None:
    cluster = bootstrapped()
    create(cluster, "tok_x")
    before = cluster.digest()
    again = create(cluster, "tok_x", secret_hash=h("fresh"))
    assert isinstance(again, Rejected) and again.code == "invalid_state"
    same_hash = create(cluster, "tok_y", secret_hash=h("rsk_tok_x"))
    assert isinstance(same_hash, Rejected) and same_hash.code == "invalid_state"
    assert cluster.digest() == before


def test_revoke_is_idempotent_and_the_last_admin_stays() -> None:
    cluster = bootstrapped()
    create(cluster, "tok_v")
    assert cluster.one(RevokeToken("tok_v"), at=T0 + 5) == TokenSaved("tok_v", True)
    token = get_token(cluster.state, "tok_v")
    assert token is not None and token.revoked_at_ms == T0 + 5 and not token.valid_at(T0 + 6)
    assert cluster.one(RevokeToken("tok_v")) == TokenSaved("tok_v", False)
    last = cluster.one(RevokeToken("tok_admin"))
    assert isinstance(last, Rejected) and last.code == "invalid_state"
    missing = cluster.one(RevokeToken("tok_nope"))
    assert isinstance(missing, Rejected) and missing.code == "not_found"
    # With a second admin, the first may go; auth stays on.
    create(cluster, "tok_admin2", "admin")
    assert cluster.one(RevokeToken("tok_admin")) == TokenSaved("tok_admin", True)
    assert auth_enabled(cluster.state)


def test_expiry_is_a_property_of_time() -> None:
    cluster = bootstrapped()
    create(cluster, "tok_e", expires_at_ms=T0 + 1_000)
    token = get_token(cluster.state, "tok_e")
    assert token is not None
    assert token.valid_at(T0 + 999) and not token.valid_at(T0 + 1_000)


def test_touch_only_moves_last_used_forward_and_skips_unknown_ids() -> None:
    cluster = bootstrapped()
    create(cluster, "tok_t")
    assert cluster.one(TouchTokens(("tok_t", "tok_gone"), T0 + 60_000), at=T0 + 60_000) == Ack()
    token = get_token(cluster.state, "tok_t")
    assert token is not None and token.last_used_at_ms == T0 + 60_000
    before = cluster.digest()
    assert cluster.one(TouchTokens(("tok_t",), T0)) == Ack()  # older: no change
    assert cluster.digest() == before
    # Never a use later than the entry's time.
    cluster.one(TouchTokens(("tok_t",), T0 + 10**9), at=T0 + 120_000)
    assert token.last_used_at_ms == T0 + 120_000


def test_the_section_round_trips_and_rebuilds_the_hash_index() -> None:
    cluster = bootstrapped()
    create(cluster, "tok_w", "worker", queues=("q",), expires_at_ms=T0 + 5_000)
    cluster.one(TouchTokens(("tok_w",), T0))
    cluster.one(RevokeToken("tok_w"))
    data = encode_state(cluster.state)
    decoded = decode_state(data)
    assert encode_state(decoded) == data
    found = find_by_hash(decoded, h("rsk_tok_w"))
    assert found is not None and found.queues == ("q",) and found.revoked_at_ms is not None
    assert auth_enabled(decoded)
