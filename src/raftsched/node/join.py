"""`raftsched node --join URL`: learn the members from one of them.

etcd's order: the operator adds the member first (`raftsched cluster
add-node`, which records it and changes the Raft configuration), then starts
it with `--join <URL of any member>`. The new node asks that member for
`GET /v1/cluster` and starts Raft with the members listed there as its
peers; the leader then sends it the log, or a snapshot when the log was
compacted. A node that is not listed (not added yet, or added under another
Raft address) refuses to start: it would otherwise ask for votes in a
cluster that does not count it.

The peers it learned are saved in the data directory (`raft/joined.json`,
written durably). A restart with `--join` asks again, so that it starts
with the members as they are now, but when no member answers within
`RESTART_ASK_S` (the whole cluster restarting at once, after a power cut)
it starts with the saved peers: a node that joined must not need another
node to be up first, or a cluster whose nodes all joined could never start
again. A member that answers without listing this node (it was removed)
still refuses the restart.

A node of several shards (`--shards S`, docs/shards.md section 5) joins
every group: once group 0 lists it, it waits until each shard's group
lists it too, at its Raft address shifted by `k × stride` (asked of the
same member with `Raftsched-Shard: k`; the shards follow group 0's
directory, driven by their leaders' nodes), and only then starts its shard
processes, with group 0's peers shifted alike. So a shard process never
stands for election in a group that does not count it.

The request needs a token with the `cluster` permission:
`--join-token-file`, else `$RAFTSCHED_TOKEN`, else the `--admin-token-file`
secret when that file exists (the same file every node of a cluster is
usually given).
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Final

from raftsched.client._calls import token_from_env
from raftsched.config import ConfigError, NodeConfig, Peer
from raftsched.raft_journal import fsync_directory, sync_fd
from raftsched.shards import SHARD_HEADER

JOIN_TIMEOUT_S: Final = 30.0
JOIN_RETRY_S: Final = 0.5
# A restart with saved peers asks this long before it starts with them.
RESTART_ASK_S: Final = 5.0
JOINED_NAME: Final = "joined.json"
# Nodes in these states are not members any more.
_GONE: Final = frozenset({"removing", "removed"})


def join_token(config: NodeConfig, token_file: Path | None) -> str | None:
    if token_file is not None:
        try:
            return token_file.read_text(encoding="utf-8").strip() or None
        except OSError as error:
            raise ConfigError(f"cannot read --join-token-file {token_file}: {error}") from error
    token = token_from_env()
    if token is None and config.admin_token_file is not None and config.admin_token_file.exists():
        token = config.admin_token_file.read_text(encoding="utf-8").strip() or None
    return token


class NoAnswer(ConfigError):
    """No member answered `--join` in time."""


def peers_for_join(
    config: NodeConfig, join_url: str, token: str | None, context: ssl.SSLContext | None
) -> tuple[Peer, ...]:
    """The peers to start with: asked from the member at `join_url`, else,
    on a restart when no member answers, the ones saved at the last start.
    With shards, once every shard's group lists this node too."""
    saved = saved_peers(config.data_dir)
    if saved is None:
        peers = peers_from_member(config, join_url, token, context)
    else:
        try:
            peers = peers_from_member(config, join_url, token, context, RESTART_ASK_S)
        except NoAnswer as error:
            print(f"warning: {error}; starting with the saved peers", file=sys.stderr)
            return saved
    for shard in range(1, config.shards):
        try:
            peers_from_member(
                config.for_shard(shard),
                join_url,
                token,
                context,
                JOIN_TIMEOUT_S if saved is None else RESTART_ASK_S,
                shard=shard,
            )
        except NoAnswer as error:
            if saved is None:
                raise
            print(f"warning: {error}; starting with the saved peers", file=sys.stderr)
            break
    save_peers(config.data_dir, peers, durable=config.durability == "fsync")
    return peers


