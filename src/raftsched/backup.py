"""The backup file: the whole replicated state at one committed index.

    RSBACKUP | header_len u32 | header_crc32 u32 | header (msgpack) | body

The header is a msgpack map: `format` (1), `cluster_id` (the backed-up
cluster's, or None for a cluster that never had one), `index` (the Raft
index the state is at), `digest` (the state digest, as `/v1/debug/digest`
reports it: the SHA-256 of the body), `body_bytes`, `created_at_ms`,
`node_id` (the node that wrote it) and `release`. The body is the state's
own encoding (`core.encode_state_pieces`), exactly what a snapshot holds.

Because the digest is the SHA-256 of the body, it is also the body's
checksum: a file cut short, padded or changed anywhere is refused
(`BackupError`), and a file that passes holds exactly the state whose
digest the header names. The header has its own CRC.

The digest must lead the file (it is also an HTTP header of `GET
/v1/backup`), but it is known only once the state is encoded. The writer
(`write_backup`, run in a forked child of the node, see `node.backup`)
therefore encodes twice: once to hash, once to write. Encoding never holds
the whole state in memory (each piece is about 1 MB), so the price is CPU
in a child at low priority, not memory or disk.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import msgpack

BACKUP_MAGIC: Final = b"RSBACKUP"
BACKUP_FORMAT: Final = 1
_PREFIX: Final = struct.Struct("<II")  # header_len, header_crc32
PREFIX_BYTES: Final = len(BACKUP_MAGIC) + _PREFIX.size
# A header is a few hundred bytes; anything near this is not one.
_HEADER_BYTES_MAX: Final = 64 * 1024
_HASH_CHUNK_BYTES: Final = 4 * 1024 * 1024


class BackupError(Exception):
    """The file is not a whole, intact backup of a format this code reads."""


@dataclass(frozen=True, slots=True)
class BackupHeader:
    cluster_id: str | None
    index: int
    digest: str
    body_bytes: int
    created_at_ms: int
    node_id: str
    release: str
    format: int = BACKUP_FORMAT

    def encode(self) -> bytes:
        """The magic, the prefix and the header: what precedes the body."""
        header: bytes = msgpack.packb(asdict(self))
        return BACKUP_MAGIC + _PREFIX.pack(len(header), zlib.crc32(header)) + header


def header_length(prefix: bytes) -> int:
    """The header's length from the file's first `PREFIX_BYTES` bytes."""
    if len(prefix) < PREFIX_BYTES or prefix[: len(BACKUP_MAGIC)] != BACKUP_MAGIC:
        raise BackupError("not a raftsched backup (no RSBACKUP magic)")
    length, _ = _PREFIX.unpack_from(prefix, len(BACKUP_MAGIC))
    if length > _HEADER_BYTES_MAX:
        raise BackupError(f"the backup's header claims {length} bytes: corrupt")
    return int(length)


def decode_header(data: bytes) -> BackupHeader:
    """The header from the file's first bytes (prefix and header, at least)."""
    length = header_length(data[:PREFIX_BYTES])
    _, crc = _PREFIX.unpack_from(data, len(BACKUP_MAGIC))
    raw = data[PREFIX_BYTES : PREFIX_BYTES + length]
    if len(raw) != length:
        raise BackupError("the backup is cut short inside its header")
    if zlib.crc32(raw) != crc:
        raise BackupError("the backup's header fails its CRC: corrupt")
    fields = msgpack.unpackb(raw)
    if not isinstance(fields, dict) or fields.get("format") != BACKUP_FORMAT:
        found = fields.get("format") if isinstance(fields, dict) else fields
        raise BackupError(f"unknown backup format {found!r}")
    try:
        header = BackupHeader(**fields)
    except TypeError as error:
        raise BackupError(f"the backup's header is not one: {error}") from error
    if not (isinstance(header.index, int) and isinstance(header.body_bytes, int)):
        raise BackupError("the backup's header has no index or length")
    return header


def write_backup(
    write: Callable[[bytes | memoryview], None],
    pieces: Callable[[], Iterable[bytes | memoryview]],
    *,
    cluster_id: str | None,
    index: int,
    node_id: str,
    release: str,
) -> BackupHeader:
    """Write a whole backup through `write`: `pieces()` is called twice and
    must give the same bytes both times (a state that holds still)."""
    digest = hashlib.sha256()
    body_bytes = 0
    for piece in pieces():
        digest.update(piece)
        body_bytes += len(piece)
    header = BackupHeader(
        cluster_id=cluster_id,
        index=index,
        digest=digest.hexdigest(),
        body_bytes=body_bytes,
        created_at_ms=int(time.time() * 1000),
        node_id=node_id,
        release=release,
    )
    write(header.encode())
    for piece in pieces():
        write(piece)
    return header


@dataclass(frozen=True, slots=True)
class OpenBackup:
    header: BackupHeader
    body: memoryview  # a view of the mapped file: valid until `close`
    _map: mmap.mmap

    def close(self) -> None:
        self.body.release()
        self._map.close()

    def __enter__(self) -> OpenBackup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_backup(path: Path) -> OpenBackup:
    """Map a backup file and check it whole (header CRC, length, digest);
    BackupError says what is wrong. The body is not read into memory."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < PREFIX_BYTES:
            raise BackupError(f"{path}: {size} bytes, too short to be a backup")
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        head_end = PREFIX_BYTES + header_length(mapped[:PREFIX_BYTES])
        header = decode_header(mapped[:head_end])
        body_bytes = size - head_end
        if body_bytes != header.body_bytes:
            how = "cut short (truncated)" if body_bytes < header.body_bytes else "too long"
            raise BackupError(
                f"{path}: the body is {how}: {body_bytes} bytes, the header says "
                f"{header.body_bytes}"
            )
        digest = hashlib.sha256()
        for start in range(head_end, size, _HASH_CHUNK_BYTES):
            digest.update(mapped[start : min(size, start + _HASH_CHUNK_BYTES)])
        if digest.hexdigest() != header.digest:
            raise BackupError(f"{path}: the body's SHA-256 is not the header's digest: corrupt")
    except BaseException:
        mapped.close()
        raise
    return OpenBackup(header, memoryview(mapped)[head_end:], mapped)


def summary(header: BackupHeader) -> dict[str, Any]:
    """What the CLI prints about a backup."""
    return {
        "cluster_id": header.cluster_id,
        "index": header.index,
        "digest": header.digest,
        "bytes": PREFIX_BYTES + len(msgpack.packb(asdict(header))) + header.body_bytes,
        "created_at_ms": header.created_at_ms,
        "node_id": header.node_id,
        "release": header.release,
    }
