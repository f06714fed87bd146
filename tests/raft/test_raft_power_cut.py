"""Power cuts: of the journal in process, and of a cluster in the middle of load.

With RAFTSCHED_SIMULATE_POWER_CUT=1 (`raftsched.power_cut`) a file's bytes
count as on the disk only once a real fsync/fdatasync of that file has
returned, and a name once its directory's has; `cut_power` (or a node
starting again after SIGKILL) throws away everything else. Each in-process
test below fails if the sync it names is left out of `raft_journal`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest
from raft_support import Cluster, ToyNode

from raftsched import power_cut, raft_journal
from raftsched.raft import decode_command
from raftsched.raft_journal import Disk, DurableJournal, SnapshotHeader

pytestmark = [pytest.mark.timeout(60)]

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


def simulated(*, fsync: bool = True) -> Disk:
    return Disk(fsync=fsync, simulate_power_cut=True, writeback_s=3600)


def journal_after_power_cut(directory: Path) -> DurableJournal:
    power_cut.cut_power(directory)
    return DurableJournal(directory, Disk(fsync=True, simulate_power_cut=False, writeback_s=30))


def test_a_synced_entry_survives_and_an_unsynced_one_does_not(tmp_path: Path) -> None:
    # The journal is new: its name is durable only after a directory sync.
    journal = DurableJournal(tmp_path, simulated())
    journal.add(b"synced", 1, 1)
    journal.sync()  # the fdatasync of the journal
    journal.add(b"unsynced", 2, 1)
    # The bytes did reach the file (the page cache); only a sync makes them durable.
    assert [e[0] for e in raft_journal.read_journal_entries(tmp_path)] == [b"synced", b"unsynced"]
    recovered = journal_after_power_cut(tmp_path)
    assert recovered[:] == [(b"synced", 1, 1)]


def test_entries_written_after_the_last_sync_are_lost(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, simulated())
    for index in range(1, 4):
        journal.add(b"e%d" % index, index, 1)
    journal.sync()
    journal.add(b"e4", 4, 1)
    journal.sync()
    journal.deleteEntriesFrom(3)  # lazy: the records stay on disk
    journal.add(b"other", 4, 2)  # a conflict: the cut is synced at once
    recovered = journal_after_power_cut(tmp_path)
    assert [entry[0] for entry in recovered[:]] == [b"e1", b"e2", b"e3"]


def test_term_and_vote_are_durable_when_set_current_term_returns(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, simulated())
    journal.setCurrentTerm(2, "127.0.0.1:1")
    journal.setCurrentTerm(3, "127.0.0.1:2")  # a rename over the first record
    recovered = journal_after_power_cut(tmp_path)
    assert (recovered.getCurrentTerm(), recovered.getVotedForNodeId()) == (3, "127.0.0.1:2")


def test_the_commit_index_is_lost_with_power_until_it_is_saved(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, simulated())
    journal.setCurrentTerm(1, None)
    journal.setRaftCommitIndex(7)
    assert journal_after_power_cut(tmp_path).getRaftCommitIndex() == 1
    journal = DurableJournal(tmp_path, simulated())
    journal.setRaftCommitIndex(7)
    journal.onOneSecondTimer()
    assert journal_after_power_cut(tmp_path).getRaftCommitIndex() == 7


def test_a_compacted_journal_keeps_its_tail_through_a_power_cut(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, simulated())
    for index in range(1, 11):
        journal.add(b"e%d" % index, index, 1)
    journal.sync()
    journal.deleteEntriesTo(7)  # a new file, synced, renamed over the old
    journal.add(b"e11", 11, 1)
    journal.sync()
    recovered = journal_after_power_cut(tmp_path)
    assert [entry[1] for entry in recovered[:]] == [8, 9, 10, 11]


def test_a_clean_close_makes_everything_durable(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, simulated(fsync=False))
    journal.add(b"e1", 1, 1)
    journal.setCurrentTerm(4, None)
    journal._destroy()
    recovered = journal_after_power_cut(tmp_path)
    assert (recovered[:], recovered.getCurrentTerm()) == ([(b"e1", 1, 1)], 4)


def test_without_fsync_a_power_cut_loses_what_was_not_written_back(tmp_path: Path) -> None:
    disk = simulated(fsync=False)
    journal = DurableJournal(tmp_path, disk)
    journal.add(b"e1", 1, 1)
    disk.writeback_all()  # the kernel's periodic writeback
    journal.add(b"e2", 2, 1)
    journal.setCurrentTerm(5, None)
    journal.sync()  # no-op in durability "none"
    recovered = journal_after_power_cut(tmp_path)
    assert (recovered[:], recovered.getCurrentTerm()) == ([(b"e1", 1, 1)], 0)


def test_a_snapshot_is_durable_once_synced_and_renamed_with_its_directory(
    tmp_path: Path,
) -> None:
    DurableJournal(tmp_path, simulated())  # watches the directory
    header = SnapshotHeader(last_entry=(b"b", 8, 2), previous_entry=(b"a", 7, 2), cluster=())
    final = tmp_path / raft_journal.SNAPSHOT_NAME
    temporary = tmp_path / (raft_journal.SNAPSHOT_NAME + ".tmp")
    raft_journal.write_snapshot_file(temporary, header, [b"state-1"], durable=True)
    temporary.replace(final)
    raft_journal.fsync_directory(tmp_path)
    raft_journal.write_snapshot_file(temporary, header, [b"state-2"], durable=False)
    temporary.replace(final)  # neither the file nor the rename synced
    power_cut.cut_power(tmp_path)
    assert raft_journal.decode_snapshot(final.read_bytes()) == (header, b"state-1")
    assert not temporary.exists()


@pytest.mark.e2e
def test_power_cut_loses_no_acknowledged_entry_with_fsync(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(compaction=40, env=POWER_CUT_ENV)
    cluster.start()
    acknowledged = run_load_then_cut_power(cluster, acknowledged_min=120)

    for node in cluster.nodes.values():
        power_cut.cut_power(node.data_dir)
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


@pytest.mark.e2e
def test_power_cut_loses_acknowledged_entries_without_fsync(
    make_cluster: Callable[..., Cluster],
) -> None:
    # The negative control: pysyncobj's own behaviour (no fsync). Without a
    # snapshot, nothing acknowledged in the last writeback interval (30 s)
    # reached the emulated disk.
    cluster = make_cluster(durability="none", env=POWER_CUT_ENV)
    cluster.start()
    acknowledged = run_load_then_cut_power(cluster, acknowledged_min=50)

    for node in cluster.nodes.values():
        power_cut.cut_power(node.data_dir)
    on_disk = [durable_entries(node.data_dir) for node in cluster.nodes.values()]
    lost_on_disk = [data for data in acknowledged if sum(data in e for e in on_disk) < 2]
    assert lost_on_disk, "without fsync a power cut should lose acknowledged entries"

    cluster.start()
    cluster.wait_leader()
    assert cluster.propose_on_leader(b"after-power-cut")["ok"]
    state = cluster.wait_converged(lambda entries: entries[-1:] == [b"after-power-cut"])
    lost = [data for data in acknowledged if data not in state]
    assert lost, "without fsync a power cut should lose acknowledged entries"
