"""A simulated power cut whose durability point is the sync call itself.

`kill -9` keeps whatever a process wrote, because the kernel's page cache
outlives the process. With `RAFTSCHED_SIMULATE_POWER_CUT=1` the journal
watches its data directory (`watch`): writes go to the real files as usual,
and a shadow copy under `.power-cut/` records what a disk would hold after a
power cut. The shadow changes only when a real `os.fsync` or `os.fdatasync`
returns, which this module wraps for the whole process (so the forked
snapshot writer is covered too):

- a file's content is durable as of the last completed sync of that file
  (by inode: a renamed file keeps its synced content);
- a name in the directory (a new file, a rename over an old one) is durable
  as of the last completed sync of the directory.

`cut_power(directory)` is the power cut: every `raft.*` file in the
directory is put back as the shadow says, and files whose names were never
made durable disappear. A watched node does this itself when it starts, so
killing every node and starting them again is a power cut of the cluster.
Leaving out a sync in the journal loses data in this simulation, which is
what a test of durability needs.

A clean close and the emulated writeback of the kernel (`writeback`) make
everything durable at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import msgpack

STORE_NAME: Final = ".power-cut"
_NAMES: Final = "names"
_LOCK: Final = "lock"
_MANAGED_PREFIX: Final = "raft."

_real_fsync: Final = os.fsync
_real_fdatasync: Final = os.fdatasync


class Shadow:
    """What the disk under one directory holds: durable names and contents."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory.resolve()
        self.store = self.directory / STORE_NAME
        # Unsynced writes per open file of the journal: (offset, data), or
        # (size, None) for a truncation. A sync applies them to the shadow.
        self._ops: dict[int, list[tuple[int, bytes | None]]] = {}
        # One descriptor per inode the shadow refers to, so that no new file
        # can take over its number while the shadow still means the old one.
        self._pins: dict[int, int] = {}
        self._lock = threading.Lock()

    # -- what the journal reports ------------------------------------------

    def track(self, fd: int) -> None:
        with self._lock:
            self._ops[fd] = []

    def untrack(self, fd: int) -> None:
        with self._lock:
            self._ops.pop(fd, None)

    def wrote(self, fd: int, offset: int, data: bytes) -> None:
        with self._lock:
            if fd in self._ops:
                self._ops[fd].append((offset, bytes(data)))

    def truncated(self, fd: int, size: int) -> None:
        with self._lock:
            if fd in self._ops:
                self._ops[fd].append((size, None))

    # -- what the wrapped sync calls report ---------------------------------

    def file_synced(self, fd: int) -> None:
        ino = os.fstat(fd).st_ino
        with self._lock, self._store_locked():
            shadow = self.store / f"ino-{ino}"
            ops = self._ops.get(fd)
            if ops is None or not shadow.exists():
                # Not a file the journal writes at offsets: take it whole.
                # (Through /proc: `fd` may be open for writing only.)
                _write_file(shadow, Path(f"/proc/self/fd/{fd}").read_bytes())
            else:
                with open(shadow, "r+b") as handle:
                    for offset, data in ops:
                        if data is None:
                            handle.truncate(offset)
                        else:
                            handle.seek(offset)
                            handle.write(data)
            if ops is not None:
                ops.clear()
            if ino not in self._pins:
                self._pins[ino] = os.dup(fd)

    def directory_synced(self) -> None:
        with self._lock, self._store_locked():
            names = self._current_names()
            for ino in names.values():
                shadow = self.store / f"ino-{ino}"
                if not shadow.exists():
                    # The name is durable, the content never was.
                    _write_file(shadow, b"")
            self._save_names(names)
            self._collect(names)

    def writeback(self) -> None:
        """Everything written so far reaches the disk, as the kernel eventually does it."""
        with self._lock, self._store_locked():
            names = self._current_names()
            for name, ino in names.items():
                _write_file(self.store / f"ino-{ino}", (self.directory / name).read_bytes())
            for ops in self._ops.values():
                ops.clear()
            self._save_names(names)
            self._collect(names)

    def start(self) -> None:
        """Begin with everything already in the directory durable."""
        self.store.mkdir(exist_ok=True)
        self.writeback()

    def close(self) -> None:
        with self._lock:
            for fd in self._pins.values():
                os.close(fd)
            self._pins.clear()
            self._ops.clear()

    # -- the store ------------------------------------------------------------

    @contextlib.contextmanager
    def _store_locked(self) -> Iterator[None]:
        # The forked snapshot writer syncs the directory too.
        with open(self.store / _LOCK, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            yield

    def _current_names(self) -> dict[str, int]:
        names: dict[str, int] = {}
        for entry in os.scandir(self.directory):
            if entry.name.startswith(_MANAGED_PREFIX) and entry.is_file(follow_symlinks=False):
                names[entry.name] = entry.inode()
        return names

    def _save_names(self, names: dict[str, int]) -> None:
        _write_file(self.store / _NAMES, msgpack.packb(names))
        for name, ino in names.items():
            if ino not in self._pins:
                with contextlib.suppress(FileNotFoundError):
                    self._pins[ino] = os.open(self.directory / name, os.O_RDONLY)

    def _collect(self, names: dict[str, int]) -> None:
        """Drop shadows that no durable name and no file in the directory refers to."""
        keep = {f"ino-{ino}" for ino in names.values()}
        keep |= {f"ino-{ino}" for ino in self._current_names().values()}
        for entry in os.scandir(self.store):
            if entry.name.startswith("ino-") and entry.name not in keep:
                os.unlink(entry.path)
                fd = self._pins.pop(int(entry.name.removeprefix("ino-")), None)
                if fd is not None:
                    os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    # The store only has to outlive the process, not the machine: no fsync.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    temporary.write_bytes(data)
    os.replace(temporary, path)


# -- the process-wide sync wrappers ------------------------------------------

_watched: dict[Path, Shadow] = {}
_watched_lock = threading.Lock()


def _reported(fd: int) -> None:
    try:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return
    with _watched_lock:
        directory = _watched.get(path)
        owner = _watched.get(path.parent)
    if directory is not None:
        directory.directory_synced()
    elif owner is not None and path.name.startswith(_MANAGED_PREFIX):
        owner.file_synced(fd)


def _fileno(fd: object) -> int:
    if isinstance(fd, int):
        return fd
    fileno = getattr(fd, "fileno", None)
    if fileno is None:
        raise TypeError(f"not a file descriptor: {fd!r}")
    return int(fileno())


def _fsync(fd: object) -> None:
    number = _fileno(fd)
    _real_fsync(number)
    _reported(number)


def _fdatasync(fd: object) -> None:
    number = _fileno(fd)
    _real_fdatasync(number)
    _reported(number)


def _after_fork_in_child() -> None:
    global _watched_lock
    _watched_lock = threading.Lock()
    for shadow in _watched.values():
        shadow._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def watch(directory: Path) -> Shadow:
    """Simulate power cuts under `directory` from now on (see the module docstring).

    Whatever a previous process left unsynced is lost first: that process
    is gone, and this is the power coming back.
    """
    cut_power(directory)
    shadow = Shadow(directory)
    shadow.start()
    with _watched_lock:
        _watched[shadow.directory] = shadow
        os.fsync = _fsync
        os.fdatasync = _fdatasync
    return shadow


def unwatch(shadow: Shadow) -> None:
    with _watched_lock:
        if _watched.get(shadow.directory) is shadow:
            del _watched[shadow.directory]
        if not _watched:
            os.fsync = _real_fsync
            os.fdatasync = _real_fdatasync
    shadow.close()


def cut_power(directory: Path) -> None:
    """Leave `directory` as a power cut would: each `raft.*` file as of its last sync.

    A no-op for a directory that is not watched. In this process, a watch
    of `directory` ends (its writer is gone with the power).
    """
    directory = directory.resolve()
    with _watched_lock:
        shadow = _watched.get(directory)
    if shadow is not None:
        unwatch(shadow)
    store = directory / STORE_NAME
    try:
        names: dict[str, int] = msgpack.unpackb((store / _NAMES).read_bytes())
    except FileNotFoundError:
        return
    for entry in os.scandir(directory):
        if entry.name.startswith(_MANAGED_PREFIX) and entry.name not in names:
            os.unlink(entry.path)
    for name, ino in names.items():
        try:
            data = (store / f"ino-{ino}").read_bytes()
        except FileNotFoundError:
            data = b""
        _write_file(directory / name, data)
    shutil.rmtree(store)
