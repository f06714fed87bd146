"""Three toy nodes in real processes on loopback: election, failover, catch-up, security."""

from __future__ import annotations

import pickle
import socket
import struct
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from raft_support import Cluster

from raftsched import raft_journal
from raftsched.raft import decode_command

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def test_election_and_replication(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster()
    cluster.start()
    leader = cluster.wait_leader()
    results = [leader.propose(b"entry-%d" % i) for i in range(20)]
    assert all(reply["ok"] for reply in results), results
    assert [reply["result"] for reply in results] == list(range(1, 21))

    entries = cluster.wait_converged(lambda entries: len(entries) == 20)
    assert entries == [b"entry-%d" % i for i in range(20)]
    status = leader.status()
    assert status["role"] == "leader" and status["leader_id"] == leader.node_id
    assert all(peer["reachable"] for peer in status["peers"])
    assert all(peer["match_index"] >= status["commit_index"] for peer in status["peers"])

    follower = next(node for node in cluster.nodes.values() if node is not leader)
    assert follower.propose(b"from-follower") == {
        "ok": False,
        "result": None,
        "error": "not_leader",
    }


def test_leader_kill_elects_a_new_leader_without_losing_acknowledged_entries(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster()
    cluster.start()
    old_leader = cluster.wait_leader()
    acknowledged = [b"before-%d" % i for i in range(10)]
    for data in acknowledged:
        assert old_leader.propose(data)["ok"]

    old_leader.kill()
    killed_at = time.monotonic()
    new_leader = cluster.wait_leader(exclude=old_leader.node_id)
    failover_s = time.monotonic() - killed_at
    assert new_leader is not old_leader
    assert failover_s < 5, failover_s

    for i in range(5):
        data = b"after-%d" % i
        assert cluster.propose_on_leader(data)["ok"]
        acknowledged.append(data)
    assert cluster.wait_converged(lambda entries: entries == acknowledged)

    # The old leader restarts from its own disk and rejoins as a follower.
    old_leader.start()
    cluster.wait_converged(lambda entries: entries == acknowledged)


def test_restart_of_the_whole_cluster_restores_snapshot_and_journal(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(compaction=15)
    cluster.start()
    cluster.wait_leader()
    acknowledged = [b"e-%d" % i for i in range(40)]
    for data in acknowledged:
        assert cluster.propose_on_leader(data)["ok"]
    before = cluster.wait_converged(lambda entries: entries == acknowledged)
    for node in cluster.nodes.values():
        assert (node.data_dir / raft_journal.SNAPSHOT_NAME).exists(), node.node_id
        node.stop()

    cluster.start()
    # Each node applies its own committed prefix before any new leader speaks.
    cluster.wait_leader()
    assert cluster.propose_on_leader(b"after-restart")["ok"]
    assert cluster.wait_converged(lambda entries: len(entries) == 41) == [
        *before,
        b"after-restart",
    ]


def test_follower_catches_up_by_log_then_by_snapshot(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(compaction=20)
    cluster.start()
    leader = cluster.wait_leader()
    follower = next(node for node in cluster.nodes.values() if node is not leader)
    expected: list[bytes] = []

    def commit(count: int, prefix: str) -> None:
        for i in range(count):
            data = f"{prefix}-{i}".encode()
            for _ in range(20):
                reply = cluster.wait_leader().propose(data)
                if reply["ok"]:
                    break
                # On two shared cores with a node down and snapshots forking,
                # leadership can move; `not_leader` means nothing was
                # appended, so proposing again cannot duplicate the entry.
                assert reply["error"] == "not_leader", reply
            assert reply["ok"], reply
            expected.append(data)

    # Down for a few entries: the leader still has them in its log.
    follower.kill()
    commit(5, "log")
    follower.start()
    cluster.wait_converged(lambda entries: entries == expected)

    # Down for many entries: the leader compacts past them, so only a
    # snapshot can bring the follower back.
    follower.kill()
    missed_from = len(expected) + 1
    commit(60, "snap")
    leader_log = raft_journal.read_journal_entries(cluster.wait_leader().data_dir)
    assert leader_log[0][1] > missed_from, "the leader should have compacted"
    follower.start()
    cluster.wait_converged(lambda entries: entries == expected)
    commit(3, "after")
    cluster.wait_converged(lambda entries: entries == expected)
    assert "failed to load full dump" not in follower.log_path.read_text()


def test_a_follower_with_entries_no_leader_committed_never_applies_them(
    make_cluster: Callable[..., Cluster],
) -> None:
    """A deposed leader comes back holding entries that never committed, and
    the new leader has compacted past them, so it installs a snapshot.

    pysyncobj raises a follower's commit index from every AppendEntries
    message, a snapshot's chunks included: to min(leader's commit index,
    the follower's last index). A snapshot chunk has checked nothing about
    the follower's log, so the deposed leader would commit and apply its own
    uncommitted entries before the snapshot replaced them (and tell callers
    waiting on them that they committed). The adapter keeps a snapshot chunk
    from raising the commit index."""
    cluster = make_cluster(compaction=20)
    cluster.start()
    old = cluster.wait_leader()
    for i in range(3):
        assert cluster.propose_on_leader(f"before-{i}".encode())["ok"]
    cluster.wait_converged(lambda entries: len(entries) == 3)
    others = [node for node in cluster.nodes.values() if node is not old]
    for node in others:
        node.kill()
    # Alone, the leader appends these (and makes them durable) but cannot
    # commit them.
    for i in range(3):
        reply = old.propose(f"uncommitted-{i}".encode(), timeout_s=0.5)
        assert not reply["ok"], reply
    old.kill()
    held = [decode_command(entry[0]) for entry in raft_journal.read_journal_entries(old.data_dir)]
    assert b"uncommitted-0" in held, "the deposed leader should hold an uncommitted entry"
    for node in others:
        node.start()
    committed = [f"before-{i}".encode() for i in range(3)]
    for i in range(60):
        # Big entries make a snapshot of many chunks, sent over many ticks.
        data = f"after-{i}-".encode().ljust(50_000, b".")
        assert cluster.propose_on_leader(data, timeout_s=20)["ok"]
        committed.append(data)
    leader_log = raft_journal.read_journal_entries(cluster.wait_leader().data_dir)
    assert leader_log[0][1] > 8, "the new leader should have compacted past them"
    old.start()
    cluster.wait_converged(lambda entries: entries == committed, timeout_s=30)
    ever = [bytes.fromhex(item) for item in old.state()["ever_applied"]]
    assert not [data for data in ever if data.startswith(b"uncommitted")], ever


@pytest.mark.expect_log_errors(
    r"state machine raised applying entry",
    reason="the test makes the machine raise; the adapter logs it and skips the entry",
)
def test_exception_in_apply_does_not_wedge_any_node(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster()
    cluster.start()
    leader = cluster.wait_leader()
    assert leader.propose(b"one")["ok"]
    reply = leader.propose(b"raise-please")
    assert reply == {"ok": False, "result": None, "error": "apply_failed"}
    assert leader.propose(b"two") == {"ok": True, "result": 2, "error": None}
    assert cluster.wait_converged(lambda entries: entries == [b"one", b"two"])
    for node in cluster.nodes.values():
        assert "state machine raised applying entry" in node.log_path.read_text()


def test_wrong_secret_and_junk_get_nothing_done(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster()
    rogue = cluster.nodes["c"]
    rogue.secret = "a-different-secret-0123456789abcd"
    cluster.start()
    leader = cluster.wait_leader(exclude="c")
    assert leader.node_id != "c"
    for i in range(5):
        assert leader.propose(b"e-%d" % i)["ok"]

    # A pickle that would create a file if anything unpickled it.
    marker = tmp_path / "pwned"
    payload = zlib.compress(pickle.dumps(_CreateFile(str(marker))))
    attacks = [
        struct.pack("i", len(payload)) + payload,
        b"\x00\x01garbage" * 100,
        struct.pack("i", 2**31 - 1) + b"x" * 10,
    ]
    host, port = leader.raft_address.rsplit(":", 1)
    for attack in attacks:
        with socket.create_connection((host, int(port)), timeout=2) as conn:
            conn.sendall(attack)
            time.sleep(0.2)

    assert leader.propose(b"still-working")["ok"]
    assert not marker.exists()
    rogue_status = rogue.status()
    assert rogue_status["leader_id"] is None and rogue_status["term"] == 0
    assert not any(peer["reachable"] for peer in rogue_status["peers"])
    assert rogue.state()["entries"] == []
    leader_view = {peer["id"]: peer["reachable"] for peer in leader.status()["peers"]}
    assert leader_view["c"] is False


class _CreateFile:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))
