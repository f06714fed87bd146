"""Bad disks under the journal, with real faults (issue 16, part 5).

Bytes flipped in a real journal file, a real full filesystem (a `tmpfs`
mounted with `size=`), and a real failed fsync (an `LD_PRELOAD` shim that
makes libc's `fsync`/`fdatasync` fail with EIO for one file). No mocks of
the journal. The e2e counterparts are in tests/e2e/test_bad_disks.py.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pysyncobj.config import SERIALIZER_STATE

from bad_disks import fill, fsync_fault_env, fsync_fault_shim, size_limited_tmpfs
from raftsched import raft_journal
from raftsched.raft import RaftNode
from raftsched.raft_journal import CorruptJournal, Disk, DiskFull, DurableJournal


def disk() -> Disk:
    return Disk(fsync=True, simulate_power_cut=False, writeback_s=30)


def write_journal(directory: Path, count: int) -> list[int]:
    """A journal of `count` entries; the offset of each record."""
    journal = DurableJournal(directory, disk())
    for index in range(1, count + 1):
        journal.add(b"entry-%d" % index, index, 1)
    offsets = list(journal._offsets)
    journal._destroy()
    return offsets


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


COMMAND_START = struct.calcsize("<IIQQ")


def test_a_bad_crc_in_the_middle_refuses_to_start_naming_file_and_offset(tmp_path: Path) -> None:
    offsets = write_journal(tmp_path, 5)
    path = tmp_path / raft_journal.JOURNAL_NAME
    flip(path, offsets[2] + COMMAND_START + 1)  # inside entry 3's command
    before = path.read_bytes()
    with pytest.raises(CorruptJournal) as raised:
        DurableJournal(tmp_path, disk())
    assert raised.value.path == path
    assert raised.value.offset == offsets[2]
    assert f"{path}" in str(raised.value) and f"offset {offsets[2]}" in str(raised.value)
    assert path.read_bytes() == before, "a refused journal must be left exactly as it was"


@pytest.mark.parametrize("field", ["cmd_len", "crc", "index", "term"])
def test_a_flip_in_any_header_field_of_a_middle_record_is_corruption(
    tmp_path: Path, field: str
) -> None:
    offsets = write_journal(tmp_path, 5)
    path = tmp_path / raft_journal.JOURNAL_NAME
    position = {"cmd_len": 0, "crc": 4, "index": 8, "term": 16}[field]
    flip(path, offsets[1] + position)
    with pytest.raises(CorruptJournal) as raised:
        DurableJournal(tmp_path, disk())
    assert raised.value.offset == offsets[1]


def test_a_bad_first_record_followed_by_good_ones_is_corruption(tmp_path: Path) -> None:
    offsets = write_journal(tmp_path, 3)
    flip(tmp_path / raft_journal.JOURNAL_NAME, offsets[0] + COMMAND_START)
    with pytest.raises(CorruptJournal):
        DurableJournal(tmp_path, disk())


def test_a_torn_last_record_is_cut_at_the_last_whole_one_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    offsets = write_journal(tmp_path, 4)
    path = tmp_path / raft_journal.JOURNAL_NAME
    path.write_bytes(path.read_bytes()[: offsets[3] + 7])  # power cut mid-record
    with caplog.at_level(logging.WARNING, logger="raftsched.raft_journal"):
        journal = DurableJournal(tmp_path, disk())
    assert [entry[1] for entry in journal[:]] == [1, 2, 3]
    assert path.stat().st_size == offsets[3]
    assert f"{path}" in caplog.text and f"byte {offsets[3]}" in caplog.text
    journal._destroy()


def test_a_last_record_with_a_bad_crc_is_a_torn_tail(tmp_path: Path) -> None:
    offsets = write_journal(tmp_path, 4)
    path = tmp_path / raft_journal.JOURNAL_NAME
    flip(path, path.stat().st_size - 1)
    journal = DurableJournal(tmp_path, disk())
    assert [entry[1] for entry in journal[:]] == [1, 2, 3]
    assert path.stat().st_size == offsets[3]
    journal._destroy()


def test_garbage_after_the_last_record_is_a_torn_tail(tmp_path: Path) -> None:
    write_journal(tmp_path, 3)
    path = tmp_path / raft_journal.JOURNAL_NAME
    with open(path, "ab") as handle:
        handle.write(b"\x00" * 4096)  # a block allocated, its data never written
    journal = DurableJournal(tmp_path, disk())
    assert [entry[1] for entry in journal[:]] == [1, 2, 3]
    journal._destroy()


# -- a full disk: a real tmpfs with size= --------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with size_limited_tmpfs(tmp_path / "mnt", "2m") as mount_point:
        yield mount_point


def test_an_append_that_finds_the_disk_full_is_not_in_the_log(small_disk: Path) -> None:
    journal = DurableJournal(small_disk, disk())
    journal.add(b"before", 1, 1)
    journal.sync()
    filler = fill(small_disk)
    big = b"x" * (64 * 1024)
    with pytest.raises(DiskFull) as raised:
        journal.add(big, 2, 1)
    assert raised.value.path == small_disk / raft_journal.JOURNAL_NAME
    assert raised.value.errno == errno.ENOSPC
    assert [entry[1] for entry in journal[:]] == [1], "the failed entry must not be in the log"
    journal.sync()  # what is in the log is durable; nothing else is claimed
    assert not journal.has_room()
    filler.unlink()  # room again: the same journal carries on, no reopen
    assert journal.has_room()
    journal.add(big, 2, 1)
    journal.add(b"after", 3, 1)
    journal._destroy()
    assert [entry[1:] for entry in raft_journal.read_journal_entries(small_disk)] == [
        (1, 1),
        (2, 1),
        (3, 1),
    ]


def test_a_term_and_vote_that_cannot_be_saved_block_sync_until_there_is_room(
    small_disk: Path,
) -> None:
    journal = DurableJournal(small_disk, disk())
    journal.setCurrentTerm(1, "n1")
    filler = fill(small_disk)
    journal.setCurrentTerm(2, "n2")  # pysyncobj took the term; it is not on disk
    with pytest.raises(DiskFull):
        journal.sync()  # so no vote or message reflecting it may leave
    journal.onOneSecondTimer()  # tries again quietly, still no room
    assert raft_journal._read_meta(small_disk / raft_journal.META_NAME)["term"] == 1
    filler.unlink()
    journal.sync()
    assert raft_journal._read_meta(small_disk / raft_journal.META_NAME)["voted_for"] == "n2"
    journal._destroy()


def test_a_compaction_without_room_keeps_the_old_file_and_its_offsets(small_disk: Path) -> None:
    journal = DurableJournal(small_disk, disk())
    for index in range(1, 6):
        journal.add(b"e%d" % index, index, 1)
    filler = fill(small_disk)
    journal.deleteEntriesTo(2)
    assert [entry[1] for entry in journal[:]] == [3, 4, 5]
    filler.unlink()
    journal.deleteEntriesFrom(2)  # offsets still point at the right records
    journal.add(b"x5", 5, 2)
    journal._destroy()
    on_disk = [entry[1:] for entry in raft_journal.read_journal_entries(small_disk)]
    assert on_disk == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 2)]
    assert not list(small_disk.glob("*.tmp")), "a failed rewrite leaves no temporary file"


# -- a failed fsync: an LD_PRELOAD shim at the libc boundary -------------------

FAIL_STOP_SCRIPT = """
import sys
from pathlib import Path
from raftsched.raft_journal import Disk, DurableJournal
directory, trigger = Path(sys.argv[1]), Path(sys.argv[2])
journal = DurableJournal(directory, Disk(fsync=True, simulate_power_cut=False, writeback_s=30))
journal.add(b"synced", 1, 1)
journal.sync()
trigger.touch()  # from now on the disk fails every fsync of the journal
journal.add(b"not-synced", 2, 1)
journal.sync()
print("CONTINUED AFTER A FAILED FSYNC", flush=True)
journal.sync()  # a second fsync would "succeed" on Linux: never reached
print("ACKNOWLEDGED", flush=True)
"""


def test_a_failed_fsync_stops_the_process_at_once_with_its_exit_status(tmp_path: Path) -> None:
    library = fsync_fault_shim(tmp_path)
    trigger = tmp_path / "fail-fsync-now"
    env = {**os.environ, **fsync_fault_env(library, trigger, "/raft.journal")}
    ran = subprocess.run(
        [sys.executable, "-c", FAIL_STOP_SCRIPT, str(tmp_path), str(trigger)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == raft_journal.EXIT_STORAGE_FAILED == 74, ran.stderr
    assert "CONTINUED" not in ran.stdout and "ACKNOWLEDGED" not in ran.stdout
    journal_path = tmp_path / raft_journal.JOURNAL_NAME
    assert f"fdatasync of {journal_path} failed: EIO" in ran.stderr
    assert ran.stderr.count("storage failure") == 1


def test_a_failed_write_stops_the_process_at_once_with_its_exit_status(tmp_path: Path) -> None:
    library = fsync_fault_shim(tmp_path)
    trigger = tmp_path / "fail-now"
    env = {
        **os.environ,
        **fsync_fault_env(library, trigger, "/raft.journal"),
        "RAFTSCHED_FAULT_WRITE_TOO": "1",
    }
    ran = subprocess.run(
        [sys.executable, "-c", FAIL_STOP_SCRIPT, str(tmp_path), str(trigger)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == raft_journal.EXIT_STORAGE_FAILED, ran.stderr
    assert "CONTINUED" not in ran.stdout
    assert f"write of {tmp_path / raft_journal.JOURNAL_NAME} failed: EIO" in ran.stderr


class BigMachine:
    """A state machine whose snapshot does not fit on a full disk."""

    def apply(self, data: bytes) -> object:
        return None

    def snapshot(self) -> Iterator[bytes]:
        for _ in range(4):  # 1 MiB, on a 2 MiB filesystem
            yield b"s" * (256 * 1024)

    def restore(self, data: bytes | memoryview) -> None:
        pass


def test_a_snapshot_without_room_is_abandoned_and_its_part_file_removed(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = RaftNode(
        node_id="n1",
        raft_address="127.0.0.1:1",
        peers={},
        data_dir=small_disk,
        secret="s" * 32,
        machine=BigMachine(),
    )
    filler = fill(small_disk)
    header_entries = ((b"b", 2, 1), (b"a", 1, 1), [])
    with caplog.at_level(logging.WARNING, logger="raftsched.raft"):
        node._serialize_snapshot(str(small_disk / "raft.snapshot.tmp"), header_entries)
        states = [node._check_snapshot()]
        while states[-1] == SERIALIZER_STATE.SERIALIZING:
            time.sleep(0.05)
            states.append(node._check_snapshot())
    assert states[-1] == SERIALIZER_STATE.FAILED
    assert "snapshot abandoned: disk full" in caplog.text
    assert not list(small_disk.glob("raft.snapshot*")), "the part file must not keep the disk full"
    assert "trying again in 10 s" in caplog.text
    node._serialize_snapshot(str(small_disk / "raft.snapshot.tmp"), header_entries)
    # No fork per tick: pysyncobj is told a snapshot is under way until the
    # wait is over, then that it failed, which lets it ask again (any other
    # answer left its serializer marked failed, never to ask again).
    assert node._snapshot_child is None
    assert node._check_snapshot() == SERIALIZER_STATE.SERIALIZING
    filler.unlink()
    node._snapshot_not_before = 0.0  # ten seconds later
    assert node._check_snapshot() == SERIALIZER_STATE.FAILED
    assert node._check_snapshot() == SERIALIZER_STATE.NOT_SERIALIZING
    node._serialize_snapshot(str(small_disk / "raft.snapshot.tmp"), header_entries)
    while (state := node._check_snapshot()) == SERIALIZER_STATE.SERIALIZING:
        time.sleep(0.05)
    assert state == SERIALIZER_STATE.SUCCESS
    assert (small_disk / raft_journal.SNAPSHOT_NAME).exists()


VOTE_SCRIPT = """
import sys
from pathlib import Path
from raftsched.raft_journal import Disk, DurableJournal
directory, trigger = Path(sys.argv[1]), Path(sys.argv[2])
journal = DurableJournal(directory, Disk(fsync=True, simulate_power_cut=False, writeback_s=30))
journal.setCurrentTerm(1, "n1")
trigger.touch()
journal.setCurrentTerm(2, "n2")
print("VOTE SENT", flush=True)
"""


@pytest.mark.parametrize(
    ("suffix", "failing"),
    [("/raft.meta.tmp", "fsync of {dir}/raft.meta.tmp"), ("/data", "fsync of {dir}")],
    ids=["meta", "directory"],
)
def test_a_failed_fsync_of_the_term_and_vote_stops_the_process_before_any_vote(
    tmp_path: Path, suffix: str, failing: str
) -> None:
    library = fsync_fault_shim(tmp_path)
    directory = tmp_path / "data"
    directory.mkdir()
    trigger = tmp_path / "fail-now"
    env = {**os.environ, **fsync_fault_env(library, trigger, suffix)}
    ran = subprocess.run(
        [sys.executable, "-c", VOTE_SCRIPT, str(directory), str(trigger)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == raft_journal.EXIT_STORAGE_FAILED, ran.stderr
    assert "VOTE SENT" not in ran.stdout
    assert failing.format(dir=directory) + " failed: EIO" in ran.stderr
