"""The node's part of the cluster's identity: the data directory's identity
file, the gate on Raft messages, the peers' verdict and the leader's duties."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raftsched import core
from raftsched.core.kernel import identity as core_identity
from raftsched.core.kernel.commands import Entry, RecordIncarnation, SetClusterId
from raftsched.identity import (
    EXIT_FOREIGN_DATA,
    EXIT_INCARNATION_REFUSED,
    ForeignDataDirectory,
    NodeIdentity,
    open_identity,
    read_identity,
    write_identity,
)
from raftsched.node.identity import (
    IdentityGate,
    PeerIdentity,
    as_json,
    from_answer,
    leader_duties,
    refusal,
)
from raftsched.node.metrics import NodeMetrics
from raftsched.raft_journal import StorageError

ME = NodeIdentity("n3", "inc_me", "clu_a")


def named_state(cluster: str = "clu_a", **incarnations: str) -> core.State:
    state = core.new_state()
    commands = [SetClusterId(cluster)] + [RecordIncarnation(n, i) for n, i in incarnations.items()]
    core.apply_entry(state, Entry(1, 1_000, tuple(commands)))
    return state


# -- the identity file -----------------------------------------------------------


def test_a_new_data_directory_gets_an_incarnation_that_stays(tmp_path: Path) -> None:
    raft_dir = tmp_path / "raft"
    first = open_identity(raft_dir, "n1")
    assert first.node_id == "n1" and first.cluster_id is None
    assert first.incarnation.startswith("inc_") and len(first.incarnation) == 36
    assert open_identity(raft_dir, "n1") == first
    write_identity(raft_dir, first.with_cluster("clu_x"))
    assert read_identity(raft_dir) == NodeIdentity("n1", first.incarnation, "clu_x")
    assert not (raft_dir / "identity.json.tmp").exists()


def test_a_data_directory_of_release_0_3_0_gets_one_and_keeps_its_files(tmp_path: Path) -> None:
    raft_dir = tmp_path / "raft"
    raft_dir.mkdir()
    (raft_dir / "raft.meta").write_bytes(b"\x80")
    made = open_identity(raft_dir, "n2")
    assert read_identity(raft_dir) == made
    assert (raft_dir / "raft.meta").read_bytes() == b"\x80"


def test_another_nodes_data_directory_is_refused(tmp_path: Path) -> None:
    open_identity(tmp_path / "raft", "n1")
    with pytest.raises(ForeignDataDirectory, match="node n1's, not n2's"):
        open_identity(tmp_path / "raft", "n2")


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", json.dumps({"format": 9}), json.dumps({"format": 1, "node_id": 3})],
)
def test_an_identity_file_that_is_not_one_is_refused(tmp_path: Path, text: str) -> None:
    (tmp_path / "identity.json").write_text(text)
    with pytest.raises(StorageError):
        read_identity(tmp_path)


# -- the gate --------------------------------------------------------------------


def gate_on(state: core.State, mine: NodeIdentity = ME) -> tuple[IdentityGate, NodeMetrics]:
    metrics = NodeMetrics()
    return IdentityGate(mine, lambda: state, metrics), metrics


def refused(metrics: NodeMetrics, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "raftsched_raft_messages_refused_total", {"reason": reason}
    )
    return value or 0.0


def test_the_gate_admits_the_recorded_incarnation_and_refuses_another() -> None:
    gate, metrics = gate_on(named_state(n1="inc_1"))
    assert gate.stamp() == ("clu_a", "n3", "inc_me")
    assert gate.admits(("clu_a", "n1", "inc_1"))
    assert gate.admits(("clu_a", "n2", "inc_2"))  # not recorded yet: heard
    assert gate.heard == {"n1": "inc_1", "n2": "inc_2"}
    assert not gate.admits(("clu_a", "n1", "inc_wiped"))
    assert not gate.admits((None, "n1", "inc_wiped"))  # a fresh directory knows no cluster
    assert refused(metrics, "incarnation") == 2
    assert gate.heard["n1"] == "inc_1"


def test_the_gate_refuses_another_cluster_and_malformed_stamps() -> None:
    gate, metrics = gate_on(named_state())
    assert not gate.admits(("clu_b", "n1", "inc_1"))
    assert not gate.admits(("clu_a", "n1"))
    assert not gate.admits("n1")
    assert refused(metrics, "cluster") == 1 and refused(metrics, "malformed") == 2
    # A node that has not learned the cluster's id yet refuses no cluster.
    fresh, _ = gate_on(core.new_state(), NodeIdentity("n3", "inc_me"))
    assert fresh.admits(("clu_b", "n1", "inc_1"))


def test_a_restored_state_holds_nobody_to_the_old_clusters_incarnations() -> None:
    restored = NodeIdentity("n1", "inc_new", "clu_new", restored_from="clu_old")
    state = named_state("clu_old", n2="inc_old_2")
    gate, _ = gate_on(state, restored)
    assert gate.admits(("clu_new", "n2", "inc_new_2"))
    assert as_json(restored, state)["incarnations"] == {}


# -- the peers' verdict ------------------------------------------------------------


def peer(node_id: str, cluster: str | None, **held: str) -> PeerIdentity:
    return PeerIdentity(cluster, node_id, f"inc_{node_id}", held)


def test_a_node_that_a_majority_holds_to_another_incarnation_is_refused() -> None:
    wiped = NodeIdentity("n3", "inc_new")
    peers = {"u1": peer("n1", "clu_a", n3="inc_old"), "u2": peer("n2", "clu_a", n3="inc_old")}
    verdict = refusal(wiped, peers, 3)
    assert verdict is not None and verdict.exit_status == EXIT_INCARNATION_REFUSED
    assert "inc_old" in verdict.message and "new member" in verdict.message
    # One peer is not a majority of three; an unrecorded id is welcome.
    assert refusal(wiped, {"u1": peers["u1"], "u2": None}, 3) is None
    assert refusal(wiped, {"u1": peer("n1", "clu_a"), "u2": peer("n2", "clu_a")}, 3) is None


def test_a_node_with_another_clusters_data_is_refused_by_a_majority_only() -> None:
    peers = {"u1": peer("n1", "clu_a"), "u2": peer("n2", "clu_a")}
    foreign = NodeIdentity("n3", "inc_me", "clu_b")
    verdict = refusal(foreign, peers, 3)
    assert verdict is not None and verdict.exit_status == EXIT_FOREIGN_DATA
    assert "clu_b" in verdict.message and "clu_a" in verdict.message
    # The healthy node that sees one foreign peer carries on.
    healthy = NodeIdentity("n1", "inc_n1", "clu_a")
    assert refusal(healthy, {"u2": peer("n2", "clu_a"), "u3": peer("n3", "clu_b")}, 3) is None


def test_peer_identities_come_from_time_answers() -> None:
    body = {"wall_ms": 1, "identity": as_json(ME, named_state(n3="inc_me"))}
    assert from_answer(body) == PeerIdentity("clu_a", "n3", "inc_me", {"n3": "inc_me"})
    assert from_answer({"wall_ms": 1}) is None  # release 0.3.0
    assert from_answer({"identity": {"node_id": 3}}) is None


# -- the leader's duties -------------------------------------------------------------


def test_the_leader_names_the_cluster_then_records_the_members_it_heard() -> None:
    fresh = NodeIdentity("n1", "inc_1")
    (name,) = leader_duties(core.new_state(), fresh, {}, ["n1", "n2", "n3"])
    assert isinstance(name, SetClusterId) and name.previous is None
    assert core_identity.valid_name(name.cluster_id) and name.cluster_id.startswith("clu_")
    state = named_state(n1="inc_1")
    heard = {"n2": "inc_2", "n9": "inc_9"}  # n9 is not a member
    assert leader_duties(state, fresh.with_cluster("clu_a"), heard, ["n1", "n2", "n3"]) == [
        RecordIncarnation("n2", "inc_2")
    ]


def test_a_restored_clusters_leader_renames_the_state_it_was_restored_from() -> None:
    restored = NodeIdentity("n1", "inc_1", "clu_new", restored_from="clu_old")
    state = named_state("clu_old", n1="inc_old")
    assert leader_duties(state, restored, {}, ["n1"]) == [SetClusterId("clu_new", "clu_old")]
    # A state of yet another cluster is not renamed.
    assert leader_duties(named_state("clu_other"), restored, {}, ["n1"]) == []
