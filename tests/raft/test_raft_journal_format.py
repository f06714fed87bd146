"""The journal's bookkeeping and the snapshot file's checks, in process.

Plain examples for what mutation testing found unexamined: compaction in
durability "none" and with a stale tail, the meta record's defaults and
saves, and each way a snapshot file can be corrupt.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import msgpack
import pytest

from raftsched import raft_journal
from raftsched.raft_journal import Disk, DurableJournal, SnapshotHeader, StorageError


def disk(*, fsync: bool = True) -> Disk:
    return Disk(fsync=fsync, simulate_power_cut=False, writeback_s=30)


def commands(directory: Path) -> list[bytes]:
    return [entry[0] for entry in raft_journal.read_journal_entries(directory)]


@pytest.mark.parametrize("fsync", [True, False], ids=["fsync", "none"])
def test_compaction_keeps_the_tail_and_its_stale_records(tmp_path: Path, fsync: bool) -> None:
    journal = DurableJournal(tmp_path, disk(fsync=fsync))
    for index in range(1, 11):
        journal.add(b"e%d" % index, index, 1)
    journal.deleteEntriesFrom(8)  # e9, e10 stay on disk as a stale tail
    journal.deleteEntriesTo(3)
    assert [entry[1] for entry in journal[:]] == [4, 5, 6, 7, 8]
    assert commands(tmp_path) == [b"e%d" % index for index in range(4, 11)]
    journal.add(b"e9", 9, 1)  # adopts the stale record
    journal.add(b"x10", 10, 2)  # a conflict: the rest of the tail is cut
    journal.deleteEntriesFrom(4)  # uses the offsets the rewrite computed
    journal.add(b"x8", 8, 2)
    journal._destroy()
    assert commands(tmp_path) == [b"e4", b"e5", b"e6", b"e7", b"x8"]
    reopened = DurableJournal(tmp_path, disk())
    assert [entry[1:] for entry in reopened[:]] == [(4, 1), (5, 1), (6, 1), (7, 1), (8, 2)]


def test_deleting_from_the_end_changes_nothing(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, disk())
    journal.add(b"e1", 1, 1)
    journal.deleteEntriesFrom(1)
    journal.add(b"e2", 2, 1)
    journal._destroy()
    assert commands(tmp_path) == [b"e1", b"e2"]


def test_a_new_journal_starts_at_term_zero_commit_one_and_no_vote(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, disk())
    assert (journal.getCurrentTerm(), journal.getRaftCommitIndex()) == (0, 1)
    assert journal.getVotedForNodeId() is None


def test_a_vote_that_is_not_a_node_id_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / raft_journal.META_NAME).write_bytes(msgpack.packb({"term": 2, "voted_for": 5}))
    assert DurableJournal(tmp_path, disk()).getVotedForNodeId() is None


def test_the_commit_index_is_saved_once_per_change(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, disk())
    saves = journal.fsync_count
    journal.setRaftCommitIndex(7)
    journal.onOneSecondTimer()
    assert journal.fsync_count == saves + 1
    journal.setRaftCommitIndex(7)
    journal.onOneSecondTimer()
    journal.onOneSecondTimer()
    assert journal.fsync_count == saves + 1
    assert DurableJournal(tmp_path, disk()).getRaftCommitIndex() == 7


HEADER = SnapshotHeader(last_entry=(b"b", 8, 2), previous_entry=(b"a", 7, 2), cluster=("x:1",))


def snapshot_with_header(header: object, body: bytes = b"state") -> bytes:
    header_bytes = msgpack.packb(header)
    prefix = struct.pack(
        "<IIQI", len(header_bytes), zlib.crc32(header_bytes), len(body), zlib.crc32(body)
    )
    return b"RSSNAP01" + prefix + header_bytes + body


def good_header(**changes: object) -> dict[str, object]:
    header: dict[str, object] = {
        "version": 1,
        "last_entry": [b"b", 8, 2],
        "previous_entry": [b"a", 7, 2],
        "cluster": ["x:1"],
    }
    header.update(changes)
    return header


def test_a_snapshot_header_without_a_cluster_has_an_empty_one() -> None:
    header = good_header()
    del header["cluster"]
    decoded, body = raft_journal.decode_snapshot(snapshot_with_header(header))
    assert (decoded.cluster, bytes(body)) == ((), b"state")


GOOD = raft_journal.encode_snapshot(HEADER, b"state")
HEADER_AT = 8 + 20  # magic, then the prefix


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"XXSNAP01" + GOOD[8:], "snapshot does not start with the raftsched snapshot magic"),
        (GOOD[:11], "snapshot is shorter than its prefix"),
        (GOOD[:HEADER_AT] + b"\x00" + GOOD[HEADER_AT + 1 :], "snapshot header is torn or corrupt"),
        (GOOD[: HEADER_AT + 3], "snapshot header is torn or corrupt"),
        (snapshot_with_header(good_header(version=2)), "unknown snapshot header"),
        (snapshot_with_header([1]), "unknown snapshot header"),
        (
            snapshot_with_header(good_header(last_entry=[b"b", 8])),
            "snapshot entry is not \\(command, index, term\\)",
        ),
        (
            snapshot_with_header(good_header(last_entry=7)),
            "snapshot entry is not \\(command, index, term\\)",
        ),
        (
            snapshot_with_header(good_header(previous_entry=["a", 7, 2])),
            "snapshot entry has wrong types",
        ),
        (
            snapshot_with_header(good_header(previous_entry=[b"a", "7", 2])),
            "snapshot entry has wrong types",
        ),
        (
            snapshot_with_header(good_header(previous_entry=[b"a", 7, "2"])),
            "snapshot entry has wrong types",
        ),
        (GOOD[:-1] + b"X", "snapshot body is torn or corrupt"),
        (GOOD[:-1], "snapshot body is torn or corrupt"),
    ],
    ids=[
        "magic",
        "short",
        "header-crc",
        "header-cut",
        "version",
        "not-a-map",
        "entry-short",
        "entry-not-a-list",
        "command-type",
        "index-type",
        "term-type",
        "body-crc",
        "body-cut",
    ],
)
def test_each_corrupt_snapshot_is_refused_with_its_reason(data: bytes, message: str) -> None:
    with pytest.raises(StorageError, match=f"^{message}"):
        raft_journal.decode_snapshot(data)
