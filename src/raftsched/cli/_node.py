"""`raftsched node`: build a NodeConfig from a TOML file and flags (flags win)
and run the node until SIGTERM/SIGINT.

TOML keys mirror the flags (relative paths are relative to the file):

    id = "n1"
    data_dir = "data/n1"
    http = "127.0.0.1:8701"
    raft = "127.0.0.1:9701"
    raft_bind = "0.0.0.0:9701"           # optional
    http_url = "http://10.0.0.1:8701"    # optional
    secret_file = "secret"
    admin_token_file = "admin.token"     # optional: the first admin token
    durability = "fsync"                 # or "none"
    peers = ["n2=127.0.0.1:9702@http://127.0.0.1:8702"]
    # optional: max_body_bytes, log_format, log_compaction_entries,
    # leader_fallback_timeout_s, proposal_queue_commands_max,
    # proposal_queue_bytes_max, and an [extra] table
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from raftsched.cli._common import EXIT_USAGE
from raftsched.config import (
    ConfigError,
    NodeConfig,
    Peer,
    load_toml,
    read_secret,
)
from raftsched.limits import PROPOSAL_QUEUE_BYTES_MAX, PROPOSAL_QUEUE_COMMANDS_MAX

_FILE_KEYS = {
    "id", "data_dir", "http", "raft", "raft_bind", "http_url", "secret_file", "durability",
    "peers", "max_body_bytes", "log_format", "extra", "log_compaction_entries",
    "leader_fallback_timeout_s", "election_timeout_min_s", "election_timeout_max_s",
    "proposal_queue_commands_max", "proposal_queue_bytes_max", "admin_token_file",
}  # fmt: skip


def register(commands: argparse._SubParsersAction[Any]) -> None:
    node = commands.add_parser("node", help="run one coordinator node")
    node.add_argument("--config", type=Path, help="TOML file; flags override it")
    node.add_argument("--id", dest="node_id")
    node.add_argument("--data-dir", type=Path)
    node.add_argument("--http", metavar="HOST:PORT", help="HTTP listen address")
    node.add_argument("--raft", metavar="HOST:PORT", help="Raft address peers use")
    node.add_argument("--raft-bind", metavar="HOST:PORT", help="Raft bind address if different")
    node.add_argument("--http-url", help="URL clients and peers use for this node's HTTP API")
    node.add_argument("--peer", action="append", metavar="ID=RAFT_HOST:PORT@HTTP_URL")
    node.add_argument("--secret-file", type=Path, help="cluster secret (16+ characters)")
    node.add_argument(
        "--admin-token-file", type=Path,
        help="the first admin token's secret: used (or generated and written, mode 0600) "
        "when the cluster has no admin token yet",
    )  # fmt: skip
    node.add_argument("--durability", choices=["fsync", "none"])
    node.add_argument("--max-body-bytes", type=int)
    node.add_argument("--log-format", choices=["auto", "json", "text"])
    node.add_argument(
        "--log-compaction-entries", type=int, help="snapshot after this many Raft entries"
    )
    node.add_argument(
        "--leader-fallback-timeout-s", type=float,
        help="a leader that has not heard from a majority this long steps down",
    )  # fmt: skip
    node.add_argument(
        "--proposal-queue-commands-max", type=int,
        help="commands that may wait for the next Raft entries (default 16000); "
        "more are answered 503 unavailable",
    )  # fmt: skip
    node.add_argument(
        "--proposal-queue-bytes-max", type=int,
        help="request bytes that may wait likewise (default 32 MiB)",
    )  # fmt: skip
    node.set_defaults(run=run_node_command)


def run_node_command(args: argparse.Namespace) -> int:
    try:
        config = build_config(args)
        config.validate()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    from raftsched.process import run_node  # imported late: the CLI's other commands need no node

    run_node(config)
    return 0


def build_config(args: argparse.Namespace) -> NodeConfig:
    settings = _from_file(args.config) if args.config else {}
    flags = {
        "id": args.node_id,
        "data_dir": args.data_dir,
        "http": args.http,
        "raft": args.raft,
        "raft_bind": args.raft_bind,
        "http_url": args.http_url,
        "secret_file": args.secret_file,
        "admin_token_file": args.admin_token_file,
        "durability": args.durability,
        "peers": args.peer,
        "max_body_bytes": args.max_body_bytes,
        "log_format": args.log_format,
        "log_compaction_entries": args.log_compaction_entries,
        "leader_fallback_timeout_s": args.leader_fallback_timeout_s,
        "proposal_queue_commands_max": args.proposal_queue_commands_max,
        "proposal_queue_bytes_max": args.proposal_queue_bytes_max,
    }
    settings.update({key: value for key, value in flags.items() if value is not None})
    return _to_config(settings)


def _from_file(path: Path) -> dict[str, Any]:
    data = load_toml(path)
    unknown = sorted(set(data) - _FILE_KEYS)
    if unknown:
        raise ConfigError(f"unknown keys in {path}: {', '.join(unknown)}")
    base = path.parent
    for key in ("data_dir", "secret_file", "admin_token_file"):
        if key in data:
            data[key] = base / str(data[key])
    return dict(data)


def _to_config(settings: dict[str, Any]) -> NodeConfig:
    for key in ("id", "data_dir", "http", "raft", "secret_file"):
        if not settings.get(key):
            raise ConfigError(f"--{key.replace('_', '-')} is required (or `{key}` in --config)")
    http_host, http_port = _host_port(str(settings["http"]), "--http")
    return NodeConfig(
        node_id=str(settings["id"]),
        data_dir=Path(settings["data_dir"]),
        http_host=http_host,
        http_port=http_port,
        raft_address=str(settings["raft"]),
        secret=read_secret(Path(settings["secret_file"])),
        peers=tuple(_peer(item) for item in settings.get("peers") or ()),
        raft_bind_address=settings.get("raft_bind"),
        http_url=str(settings["http_url"]).rstrip("/") if settings.get("http_url") else None,
        durability=str(settings.get("durability", "fsync")),
        max_body_bytes=int(settings.get("max_body_bytes", 1024 * 1024)),
        log_format=str(settings.get("log_format", "auto")),
        log_compaction_entries=int(settings.get("log_compaction_entries", 5000)),
        leader_fallback_timeout_s=float(settings.get("leader_fallback_timeout_s", 3.0)),
        election_timeout_min_s=float(settings.get("election_timeout_min_s", 0.8)),
        election_timeout_max_s=float(settings.get("election_timeout_max_s", 1.6)),
        proposal_queue_commands_max=int(
            settings.get("proposal_queue_commands_max", PROPOSAL_QUEUE_COMMANDS_MAX)
        ),
        proposal_queue_bytes_max=int(
            settings.get("proposal_queue_bytes_max", PROPOSAL_QUEUE_BYTES_MAX)
        ),
        admin_token_file=(
            Path(settings["admin_token_file"]) if settings.get("admin_token_file") else None
        ),
        extra={str(k): str(v) for k, v in dict(settings.get("extra") or {}).items()},
    )


def _peer(item: object) -> Peer:
    if isinstance(item, str):
        return Peer.parse(item)
    if isinstance(item, dict) and {"id", "raft", "http_url"} <= set(item):
        return Peer.parse(f"{item['id']}={item['raft']}@{item['http_url']}")
    raise ConfigError(f"a peer is 'ID=HOST:PORT@URL' or {{id, raft, http_url}}, got {item!r}")


def _host_port(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what} must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)
