"""Shards (docs/shards.md): the rules every process of a sharded node shares.

A node started with `--shards S` runs group 0 (the cluster-wide state and
shard 0's jobs) in its own process and one shard process per shard 1..S-1
(`raftsched.shard_processes`). This module holds what both sides must agree
on and nothing that runs:

- where shard k lives: its data directory `<data>/shards/<k>/`, the Unix
  socket its API is served on there, and its Raft address, the member's
  Raft port plus `k × stride`;
- the record of S in the data directory (`shards.json`), written when the
  directory is created and checked at every start;
- which shard an identifier names (`job<k>_...`, `wf<k>_...`, `sch<k>_...`,
  `sub<k>_...`, and a workflow step's `job_wf<k>_..._s<i>`), and the prefix
  shard k draws its identifiers with;
- where a key places a job: the first 8 bytes (big-endian) of BLAKE2b over
  the msgpack of (tenant, key), modulo S. Never Python's `hash()`, which
  differs per process: every node and every release places alike.

With one shard (no `--shards`) none of this is used: ids, data directories
and routing are exactly as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
from pathlib import Path
from typing import Final

import msgpack

# The most data shards a cluster may have (the core's SetShard has the same bound).
SHARDS_MAX: Final = 64
# Shard k of a member whose Raft port is p listens on p + k × stride.
SHARD_PORT_STRIDE: Final = 100
# A request may name its shard (workers' claims do); the node routes it there.
SHARD_HEADER: Final = "Raftsched-Shard"
# The principal the node process authenticated, as it tells a shard process
# over the shard's socket (api.shard_routing); a shard process accepts it
# there only, and has no other listener.
INTERNAL_PRINCIPAL_HEADER: Final = "Raftsched-Internal-Principal"
# A node process's own requests to its shard processes (the routes under
# `INTERNAL_PREFIX`: a shard's view, and the commands that align its
# settings with group 0's, node.shard_settings) carry this header with
# `internal_key(secret)`, which only holders of the cluster secret can make;
# the node never forwards a client's value of it.
INTERNAL_KEY_HEADER: Final = "Raftsched-Internal-Key"
INTERNAL_PREFIX: Final = "/v1/internal/"
# A placed request redirected to another node keeps its shard there: the
# node adds `?shard=k` to the Location of a 307 for a request it placed.
SHARD_QUERY: Final = "shard"

# A node of several shards asks each shard's list for the cursor after each
# item (`each`), to merge the shards' pages (api.shard_reads).
CURSORS_HEADER: Final = "Raftsched-Cursors"

RECORD_NAME: Final = "shards.json"
RECORD_FORMAT: Final = 1
SHARDS_DIR: Final = "shards"
SOCKET_NAME: Final = "api.sock"
# sockaddr_un's sun_path holds 108 bytes, the terminating NUL included.
SOCKET_PATH_BYTES_MAX: Final = 107

# The identifier prefixes the node draws with (node.draws callers): jobs,
# workflows, schedules, subscriptions.
ID_PREFIXES: Final = ("job", "wf", "sch", "sub")
_SHARD_ID = re.compile(r"^(?:job|wf|sch|sub)([1-9][0-9]{0,8})_")
# A workflow step's job (core.workflows.model.step_job_id): `job_` + the
# workflow id without its `wf_`, so shard k's steps read `job_wf<k>_...`.
_STEP_ID = re.compile(r"^job_wf([1-9][0-9]{0,8})_")


class ShardCountMismatch(ValueError):
    """The data directory was created with another number of shards."""


def internal_key(secret: str) -> str:
    """What a node process shows its shard processes on their internal
    routes: a MAC of a fixed label under the cluster secret (both sides hold
    the secret: a shard process gets it with its configuration)."""
    return hmac.new(secret.encode(), b"raftsched shard process internal v1", "sha256").hexdigest()


def shift_address(address: str, shard: int, stride: int) -> str:
    """`host:port` of shard `shard` for a member whose Raft address is `address`."""
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + shard * stride}"


def shard_dir(data_dir: Path, shard: int) -> Path:
    return data_dir / SHARDS_DIR / str(shard)


def socket_path(data_dir: Path, shard: int) -> Path:
    """The Unix socket shard `shard`'s process serves its API on."""
    return shard_dir(data_dir, shard) / SOCKET_NAME


def id_prefix(prefix: str, shard: int) -> str:
    """The prefix shard `shard` draws `prefix` identifiers with: shard 0
    keeps today's (`job`), shard k >= 1 names itself (`job<k>`)."""
    return prefix if shard == 0 else f"{prefix}{shard}"


def event_id(shard: int, seq: int) -> str:
    """An event's id in the cluster: `evt_<seq>` in shard 0 (and in a
    one-shard cluster), `evt<k>_<seq>` in shard k: each shard's outbox
    numbers its own events, so the id names the shard to be unique."""
    return f"evt{'' if shard == 0 else shard}_{seq}"


def shard_of_id(identifier: str) -> int:
    """The shard an identifier names: k for `job<k>_...` (and the other
    prefixes) and for a step of workflow `wf<k>_...`; 0 for anything else,
    today's ids and ids a client chose included."""
    found = _SHARD_ID.match(identifier) or _STEP_ID.match(identifier)
    return 0 if found is None else int(found.group(1))


def key_hash(tenant: str, key: str) -> int:
    """The placement hash of a (tenant, key) pair."""
    packed = msgpack.packb([tenant, key], use_bin_type=True)
    return int.from_bytes(hashlib.blake2b(packed).digest()[:8], "big")


def key_shard(tenant: str, key: str, count: int) -> int:
    """The shard a (tenant, ordering or idempotency key) places a job in."""
    return key_hash(tenant, key) % count


# -- the record of S in the data directory ---------------------------------------


def recorded_shards(data_dir: Path) -> int | None:
    """S as the data directory records it; 1 for a directory made before
    shards (Raft files, no record); None for a new directory."""
    path = data_dir / RECORD_NAME
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return 1 if (data_dir / "raft").exists() else None
    except (OSError, ValueError) as error:
        raise ShardCountMismatch(f"cannot read {path}: {error}") from None
    shards = raw.get("shards") if isinstance(raw, dict) else None
    if type(shards) is not int or not 1 <= shards <= SHARDS_MAX:
        raise ShardCountMismatch(f"{path} does not hold a number of shards")
    return shards


def settle_shards(data_dir: Path, shards: int, *, durable: bool = True) -> None:
    """Check `shards` against the data directory's record, or record it in a
    new directory (S > 1 only: a one-shard directory stays as it always
    was). Raises ShardCountMismatch with what to do."""
    recorded = recorded_shards(data_dir)
    if recorded is None:
        if shards > 1:
            _write_record(data_dir, shards, durable=durable)
        return
    if recorded != shards:
        given = "without --shards" if shards == 1 else f"with --shards {shards}"
        created = "without --shards" if recorded == 1 else f"with --shards {recorded}"
        raise ShardCountMismatch(
            f"the data directory {data_dir} was created {created} and is started {given}: "
            f"a cluster's number of shards never changes; start it "
            f"{'without --shards' if recorded == 1 else f'with --shards {recorded}'}"
        )


def _write_record(data_dir: Path, shards: int, *, durable: bool) -> None:
    from raftsched.raft_journal import fsync_directory, sync_fd

    path = data_dir / RECORD_NAME
    temporary = path.with_name(path.name + ".tmp")
    data = json.dumps({"format": RECORD_FORMAT, "shards": shards}) + "\n"
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
        fsync_directory(data_dir)
