"""Backups without stalling the node: the state is encoded in a forked child.

Theory of operation. Encoding a million jobs takes seconds, far longer than
an election timeout, and the state must hold still while it is encoded. The
Raft adapter's snapshot writer solves the same problem by forking
(`raft.py`, guard rail 5), and so does this: the asyncio thread takes the
replica's lock (so no entry is half applied, and no other thread holds the
lock across the fork), reads the applied index and the cluster id, forks,
and lets go at once. The child owns a copy-on-write image of the state as
of exactly that index; it writes the backup file's bytes
(`raftsched.backup.write_backup`) into a pipe at a low CPU priority and
exits. The parent relays the pipe to the HTTP client, so neither the whole
encoding nor a temporary file ever exists; a slow client slows the child,
not the node.

The price is the snapshot writer's: pages the node changes while the child
runs are copied (up to the size of the state), and the child takes CPU. One
backup at a time runs on a node (`BackupBusy`). The child dies with the
node (`child_processes.die_with`), and is killed when the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final

import raftsched
from raftsched import child_processes
from raftsched.backup import PREFIX_BYTES, BackupHeader, decode_header, header_length, write_backup
from raftsched.core.kernel import identity as core_identity
from raftsched.node.machine import ReplicatedState

BACKUP_CHILD_NICE: Final = 10
READ_CHUNK_BYTES: Final = 1 << 20


class BackupBusy(Exception):
    """Another backup is running on this node."""


class BackupFailed(Exception):
    """The child stopped before the backup was whole."""


@dataclass(slots=True)
class BackupStream:
    """A backup being written by a child: its header, then its bytes."""

    header: BackupHeader
    head: bytes  # the magic, prefix and header, already read from the pipe
    _pid: int
    _reader: asyncio.StreamReader
    _transport: asyncio.ReadTransport
    _finished: bool = False

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, as the child writes it; BackupFailed if it stops short."""
        remaining = self.header.body_bytes
        while remaining > 0:
            chunk = await self._reader.read(min(READ_CHUNK_BYTES, remaining))
            if not chunk:
                status = await self._reap()
                raise BackupFailed(f"the backup child stopped early (exit status {status})")
            remaining -= len(chunk)
            yield chunk
        status = await self._reap()
        if status != 0:
            raise BackupFailed(f"the backup child failed (exit status {status})")

    async def close(self) -> None:
        """Stop the child if it still runs (the client went away) and reap it."""
        self._transport.close()
        if not self._finished:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            await self._reap()

    async def _reap(self) -> int:
        if self._finished:
            return 0
        self._finished = True
        _, status = await asyncio.to_thread(os.waitpid, self._pid, 0)
        return os.waitstatus_to_exitcode(status)


class Backups:
    """The node's backups: at most one at a time."""

    def __init__(self, replica: ReplicatedState, node_id: str) -> None:
        self._replica = replica
        self._node_id = node_id
        self._running = False

    async def start(self) -> BackupStream:
        """Fork the writer at the replica's applied index and read the header."""
        if self._running:
            raise BackupBusy()
        self._running = True
        try:
            return await self._start()
        except BaseException:
            self._running = False
            raise

    def done(self) -> None:
        self._running = False

    async def _start(self) -> BackupStream:
        loop = asyncio.get_running_loop()
        read_fd, write_fd = os.pipe()
        replica = self._replica
        with replica.lock:
            index = replica.applied_index
            cluster_id = core_identity.cluster_id(replica.state)
            parent_pid = os.getpid()
            pid = os.fork()
            if pid == 0:  # the child; never returns
                os.close(read_fd)
                _child_main(write_fd, replica, cluster_id, index, self._node_id, parent_pid)
        os.close(write_fd)
        reader = asyncio.StreamReader(limit=2 * READ_CHUNK_BYTES)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", buffering=0)
        )
        stream = BackupStream(
            BackupHeader(None, index, "", 0, 0, "", ""), b"", pid, reader, transport
        )
        try:
            prefix = await reader.readexactly(PREFIX_BYTES)
            rest = await reader.readexactly(header_length(prefix))
        except (asyncio.IncompleteReadError, ValueError) as error:
            await stream.close()
            raise BackupFailed(f"the backup child wrote no header: {error}") from error
        stream.head = prefix + rest
        stream.header = decode_header(stream.head)
        return stream


def _child_main(
    fd: int,
    replica: ReplicatedState,
    cluster_id: str | None,
    index: int,
    node_id: str,
    parent_pid: int,
) -> None:
    """In the forked child: write the backup into the pipe and exit."""
    status = 1
    try:
        child_processes.die_with(parent_pid)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        with contextlib.suppress(OSError):
            os.nice(BACKUP_CHILD_NICE)

        def write(data: bytes | memoryview) -> None:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]

        write_backup(
            write,
            replica.snapshot,
            cluster_id=cluster_id,
            index=index,
            node_id=node_id,
            release=raftsched.__version__,
        )
        status = 0
    finally:
        os._exit(status)
