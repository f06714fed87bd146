"""Durable storage behind the Raft adapter: the log, the term/vote record and the snapshot.

pysyncobj's own `FileJournal` writes through mmap and never calls fsync, so a
follower acknowledges entries that a power cut would take away. This module
is the journal that `raftsched.raft` plugs into pysyncobj instead. It keeps
the same duck-typed interface (`add`, `clear`, `deleteEntriesFrom`,
`deleteEntriesTo`, indexing, `setCurrentTerm`, ...) and adds `sync()`, which
the adapter calls before any Raft message leaves the node. That ordering is
the whole durability argument: an entry is on disk before its follower
acknowledges it, and before its leader sends it (so before the leader can
count its own copy), and one fsync covers every entry written since the last
message (group commit).

On disk, in the node's data directory:

- `raft.journal`: a magic header, then records `<cmd_len u32, crc32 u32,
  index u64, term u64, command>` (the CRC covers index, term and command).
  Recovery stops at the first torn or out-of-sequence record and cuts the
  file there (a torn tail, after a power cut). A record that fails its
  check but is followed by a whole record of the entry after it is not a
  torn tail: the file is corrupt in the middle, and the node refuses to
  start (`CorruptJournal`, exit status `EXIT_CORRUPT_DATA`).
- `raft.meta`: msgpack `{term, voted_for, commit_index}`, replaced atomically.
  Term and vote are durable before `setCurrentTerm` returns, so before a vote
  is sent.
- `raft.snapshot`: a magic header, a small msgpack header with pysyncobj's
  bookkeeping (the last two applied log entries, which it needs to resume the
  log) and the state machine's own bytes. Never pickle of our state.

Power-cut simulation (`RAFTSCHED_SIMULATE_POWER_CUT=1`, `raftsched.power_cut`):
`kill -9` keeps whatever a process wrote, because the kernel's page cache
survives the process. In the simulation a file's bytes count as on the disk
only once a real `os.fsync`/`os.fdatasync` of that file has returned, and a
new name or a rename once the directory's has; a node that starts again
finds everything else gone, as after a power cut. So a sync left out here
loses data in the power-cut tests. A periodic emulated writeback
(`RAFTSCHED_SIMULATE_WRITEBACK_S`, default 30 s like Linux's
`dirty_expire_centisecs`) makes everything durable as the kernel eventually
would. `RAFTSCHED_SIMULATE_FSYNC_DELAY_S` makes each journal fsync take a
random time up to that long (a slow, uneven disk), which widens the window
in which code that acknowledges before syncing would be caught.

Bad disks (docs/operations.md). Every fsync and fdatasync goes through
`sync_fd`; a failure there, or a failed write other than a full disk,
stops the process at once (`fail_stop`, exit status `EXIT_STORAGE_FAILED`):
after a failed fsync the kernel may have dropped the dirty pages and marked
them clean, so a retry that "succeeds" proves nothing (PostgreSQL's
fsyncgate). A full disk (ENOSPC, EDQUOT) is not fatal: `add` raises
`DiskFull` and leaves the journal as it was (the entry is not in the log),
and a term and vote that cannot be saved make `sync()` raise `DiskFull`
until they can, so no message that reflects them leaves the node.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import queue
import random
import struct
import sys
import threading
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final, NoReturn, overload

import msgpack

from raftsched import power_cut

logger = logging.getLogger(__name__)

SIMULATE_POWER_CUT_ENV: Final = "RAFTSCHED_SIMULATE_POWER_CUT"
SIMULATE_WRITEBACK_ENV: Final = "RAFTSCHED_SIMULATE_WRITEBACK_S"
SIMULATE_FSYNC_DELAY_ENV: Final = "RAFTSCHED_SIMULATE_FSYNC_DELAY_S"

JOURNAL_NAME: Final = "raft.journal"
META_NAME: Final = "raft.meta"
SNAPSHOT_NAME: Final = "raft.snapshot"

_JOURNAL_MAGIC: Final = b"RSJRNL01"
_RECORD_HEADER: Final = struct.Struct("<IIQQ")  # cmd_len, crc32, index, term
# A length beyond this can only be garbage after a torn write; refusing it
# keeps recovery from allocating whatever a random length field says.
_RECORD_COMMAND_BYTES_MAX: Final = 256 * 1024 * 1024

_SNAPSHOT_MAGIC: Final = b"RSSNAP01"
_SNAPSHOT_PREFIX: Final = struct.Struct("<IIQI")  # header_len, header_crc, body_len, body_crc

# One Raft log entry as pysyncobj handles it: (command bytes, index, term).
Entry = tuple[bytes, int, int]


# Exit statuses of a node stopped by its storage (sysexits.h names).
EXIT_STORAGE_FAILED: Final = 74  # EX_IOERR: an fsync or write failed; see fail_stop
EXIT_CORRUPT_DATA: Final = 65  # EX_DATAERR: a journal record is corrupt in the middle

# Errors of a write that mean "no room", not "the disk is failing".
_NO_SPACE_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT})
# Space that must be free before a node with a full disk tries again (or a
# sixteenth of the filesystem, if that is less).
DISK_FULL_RETRY_FREE_BYTES: Final = 4 * 1024 * 1024


class StorageError(RuntimeError):
    """The files in the data directory are not what this module wrote."""


class CorruptJournal(StorageError):
    """A journal record fails its check and is not the torn tail of a power cut."""

    def __init__(self, path: Path | None, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(f"journal {path}: corrupt record at byte offset {offset}: {reason}")

    def at(self, path: Path) -> CorruptJournal:
        return CorruptJournal(path, self.offset, self.reason)


class DiskFull(Exception):
    """A write found no space (ENOSPC or EDQUOT); nothing of it counts as written."""

    def __init__(self, path: Path, error: OSError) -> None:
        self.path = path
        self.errno = error.errno
        super().__init__(f"{path}: {errno.errorcode.get(error.errno or 0, error.errno)}")


def fail_stop(path: Path, action: str, error: OSError) -> NoReturn:
    """Stop the process now: a write or sync of `path` failed.

    Never continue after a failed fsync: the kernel may already have thrown
    the unwritten pages away and marked them clean, so a second fsync would
    succeed and the node would acknowledge what is not on disk. `os._exit`
    from whichever thread found it (usually pysyncobj's tick thread): no
    clean-up runs that could send a message or acknowledge anything more. A
    supervisor restarts the node, which recovers from what is on disk.
    """
    code = errno.errorcode.get(error.errno or 0, str(error.errno))
    try:
        logger.critical(
            "storage failure: %s of %s failed: %s (%s); stopping the node at once "
            "(exit status %d, see docs/operations.md 'Failed fsync')",
            action,
            path,
            code,
            error.strerror,
            EXIT_STORAGE_FAILED,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stderr.flush()
    finally:
        os._exit(EXIT_STORAGE_FAILED)


def sync_fd(fd: int, path: Path, *, data_only: bool = False) -> None:
    """The one place this module syncs a file or directory; fail-stop on error."""
    try:
        if data_only:
            os.fdatasync(fd)
        else:
            os.fsync(fd)
    except OSError as error:
        fail_stop(path, "fdatasync" if data_only else "fsync", error)


def _write_failed(path: Path, action: str, error: OSError) -> DiskFull:
    """A failed write: `DiskFull` to raise when there is no room, else fail-stop."""
    if error.errno in _NO_SPACE_ERRNOS:
        return DiskFull(path, error)
    fail_stop(path, action, error)


def has_room(directory: Path) -> bool:
    """Whether `directory`'s filesystem has room to try writing again."""
    stat = os.statvfs(directory)
    available = stat.f_bfree if os.geteuid() == 0 else stat.f_bavail
    wanted = min(DISK_FULL_RETRY_FREE_BYTES, stat.f_blocks * stat.f_frsize // 16)
    return available * stat.f_frsize >= wanted


def simulate_power_cut_from_env() -> bool:
    return os.environ.get(SIMULATE_POWER_CUT_ENV, "") not in ("", "0")


def _float_from_env(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, str(default)))
    except ValueError:
        return default


def fsync_directory(directory: Path) -> None:
    """Make a rename or a new file in `directory` survive a power cut."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        sync_fd(fd, directory)
    finally:
        os.close(fd)


class Disk:
    """Writes files, syncs them, and (in the simulation) reports both.

    `fsync=False` is durability "none": nothing is ever synced, as in
    pysyncobj. With `simulate_power_cut`, a watched directory's files lose
    everything after their last sync when the node is killed.
    """

    def __init__(
        self,
        *,
        fsync: bool,
        simulate_power_cut: bool,
        writeback_s: float,
        fsync_delay_s: float = 0.0,
    ) -> None:
        self.fsync = fsync
        self.simulate_power_cut = simulate_power_cut
        self.fsync_delay_s = fsync_delay_s if simulate_power_cut else 0.0
        self._writeback_s = writeback_s
        self._last_writeback = time.monotonic()
        self.shadow: power_cut.Shadow | None = None
        self.fsync_count = 0

    @classmethod
    def from_env(cls, *, fsync: bool) -> Disk:
        return cls(
            fsync=fsync,
            simulate_power_cut=simulate_power_cut_from_env(),
            writeback_s=_float_from_env(SIMULATE_WRITEBACK_ENV, 30.0),
            fsync_delay_s=_float_from_env(SIMULATE_FSYNC_DELAY_ENV, 0.0),
        )

    def watch(self, directory: Path) -> None:
        """Start the power-cut simulation for `directory` (when it is on)."""
        if self.simulate_power_cut and self.shadow is None:
            self.shadow = power_cut.watch(directory)

    def open_append_file(self, path: Path) -> AppendFile:
        return AppendFile(self, path)

    def replace_file(self, path: Path, data: bytes) -> None:
        """Atomically replace `path`; durable on return when fsync is on."""
        _write_replace(path, data, durable=self.fsync)
        if self.fsync:
            self.fsync_count += 1

    def maybe_writeback(self) -> None:
        """Emulate the kernel flushing old dirty pages (simulation only)."""
        if self.shadow is None:
            return
        if time.monotonic() - self._last_writeback < self._writeback_s:
            return
        self.writeback_all()

    def writeback_all(self) -> None:
        self._last_writeback = time.monotonic()
        if self.shadow is not None:
            self.shadow.writeback()

    def close(self) -> None:
        """A clean shutdown: the kernel writes everything, and the watch ends."""
        if self.shadow is not None:
            self.shadow.writeback()
            power_cut.unwatch(self.shadow)
            self.shadow = None


def _write_replace(path: Path, data: bytes, *, durable: bool) -> None:
    """Raises DiskFull (the old file left in place) when there is no room."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                sync_fd(handle.fileno(), temporary)
        os.replace(temporary, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise _write_failed(path, "write", error) from error
    if durable:
        fsync_directory(path.parent)


class AppendFile:
    """A file written at offsets, truncated, and synced; see `Disk`."""

    def __init__(self, disk: Disk, path: Path) -> None:
        self._disk = disk
        self.path = path
        self.created = not path.exists()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._shadow = disk.shadow
        if self._shadow is not None:
            self._shadow.track(self._fd)
        self._dirty = False

    def read_all(self) -> bytes:
        size = os.fstat(self._fd).st_size
        return os.pread(self._fd, size, 0)

    def write(self, offset: int, data: bytes) -> None:
        """Write all of `data` at `offset`, or raise DiskFull (its bytes may
        be partly on disk past the logical end, a torn tail to a restart)."""
        self._dirty = True
        written = 0
        try:
            while written < len(data):
                count = os.pwrite(self._fd, memoryview(data)[written:], offset + written)
                if count == 0:  # no progress: a full disk by another name
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += count
        except OSError as error:
            raise _write_failed(self.path, "write", error) from error
        finally:
            if self._shadow is not None and written:
                self._shadow.wrote(self._fd, offset, data[:written])

    def truncate(self, size: int) -> None:
        self._dirty = True
        try:
            os.ftruncate(self._fd, size)
        except OSError as error:
            fail_stop(self.path, "truncate", error)
        if self._shadow is not None:
            self._shadow.truncated(self._fd, size)

    def sync(self) -> bool:
        """Make everything written so far durable. Returns whether it synced."""
        if not self._dirty or not self._disk.fsync:
            return False
        if self._disk.fsync_delay_s:
            time.sleep(random.uniform(0.0, self._disk.fsync_delay_s))
        # The durability point, also of the power-cut simulation.
        sync_fd(self._fd, self.path, data_only=True)
        self._dirty = False
        self._disk.fsync_count += 1
        return True

    def close(self) -> None:
        if self._shadow is not None:
            self._shadow.untrack(self._fd)
        os.close(self._fd)


def _encode_record(entry: Entry) -> bytes:
    command, index, term = entry
    body = struct.pack("<QQ", index, term) + command
    return _RECORD_HEADER.pack(len(command), zlib.crc32(body), index, term) + command


def parse_journal(data: bytes) -> tuple[list[Entry], list[int], int]:
    """Decode journal bytes: (entries, offset of each record, end of the good part).

    Raises CorruptJournal (without a path) when a record fails its check
    and a whole record of a later entry follows it: that is not a torn
    tail, which only ever ends the file."""
    if not data:
        return [], [], 0
    if data[: len(_JOURNAL_MAGIC)] != _JOURNAL_MAGIC:
        raise StorageError("journal file does not start with the raftsched journal magic")
    entries: list[Entry] = []
    offsets: list[int] = []
    offset = len(_JOURNAL_MAGIC)
    while offset + _RECORD_HEADER.size <= len(data):
        command_len, crc, index, term = _RECORD_HEADER.unpack_from(data, offset)
        end = offset + _RECORD_HEADER.size + command_len
        if command_len > _RECORD_COMMAND_BYTES_MAX or end > len(data):
            _refuse_if_followed(data, offset, entries, index, "length runs past the end")
            break
        command = data[offset + _RECORD_HEADER.size : end]
        if zlib.crc32(struct.pack("<QQ", index, term) + command) != crc:
            _refuse_if_followed(data, offset, entries, index, "CRC mismatch")
            break
        # A record that does not continue the sequence is left over from
        # before a truncation that did not reach the disk; it is not ours.
        if entries and (index != entries[-1][1] + 1 or term < entries[-1][2]):
            break
        entries.append((command, index, term))
        offsets.append(offset)
        offset = end
    return entries, offsets, offset


def _whole_record_at(data: bytes, offset: int) -> tuple[int, int] | None:
    """(index, term) of a record at `offset` that passes its check, else None."""
    if offset < 0 or offset + _RECORD_HEADER.size > len(data):
        return None
    command_len, crc, index, term = _RECORD_HEADER.unpack_from(data, offset)
    end = offset + _RECORD_HEADER.size + command_len
    if command_len > _RECORD_COMMAND_BYTES_MAX or end > len(data):
        return None
    body = data[offset + _RECORD_HEADER.size : end]
    if zlib.crc32(struct.pack("<QQ", index, term) + body) != crc:
        return None
    return index, term


def _refuse_if_followed(
    data: bytes, offset: int, entries: list[Entry], header_index: int, reason: str
) -> None:
    """Raise CorruptJournal if a whole record of a later entry follows the
    bad record at `offset`; return if what follows is a torn tail.

    A power cut tears only what was written after the last sync, which is
    the end of the file. A whole record after the bad one shows that the bad
    one was written and then damaged (or its neighbour lost): cutting there
    would silently drop records that may have been acknowledged. The bad
    record should hold the entry after the last good one, so the record
    after it holds the one after that; its index is looked for as bytes
    (cheap), and each place it occurs is checked as a whole record. The bad
    record's own index field is tried too, for a journal whose first record
    is the bad one."""
    wanted: set[int] = set()
    if entries:
        wanted.add(entries[-1][1] + 2)
    else:
        wanted.add(header_index + 1)
    index_at = struct.calcsize("<II")
    for index in sorted(wanted):
        needle = struct.pack("<Q", index)
        found = data.find(needle, offset + 1 + index_at)
        while found != -1:
            whole = _whole_record_at(data, found - index_at)
            if whole is not None and whole[0] == index:
                raise CorruptJournal(None, offset, f"{reason}, and a whole record follows")
            found = data.find(needle, found + 1)


class DurableJournal:
    """pysyncobj's journal interface over `AppendFile`, plus `sync()`.

    Only pysyncobj's tick thread touches a journal after construction.
    """

    def __init__(self, directory: Path, disk: Disk) -> None:
        self._directory = directory
        self._disk = disk
        self._path = directory / JOURNAL_NAME
        self._meta_path = directory / META_NAME
        disk.watch(directory)
        self._file = disk.open_append_file(self._path)
        try:
            entries, offsets, end = parse_journal(self._file.read_all())
        except CorruptJournal as corrupt:
            self._file.close()
            raise corrupt.at(self._path) from None
        self._entries = entries
        self._offsets = offsets
        # Records still on disk past the logical end, after a truncation
        # that has not been written yet; see deleteEntriesFrom.
        self._stale: list[tuple[Entry, int]] = []
        if end == 0:
            self._file.write(0, _JOURNAL_MAGIC)
            end = len(_JOURNAL_MAGIC)
        elif end < len(self._file.read_all()):
            logger.warning("journal %s: cutting a torn tail at byte %d", self._path, end)
            self._file.truncate(end)
        self._end = end
        self._meta = _read_meta(self._meta_path)
        self._meta_dirty = False
        # A term or vote that a full disk kept from being saved: nothing
        # that reflects it may be sent (see sync).
        self._vote_unsaved = False
        self._align_with_snapshot(directory / SNAPSHOT_NAME)
        self._file.sync()
        if self._file.created and disk.fsync:
            # A new file's name is durable only once its directory is synced.
            fsync_directory(directory)

    # -- what the adapter adds -------------------------------------------

    def sync(self) -> None:
        """Make every entry written so far, and the term and vote, durable
        (no-op when clean or "none"). Raises DiskFull while a term or vote
        cannot be saved for want of space."""
        if self._vote_unsaved:
            self._save_meta()
        self._file.sync()

    @property
    def directory(self) -> Path:
        return self._directory

    def has_room(self) -> bool:
        """Whether the data directory's filesystem has room to try writing again."""
        try:
            return has_room(self._directory)
        except OSError:
            return True

    @property
    def fsync_count(self) -> int:
        return self._disk.fsync_count

    @property
    def size_bytes(self) -> int:
        """The journal file's logical length: its header and every entry in
        the log (those since the last snapshot, and the two it ends with)."""
        return self._end

    def _align_with_snapshot(self, snapshot_path: Path) -> None:
        """Drop journal entries that a durable snapshot already covers.

        pysyncobj writes the snapshot, then (on a later tick) cuts the
        journal. After a crash between the two, it would find that the
        journal does not start with the snapshot's last two entries and
        clear the whole journal, entries after the snapshot included, which
        may have been acknowledged. Cutting the head here first makes the
        two agree, so nothing after the snapshot is lost.
        """
        try:
            header = read_snapshot_header(snapshot_path)
        except FileNotFoundError:
            return
        except StorageError:
            logger.exception("snapshot %s is unreadable; journal left as it is", snapshot_path)
            return
        previous = header.previous_entry
        for position, entry in enumerate(self._entries):
            if entry[1] == previous[1]:
                if entry == previous and position > 0:
                    logger.warning(
                        "journal starts before snapshot index %d; cutting %d entries",
                        previous[1],
                        position,
                    )
                    self.deleteEntriesTo(position)
                return

    # -- pysyncobj's journal interface -------------------------------------

    def add(self, command: bytes | str, idx: int, term: int) -> None:
        data = command if isinstance(command, bytes) else command.encode("utf-8")
        entry: Entry = (bytes(data), int(idx), int(term))
        if self._stale:
            stale_entry, stale_offset = self._stale[0]
            if stale_entry == entry:
                # The same record is already on disk at this position.
                self._stale.pop(0)
                self._entries.append(entry)
                self._offsets.append(stale_offset)
                self._end = stale_offset + _RECORD_HEADER.size + len(entry[0])
                return
            # A different entry at this index means the stale tail
            # conflicts with the leader's log, so it was never committed.
            # It is cut, durably, before anything replaces it on disk.
            self._stale = []
            self._truncate_durably(self._end)
        record = _encode_record(entry)
        try:
            self._file.write(self._end, record)
        except DiskFull:
            # Whatever part of the record did get written is past the end;
            # giving it back keeps it from reading as a torn tail later.
            self._file.truncate(self._end)
            raise
        self._entries.append(entry)
        self._offsets.append(self._end)
        self._end += len(record)

    def clear(self) -> None:
        self.deleteEntriesFrom(0)

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 - pysyncobj's name
        """Drop entries from position `entryFrom` on, lazily.

        pysyncobj truncates whenever an append overlaps entries the follower
        already has, then appends the same entries again. Cutting the file
        at once would leave acknowledged entries only in memory until the
        next sync. Instead the records stay on disk as a stale tail: an
        identical re-append adopts them again, and only a different entry
        (a real conflict) cuts the file. Until then a restart finds the
        tail, a log this node really had, which Raft repairs as usual.
        """
        if entryFrom >= len(self._entries):
            return
        self._end = self._offsets[entryFrom]
        self._stale = [
            *zip(self._entries[entryFrom:], self._offsets[entryFrom:], strict=True),
            *self._stale,
        ]
        del self._entries[entryFrom:]
        del self._offsets[entryFrom:]

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802 - pysyncobj's name
        """Drop the first `entryTo` entries (after a snapshot), by rewriting the file.

        pysyncobj calls this only after the snapshot has been renamed into
        place, so the directory is synced first: the snapshot must be
        durable before the entries it replaces disappear.
        """
        kept = self._entries[entryTo:]
        if self._disk.fsync:
            fsync_directory(self._directory)
        contents = bytearray(_JOURNAL_MAGIC)
        offsets: list[int] = []
        for entry in kept:
            offsets.append(len(contents))
            contents += _encode_record(entry)
        end = len(contents)
        # The stale tail is kept on disk: it may hold acknowledged entries.
        stale: list[tuple[Entry, int]] = []
        for entry, _ in self._stale:
            stale.append((entry, len(contents)))
            contents += _encode_record(entry)
        if self._disk.fsync:
            # A rewrite in place could lose acknowledged entries if power
            # failed half way; a synced new file renamed over the old cannot.
            self._file.sync()
            self._file.close()
            try:
                self._disk.replace_file(self._path, bytes(contents))
            except DiskFull as full:
                # The old file stays, with the compacted entries at its head
                # (a restart cuts them, see _align_with_snapshot); the records
                # after them are where they were. The next compaction retries.
                logger.warning(
                    "journal %s: no room to compact it (%s); kept as it is", self._path, full
                )
                self._file = self._disk.open_append_file(self._path)
                del self._entries[:entryTo]
                del self._offsets[:entryTo]
                return
            self._file = self._disk.open_append_file(self._path)
        else:
            self._file.truncate(0)
            self._file.write(0, bytes(contents))
        self._entries = list(kept)
        self._offsets = offsets
        self._stale = stale
        self._end = end

    @overload
    def __getitem__(self, item: int) -> Entry: ...
    @overload
    def __getitem__(self, item: slice) -> list[Entry]: ...
    def __getitem__(self, item: int | slice) -> Entry | list[Entry]:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        try:
            self._save_meta()
        except DiskFull as full:
            # The term and vote were never sent unsaved (see sync), so what
            # is on disk is what the others know; the commit index is a hint.
            logger.warning(
                "closing with a full disk: %s; the last term and vote stay as saved", full
            )
        self._file.sync()
        self._file.close()
        self._disk.close()

    def flush(self) -> None:
        self._file.sync()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803
        # The commit index is volatile in Raft; it is saved once a second
        # only so that a restarted node can apply what it knows is committed.
        if self._meta.get("commit_index") != raftCommitIndex:
            self._meta["commit_index"] = int(raftCommitIndex)
            self._meta_dirty = True

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return int(self._meta.get("commit_index", 1))

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:  # noqa: N802, N803
        # Raft: term and vote must be durable before any message that
        # reflects them (a vote request or a granted vote) is sent.
        self._meta["term"] = int(term)
        self._meta["voted_for"] = votedForNodeId
        self._vote_unsaved = True
        try:
            self._save_meta()
        except DiskFull as full:
            # pysyncobj has taken the term already; sync() refuses (so no
            # vote or message with this term leaves) until it is saved.
            logger.warning(
                "cannot save term %d and vote: %s; retrying when there is room", term, full
            )

    def getCurrentTerm(self) -> int:  # noqa: N802
        return int(self._meta.get("term", 0))

    def getVotedForNodeId(self) -> str | None:  # noqa: N802
        voted_for = self._meta.get("voted_for")
        return voted_for if isinstance(voted_for, str) else None

    def onOneSecondTimer(self) -> None:  # noqa: N802
        if self._meta_dirty or self._vote_unsaved:
            # The commit index is only a hint; a full disk just delays it.
            with contextlib.suppress(DiskFull):
                self._save_meta()
        self._disk.maybe_writeback()

    def _save_meta(self) -> None:
        self._disk.replace_file(self._meta_path, msgpack.packb(self._meta))
        self._meta_dirty = False
        self._vote_unsaved = False

    def _truncate_durably(self, size: int) -> None:
        # Truncations are rare (a conflicting follower tail, an installed
        # snapshot). Syncing them at once keeps a stale record from
        # resurfacing behind new ones after a power cut.
        self._file.truncate(size)
        self._file.sync()


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        meta = msgpack.unpackb(raw)
    except (ValueError, msgpack.UnpackException) as error:
        raise StorageError(f"{path} is not a msgpack record: {error}") from error
    if not isinstance(meta, dict):
        raise StorageError(f"{path} does not hold a msgpack map")
    return meta


def read_journal_entries(directory: Path) -> list[Entry]:
    """What a restarted node would recover from its journal (for tests and tools)."""
    try:
        data = (directory / JOURNAL_NAME).read_bytes()
    except FileNotFoundError:
        return []
    return parse_journal(data)[0]


# -- snapshot file -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SnapshotHeader:
    last_entry: Entry
    previous_entry: Entry
    cluster: tuple[str, ...]


def _entry_from_wire(value: object) -> Entry:
    if not isinstance(value, Sequence) or len(value) != 3:
        raise StorageError(f"snapshot entry is not (command, index, term): {value!r}")
    command, index, term = value
    if not isinstance(command, bytes) or not isinstance(index, int) or not isinstance(term, int):
        raise StorageError(f"snapshot entry has wrong types: {value!r}")
    return (command, index, term)


def _snapshot_header_bytes(header: SnapshotHeader) -> bytes:
    packed: bytes = msgpack.packb(
        {
            "version": 1,
            "last_entry": list(header.last_entry),
            "previous_entry": list(header.previous_entry),
            "cluster": list(header.cluster),
        }
    )
    return packed


def _snapshot_prefix(header_bytes: bytes, body_len: int, body_crc: int) -> bytes:
    return _SNAPSHOT_PREFIX.pack(len(header_bytes), zlib.crc32(header_bytes), body_len, body_crc)


def encode_snapshot(header: SnapshotHeader, body: bytes) -> bytes:
    """A whole snapshot file's bytes (what `write_snapshot_file` writes)."""
    header_bytes = _snapshot_header_bytes(header)
    prefix = _snapshot_prefix(header_bytes, len(body), zlib.crc32(body))
    return _SNAPSHOT_MAGIC + prefix + header_bytes + body


def _decode_snapshot_header(data: bytes) -> tuple[SnapshotHeader, int, int, int]:
    if data[: len(_SNAPSHOT_MAGIC)] != _SNAPSHOT_MAGIC:
        raise StorageError("snapshot does not start with the raftsched snapshot magic")
    start = len(_SNAPSHOT_MAGIC)
    if len(data) < start + _SNAPSHOT_PREFIX.size:
        raise StorageError("snapshot is shorter than its prefix")
    header_len, header_crc, body_len, body_crc = _SNAPSHOT_PREFIX.unpack_from(data, start)
    header_start = start + _SNAPSHOT_PREFIX.size
    header_bytes = data[header_start : header_start + header_len]
    if len(header_bytes) != header_len or zlib.crc32(header_bytes) != header_crc:
        raise StorageError("snapshot header is torn or corrupt")
    raw = msgpack.unpackb(header_bytes)
    if not isinstance(raw, dict) or raw.get("version") != 1:
        raise StorageError(f"unknown snapshot header {raw!r}")
    cluster = raw.get("cluster", [])
    header = SnapshotHeader(
        last_entry=_entry_from_wire(raw.get("last_entry")),
        previous_entry=_entry_from_wire(raw.get("previous_entry")),
        cluster=tuple(str(address) for address in cluster),
    )
    return header, header_start + header_len, body_len, body_crc


def decode_snapshot(data: bytes) -> tuple[SnapshotHeader, memoryview]:
    """The header and the machine's bytes, checked against their CRCs. The
    body is a view of `data`, not a copy (a 1M-job state is ~270 MB)."""
    header, body_start, body_len, body_crc = _decode_snapshot_header(data)
    body = memoryview(data)[body_start : body_start + body_len]
    if len(body) != body_len or zlib.crc32(body) != body_crc:
        raise StorageError("snapshot body is torn or corrupt")
    return header, body


def read_snapshot_header(path: Path) -> SnapshotHeader:
    with open(path, "rb") as handle:
        start = handle.read(len(_SNAPSHOT_MAGIC) + _SNAPSHOT_PREFIX.size)
        if len(start) < len(_SNAPSHOT_MAGIC) + _SNAPSHOT_PREFIX.size:
            raise StorageError("snapshot is shorter than its prefix")
        header_len = _SNAPSHOT_PREFIX.unpack_from(start, len(_SNAPSHOT_MAGIC))[0]
        data = start + handle.read(header_len)
    return _decode_snapshot_header(data)[0]


def write_snapshot_file(
    path: Path, header: SnapshotHeader, body: Iterable[bytes | memoryview], *, durable: bool
) -> None:
    """Write a snapshot to `path` (a temporary name that pysyncobj renames),
    the machine's bytes as they come: `body` is read piece by piece and each
    piece copied out before the next is asked for, so the whole state never
    has to be in memory at once. A thread of its own writes the pieces, so
    that the kernel's share (taking ~300 MB into its page cache at 1M jobs,
    0.5-1.7 s on this VM) overlaps the encoding instead of following it.
    The body's length and CRC are known only at the end, so the prefix is
    written last; until then the file reads as torn."""
    header_bytes = _snapshot_header_bytes(header)
    with open(path, "wb") as handle:
        handle.write(_SNAPSHOT_MAGIC + b"\xff" * _SNAPSHOT_PREFIX.size + header_bytes)
        length = crc = 0
        writer = _PieceWriter(handle)
        try:
            for piece in body:
                crc = zlib.crc32(piece, crc)
                length += len(piece)
                writer.put(bytes(piece))
        finally:
            writer.close()
        if writer.error is not None:
            raise writer.error
        handle.seek(len(_SNAPSHOT_MAGIC))
        handle.write(_snapshot_prefix(header_bytes, length, crc))
        handle.flush()
        if durable:
            os.fsync(handle.fileno())


_WRITE_AHEAD: Final = 4
"""Pieces (about 1 MB each) that may wait for the snapshot writer thread."""


class _PieceWriter:
    """Writes pieces to a file on its own thread (a file write releases the
    GIL). After a failed write it drops the rest, so `put` never blocks on a
    writer that stopped; the first error is kept for the caller."""

    def __init__(self, handle: BinaryIO) -> None:
        self.error: BaseException | None = None
        self._queue: queue.Queue[bytes | None] = queue.Queue(_WRITE_AHEAD)
        self._thread = threading.Thread(
            target=self._run, args=(handle,), name="snapshot-writer", daemon=True
        )
        self._thread.start()

    def _run(self, handle: BinaryIO) -> None:
        while (piece := self._queue.get()) is not None:
            if self.error is None:
                try:
                    handle.write(piece)
                except BaseException as error:  # handed to the caller
                    self.error = error

    def put(self, piece: bytes) -> None:
        if self.error is not None:
            raise self.error
        self._queue.put(piece)

    def close(self) -> None:
        """Wait until every piece put so far is written (or dropped)."""
        self._queue.put(None)
        self._thread.join()
