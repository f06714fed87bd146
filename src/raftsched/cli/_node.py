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
    secret_accept_files = []             # rotation: also accepted, never sent with
    admin_token_file = "admin.token"     # optional: the first admin token
    durability = "fsync"                 # or "none"
    peers = ["n2=127.0.0.1:9702@http://127.0.0.1:8702"]
    webhook_allow_private = false        # webhooks to private addresses
    webhook_allow_cidrs = []             # e.g. ["10.1.0.0/16"]; may include loopback
    # optional: max_body_bytes, log_format, log_compaction_entries,
    # log_compaction_bytes, log_compaction_interval_s,
    # leader_fallback_timeout_s, proposal_queue_commands_max,
    # proposal_queue_bytes_max, auth_failures_per_minute, and an [extra] table
    # TLS (docs/security.md): tls_cert, tls_key, tls_client_ca, tls_ca
    # (paths), insecure_http = true to serve plain HTTP off loopback
    # tracing (docs/observability.md): otlp_endpoint = "http://collector:4318"
    # shards (docs/shards.md): shards = 3, shard_port_stride = 100
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raftsched.cli._common import EXIT_USAGE
from raftsched.config import (
    LOG_COMPACTION_BYTES,
    LOG_COMPACTION_INTERVAL_S,
    ConfigError,
    NodeConfig,
    Peer,
    load_toml,
    read_secret,
)
from raftsched.limits import (
    AUTH_FAILURES_PER_MINUTE,
    PROPOSAL_QUEUE_BYTES_MAX,
    PROPOSAL_QUEUE_COMMANDS_MAX,
)
from raftsched.shards import SHARD_PORT_STRIDE

if TYPE_CHECKING:
    from raftsched.raft_journal import CorruptJournal

_FILE_KEYS = {
    "id", "data_dir", "http", "raft", "raft_bind", "http_url", "secret_file", "durability",
    "secret_accept_files", "webhook_allow_private", "webhook_allow_cidrs",
    "peers", "max_body_bytes", "log_format", "extra", "log_compaction_entries",
    "log_compaction_bytes", "log_compaction_interval_s",
    "leader_fallback_timeout_s", "election_timeout_min_s", "election_timeout_max_s",
    "proposal_queue_commands_max", "proposal_queue_bytes_max", "admin_token_file",
    "tls_cert", "tls_key", "tls_client_ca", "tls_ca", "insecure_http",
    "auth_failures_per_minute", "otlp_endpoint", "shards", "shard_port_stride",
}  # fmt: skip
_PATH_KEYS = (
    "data_dir",
    "secret_file",
    "admin_token_file",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "tls_ca",
)


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
    node.add_argument(
        "--join", metavar="URL",
        help="a new member (added first with `raftsched cluster add-node`): learn the "
        "members from the member at URL instead of --peer flags",
    )  # fmt: skip
    node.add_argument(
        "--join-token-file", type=Path,
        help="token for --join (default: $RAFTSCHED_TOKEN, else the --admin-token-file secret)",
    )  # fmt: skip
    node.add_argument(
        "--secret-file", type=Path,
        help="cluster secret (16+ characters): Raft messages are sent with it and accepted",
    )  # fmt: skip
    node.add_argument(
        "--admin-token-file", type=Path,
        help="the first admin token's secret: used (or generated and written, mode 0600) "
        "when the cluster has no admin token yet",
    )  # fmt: skip
    node.add_argument(
        "--secret-accept-file", type=Path, action="append", metavar="PATH",
        help="another secret accepted from peers but never sent with (repeatable): "
        "a secret rotation by rolling restart, see docs/security.md",
    )  # fmt: skip
    node.add_argument("--durability", choices=["fsync", "none"])
    node.add_argument(
        "--webhook-allow-private", action="store_true", default=None,
        help="deliver webhooks to private addresses too (RFC 1918, fc00::/7, ...); "
        "loopback, link-local and metadata addresses stay refused",
    )  # fmt: skip
    node.add_argument(
        "--webhook-allow-cidr", action="append", metavar="CIDR",
        help="deliver webhooks to this network even if private or loopback (repeatable)",
    )  # fmt: skip
    node.add_argument("--max-body-bytes", type=int)
    node.add_argument("--log-format", choices=["auto", "json", "text"])
    node.add_argument(
        "--log-compaction-entries", type=int, help="snapshot after this many Raft entries"
    )
    node.add_argument(
        "--log-compaction-bytes", type=int,
        help="snapshot once the journal holds this many bytes (default 64 MiB)",
    )  # fmt: skip
    node.add_argument(
        "--log-compaction-interval-s", type=float,
        help="snapshot this long after the last one if anything was applied since (default 300)",
    )  # fmt: skip
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
    node.add_argument(
        "--auth-failures-per-minute", type=int,
        help="failed authentications one address may make in a minute before it is "
        "answered 429 rate_limited (default 10)",
    )  # fmt: skip
    node.add_argument(
        "--otlp-endpoint", metavar="URL",
        help="export spans over OTLP/HTTP to this collector (its base URL, e.g. "
        "http://127.0.0.1:4318; spans go to /v1/traces). Default: as the OTEL_* "
        "environment says, else off (docs/observability.md)",
    )  # fmt: skip
    node.add_argument(
        "--shards", type=int, metavar="S",
        help="data shards (docs/shards.md): this node runs group 0 and one shard process "
        "per shard 1..S-1; fixed when the data directory is created (default 1)",
    )  # fmt: skip
    node.add_argument(
        "--shard-port-stride", type=int, metavar="N",
        help="shard k's Raft port is the --raft port plus k × N, on every member "
        "(default 100)",
    )  # fmt: skip
    tls = node.add_argument_group("TLS (docs/security.md)")
    tls.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate chain (PEM)")
    tls.add_argument("--tls-key", type=Path, help="the certificate's private key (PEM)")
    tls.add_argument(
        "--tls-client-ca", type=Path,
        help="require client certificates that chain to this CA bundle (mutual TLS)",
    )  # fmt: skip
    tls.add_argument(
        "--tls-ca", type=Path,
        help="CA bundle to verify peers with (default: --tls-client-ca, else the system store)",
    )  # fmt: skip
    tls.add_argument(
        "--insecure-http", action="store_true", default=None,
        help="serve plain HTTP on a non-loopback --http address (behind a TLS proxy)",
    )  # fmt: skip
    node.set_defaults(run=run_node_command)


