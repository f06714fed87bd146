"""The journal's bookkeeping and the snapshot file's checks, in process.

Plain examples for what mutation testing found unexamined: compaction in
durability "none" and with a stale tail, the meta record's defaults and
saves, and each way a snapshot file can be corrupt.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from pathlib import Path

import msgpack
import pytest

from raftsched import power_cut, raft_journal
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


def test_a_file_syncs_only_after_a_write_and_counts_each_sync(tmp_path: Path) -> None:
    data = disk()
    assert (data.fsync_count, data.fsync_delay_s) == (0, 0.0)
    handle = data.open_append_file(tmp_path / "raft.file")
    assert handle.sync() is False
    handle.write(0, b"x")
    assert handle.sync() is True
    assert handle.sync() is False
    handle.truncate(0)
    assert handle.sync() is True
    assert data.fsync_count == 2
    handle.close()


def test_reopening_a_clean_journal_syncs_nothing(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, disk())
    journal.add(b"e1", 1, 1)
    journal._destroy()
    reopened = DurableJournal(tmp_path, disk())
    reopened.sync()
    assert reopened.fsync_count == 0


def test_the_journal_file_is_created_readable_by_all_writable_by_its_owner(
    tmp_path: Path,
) -> None:
    previous = os.umask(0o022)
    try:
        DurableJournal(tmp_path, disk())._destroy()
    finally:
        os.umask(previous)
    assert (tmp_path / raft_journal.JOURNAL_NAME).stat().st_mode & 0o777 == 0o644


def test_a_text_command_is_stored_as_utf8(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, disk())
    journal.add("zürich", 1, 1)
    assert journal[0] == ("zürich".encode(), 1, 1)
    journal._destroy()
    assert commands(tmp_path) == ["zürich".encode()]


def test_an_empty_command_is_a_record_like_any_other(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, disk())
    journal.add(b"", 1, 1)
    journal._destroy()
    assert raft_journal.read_journal_entries(tmp_path) == [(b"", 1, 1)]


def test_two_identical_reappends_adopt_the_stale_tail_in_order(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, disk())
    for index in range(1, 6):
        journal.add(b"e%d" % index, index, 1)
    journal.sync()
    before = (tmp_path / raft_journal.JOURNAL_NAME).read_bytes()
    journal.deleteEntriesFrom(2)
    journal.add(b"e3", 3, 1)
    journal.add(b"e4", 4, 1)
    journal.sync()
    assert journal[:] == [(b"e%d" % index, index, 1) for index in range(1, 5)]
    assert (tmp_path / raft_journal.JOURNAL_NAME).read_bytes() == before
    journal.deleteEntriesFrom(3)  # at an adopted record's offset
    journal.add(b"x4", 4, 2)
    journal._destroy()
    assert commands(tmp_path) == [b"e1", b"e2", b"e3", b"x4"]


def test_recovery_stops_at_a_corrupt_or_out_of_sequence_record(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, disk())
    for index in range(1, 4):
        journal.add(b"e%d" % index, index, 1)
    journal._destroy()
    path = tmp_path / raft_journal.JOURNAL_NAME
    good = path.read_bytes()
    path.write_bytes(good[:-1] + b"X")  # the last record's CRC fails
    assert commands(tmp_path) == [b"e1", b"e2"]
    record = raft_journal._encode_record((b"e5", 5, 1))  # an index gap
    path.write_bytes(good + record)
    assert commands(tmp_path) == [b"e1", b"e2", b"e3"]
    record = raft_journal._encode_record((b"e4", 4, 0))  # a term going back
    path.write_bytes(good + record)
    assert commands(tmp_path) == [b"e1", b"e2", b"e3"]
    with pytest.raises(StorageError, match="^journal file does not start with the raftsched"):
        raft_journal.parse_journal(b"NOTMAGIC" + good[8:])


def test_a_reopened_journal_knows_where_each_record_is(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path, disk())
    for index in range(1, 4):
        journal.add(b"e%d" % index, index, 1)
    journal._destroy()
    reopened = DurableJournal(tmp_path, disk())
    reopened.deleteEntriesFrom(1)
    reopened.add(b"x2", 2, 2)
    reopened._destroy()
    assert commands(tmp_path) == [b"e1", b"x2"]


def test_disk_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        raft_journal.SIMULATE_POWER_CUT_ENV,
        raft_journal.SIMULATE_WRITEBACK_ENV,
        raft_journal.SIMULATE_FSYNC_DELAY_ENV,
    ):
        monkeypatch.delenv(name, raising=False)
    plain = Disk.from_env(fsync=True)
    assert (plain.fsync, plain.simulate_power_cut, plain.fsync_delay_s) == (True, False, 0.0)
    assert plain._writeback_s == 30.0
    monkeypatch.setenv(raft_journal.SIMULATE_POWER_CUT_ENV, "0")
    assert Disk.from_env(fsync=False).simulate_power_cut is False
    monkeypatch.setenv(raft_journal.SIMULATE_POWER_CUT_ENV, "1")
    assert Disk.from_env(fsync=True).fsync_delay_s == 0.0  # no slow disk unless asked
    assert Disk(fsync=True, simulate_power_cut=True, writeback_s=1).fsync_delay_s == 0.0
    monkeypatch.setenv(raft_journal.SIMULATE_WRITEBACK_ENV, "5")
    monkeypatch.setenv(raft_journal.SIMULATE_FSYNC_DELAY_ENV, "0.25")
    simulated = Disk.from_env(fsync=False)
    assert (simulated.fsync, simulated.simulate_power_cut) == (False, True)
    assert (simulated._writeback_s, simulated.fsync_delay_s) == (5.0, 0.25)
    monkeypatch.setenv(raft_journal.SIMULATE_WRITEBACK_ENV, "soon")
    assert Disk.from_env(fsync=True)._writeback_s == 30.0
    # The slow disk is a knob of the simulation only.
    plain = Disk(fsync=True, simulate_power_cut=False, writeback_s=1, fsync_delay_s=0.25)
    assert plain.fsync_delay_s == 0.0


def test_a_slow_simulated_disk_still_syncs(tmp_path: Path) -> None:
    slow = Disk(fsync=True, simulate_power_cut=True, writeback_s=3600, fsync_delay_s=0.001)
    journal = DurableJournal(tmp_path, slow)
    journal.add(b"e1", 1, 1)
    journal.sync()
    power_cut.cut_power(tmp_path)
    assert commands(tmp_path) == [b"e1"]


def test_the_emulated_writeback_runs_when_it_is_due(tmp_path: Path) -> None:
    due = Disk(fsync=False, simulate_power_cut=True, writeback_s=0)
    journal = DurableJournal(tmp_path, due)
    journal.add(b"e1", 1, 1)
    journal.onOneSecondTimer()  # due at once: everything is written back
    journal.onOneSecondTimer()
    power_cut.cut_power(tmp_path)
    assert commands(tmp_path) == [b"e1"]
    later = Disk(fsync=False, simulate_power_cut=True, writeback_s=3600)
    journal = DurableJournal(tmp_path, later)
    journal.add(b"e2", 2, 1)
    journal.onOneSecondTimer()  # not due for an hour
    power_cut.cut_power(tmp_path)
    assert commands(tmp_path) == [b"e1"]


def test_reopening_a_clean_journal_cuts_nothing_and_saves_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = DurableJournal(tmp_path, disk())
    journal.add(b"e1", 1, 1)
    journal._destroy()
    with caplog.at_level(logging.WARNING, logger="raftsched.raft_journal"):
        reopened = DurableJournal(tmp_path, disk())
        reopened.onOneSecondTimer()
    assert caplog.records == []
    assert reopened.fsync_count == 0


def snapshot_at(directory: Path, previous: raft_journal.Entry, last: raft_journal.Entry) -> None:
    header = SnapshotHeader(last_entry=last, previous_entry=previous, cluster=())
    (directory / raft_journal.SNAPSHOT_NAME).write_bytes(
        raft_journal.encode_snapshot(header, b"state")
    )


def journal_of(directory: Path, entries: list[raft_journal.Entry]) -> None:
    journal = DurableJournal(directory, disk())
    for entry in entries:
        journal.add(*entry)
    journal._destroy()


ENTRIES = [(b"e%d" % index, index, 1) for index in range(1, 11)]


def test_the_journal_is_cut_to_a_snapshot_one_entry_in(tmp_path: Path) -> None:
    journal_of(tmp_path, ENTRIES)
    snapshot_at(tmp_path, ENTRIES[1], ENTRIES[2])
    assert DurableJournal(tmp_path, disk())[:] == ENTRIES[1:]


def test_a_journal_already_aligned_with_the_snapshot_is_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal_of(tmp_path, ENTRIES)
    snapshot_at(tmp_path, ENTRIES[0], ENTRIES[1])
    with caplog.at_level(logging.WARNING, logger="raftsched.raft_journal"):
        assert DurableJournal(tmp_path, disk())[:] == ENTRIES
    assert caplog.records == []


def test_a_snapshot_of_another_log_does_not_cut_the_journal(tmp_path: Path) -> None:
    journal_of(tmp_path, ENTRIES)
    snapshot_at(tmp_path, (b"other", 6, 2), (b"other", 7, 2))
    assert DurableJournal(tmp_path, disk())[:] == ENTRIES


def test_a_meta_record_that_is_not_a_map_is_refused(tmp_path: Path) -> None:
    (tmp_path / raft_journal.META_NAME).write_bytes(msgpack.packb([1, 2]))
    with pytest.raises(StorageError, match="raft.meta does not hold a msgpack map$"):
        DurableJournal(tmp_path, disk())


def test_a_snapshot_file_shorter_than_its_prefix_has_no_header(tmp_path: Path) -> None:
    path = tmp_path / raft_journal.SNAPSHOT_NAME
    path.write_bytes(GOOD[:10])
    with pytest.raises(StorageError, match="^snapshot is shorter than its prefix$"):
        raft_journal.read_snapshot_header(path)
    path.write_bytes(GOOD)
    assert raft_journal.read_snapshot_header(path) == HEADER


def test_clear_drops_every_entry_but_keeps_them_on_disk_until_a_conflict(
    tmp_path: Path,
) -> None:
    journal = DurableJournal(tmp_path, disk())
    for entry in ENTRIES[:3]:
        journal.add(*entry)
    journal.clear()
    assert len(journal) == 0
    journal.add(b"x1", 1, 2)
    journal._destroy()
    assert commands(tmp_path) == [b"x1"]
