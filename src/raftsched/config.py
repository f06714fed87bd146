"""Node configuration: what an operator sets, parsed from flags or a TOML file.

The CLI builds a `NodeConfig` and hands it to `raftsched.process.run_node`.
A node refuses to start without a cluster secret: pysyncobj speaks pickle on
its Raft port, and only its `password` option (encryption and
authentication) keeps strangers from running code in the node. Likewise its
HTTP API (tokens, payloads) is served in clear text only on a loopback
address, unless it has TLS or the operator says `--insecure-http`.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final

from raftsched.limits import (
    AUTH_FAILURES_PER_MINUTE,
    BODY_BYTES_MAX,
    PROPOSAL_QUEUE_BYTES_MAX,
    PROPOSAL_QUEUE_COMMANDS_MAX,
)
from raftsched.node.webhook_targets import TargetPolicy
from raftsched.shards import (
    SHARD_PORT_STRIDE,
    SHARDS_MAX,
    SOCKET_NAME,
    SOCKET_PATH_BYTES_MAX,
    shard_dir,
    shift_address,
    socket_path,
)

# Log compaction defaults (NodeConfig); raftsched.raft has the same, and why.
LOG_COMPACTION_BYTES: Final = 64 * 1024 * 1024
LOG_COMPACTION_BYTES_MIN: Final = 64 * 1024
LOG_COMPACTION_INTERVAL_S: Final = 300.0


class ConfigError(ValueError):
    """The configuration cannot start a node; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class Peer:
    """Another coordinator: its id, Raft address (host:port) and HTTP base URL."""

    id: str
    raft_address: str
    http_url: str

    @staticmethod
    def parse(text: str) -> Peer:
        """Parse `ID=RAFT_HOST:PORT@HTTP_URL`."""
        node_id, sep, rest = text.partition("=")
        raft_address, sep2, http_url = rest.partition("@")
        if not sep or not sep2 or not node_id or not raft_address or not http_url:
            raise ConfigError(f"--peer must look like ID=HOST:PORT@http://HOST:PORT, got {text!r}")
        _check_host_port(raft_address, "peer raft address")
        return Peer(node_id, raft_address, http_url.rstrip("/"))


