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

A cluster of several shards (docs/shards.md, section 5) backs up every
group into one file, a container of the groups' own backup files:

    RSSHARDS | header_len u32 | header_crc32 u32 | header (msgpack) | part 0 | ... | part S-1

The header is a msgpack map: `format` (1), `shards` (S), `cluster_id`
(group 0's), `created_at_ms`, `node_id`, `release` and `parts`, one map per
group in shard order (`shard`, `index`, `digest`, `bytes`, `cluster_id`).
Part k is shard k's backup file exactly as `GET /v1/backup` of that group
alone gives it (`RSBACKUP...`, at its own committed index, with its own
digest); group 0 is shard 0. A one-shard cluster's backup is one RSBACKUP
file, as it always was. `open_any` reads either; every part is checked as
a backup file is (header CRC, length, SHA-256), and against the container's
listing.
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
SHARDED_MAGIC: Final = b"RSSHARDS"
SHARDED_FORMAT: Final = 1
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


def _map(path: Path) -> mmap.mmap:
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < PREFIX_BYTES:
            raise BackupError(f"{path}: {size} bytes, too short to be a backup")
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


def _checked_part(mapped: mmap.mmap, start: int, end: int, what: str) -> tuple[BackupHeader, int]:
    """The header of the backup file at mapped[start:end] and where its body
    starts, once its header CRC, its length and its digest are checked."""
    if end - start < PREFIX_BYTES:
        raise BackupError(f"{what}: {end - start} bytes, too short to be a backup (truncated)")
    head_end = start + PREFIX_BYTES + header_length(mapped[start : start + PREFIX_BYTES])
    header = decode_header(mapped[start:head_end])
    body_bytes = end - head_end
    if body_bytes != header.body_bytes:
        how = "cut short (truncated)" if body_bytes < header.body_bytes else "too long"
        raise BackupError(
            f"{what}: the body is {how}: {body_bytes} bytes, the header says {header.body_bytes}"
        )
    digest = hashlib.sha256()
    for at in range(head_end, end, _HASH_CHUNK_BYTES):
        digest.update(mapped[at : min(end, at + _HASH_CHUNK_BYTES)])
    if digest.hexdigest() != header.digest:
        raise BackupError(f"{what}: the body's SHA-256 is not the header's digest: corrupt")
    return header, head_end


def open_backup(path: Path) -> OpenBackup:
    """Map a backup file and check it whole (header CRC, length, digest);
    BackupError says what is wrong. The body is not read into memory."""
    mapped = _map(path)
    try:
        if mapped[: len(SHARDED_MAGIC)] == SHARDED_MAGIC:
            raise BackupError(f"{path}: a backup of a cluster of several shards, not of one group")
        header, head_end = _checked_part(mapped, 0, len(mapped), str(path))
    except BaseException:
        mapped.close()
        raise
    return OpenBackup(header, memoryview(mapped)[head_end:], mapped)


# -- the backup of a cluster of several shards -------------------------------------


@dataclass(frozen=True, slots=True)
class PartListing:
    """One group's part as the container's header lists it."""

    shard: int
    index: int
    digest: str
    bytes: int
    cluster_id: str | None


@dataclass(frozen=True, slots=True)
class ShardedHeader:
    shards: int
    cluster_id: str | None
    created_at_ms: int
    node_id: str
    release: str
    parts: tuple[PartListing, ...]
    format: int = SHARDED_FORMAT

    def encode(self) -> bytes:
        fields = asdict(self)
        fields["parts"] = [asdict(part) for part in self.parts]
        header: bytes = msgpack.packb(fields)
        return SHARDED_MAGIC + _PREFIX.pack(len(header), zlib.crc32(header)) + header

    @property
    def total_bytes(self) -> int:
        return len(self.encode()) + sum(part.bytes for part in self.parts)


def decode_sharded_header(data: bytes) -> ShardedHeader:
    """The container's header from the file's first bytes."""
    if data[: len(SHARDED_MAGIC)] != SHARDED_MAGIC or len(data) < PREFIX_BYTES:
        raise BackupError("not a raftsched backup of several shards (no RSSHARDS magic)")
    length, crc = _PREFIX.unpack_from(data, len(SHARDED_MAGIC))
    if length > _HEADER_BYTES_MAX:
        raise BackupError(f"the backup's header claims {length} bytes: corrupt")
    raw = data[PREFIX_BYTES : PREFIX_BYTES + length]
    if len(raw) != length:
        raise BackupError("the backup is cut short inside its header (truncated)")
    if zlib.crc32(raw) != crc:
        raise BackupError("the backup's header fails its CRC: corrupt")
    fields = msgpack.unpackb(raw)
    if not isinstance(fields, dict) or fields.get("format") != SHARDED_FORMAT:
        found = fields.get("format") if isinstance(fields, dict) else fields
        raise BackupError(f"unknown backup format {found!r} (of several shards)")
    try:
        parts = tuple(PartListing(**part) for part in fields.pop("parts"))
        header = ShardedHeader(parts=parts, **fields)
    except (TypeError, KeyError) as error:
        raise BackupError(f"the backup's header is not one: {error}") from error
    shards = header.shards
    if (
        not isinstance(shards, int)
        or shards < 2
        or [part.shard for part in parts] != list(range(shards))
        or not all(isinstance(part.bytes, int) and part.bytes > 0 for part in parts)
    ):
        raise BackupError("the backup's header does not list one part per shard: corrupt")
    return header


@dataclass(frozen=True, slots=True)
class OpenPart:
    shard: int
    header: BackupHeader
    body: memoryview


@dataclass(frozen=True, slots=True)
class OpenShardedBackup:
    header: ShardedHeader
    parts: tuple[OpenPart, ...]
    _map: mmap.mmap

    def close(self) -> None:
        for part in self.parts:
            part.body.release()
        self._map.close()

    def __enter__(self) -> OpenShardedBackup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_any(path: Path) -> OpenBackup | OpenShardedBackup:
    """Map a backup file of either kind and check it whole: for a cluster of
    several shards, the container's header and every part (as `open_backup`
    checks one), each part's header against the container's listing."""
    mapped = _map(path)
    try:
        if mapped[: len(SHARDED_MAGIC)] != SHARDED_MAGIC:
            header, head_end = _checked_part(mapped, 0, len(mapped), str(path))
            return OpenBackup(header, memoryview(mapped)[head_end:], mapped)
        length = header_length(BACKUP_MAGIC + mapped[len(SHARDED_MAGIC) : PREFIX_BYTES])
        sharded = decode_sharded_header(mapped[: PREFIX_BYTES + length])
        start = PREFIX_BYTES + length
        expected = start + sum(part.bytes for part in sharded.parts)
        if len(mapped) != expected:
            how = "cut short (truncated)" if len(mapped) < expected else "too long"
            raise BackupError(
                f"{path}: the backup is {how}: {len(mapped)} bytes, its header says {expected}"
            )
        parts: list[tuple[int, BackupHeader, int, int]] = []
        for listed in sharded.parts:
            end = start + listed.bytes
            what = f"{path}, shard {listed.shard}'s part"
            header, head_end = _checked_part(mapped, start, end, what)
            if (header.index, header.digest, header.cluster_id) != (
                listed.index,
                listed.digest,
                listed.cluster_id,
            ):
                raise BackupError(f"{what}: its header is not what the container lists: corrupt")
            parts.append((listed.shard, header, head_end, end))
            start = end
    except BaseException:
        mapped.close()
        raise
    view = memoryview(mapped)
    return OpenShardedBackup(
        sharded,
        tuple(OpenPart(shard, header, view[body:end]) for shard, header, body, end in parts),
        mapped,
    )


def sharded_summary(header: ShardedHeader) -> dict[str, Any]:
    """What the CLI prints about a backup of several shards: group 0's
    fields (as for one group), `shards` and each part's."""
    first = header.parts[0]
    return {
        "cluster_id": header.cluster_id,
        "index": first.index,
        "digest": first.digest,
        "bytes": header.total_bytes,
        "created_at_ms": header.created_at_ms,
        "node_id": header.node_id,
        "release": header.release,
        "shards": header.shards,
        "parts": [asdict(part) for part in header.parts],
    }


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
