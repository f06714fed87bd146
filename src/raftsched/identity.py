"""Who a data directory belongs to: `<data_dir>/raft/identity.json`.

A Raft node's safety rests on what its data directory remembers: its term
and the vote it cast in it (`raft.meta`). A node that comes back with an
empty directory under the same node id has forgotten them and could vote
twice in one term. So each data directory is given, when it is created, a
random *incarnation*, and records the id of the cluster it belongs to once
it learns it. The replicated state records each member's incarnation
(`core.kernel.identity`), and peers refuse a node that runs under another
one (`node.identity`). The file sits beside `raft.meta` because it names
exactly that history: whoever deletes the Raft files deletes it too and
comes back as a new incarnation.

The file is small JSON, written whole to a temporary name, fsynced,
renamed into place and the directory fsynced, so that it is either the old
file or the new one after a power cut. A data directory of release 0.3.0
(Raft files, no identity) is given one when a node of this release first
starts on it: that node keeps its votes, and its cluster records the new
incarnation as it would a new member's.

`restored_from` is set by `raftsched restore`: the data directory holds a
backup of another cluster's state (whose id is `restored_from`) and belongs
to the new cluster `cluster_id`; the new cluster's first leader renames the
restored state (core.kernel.identity).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final

from raftsched.raft_journal import StorageError, fsync_directory, sync_fd

IDENTITY_NAME: Final = "identity.json"
IDENTITY_FORMAT: Final = 1

# The node refused to start: its data directory belongs to another cluster,
# or to another node id (EX_CONFIG).
EXIT_FOREIGN_DATA: Final = 78
# Its peers refuse it: it came back with a data directory that is not the
# one its node id voted with (EX_NOPERM).
EXIT_INCARNATION_REFUSED: Final = 77


def new_id(prefix: str) -> str:
    """A random id for an incarnation or a cluster (128 bits)."""
    return f"{prefix}_{secrets.token_hex(16)}"


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    node_id: str
    incarnation: str
    cluster_id: str | None = None
    restored_from: str | None = None

    def with_cluster(self, cluster_id: str) -> NodeIdentity:
        return replace(self, cluster_id=cluster_id)


class ForeignDataDirectory(StorageError):
    """The data directory belongs to another node or another cluster."""


def identity_path(raft_dir: Path) -> Path:
    return raft_dir / IDENTITY_NAME


def read_identity(raft_dir: Path) -> NodeIdentity | None:
    """The directory's identity, or None if it has none (new, or release 0.3.0)."""
    path = identity_path(raft_dir)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise StorageError(f"{path} is not an identity file: {error}") from error
    return _from_json(path, raw)


def _from_json(path: Path, raw: Any) -> NodeIdentity:
    if not isinstance(raw, dict) or raw.get("format") != IDENTITY_FORMAT:
        raise StorageError(f"{path}: unknown identity format")
    node_id, incarnation = raw.get("node_id"), raw.get("incarnation")
    cluster_id, restored_from = raw.get("cluster_id"), raw.get("restored_from")
    if not (isinstance(node_id, str) and node_id and isinstance(incarnation, str) and incarnation):
        raise StorageError(f"{path}: node_id and incarnation must be strings")
    if not all(value is None or isinstance(value, str) for value in (cluster_id, restored_from)):
        raise StorageError(f"{path}: cluster_id and restored_from must be strings or null")
    return NodeIdentity(node_id, incarnation, cluster_id, restored_from)


def write_identity(raft_dir: Path, identity: NodeIdentity, *, durable: bool = True) -> None:
    """Replace the identity file atomically (and durably unless told not to)."""
    path = identity_path(raft_dir)
    temporary = path.with_name(path.name + ".tmp")
    data = json.dumps({"format": IDENTITY_FORMAT, **asdict(identity)}, indent=2) + "\n"
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                sync_fd(handle.fileno(), temporary)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    if durable:
        fsync_directory(raft_dir)


def open_identity(raft_dir: Path, node_id: str, *, durable: bool = True) -> NodeIdentity:
    """The identity of the data directory a node `node_id` starts on: read,
    or made now (a new directory, or one of release 0.3.0). Raises
    ForeignDataDirectory when the directory is another node's."""
    raft_dir.mkdir(parents=True, exist_ok=True)
    identity = read_identity(raft_dir)
    if identity is None:
        identity = NodeIdentity(node_id, new_id("inc"))
        write_identity(raft_dir, identity, durable=durable)
        return identity
    if identity.node_id != node_id:
        raise ForeignDataDirectory(
            f"the data directory {raft_dir.parent} is node {identity.node_id}'s, not "
            f"{node_id}'s (its {IDENTITY_NAME} says so): start it as {identity.node_id}, "
            "or give this node a data directory of its own"
        )
    return identity