@dataclass(frozen=True, slots=True)
class NodeConfig:
    node_id: str
    data_dir: Path
    http_host: str
    http_port: int
    # The address peers use to reach this node's Raft port, and the address
    # it binds (they differ behind NAT or inside a namespace).
    raft_address: str
    secret: str
    peers: tuple[Peer, ...] = ()
    # Secrets accepted from peers besides `secret` but never sent with: a
    # secret rotation by rolling restart (docs/security.md).
    accepted_secrets: tuple[str, ...] = ()
    raft_bind_address: str | None = None
    # The URL other nodes and clients use to reach this node's HTTP API.
    http_url: str | None = None
    # "fsync": an entry counts towards a commit only once it is on disk.
    # "none": pysyncobj's own behaviour, for benchmarks that show the cost.
    durability: str = "fsync"
    max_body_bytes: int = BODY_BYTES_MAX
    # A leader that has not heard from a majority for this long steps down.
    # Lease decisions never rely on it (every grant commits through Raft), so
    # it only bounds how long a cut-off leader keeps proposing in vain; too
    # short, and a briefly starved CPU makes a healthy leader step down.
    leader_fallback_timeout_s: float = 3.0
    # A follower that hears nothing from a leader for a random time in this
    # range starts an election. Failover takes about this long; shorter values
    # make a loaded machine hold needless elections (pysyncobj has no pre-vote).
    election_timeout_min_s: float = 0.8
    election_timeout_max_s: float = 1.6
    # A snapshot is taken (and the journal cut) when any of these is met,
    # each staggered across the replicas (raftsched.raft): this many Raft
    # entries since the last snapshot (each entry may carry many commands);
    # this many journal bytes (raft.LOG_COMPACTION_BYTES says why 64 MiB);
    # or this long since the last snapshot, with an entry applied since.
    log_compaction_entries: int = 5000
    log_compaction_bytes: int = LOG_COMPACTION_BYTES
    log_compaction_interval_s: float = LOG_COMPACTION_INTERVAL_S
    log_format: str = "auto"  # "json", "text" or "auto" (text on a terminal)
    # Commands and request bytes that may wait for the next Raft entries
    # (see limits.PROPOSAL_QUEUE_COMMANDS_MAX); more are answered 503 unavailable.
    proposal_queue_commands_max: int = PROPOSAL_QUEUE_COMMANDS_MAX
    proposal_queue_bytes_max: int = PROPOSAL_QUEUE_BYTES_MAX
    # Webhook targets besides public addresses (node/webhook_targets.py):
    # private ranges, and explicit networks (which may include loopback).
    webhook_allow_private: bool = False
    webhook_allow_cidrs: tuple[str, ...] = ()
    # The first admin token's secret (see node.auth): read, or generated and
    # written, when the cluster has no admin token yet.
    admin_token_file: Path | None = None
    # Failed authentications one address may make in a minute before it is
    # answered 429 rate_limited (api/auth.py).
    auth_failures_per_minute: int = AUTH_FAILURES_PER_MINUTE
    extra: dict[str, str] = field(default_factory=dict)
    # Where to export spans over OTLP/HTTP, the collector's base URL (spans
    # go to its /v1/traces); None: as the OTEL_* environment says, which by
    # default is nowhere (raftsched.tracing).
    otlp_endpoint: str | None = None
    # TLS (docs/security.md): the node's certificate chain and key (PEM). With
    # them it serves HTTPS, and presents the certificate to peers that ask.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # CA bundle that client certificates must chain to: mutual TLS when set.
    tls_client_ca_file: Path | None = None
    # CA bundle that peers' server certificates must chain to (default: the
    # client CA if set, else the system store).
    tls_ca_file: Path | None = None
    # Serve plain HTTP on a non-loopback address anyway (behind a TLS proxy).
    insecure_http: bool = False
    # Data shards (docs/shards.md): S, fixed when the data directory is
    # created; shard k's Raft port is the member's plus k × the stride.
    shards: int = 1
    shard_port_stride: int = SHARD_PORT_STRIDE
    # The group this process runs: 0 for the node process (group 0), k for
    # the shard process of shard k (`for_shard`), which serves its API on a
    # Unix socket in its data directory only.
    shard: int = 0

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert_file is not None

    def webhook_policy(self) -> TargetPolicy:
        try:
            return TargetPolicy.from_flags(self.webhook_allow_private, self.webhook_allow_cidrs)
        except ValueError as error:
            raise ConfigError(f"--webhook-allow-cidr: {error}") from error

    @property
    def advertised_http_url(self) -> str:
        scheme = "https" if self.tls_enabled else "http"
        host = f"[{self.http_host}]" if ":" in self.http_host else self.http_host
        return self.http_url or f"{scheme}://{host}:{self.http_port}"

    def validate(self) -> None:
        if not self.node_id:
            raise ConfigError("node id is required")
        if not self.secret or len(self.secret) < 16:
            raise ConfigError(
                "a cluster secret of at least 16 characters is required "
                "(--secret-file); Raft traffic is pickle and must be authenticated"
            )
        if any(len(item) < 16 for item in self.accepted_secrets):
            raise ConfigError("an accepted secret (--secret-accept-file) needs 16+ characters")
        _check_host_port(self.raft_address, "raft address")
        if self.raft_bind_address:
            _check_host_port(self.raft_bind_address, "raft bind address")
        ids = [self.node_id, *(p.id for p in self.peers)]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"node ids must be unique, got {ids}")
        if self.durability not in ("fsync", "none"):
            raise ConfigError("durability must be 'fsync' or 'none'")
        if self.log_compaction_entries < 10:
            raise ConfigError("log_compaction_entries must be at least 10")
        if self.log_compaction_bytes < LOG_COMPACTION_BYTES_MIN:
            raise ConfigError(
                f"log_compaction_bytes must be at least {LOG_COMPACTION_BYTES_MIN} (64 KiB)"
            )
        if not 1 <= self.log_compaction_interval_s <= 86_400:
            raise ConfigError("log_compaction_interval_s must be between 1 and 86400 seconds")
        if not 0.2 <= self.leader_fallback_timeout_s <= 60:
            raise ConfigError("leader_fallback_timeout_s must be between 0.2 and 60")
        if not 0.2 <= self.election_timeout_min_s < self.election_timeout_max_s <= 30:
            raise ConfigError("election timeouts must satisfy 0.2 <= min < max <= 30 seconds")
        if self.otlp_endpoint is not None and not self.otlp_endpoint.startswith(
            ("http://", "https://")
        ):
            raise ConfigError(f"otlp_endpoint must be an http(s) URL, got {self.otlp_endpoint!r}")
        self.webhook_policy()
        if self.proposal_queue_commands_max < 1 or self.proposal_queue_bytes_max < 1:
            raise ConfigError("proposal queue bounds must be at least 1")
        if self.auth_failures_per_minute < 1:
            raise ConfigError("auth_failures_per_minute must be at least 1")
        self._validate_tls()
        self._validate_shards()

    def _validate_shards(self) -> None:
        if not 1 <= self.shards <= SHARDS_MAX:
            raise ConfigError(f"--shards must be between 1 and {SHARDS_MAX}, got {self.shards}")
        if not 0 <= self.shard < self.shards:
            raise ConfigError(f"shard {self.shard} is not one of the {self.shards} shards")
        if self.shards == 1:
            return
        if self.shard_port_stride < 1:
            raise ConfigError("--shard-port-stride must be at least 1")
        if self.shard:
            # A shard process's addresses were shifted and checked by its node.
            self._check_socket_path(self.data_dir / SOCKET_NAME)
            return
        members = [(self.node_id, self.raft_address)]
        members += [(peer.id, peer.raft_address) for peer in self.peers]
        if self.raft_bind_address:
            _shifted_port(
                self.node_id, self.raft_bind_address, self.shards - 1, self.shard_port_stride
            )
        seen: dict[tuple[str, int], str] = {}
        for node_id, address in members:
            host = address.rpartition(":")[0]
            for shard in range(self.shards):
                port = _shifted_port(node_id, address, shard, self.shard_port_stride)
                if (host, port) in seen:
                    raise ConfigError(
                        f"shard {shard} of {node_id} would listen on {host}:{port}, which "
                        f"{seen[(host, port)]} uses: choose a --shard-port-stride larger "
                        "than the spread of the members' Raft ports"
                    )
                seen[(host, port)] = f"{node_id}'s group {shard}"
        self._check_socket_path(socket_path(self.data_dir, self.shards - 1))

    @staticmethod
    def _check_socket_path(sock: Path) -> None:
        if len(os.fsencode(sock.absolute())) > SOCKET_PATH_BYTES_MAX:
            raise ConfigError(
                f"the shard processes' sockets ({sock}) would be longer than the "
                f"{SOCKET_PATH_BYTES_MAX} bytes a Unix socket's path may have: use a "
                "shorter --data-dir"
            )

    def for_shard(self, shard: int) -> NodeConfig:
        """The configuration of this node's shard process for `shard`: its
        own data directory, the Raft addresses of every member shifted by
        `shard × stride`, the same secrets and TLS files, and this node's
        public URL as its HTTP URL (its redirects name the node that hosts
        the shard's leader). It bootstraps no admin token (tokens live in
        group 0)."""
        stride = self.shard_port_stride
        return replace(
            self,
            data_dir=shard_dir(self.data_dir, shard),
            raft_address=shift_address(self.raft_address, shard, stride),
            raft_bind_address=(
                shift_address(self.raft_bind_address, shard, stride)
                if self.raft_bind_address
                else None
            ),
            peers=tuple(
                Peer(peer.id, shift_address(peer.raft_address, shard, stride), peer.http_url)
                for peer in self.peers
            ),
            http_url=self.advertised_http_url,
            admin_token_file=None,
            shard=shard,
        )

    def _validate_tls(self) -> None:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError("--tls-cert and --tls-key go together: give both or neither")
        if not self.tls_enabled:
            if self.tls_client_ca_file is not None:
                raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key")
            if self.tls_ca_file is not None:
                raise ConfigError("--tls-ca needs --tls-cert and --tls-key")
            if not self.insecure_http and not is_loopback_host(self.http_host):
                raise ConfigError(
                    f"--http {self.http_host}:{self.http_port} is not a loopback address, and "
                    "the API would carry tokens and payloads in clear text there: give "
                    "--tls-cert and --tls-key to serve HTTPS, or --insecure-http if a "
                    "TLS-terminating proxy or a private network protects it"
                )
            return
        urls = [("--http-url", self.advertised_http_url)]
        urls += [(f"peer {peer.id}", peer.http_url) for peer in self.peers]
        for what, url in urls:
            if not url.startswith("https://"):
                raise ConfigError(
                    f"{what} is {url!r}: a node with TLS needs https:// URLs for itself "
                    "and its peers (redirects and peer calls use them)"
                )


