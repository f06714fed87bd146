"""`raftsched node --join URL`: learn the members from one of them.

etcd's order: the operator adds the member first (`raftsched cluster
add-node`, which records it and changes the Raft configuration), then starts
it with `--join <URL of any member>`. The new node asks that member for
`GET /v1/cluster` and starts Raft with the members listed there as its
peers; the leader then sends it the log, or a snapshot when the log was
compacted. A node that is not listed (not added yet, or added under another
Raft address) refuses to start: it would otherwise ask for votes in a
cluster that does not count it.

The request needs a token with the `cluster` permission:
`--join-token-file`, else `$RAFTSCHED_TOKEN`, else the `--admin-token-file`
secret when that file exists (the same file every node of a cluster is
usually given).
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Final

from raftsched.client._calls import token_from_env
from raftsched.config import ConfigError, NodeConfig, Peer

JOIN_TIMEOUT_S: Final = 30.0
JOIN_RETRY_S: Final = 0.5
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


def peers_from_member(
    config: NodeConfig,
    join_url: str,
    token: str | None,
    context: ssl.SSLContext | None,
    timeout_s: float = JOIN_TIMEOUT_S,
) -> tuple[Peer, ...]:
    """The other members, as the member at `join_url` lists them once it
    lists this node (it may not have applied the add yet: asked again)."""
    deadline = time.monotonic() + timeout_s
    problem = "no answer"
    while True:
        try:
            body = _cluster(join_url, token, context)
            return _peers(config, body)
        except _NotListed as error:
            problem = str(error)
        except (OSError, ValueError) as error:
            problem = f"GET {join_url}/v1/cluster failed: {error}"
        if time.monotonic() >= deadline:
            raise ConfigError(f"--join {join_url}: {problem}")
        time.sleep(JOIN_RETRY_S)


class _NotListed(Exception):
    pass


def _cluster(join_url: str, token: str | None, context: ssl.SSLContext | None) -> Any:
    request = urllib.request.Request(join_url.rstrip("/") + "/v1/cluster")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
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


def _peers(config: NodeConfig, body: Any) -> tuple[Peer, ...]:
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
    if not listed:
        raise _NotListed(
            f"node {config.node_id} is not a member: add it first with "
            f"`raftsched cluster add-node {config.node_id} --raft {config.raft_address} "
            f"--http-url {config.advertised_http_url}`"
        )
    return tuple(peers)
