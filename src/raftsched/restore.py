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
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from raftsched import core
from raftsched.backup import open_backup
from raftsched.core.jobs.queries import packed_count
from raftsched.core.kernel.identity import valid_name
from raftsched.identity import NodeIdentity, new_id, write_identity
from raftsched.raft_journal import (
    SNAPSHOT_NAME,
    SnapshotHeader,
    fsync_directory,
    write_snapshot_file,
)

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

    def as_json(self) -> dict[str, Any]:
        return {
            "data_dir": str(self.data_dir),
            "node_id": self.identity.node_id,
            "cluster_id": self.identity.cluster_id,
            "restored_from": self.identity.restored_from,
            "index": self.index,
            "digest": self.digest,
            "jobs": self.jobs,
            "seconds": round(self.seconds, 3),
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
    raft_dir = data_dir / "raft"
    if data_dir.exists() and any(data_dir.iterdir()):
        raise RestoreRefused(
            f"{data_dir} is not empty: a backup is restored only into the empty data "
            "directory of a node of a new cluster, never over a node's data"
        )
    with open_backup(backup_path) as backup:
        header = backup.header
        # This release must read the state, or the node would not start.
        state = core.decode_state(backup.body)
        jobs = len(state.jobs) + packed_count(state)  # packed: kernel.wheel
        del state
        index = max(header.index, 2)
        snapshot = SnapshotHeader(
            last_entry=(_NO_OP, index, _TERM), previous_entry=(_NO_OP, index - 1, _TERM), cluster=()
        )
        raft_dir.mkdir(parents=True, exist_ok=True)
        partial = raft_dir / (SNAPSHOT_NAME + ".restore")
        body = backup.body
        pieces = (body[start : start + _PIECE_BYTES] for start in range(0, len(body), _PIECE_BYTES))
        write_snapshot_file(partial, snapshot, pieces, durable=durable)
    os.replace(partial, raft_dir / SNAPSHOT_NAME)
    identity = NodeIdentity(
        node_id, new_id("inc"), cluster_id or new_id("clu"), restored_from=header.cluster_id
    )
    write_identity(raft_dir, identity, durable=durable)
    if durable:
        fsync_directory(raft_dir)
        fsync_directory(data_dir)
    return Restored(data_dir, identity, index, header.digest, jobs, time.monotonic() - started)