def saved_peers(data_dir: Path) -> tuple[Peer, ...] | None:
    path = data_dir / "raft" / JOINED_NAME
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["peers"]
        return tuple(Peer(row["id"], row["raft_address"], row["http_url"]) for row in rows)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"{path} is not a saved list of peers: {error}") from error


def save_peers(data_dir: Path, peers: tuple[Peer, ...], *, durable: bool) -> None:
    """Replace `raft/joined.json` atomically (and durably unless told not to)."""
    directory = data_dir / "raft"
    directory.mkdir(parents=True, exist_ok=True)
    rows = [{"id": p.id, "raft_address": p.raft_address, "http_url": p.http_url} for p in peers]
    temporary = directory / (JOINED_NAME + ".tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(json.dumps({"peers": rows}, indent=2) + "\n")
        handle.flush()
        if durable:
            sync_fd(handle.fileno(), temporary)
    os.replace(temporary, directory / JOINED_NAME)
    if durable:
        fsync_directory(directory)


def peers_from_member(
    config: NodeConfig,
    join_url: str,
    token: str | None,
    context: ssl.SSLContext | None,
    timeout_s: float = JOIN_TIMEOUT_S,
    *,
    shard: int | None = None,
) -> tuple[Peer, ...]:
    """The other members, as the member at `join_url` lists them once it
    lists this node (it may not have applied the add yet: asked again); of
    shard `shard`'s group when given."""
    deadline = time.monotonic() + timeout_s
    problem, listed_problem = "no answer", False
    while True:
        try:
            body = _cluster(join_url, token, context, shard)
            return _peers(config, body, shard)
        except _NotListed as error:
            problem, listed_problem = str(error), True
        except (OSError, ValueError) as error:
            problem, listed_problem = f"GET {join_url}/v1/cluster failed: {error}", False
        if time.monotonic() >= deadline:
            if listed_problem:
                raise ConfigError(f"--join {join_url}: {problem}")
            raise NoAnswer(f"--join {join_url}: {problem}")
        time.sleep(JOIN_RETRY_S)


class _NotListed(Exception):
    pass


def _cluster(
    join_url: str, token: str | None, context: ssl.SSLContext | None, shard: int | None = None
) -> Any:
    request = urllib.request.Request(join_url.rstrip("/") + "/v1/cluster")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if shard is not None:
        request.add_header(SHARD_HEADER, str(shard))
    try:
        with urllib.request.urlopen(request, timeout=5.0, context=context) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            raise ConfigError(
                f"--join {join_url}: GET /v1/cluster answered {error.code}; give a token "
                "with the cluster permission (--join-token-file or $RAFTSCHED_TOKEN)"
            ) from None
        raise


def _peers(config: NodeConfig, body: Any, shard: int | None = None) -> tuple[Peer, ...]:
    nodes = body.get("nodes") if isinstance(body, dict) else None
    if not isinstance(nodes, list):
        raise ValueError("GET /v1/cluster did not list nodes")
    peers: list[Peer] = []
    listed = False
    for item in nodes:
        if not isinstance(item, dict) or item.get("status") in _GONE:
            continue
        node_id, address, url = item.get("id"), item.get("raft_address"), item.get("http_url")
        if not isinstance(node_id, str) or not isinstance(address, str):
            continue
        if node_id == config.node_id:
            if address != config.raft_address:
                raise ConfigError(
                    f"node {node_id} is a member with Raft address {address}, "
                    f"not {config.raft_address}"
                )
            listed = True
            continue
        if not isinstance(url, str):
            raise ValueError(f"member {node_id} has no http_url")
        peers.append(Peer(node_id, address, url))
    if not listed and shard is not None:
        raise _NotListed(
            f"node {config.node_id} is not a member of shard {shard}'s group yet (the shards "
            "follow group 0's members within seconds; is every shard's leader up?)"
        )
    if not listed:
        raise _NotListed(
            f"node {config.node_id} is not a member: add it first with "
            f"`raftsched cluster add-node {config.node_id} --raft {config.raft_address} "
            f"--http-url {config.advertised_http_url}`"
        )
    return tuple(peers)