def run_node_command(args: argparse.Namespace) -> int:
    try:
        config = build_config(args)
        config.validate()
        if args.join:
            config = _joined(config, args.join, args.join_token_file)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return run_config(config)


def run_config(config: NodeConfig) -> int:
    """Run a node (or a shard process, `raftsched.shard_process`) until it
    stops; its exit status."""
    # Imported late: the CLI's other commands need no node.
    from raftsched.identity import EXIT_FOREIGN_DATA, ForeignDataDirectory
    from raftsched.process import NodeRefused, run_node
    from raftsched.raft_journal import EXIT_CORRUPT_DATA, CorruptJournal, StorageError

    try:
        run_node(config)
    except ConfigError as error:  # raised before the node binds anything
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except CorruptJournal as error:  # raised before the node binds anything
        print(corrupt_journal_advice(error), file=sys.stderr)
        return EXIT_CORRUPT_DATA
    except ForeignDataDirectory as error:  # raised before the node binds anything
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FOREIGN_DATA
    except NodeRefused as error:  # the node ran, and stopped when the cluster refused it
        print(
            f"error: {error}\nThe node stopped (exit status {error.exit_status}).", file=sys.stderr
        )
        return error.exit_status
    except StorageError as error:  # another file of the data directory is not ours
        print(f"error: {error} (docs/operations.md, 'Corrupted journal')", file=sys.stderr)
        return EXIT_CORRUPT_DATA
    return 0


def _joined(config: NodeConfig, join_url: str, token_file: Path | None) -> NodeConfig:
    """The configuration with the peers the member at `join_url` lists (node.join)."""
    from raftsched import tls
    from raftsched.node.join import join_token, peers_for_join

    if config.peers:
        raise ConfigError("--join and --peer exclude each other: --join learns the peers")
    if config.shards > 1:
        # Recorded before `raft/joined.json`: a directory with a `raft/` and
        # no record counts as one made before shards (S = 1).
        from raftsched.shards import ShardCountMismatch, settle_shards

        try:
            config.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            settle_shards(config.data_dir, config.shards, durable=config.durability == "fsync")
        except ShardCountMismatch as error:
            raise ConfigError(str(error)) from None
    token = join_token(config, token_file)
    peers = peers_for_join(config, join_url, token, tls.peer_context(config))
    joined = dataclasses.replace(config, peers=peers)
    joined.validate()
    return joined


