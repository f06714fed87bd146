"""Log compaction's triggers, each on its own, on three toy nodes in real processes.

pysyncobj compacts on an entry count or on time since the last snapshot;
the adapter adds journal bytes (raftsched.raft `_compact_by_bytes`). Each
test sets the other two triggers far out of reach.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable

import msgpack
import pytest
from raft_support import Cluster, ToyNode

from raftsched import raft_journal

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

FAR_ENTRIES = 100_000
FAR_BYTES = 1 << 30
FAR_INTERVAL_S = 3600.0


def _wait_snapshots(nodes: list[ToyNode], timeout_s: float) -> dict[str, dict[str, object]]:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = {node.node_id: node.request({"op": "snapshot_stats"}) for node in nodes}
        if all(item["taken"] >= 1 for item in stats.values()):
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.2)


def _wait_compacted(node: ToyNode, past: int, timeout_s: float = 20) -> None:
    """Until the node's journal starts after index `past` (the journal is
    cut on the tick after its snapshot child is done)."""
    deadline = time.monotonic() + timeout_s
    while raft_journal.read_journal_entries(node.data_dir)[0][1] <= past:
        assert time.monotonic() < deadline, f"{node.node_id} kept its journal from {past}"
        time.sleep(0.1)


def _commit_all(cluster: Cluster, entries: list[bytes]) -> None:
    for data in entries:
        assert cluster.propose_on_leader(data)["ok"], data


def test_the_journal_s_bytes_trigger_a_snapshot_below_the_entry_count(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(
        compaction=FAR_ENTRIES, compaction_bytes=64 * 1024, compaction_interval_s=FAR_INTERVAL_S
    )
    cluster.start()
    cluster.wait_leader()
    nodes = list(cluster.nodes.values())
    small = [b"small-%d" % i for i in range(10)]
    _commit_all(cluster, small)
    cluster.wait_converged(lambda entries: entries == small)
    time.sleep(0.5)  # a few ticks: nothing is due yet
    for node in nodes:
        assert node.request({"op": "snapshot_stats"})["taken"] == 0, node.node_id
        assert not (node.data_dir / raft_journal.SNAPSHOT_NAME).exists()

    # 40 entries of 8 KiB: 320 KiB of journal, past every replica's staggered
    # threshold (64 to 96 KiB), and far below the entry count.
    large = [b"large-%d-" % i + b"x" * 8192 for i in range(40)]
    _commit_all(cluster, large)
    stats = _wait_snapshots(nodes, timeout_s=20)
    expected = small + large
    cluster.wait_converged(lambda entries: entries == expected)
    for node in nodes:
        _wait_compacted(node, past=1)
        assert (node.data_dir / raft_journal.SNAPSHOT_NAME).exists()
        item = stats[node.node_id]
        # The fork's cost is measured: the pause, and what the child copied.
        assert isinstance(item["fork_pause_s"], float) and 0 < item["fork_pause_s"] < 5, item
        assert isinstance(item["cow_bytes"], int) and item["cow_bytes"] > 0, item
        assert isinstance(item["size_bytes"], int) and item["size_bytes"] > 0, item


def test_the_interval_triggers_a_snapshot_of_a_few_entries(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(
        compaction=FAR_ENTRIES, compaction_bytes=FAR_BYTES, compaction_interval_s=2.0
    )
    cluster.start()
    cluster.wait_leader()
    nodes = list(cluster.nodes.values())
    entries = [b"e-%d" % i for i in range(5)]
    started = time.monotonic()
    _commit_all(cluster, entries)
    # Staggered: 2 s to 2.67 s after each node's start (or its last snapshot).
    _wait_snapshots(nodes, timeout_s=15)
    assert time.monotonic() - started < 15
    for node in nodes:
        header = raft_journal.read_snapshot_header(node.data_dir / raft_journal.SNAPSHOT_NAME)
        assert header.last_entry[1] >= 2, node.node_id

    # And nothing more while nothing is applied: the interval alone does not
    # write the same state again. First every node's snapshot must hold all
    # it applied: on a loaded machine a node's first snapshot may come before
    # its last entries, and the interval rightly takes the newer state.
    def covered(node: ToyNode) -> bool:
        header = raft_journal.read_snapshot_header(node.data_dir / raft_journal.SNAPSHOT_NAME)
        return bool(header.last_entry[1] == node.request({"op": "status"})["applied_index"])

    deadline = time.monotonic() + 15
    while not all(covered(node) for node in nodes):
        assert time.monotonic() < deadline, "a snapshot never caught up with its node"
        time.sleep(0.2)
    taken = {node.node_id: node.request({"op": "snapshot_stats"})["taken"] for node in nodes}
    time.sleep(3.5)
    again = {node.node_id: node.request({"op": "snapshot_stats"})["taken"] for node in nodes}
    assert again == taken


def test_a_restart_loads_its_snapshot_and_measures_it(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(compaction=20)
    cluster.start()
    cluster.wait_leader()
    entries = [b"r-%d" % i for i in range(40)]
    _commit_all(cluster, entries)
    cluster.wait_converged(lambda applied: applied == entries)
    node = next(iter(cluster.nodes.values()))
    _wait_snapshots([node], timeout_s=10)
    term_before = max(n.status()["term"] for n in cluster.nodes.values())
    node.stop()
    node.start()
    deadline = time.monotonic() + 10
    while (stats := node.request({"op": "snapshot_stats"}))["loads"] < 1:
        assert time.monotonic() < deadline, stats
        time.sleep(0.1)
    assert isinstance(stats["load_s"], float) and stats["load_s"] > 0
    cluster.wait_converged(lambda applied: applied == entries)
    # The restarted follower did not depose the leader.
    assert max(n.status()["term"] for n in cluster.nodes.values()) == term_before


@pytest.mark.slow
# 40 MB through a snapshot transfer, with its own 90 s bounds: the module's
# 60 s cut it short once while two other test files ran beside it.
@pytest.mark.timeout(180)
def test_a_snapshot_transfer_longer_than_the_connection_timeout_arrives_whole(
    make_cluster: Callable[..., Cluster],
) -> None:
    # The leader closes a connection it has read nothing from for the
    # connection timeout (1.2 s here). A follower receiving a snapshot used
    # to answer nothing until the last chunk, so a longer transfer was cut;
    # pysyncobj went on from its place in the file on the next connection
    # and the follower's copy arrived torn ("failed to load full dump"),
    # again and again. ~40 MB of random bytes take longer than that to send.
    cluster = make_cluster(compaction=10, connection_timeout_s=1.2)
    cluster.start()
    cluster.wait_leader()
    follower = next(node for node in cluster.nodes.values() if node is not cluster.wait_leader())
    follower.kill()
    entries = [os.urandom(1024 * 1024) for _ in range(40)]
    _commit_all(cluster, entries)
    leader = cluster.wait_leader()
    _wait_compacted(leader, past=2)
    term = leader.status()["term"]
    # Writes go on during the catch-up, far more entries than a compaction
    # takes (10): had the leader compacted while sending, the follower would
    # have needed the next snapshot, and the next (RaftNode._holding_for_transfer).
    stop = threading.Event()
    written: list[bytes] = []

    def write() -> None:
        for index in range(5_000):
            if stop.is_set():
                return
            data = b"during-%d" % index
            if leader.propose(data)["ok"]:
                written.append(data)

    writer = threading.Thread(target=write, daemon=True)
    started = time.monotonic()
    follower.start()
    writer.start()
    deadline = time.monotonic() + 90
    while follower.request({"op": "snapshot_stats"})["loads"] < 1 or (
        follower.status()["applied_index"] < leader.status()["commit_index"] - 20
    ):
        assert time.monotonic() < deadline, "the follower did not catch up"
        time.sleep(0.2)
    stop.set()
    writer.join(30)
    assert len(written) > 20, "the leader served no writes during the catch-up"
    expected = hashlib.sha256(msgpack.packb(entries + written)).hexdigest()
    while {node.request({"op": "digest"})["digest"] for node in cluster.nodes.values()} != {
        expected
    }:
        assert time.monotonic() < deadline, "the replicas did not converge"
        time.sleep(0.2)
    took_s = time.monotonic() - started
    assert follower.request({"op": "snapshot_stats"})["loads"] >= 1
    assert "failed to load full dump" not in follower.log_path.read_text(), took_s
    assert {node.status()["term"] for node in cluster.nodes.values()} == {term}
