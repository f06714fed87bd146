"""The backup file of a cluster of several shards (raftsched.backup, RSSHARDS):
a container of the groups' own backup files, checked whole on opening."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from raftsched.backup import (
    BackupError,
    OpenBackup,
    OpenShardedBackup,
    PartListing,
    ShardedHeader,
    decode_header,
    open_any,
    open_backup,
)


def _group(body: bytes, index: int, cluster_id: str) -> bytes:
    from raftsched.backup import write_backup

    out: list[bytes] = []
    write_backup(
        lambda data: out.append(bytes(data)),
        lambda: [body[:3], body[3:]],
        cluster_id=cluster_id,
        index=index,
        node_id="n1",
        release="test",
    )
    return b"".join(out)


def _container(parts: list[bytes], **change: object) -> bytes:
    listings = []
    for shard, part in enumerate(parts):
        header = decode_header(part)
        listings.append(
            PartListing(shard, header.index, header.digest, len(part), header.cluster_id)
        )
    header = ShardedHeader(
        shards=len(parts),
        cluster_id="clu_0",
        created_at_ms=1,
        node_id="n1",
        release="test",
        parts=tuple(listings),
    )
    header = dataclasses.replace(header, **change)  # type: ignore[arg-type]
    return header.encode() + b"".join(parts)


PARTS = [_group(b"group zero state", 10, "clu_0"), _group(b"shard one", 7, "clu_1")]


def test_a_container_opens_with_every_part(tmp_path: Path) -> None:
    path = tmp_path / "b"
    path.write_bytes(_container(PARTS + [_group(b"two", 3, "clu_2")]))
    with open_any(path) as backup:
        assert isinstance(backup, OpenShardedBackup)
        assert [bytes(part.body) for part in backup.parts] == [
            b"group zero state",
            b"shard one",
            b"two",
        ]
        assert [part.header.index for part in backup.parts] == [10, 7, 3]
        assert backup.header.total_bytes == path.stat().st_size
    # One group's file is what it always was, and open_any reads it too.
    single = tmp_path / "s"
    single.write_bytes(PARTS[0])
    with open_any(single) as backup:
        assert isinstance(backup, OpenBackup) and bytes(backup.body) == b"group zero state"
    with pytest.raises(BackupError, match="several shards"):
        open_backup(path)


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda data: data[:-1], "truncated"),
        (lambda data: data[:20], "truncated"),
        (lambda data: data + b"x", "too long"),
        (lambda data: data[:-2] + bytes([data[-2] ^ 1]) + data[-1:], "corrupt"),
        (lambda data: data[:14] + bytes([data[14] ^ 1]) + data[15:], "CRC"),
    ],
)
def test_a_damaged_container_is_refused(tmp_path: Path, damage: object, says: str) -> None:
    path = tmp_path / "b"
    path.write_bytes(damage(_container(PARTS)))  # type: ignore[operator]
    with pytest.raises(BackupError, match=says):
        open_any(path).close()


def test_a_listing_that_is_not_the_part_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "b"
    good = _container(PARTS)
    header = ShardedHeader(
        shards=2,
        cluster_id="clu_0",
        created_at_ms=1,
        node_id="n1",
        release="test",
        parts=(
            PartListing(0, 10, decode_header(PARTS[0]).digest, len(PARTS[0]), "clu_0"),
            PartListing(1, 8, decode_header(PARTS[1]).digest, len(PARTS[1]), "clu_1"),
        ),
    )
    path.write_bytes(header.encode() + b"".join(PARTS))
    assert len(path.read_bytes()) == len(good)
    with pytest.raises(BackupError, match="not what the container lists"):
        open_any(path).close()
    one = dataclasses.replace(header, shards=1, parts=header.parts[:1])
    path.write_bytes(one.encode() + PARTS[0])
    with pytest.raises(BackupError, match="one part per shard"):
        open_any(path).close()
