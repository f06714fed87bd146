"""The journal, the snapshot file and the adapter's refusals, in process."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftsched import power_cut, raft_journal
from raftsched.raft import (
    SNAPSHOT_CHILD_NICE,
    ProposeError,
    RaftNode,
    staggered_compaction_entries,
)
from raftsched.raft_journal import Disk, DurableJournal, SnapshotHeader


def fsync_disk() -> Disk:
    return Disk(fsync=True, simulate_power_cut=False, writeback_s=30)


def test_journal_recovers_entries_term_and_vote(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, fsync_disk())
    for index in range(1, 6):
        journal.add(b"cmd%d" % index, index, 1)
    journal.setCurrentTerm(3, "127.0.0.1:1")
    journal.setRaftCommitIndex(4)
    journal._destroy()

    reopened = DurableJournal(tmp_path, fsync_disk())
    assert [entry[1] for entry in reopened[:]] == [1, 2, 3, 4, 5]
    assert reopened[-1] == (b"cmd5", 5, 1)
    assert reopened.getCurrentTerm() == 3
    assert reopened.getVotedForNodeId() == "127.0.0.1:1"
    assert reopened.getRaftCommitIndex() == 4


def test_journal_cuts_a_torn_tail(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, fsync_disk())
    for index in range(1, 4):
        journal.add(b"x" * 50, index, 1)
    journal._destroy()
    path = tmp_path / raft_journal.JOURNAL_NAME
    path.write_bytes(path.read_bytes()[:-10])

    reopened = DurableJournal(tmp_path, fsync_disk())
    assert [entry[1] for entry in reopened[:]] == [1, 2]
    reopened.add(b"y", 3, 2)
    reopened._destroy()
    assert [entry[1:] for entry in raft_journal.read_journal_entries(tmp_path)] == [
        (1, 1),
        (2, 1),
        (3, 2),
    ]


def test_identical_reappend_after_truncation_touches_nothing(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, fsync_disk())
    for index in range(1, 6):
        journal.add(b"e%d" % index, index, 1)
    journal.sync()
    before = (tmp_path / raft_journal.JOURNAL_NAME).read_bytes()
    journal.deleteEntriesFrom(2)  # pysyncobj: overlap with entries we already hold
    journal.add(b"e3", 3, 1)
    journal.sync()
    # The tail that was not re-sent is still on disk (it may be acknowledged).
    assert (tmp_path / raft_journal.JOURNAL_NAME).read_bytes() == before
    assert len(journal) == 3
    journal.add(b"e4", 4, 1)
    journal.add(b"other", 5, 2)  # a real conflict cuts the stale tail
    journal._destroy()
    assert [entry[0] for entry in raft_journal.read_journal_entries(tmp_path)] == [
        b"e1",
        b"e2",
        b"e3",
        b"e4",
        b"other",
    ]


def test_compaction_rewrite_keeps_the_tail(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, fsync_disk())
    for index in range(1, 11):
        journal.add(b"e%d" % index, index, 1)
    journal.deleteEntriesTo(7)
    assert [entry[1] for entry in journal[:]] == [8, 9, 10]
    journal.add(b"e11", 11, 1)
    journal._destroy()
    assert [entry[1] for entry in raft_journal.read_journal_entries(tmp_path)] == [8, 9, 10, 11]


def test_journal_is_cut_to_a_snapshot_written_before_a_crash(tmp_path: Path) -> None:
    # The crash came after the snapshot was renamed into place and before
    # pysyncobj cut the journal; entries after the snapshot must survive.
    journal = DurableJournal(tmp_path, fsync_disk())
    entries = [(b"e%d" % index, index, 1) for index in range(1, 11)]
    for entry in entries:
        journal.add(*entry)
    journal._destroy()
    header = SnapshotHeader(last_entry=entries[6], previous_entry=entries[5], cluster=())
    (tmp_path / raft_journal.SNAPSHOT_NAME).write_bytes(
        raft_journal.encode_snapshot(header, b"state")
    )
    reopened = DurableJournal(tmp_path, fsync_disk())
    assert reopened[0] == entries[5] and reopened[1] == entries[6]
    assert [entry[1] for entry in reopened[:]] == [6, 7, 8, 9, 10]


def test_power_cut_simulation_loses_exactly_the_unsynced_bytes(tmp_path: Path) -> None:
    disk = Disk(fsync=True, simulate_power_cut=True, writeback_s=3600)
    journal = DurableJournal(tmp_path, disk)
    journal.add(b"synced", 1, 1)
    journal.sync()
    journal.add(b"unsynced", 2, 1)
    # No close: the process "dies" here.
    power_cut.cut_power(tmp_path)
    assert [entry[0] for entry in raft_journal.read_journal_entries(tmp_path)] == [b"synced"]


def test_snapshot_round_trip_and_corruption(tmp_path: Path) -> None:
    header = SnapshotHeader(last_entry=(b"b", 8, 2), previous_entry=(b"a", 7, 2), cluster=("x:1",))
    data = raft_journal.encode_snapshot(header, b"machine-state")
    assert raft_journal.decode_snapshot(data) == (header, b"machine-state")
    with pytest.raises(raft_journal.StorageError):
        raft_journal.decode_snapshot(data[:-1] + b"X")


def test_a_snapshot_written_piece_by_piece_is_the_same_file(tmp_path: Path) -> None:
    """The machine's bytes are streamed to the file (a 1M-job state is never
    in memory whole); the prefix, with the body's length and CRC, goes in
    last, so a file cut off before then reads as torn."""
    header = SnapshotHeader(last_entry=(b"b", 8, 2), previous_entry=(b"a", 7, 2), cluster=("x:1",))
    pieces = [b"machine", memoryview(b"-state-"), b"", b"x" * 100_000]
    path = tmp_path / "snapshot.tmp"
    raft_journal.write_snapshot_file(path, header, iter(pieces), durable=True)
    body = b"".join(pieces)
    assert path.read_bytes() == raft_journal.encode_snapshot(header, body)
    assert raft_journal.decode_snapshot(path.read_bytes()) == (header, body)

    def cut_off() -> Iterator[bytes]:
        yield b"machine"
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        raft_journal.write_snapshot_file(path, header, cut_off(), durable=False)
    with pytest.raises(raft_journal.StorageError, match="torn"):
        raft_journal.decode_snapshot(path.read_bytes())


def test_a_failed_snapshot_write_is_reported_not_lost(tmp_path: Path) -> None:
    """The pieces are written on a thread of their own; its error reaches
    the caller (and the snapshot child's exit status), and the encoder is
    not left blocked behind a writer that stopped."""
    header = SnapshotHeader(last_entry=(b"b", 8, 2), previous_entry=(b"a", 7, 2), cluster=())
    pieces = (b"x" * 1_000_000 for _ in range(20))
    with pytest.raises(OSError) as raised:
        raft_journal.write_snapshot_file(Path("/dev/full"), header, pieces, durable=False)
    assert raised.value.errno == errno.ENOSPC


class Machine:
    def __init__(self) -> None:
        self.entries: list[bytes] = []

    def apply(self, data: bytes) -> object:
        if data == b"raise":
            raise RuntimeError("bug in the machine")
        self.entries.append(data)
        return len(self.entries)

    def snapshot(self) -> list[bytes]:
        return [b"".join(self.entries)]

    def restore(self, data: bytes | memoryview) -> None:
        self.entries = [bytes(data)]


def node_options(tmp_path: Path, **overrides: object) -> dict[str, object]:
    options: dict[str, object] = {
        "node_id": "solo",
        "raft_address": "127.0.0.1:1",
        "peers": {},
        "data_dir": tmp_path,
        "secret": "s" * 32,
        "machine": Machine(),
    }
    options.update(overrides)
    return options


@pytest.mark.parametrize("secret", ["", "short"])
def test_refuses_to_construct_without_a_secret(tmp_path: Path, secret: str) -> None:
    with pytest.raises(ValueError, match="secret"):
        RaftNode(**node_options(tmp_path, secret=secret))  # type: ignore[arg-type]


def test_refuses_unknown_durability(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        RaftNode(**node_options(tmp_path, durability="sometimes"))  # type: ignore[arg-type]


def test_start_refuses_other_threads(tmp_path: Path) -> None:
    node = RaftNode(**node_options(tmp_path))  # type: ignore[arg-type]
    errors: list[BaseException] = []

    def start() -> None:
        try:
            node.start()
        except RuntimeError as error:
            errors.append(error)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    assert errors and "main thread" in str(errors[0])


def propose_and_wait(node: RaftNode, data: bytes) -> tuple[object, str | None]:
    done = threading.Event()
    outcome: list[tuple[object, str | None]] = []

    def callback(result: object | None, error: str | None) -> None:
        outcome.append((result, error))
        done.set()

    node.propose(data, callback)
    assert done.wait(5), "callback never fired"
    return outcome[0]


def test_single_node_busy_apply_failure_and_close(tmp_path: Path) -> None:
    from raftsched.testing import free_port

    machine = Machine()
    calls: list[tuple[bool, int]] = []
    node = RaftNode(
        **node_options(  # type: ignore[arg-type]
            tmp_path,
            raft_address=f"127.0.0.1:{free_port()}",
            machine=machine,
            on_leadership=lambda leader, term: calls.append((leader, term)),
        )
    )
    node.start()
    try:
        deadline = time.monotonic() + 10
        while not node.is_leader() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert node.is_leader() and node.leader_id() == "solo"
        assert (True, node.term()) in calls

        assert propose_and_wait(node, b"one") == (1, None)
        # The adapter contains the machine's exception; the node keeps going.
        assert propose_and_wait(node, b"raise") == (None, ProposeError.APPLY_FAILED)
        assert propose_and_wait(node, b"two") == (2, None)

        # Only one proposal may be in flight.
        first = threading.Event()
        errors: list[str | None] = []
        node.propose(b"three", lambda result, error: first.set())
        node.propose(b"four", lambda result, error: errors.append(error))
        assert first.wait(5)
        deadline = time.monotonic() + 5
        while not errors and time.monotonic() < deadline:
            time.sleep(0.02)
        assert errors == [ProposeError.BUSY]
        assert machine.entries == [b"one", b"two", b"three"]
        status = node.status()
        assert status.role == "leader" and status.applied_index == status.commit_index
    finally:
        node.close()
    assert propose_and_wait(node, b"late") == (None, ProposeError.CLOSED)


def test_replicas_compact_at_different_log_indexes() -> None:
    """Replicas that compact at the same index fork and encode at the same
    moment; each gets its own threshold, from 1x up to 1.5x, by its id."""
    ids = ["n1", "n2", "n3"]
    thresholds = [staggered_compaction_entries(n, [i for i in ids if i != n], 6000) for n in ids]
    assert thresholds == [6000, 7000, 8000]
    five = [f"n{i}" for i in range(1, 6)]
    spread = {staggered_compaction_entries(n, five, 5000) for n in five}
    assert len(spread) == 5 and min(spread) == 5000 and max(spread) < 7500
    assert staggered_compaction_entries("solo", [], 10) == 10


class NicenessMachine(Machine):
    """Its snapshot is the CPU niceness of the process that encodes it."""

    def snapshot(self) -> list[bytes]:
        return [str(os.nice(0)).encode()]


def test_the_snapshot_child_encodes_at_a_lower_cpu_priority(tmp_path: Path) -> None:
    """The child is background work beside the node's Raft and HTTP threads;
    the node itself keeps its priority."""
    from raftsched.testing import free_port

    parent_nice = os.nice(0)
    node = RaftNode(
        **node_options(  # type: ignore[arg-type]
            tmp_path,
            raft_address=f"127.0.0.1:{free_port()}",
            machine=NicenessMachine(),
            log_compaction_entries=10,
        )
    )
    node.start()
    snapshot = tmp_path / raft_journal.SNAPSHOT_NAME
    try:
        deadline = time.monotonic() + 10
        while not node.is_leader() and time.monotonic() < deadline:
            time.sleep(0.05)
        for i in range(40):
            assert propose_and_wait(node, b"entry-%d" % i)[1] is None
            if snapshot.exists():
                break
        deadline = time.monotonic() + 10
        while not snapshot.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        _, body = raft_journal.decode_snapshot(snapshot.read_bytes())
    finally:
        node.close()
    assert int(bytes(body)) == min(19, parent_nice + SNAPSHOT_CHILD_NICE)
    assert os.nice(0) == parent_nice
