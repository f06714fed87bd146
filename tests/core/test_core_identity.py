"""The cluster's identity in the replicated state (core.kernel.identity)."""

from __future__ import annotations

from raftsched import core
from raftsched.core.kernel import identity
from raftsched.core.kernel.commands import (
    Command,
    Entry,
    ForgetIncarnation,
    RecordIncarnation,
    SetClusterId,
)
from raftsched.core.kernel.results import Ack, Rejected


def apply(state: core.State, *commands: Command) -> list[object]:
    results = core.apply_entry(state, Entry(1, 1_000, commands))
    assert core.check_invariants(state) == []
    return list(results)


def codes(results: list[object]) -> list[str]:
    return [r.code if isinstance(r, Rejected) else type(r).__name__ for r in results]


def test_a_state_without_an_identity_keeps_its_bytes() -> None:
    state = core.new_state()
    before = core.encode_state(state)
    assert identity.cluster_id(state) is None
    assert core.encode_state(state) == before


def test_the_cluster_is_named_once() -> None:
    state = core.new_state()
    results = apply(
        state,
        SetClusterId("clu_a"),
        SetClusterId("clu_a"),
        SetClusterId("clu_b"),
        SetClusterId("clu b"),
        SetClusterId("clu_c", previous="clu_x"),
    )
    assert codes(results) == ["Ack", "Ack", "invalid_state", "invalid_request", "invalid_state"]
    assert identity.cluster_id(state) == "clu_a"


def test_a_restored_state_is_renamed_and_forgets_the_old_members() -> None:
    state = core.new_state()
    apply(state, SetClusterId("clu_old"), RecordIncarnation("n1", "inc_old"))
    assert apply(state, SetClusterId("clu_new", previous="clu_old")) == [Ack()]
    assert identity.cluster_id(state) == "clu_new" and identity.incarnations(state) == {}
    assert codes(apply(state, SetClusterId("clu_late", previous="clu_old"))) == ["invalid_state"]


def test_an_incarnation_is_recorded_once_until_the_member_is_forgotten() -> None:
    state = core.new_state()
    results = apply(
        state,
        SetClusterId("clu_a"),
        RecordIncarnation("n1", "inc_1"),
        RecordIncarnation("n1", "inc_1"),
        RecordIncarnation("n1", "inc_wiped"),
        RecordIncarnation("n2", ""),
    )
    assert codes(results) == ["Ack", "Ack", "Ack", "invalid_state", "invalid_request"]
    assert "remove, then add" in results[3].message  # type: ignore[attr-defined]
    assert apply(state, ForgetIncarnation("n1"), RecordIncarnation("n1", "inc_new")) == [
        Ack(),
        Ack(),
    ]
    assert identity.incarnations(state) == {"n1": "inc_new"}


def test_the_identity_survives_a_snapshot_and_changes_the_digest() -> None:
    state = core.new_state()
    empty_digest = core.state_digest(state)
    apply(state, SetClusterId("clu_a"), RecordIncarnation("n2", "inc_2"))
    restored = core.decode_state(core.encode_state(state))
    assert identity.identity(restored) == identity.Identity("clu_a", {"n2": "inc_2"})
    assert core.state_digest(restored) == core.state_digest(state) != empty_digest