def corrupt_journal_advice(error: CorruptJournal) -> str:
    """What an operator reads when the node refuses a corrupt journal."""
    from raftsched.raft_journal import EXIT_CORRUPT_DATA, JOURNAL_NAME

    raft_dir = error.path.parent if error.path is not None else Path("<data_dir>/raft")
    aside = raft_dir / "corrupt"
    return (
        f"error: {error}\n"
        f"The node did not start (exit status {EXIT_CORRUPT_DATA}); it changed nothing on disk.\n"
        "Rebuild this node's Raft log from its peers (docs/operations.md, 'Corrupted journal'),\n"
        "only while the other nodes are up and have a leader:\n"
        f"    mkdir -p {aside} && mv {raft_dir / JOURNAL_NAME} {aside}/\n"
        "then start the node again. Keep raft.meta: it holds the node's term and vote,\n"
        "so that it cannot vote twice in one term; raft.snapshot, if there is one, was\n"
        "checked by its own CRC and saves the peers sending it all again. Keep the other\n"
        "nodes up until this one has caught up (its applied index reaches the leader's\n"
        "commit index)."
    )


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
        "secret_accept_files": args.secret_accept_file,
        "webhook_allow_private": args.webhook_allow_private,
        "webhook_allow_cidrs": args.webhook_allow_cidr,
        "admin_token_file": args.admin_token_file,
        "durability": args.durability,
        "peers": args.peer,
        "max_body_bytes": args.max_body_bytes,
        "log_format": args.log_format,
        "log_compaction_entries": args.log_compaction_entries,
        "log_compaction_bytes": args.log_compaction_bytes,
        "log_compaction_interval_s": args.log_compaction_interval_s,
        "leader_fallback_timeout_s": args.leader_fallback_timeout_s,
        "proposal_queue_commands_max": args.proposal_queue_commands_max,
        "proposal_queue_bytes_max": args.proposal_queue_bytes_max,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "tls_client_ca": args.tls_client_ca,
        "tls_ca": args.tls_ca,
        "insecure_http": args.insecure_http,
        "auth_failures_per_minute": args.auth_failures_per_minute,
        "otlp_endpoint": args.otlp_endpoint,
        "shards": args.shards,
        "shard_port_stride": args.shard_port_stride,
    }
    settings.update({key: value for key, value in flags.items() if value is not None})
    return _to_config(settings)


def _from_file(path: Path) -> dict[str, Any]:
    data = load_toml(path)
    unknown = sorted(set(data) - _FILE_KEYS)
    if unknown:
        raise ConfigError(f"unknown keys in {path}: {', '.join(unknown)}")
    base = path.parent
    for key in _PATH_KEYS:
        if key in data:
            data[key] = base / str(data[key])
    if "secret_accept_files" in data:
        data["secret_accept_files"] = [
            base / str(item) for item in _list(data, "secret_accept_files")
        ]
    if "webhook_allow_cidrs" in data:
        data["webhook_allow_cidrs"] = [str(item) for item in _list(data, "webhook_allow_cidrs")]
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
        accepted_secrets=tuple(
            read_secret(Path(item)) for item in settings.get("secret_accept_files") or ()
        ),
        peers=tuple(_peer(item) for item in settings.get("peers") or ()),
        raft_bind_address=settings.get("raft_bind"),
        http_url=str(settings["http_url"]).rstrip("/") if settings.get("http_url") else None,
        durability=str(settings.get("durability", "fsync")),
        max_body_bytes=int(settings.get("max_body_bytes", 1024 * 1024)),
        log_format=str(settings.get("log_format", "auto")),
        log_compaction_entries=int(settings.get("log_compaction_entries", 5000)),
        log_compaction_bytes=int(settings.get("log_compaction_bytes", LOG_COMPACTION_BYTES)),
        log_compaction_interval_s=float(
            settings.get("log_compaction_interval_s", LOG_COMPACTION_INTERVAL_S)
        ),
        leader_fallback_timeout_s=float(settings.get("leader_fallback_timeout_s", 3.0)),
        election_timeout_min_s=float(settings.get("election_timeout_min_s", 0.8)),
        election_timeout_max_s=float(settings.get("election_timeout_max_s", 1.6)),
        proposal_queue_commands_max=int(
            settings.get("proposal_queue_commands_max", PROPOSAL_QUEUE_COMMANDS_MAX)
        ),
        proposal_queue_bytes_max=int(
            settings.get("proposal_queue_bytes_max", PROPOSAL_QUEUE_BYTES_MAX)
        ),
        webhook_allow_private=_flag(
            settings.get("webhook_allow_private", False), "webhook_allow_private"
        ),
        webhook_allow_cidrs=tuple(str(c) for c in settings.get("webhook_allow_cidrs") or ()),
        admin_token_file=(
            Path(settings["admin_token_file"]) if settings.get("admin_token_file") else None
        ),
        auth_failures_per_minute=int(
            settings.get("auth_failures_per_minute", AUTH_FAILURES_PER_MINUTE)
        ),
        extra={str(k): str(v) for k, v in dict(settings.get("extra") or {}).items()},
        tls_cert_file=_optional_path(settings.get("tls_cert")),
        tls_key_file=_optional_path(settings.get("tls_key")),
        tls_client_ca_file=_optional_path(settings.get("tls_client_ca")),
        tls_ca_file=_optional_path(settings.get("tls_ca")),
        insecure_http=_flag(settings.get("insecure_http", False), "insecure_http"),
        otlp_endpoint=str(settings["otlp_endpoint"]) if settings.get("otlp_endpoint") else None,
        shards=int(settings.get("shards", 1)),
        shard_port_stride=int(settings.get("shard_port_stride", SHARD_PORT_STRIDE)),
    )


def _optional_path(value: object) -> Path | None:
    return Path(str(value)) if value else None


def _flag(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"`{key}` must be true or false, got {value!r}")
    return value


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data[key]
    if not isinstance(value, list):
        raise ConfigError(f"`{key}` must be a list")
    return value


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
