"""Power cut in the middle of load: every acknowledged entry survives with fsync.

With RAFTSCHED_SIMULATE_POWER_CUT=1 the nodes keep everything they have not
fsynced in process memory, so SIGKILL loses exactly what a power cut would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest
from raft_support import Cluster, ToyNode

from raftsched import raft_journal
from raftsched.raft import decode_command

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

# A slow, uneven disk (0-10 ms per fsync) so that an acknowledgement sent
# before its fsync would leave a window for the kill to land in.
POWER_CUT_ENV = {
    raft_journal.SIMULATE_POWER_CUT_ENV: "1",
    raft_journal.SIMULATE_FSYNC_DELAY_ENV: "0.010",
}


def durable_entries(data_dir: Path) -> set[bytes]:
    """Everything a node could recover from its disk: snapshot state plus journal."""
    found: set[bytes] = set()
    snapshot = data_dir / raft_journal.SNAPSHOT_NAME
    if snapshot.exists():
        _, body = raft_journal.decode_snapshot(snapshot.read_bytes())
        found.update(msgpack.unpackb(body))
    for command, _, _ in raft_journal.read_journal_entries(data_dir):
        data = decode_command(command)
        if data is not None:
            found.add(data)
    return found


def run_load_then_cut_power(cluster: Cluster, acknowledged_min: int) -> list[bytes]:
    """Propose from one client until enough are acknowledged, then kill every node."""
    leader = cluster.wait_leader()
    acknowledged: list[bytes] = []
    stop = threading.Event()

    def load(node: ToyNode) -> None:
        sequence = 0
        while not stop.is_set():
            data = b"load-%d" % sequence
            sequence += 1
            try:
                reply = node.propose(data)
            except OSError:
                return
            if reply.get("ok"):
                acknowledged.append(data)

    thread = threading.Thread(target=load, args=(leader,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while len(acknowledged) < acknowledged_min and time.monotonic() < deadline:
        time.sleep(0.005)
    # All at once, while a proposal is (very likely) in flight.
    cluster.kill_all()
    stop.set()
    thread.join(10)
    assert len(acknowledged) >= acknowledged_min
    return list(acknowledged)


def test_power_cut_loses_no_acknowledged_entry_with_fsync(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(compaction=40, env=POWER_CUT_ENV)
    cluster.start()
    acknowledged = run_load_then_cut_power(cluster, acknowledged_min=120)

    recovered = {node.node_id: durable_entries(node.data_dir) for node in cluster.nodes.values()}
    for data in acknowledged:
        holders = [node_id for node_id, entries in recovered.items() if data in entries]
        assert len(holders) >= 2, f"{data!r} is durable only on {holders}"

    cluster.start()
    cluster.wait_leader()
    assert cluster.propose_on_leader(b"after-power-cut")["ok"]
    state = cluster.wait_converged(lambda entries: entries[-1:] == [b"after-power-cut"])
    position = {data: index for index, data in enumerate(state)}
    missing = [data for data in acknowledged if data not in position]
    assert not missing, f"lost {len(missing)} acknowledged entries: {missing[:5]}"
    assert [position[data] for data in acknowledged] == sorted(
        position[data] for data in acknowledged
    )


def test_power_cut_loses_acknowledged_entries_without_fsync(
    make_cluster: Callable[..., Cluster],
) -> None:
    # The negative control: pysyncobj's own behaviour (no fsync). Without a
    # snapshot, nothing acknowledged in the last writeback interval (30 s)
    # reached the emulated disk.
    cluster = make_cluster(durability="none", env=POWER_CUT_ENV)
    cluster.start()
    acknowledged = run_load_then_cut_power(cluster, acknowledged_min=50)

    on_disk = [durable_entries(node.data_dir) for node in cluster.nodes.values()]
    lost_on_disk = [data for data in acknowledged if sum(data in e for e in on_disk) < 2]
    assert lost_on_disk, "without fsync a power cut should lose acknowledged entries"

    cluster.start()
    cluster.wait_leader()
    assert cluster.propose_on_leader(b"after-power-cut")["ok"]
    state = cluster.wait_converged(lambda entries: entries[-1:] == [b"after-power-cut"])
    lost = [data for data in acknowledged if data not in state]
    assert lost, "without fsync a power cut should lose acknowledged entries"