_OPTIONAL_PATHS: Final = frozenset(
    {"admin_token_file", "tls_cert_file", "tls_key_file", "tls_client_ca_file", "tls_ca_file"}
)
_TUPLES: Final = frozenset({"accepted_secrets", "webhook_allow_cidrs"})


def config_to_json(config: NodeConfig) -> dict[str, Any]:
    """The configuration as JSON, for a shard process (`config_from_json`).
    It holds the cluster secret: it goes through a pipe, never an argument."""
    document: dict[str, Any] = {}
    for item in fields(config):
        value = getattr(config, item.name)
        if isinstance(value, Path):
            value = str(value)
        elif item.name == "peers":
            value = [[peer.id, peer.raft_address, peer.http_url] for peer in value]
        elif isinstance(value, tuple):
            value = list(value)
        document[item.name] = value
    return document


def config_from_json(document: dict[str, Any]) -> NodeConfig:
    values: dict[str, Any] = {}
    for item in fields(NodeConfig):
        if item.name not in document:
            continue
        value = document[item.name]
        if item.name == "data_dir" or (item.name in _OPTIONAL_PATHS and value is not None):
            value = Path(value)
        elif item.name == "peers":
            value = tuple(Peer(str(a), str(b), str(c)) for a, b, c in value)
        elif item.name in _TUPLES:
            value = tuple(str(each) for each in value)
        values[item.name] = value
    return NodeConfig(**values)


def _shifted_port(node_id: str, address: str, shard: int, stride: int) -> int:
    port = int(address.rpartition(":")[2]) + shard * stride
    if port >= 65536:
        raise ConfigError(
            f"shard {shard} of {node_id} would listen on port {port} ({address} + {shard} × "
            f"--shard-port-stride {stride}): choose lower Raft ports or a smaller stride"
        )
    return port


def is_loopback_host(host: str) -> bool:
    """Whether binding `host` listens on this machine's loopback interface
    only: `localhost` or a loopback IP literal (127.0.0.0/8, ::1). Any other
    name counts as not loopback, since what it resolves to may change; an
    empty host or 0.0.0.0 / :: means every interface."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_host_port(text: str, what: str) -> None:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what} must be HOST:PORT, got {text!r}")


def read_secret(path: Path) -> str:
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise ConfigError(f"cannot read secret file {path}: {error}") from error
    if len(secret) < 16:
        raise ConfigError(f"secret in {path} must be at least 16 characters")
    return secret


def load_toml(path: Path) -> dict[str, object]:
    """Read a node config file (see cluster/ for examples)."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"cannot read config {path}: {error}") from error
