"""`raftsched restore`: seed a new cluster's data directory from a backup.

The restored node starts as any node does, from a snapshot in its data
directory: `raft/raft.snapshot` holds the backup's body byte for byte, so
its state digest is the backup's, at the backup's index (the Raft entries
around it are no-ops of term 1; no `raft.meta`, so the new cluster's first
election is term 1 or more). `raft/identity.json` gives the node a new
incarnation and the new cluster's id, and records which cluster the state
came from (`restored_from`): the new cluster's first leader renames the
state (`SetClusterId(new, previous=old)`, core.kernel.identity), and a
member of the old cluster that reaches the new one is refused, and the
other way round (node.identity).

A backup is restored only into an empty data directory: a running or
stopped node's data is never overwritten, so a backup cannot be fed into a
running cluster. The first node is given a new cluster id; the others of
the new cluster are restored from the same file with that id
(`--cluster-id`), so the whole cluster starts from the same snapshot.

A backup of a cluster of several shards (`raftsched.backup`, RSSHARDS)
restores every group: group 0 into the data directory as above, shard k
into `<data>/shards/<k>/` (the directory its shard process runs on), and
the record of S (`shards.json`), so `raftsched node --shards S` on it
starts every group from its part. Shard k's group gets the cluster id
`<cluster id>.s<k>`, the same on every node restored with the same
`--cluster-id`. The whole file is checked, and every part decoded, before
anything is written.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from raftsched import core
from raftsched.backup import BackupHeader, OpenBackup, open_any
from raftsched.core.jobs.queries import packed_count
from raftsched.core.kernel.identity import valid_name
from raftsched.identity import NodeIdentity, new_id, write_identity
from raftsched.raft_journal import (
    SNAPSHOT_NAME,
    SnapshotHeader,
    fsync_directory,
    write_snapshot_file,
)
from raftsched.shards import settle_shards, shard_dir

# pysyncobj's no-op command (its `_COMMAND_TYPE.NO_OP`): the log entries the
# snapshot resumes after must be entries pysyncobj knows.
_NO_OP: Final = b"\x01"
_TERM: Final = 1
_PIECE_BYTES: Final = 1 << 20


class RestoreRefused(Exception):
    """The data directory is not empty, or an argument is not usable."""


@dataclass(frozen=True, slots=True)
class Restored:
    data_dir: Path
    identity: NodeIdentity
    index: int
    digest: str
    jobs: int
    seconds: float
    # A backup of several shards: each group's (shard, index, digest, jobs).
    shards: tuple[tuple[int, int, str, int], ...] = ()

    def as_json(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.shards:
            extra = {
                "shards": len(self.shards),
                "parts": [
                    {"shard": shard, "index": index, "digest": digest, "jobs": jobs}
                    for shard, index, digest, jobs in self.shards
                ],
            }
        return {
            "data_dir": str(self.data_dir),
            "node_id": self.identity.node_id,
            "cluster_id": self.identity.cluster_id,
            "restored_from": self.identity.restored_from,
            "index": self.index,
            "digest": self.digest,
            "jobs": self.jobs,
            "seconds": round(self.seconds, 3),
            **extra,
        }


def restore(
    backup_path: Path,
    data_dir: Path,
    node_id: str,
    cluster_id: str | None = None,
    *,
    durable: bool = True,
) -> Restored:
    """Write `data_dir` for node `node_id` of a new cluster (`cluster_id`, or
    a new one) from the backup. BackupError for a damaged backup,
    RestoreRefused for a data directory that is not empty."""
    started = time.monotonic()
    for name, value in (("--id", node_id), ("--cluster-id", cluster_id)):
        if value is not None and not valid_name(value):
            raise RestoreRefused(f"{name} must be 1 to 64 letters, digits, '_', '.' or '-'")
    if data_dir.exists() and any(data_dir.iterdir()):
        raise RestoreRefused(
            f"{data_dir} is not empty: a backup is restored only into the empty data "
            "directory of a node of a new cluster, never over a node's data"
        )
    cluster_id = cluster_id or new_id("clu")
    with open_any(backup_path) as backup:
        if isinstance(backup, OpenBackup):
            groups = [(0, backup.header, backup.body)]
        else:
            groups = [(part.shard, part.header, part.body) for part in backup.parts]
            for shard, _, _ in groups[1:]:
                if not valid_name(_group_cluster_id(cluster_id, shard)):
                    raise RestoreRefused(
                        f"--cluster-id {cluster_id} is too long to name the shards' groups "
                        f"({_group_cluster_id(cluster_id, shard)})"
                    )
        # This release must read every group's state, or its node would not
        # start: checked before anything is written.
        counts = [_jobs_in(body) for _, _, body in groups]
        if len(groups) > 1:  # recorded first: a directory with Raft files and no record is S = 1
            data_dir.mkdir(parents=True, exist_ok=True)
            settle_shards(data_dir, len(groups), durable=durable)
        identity: NodeIdentity | None = None
        written: list[tuple[int, int, str, int]] = []
        for (shard, header, body), jobs in zip(groups, counts, strict=True):
            group_dir = data_dir if shard == 0 else shard_dir(data_dir, shard)
            mine = _write_group(
                group_dir,
                header,
                body,
                NodeIdentity(
                    node_id,
                    new_id("inc"),
                    _group_cluster_id(cluster_id, shard),
                    restored_from=header.cluster_id,
                ),
                durable=durable,
            )
            identity = identity or mine
            written.append((shard, max(header.index, 2), header.digest, jobs))
        if len(groups) > 1 and durable:
            fsync_directory(data_dir / "shards")
    if durable:
        fsync_directory(data_dir)
    assert identity is not None
    _, index, digest, _ = written[0]
    return Restored(
        data_dir,
        identity,
        index,
        digest,
        sum(counts),
        time.monotonic() - started,
        tuple(written) if len(groups) > 1 else (),
    )


def _group_cluster_id(cluster_id: str, shard: int) -> str:
    """The cluster id of shard `shard`'s group in the restored cluster."""
    return cluster_id if shard == 0 else f"{cluster_id}.s{shard}"


def _jobs_in(body: memoryview) -> int:
    state = core.decode_state(body)
    return len(state.jobs) + packed_count(state)  # packed: kernel.wheel


def _write_group(
    group_dir: Path,
    header: BackupHeader,
    body: memoryview,
    identity: NodeIdentity,
    *,
    durable: bool,
) -> NodeIdentity:
    """One group's Raft directory in `group_dir`: the snapshot of its state
    at its index, and its identity."""
    raft_dir = group_dir / "raft"
    index = max(header.index, 2)
    snapshot = SnapshotHeader(
        last_entry=(_NO_OP, index, _TERM), previous_entry=(_NO_OP, index - 1, _TERM), cluster=()
    )
    raft_dir.mkdir(parents=True, exist_ok=True)
    partial = raft_dir / (SNAPSHOT_NAME + ".restore")
    pieces = (body[start : start + _PIECE_BYTES] for start in range(0, len(body), _PIECE_BYTES))
    write_snapshot_file(partial, snapshot, pieces, durable=durable)
    os.replace(partial, raft_dir / SNAPSHOT_NAME)
    write_identity(raft_dir, identity, durable=durable)
    if durable:
        fsync_directory(raft_dir)
        fsync_directory(group_dir)
    return identity
