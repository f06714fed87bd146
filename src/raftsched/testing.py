"""Real clusters for tests, benchmarks and chaos runs, and the handler test kit.

`run_handler` and `run_reconciler` (from `raftsched.worker._testkit`, see
docs/testing-handlers.md) run one job or reconcile handler through the
worker's own code on an in-process lease, with no cluster.

`LocalCluster` starts each node as its own `raftsched node` process on
loopback, with its own data directory and a generated secret, and can kill,
pause, resume and restart them. Nothing is mocked: the processes speak real
Raft and real HTTP (or HTTPS, given a `ClusterTls` from `make_cluster_tls`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from raftsched import child_processes
from raftsched.client._calls import token_from_env
from raftsched.node.auth import looks_like_secret, new_secret

# The handler test kit, re-exported (`as`) for tests to import from here.
from raftsched.worker._testkit import HandlerOutcome as HandlerOutcome
from raftsched.worker._testkit import ReconcileOutcome as ReconcileOutcome
from raftsched.worker._testkit import Seen as Seen
from raftsched.worker._testkit import arun_handler as arun_handler
from raftsched.worker._testkit import arun_reconciler as arun_reconciler
from raftsched.worker._testkit import run_handler as run_handler
from raftsched.worker._testkit import run_reconciler as run_reconciler

# The loopback networks, which test clusters allow as webhook targets.
WEBHOOK_ALLOW_LOOPBACK: Final = ("127.0.0.0/8", "::1/128")


def process_running(pid: int) -> bool:
    """Alive and not a zombie waiting for whoever adopted it to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def wait_for(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `predicate` until it holds or `timeout_s` passes; its last answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


# Ports for test servers come from below Linux's ephemeral range (32768 and
# up), never from the kernel's `bind(0)`: a port in that range can be taken
# by any outgoing connection while its node is down for a restart, and the
# node then fails to bind it ("address already in use").
_ALL_TEST_PORTS = range(20_000, 32_000)
_handed_out: set[int] = set()


def _share_of_ports() -> range:
    """This process's share of the test ports. The processes of one
    pytest-xdist run (`make test`) each draw from a slice of their own:
    `_handed_out` is per process, and a port one of them handed out (its
    node down for a restart, say) must not be handed out by another."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return _ALL_TEST_PORTS
    index, workers = int(worker[2:]), max(1, int(count))
    width = len(_ALL_TEST_PORTS) // workers
    start = _ALL_TEST_PORTS.start + (index % workers) * width
    return range(start, start + width)


_TEST_PORTS = _share_of_ports()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now, below the ephemeral range, not handed out before
    by this process."""
    import random

    for _ in range(500):
        port = random.choice(_TEST_PORTS)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port found")


def redis_server_argv(binary: str, host: str, port: int, root: Path, password: str) -> list[str]:
    """A `redis-server` for the broker relay's tests and chaos campaign: in
    the foreground, on `host:port`, with a password, its data in `root` and
    an append-only file synced at every write, so that a stop or a kill
    keeps every entry it confirmed."""
    return [
        binary,
        "--port", str(port),
        "--bind", host,
        "--dir", str(root),
        "--requirepass", password,
        "--appendonly", "yes",
        "--appendfsync", "always",
        "--save", "",
        "--daemonize", "no",
    ]  # fmt: skip


def free_port_block(count: int, host: str = "127.0.0.1", tries: int = 200) -> int:
    """The first of `count` consecutive ports that are all free right now."""
    import random

    for _ in range(tries):
        base = random.randrange(_TEST_PORTS.start, _TEST_PORTS.stop - count)
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no block of {count} free ports found")


def http_json(
    method: str,
    url: str,
    body: Any = None,
    timeout_s: float = 5.0,
    context: ssl.SSLContext | None = None,
    *,
    token: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """One HTTP request without following redirects: (status, json body, headers).

    `context`: the TLS context for an https:// URL (default: the system's).
    It carries `Authorization: Bearer <token>`; `token=None` takes
    `$RAFTSCHED_TOKEN` (what the test session's clusters are given, see
    `LocalCluster.admin_secret`), and `token=""` sends no token at all."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    _authorize(request, token)
    for name, value in (headers or {}).items():
        request.add_header(name, value)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect, urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(request, timeout=timeout_s) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else {}, dict(response.headers)
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            parsed = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            parsed = {"raw": raw.decode(errors="replace")}
        return error.code, parsed, dict(error.headers)


def free_port_with_shards(shards: int, stride: int, host: str = "127.0.0.1") -> int:
    """A port that is free with `port + k × stride` for every shard k
    (docs/shards.md), none handed out before by this process."""
    import random

    for _ in range(500):
        port = random.choice(range(_TEST_PORTS.start, _TEST_PORTS.stop - (shards - 1) * stride))
        ports = [port + shard * stride for shard in range(shards)]
        if any(each in _handed_out for each in ports):
            continue
        try:
            for each in ports:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind((host, each))
        except OSError:
            continue
        _handed_out.update(ports)
        return port
    raise RuntimeError("no free ports for the shards found")


@dataclass(frozen=True, slots=True)
class ClusterTls:
    """Certificates for a `LocalCluster` that serves HTTPS: one CA, one node
    certificate that every node serves (and shows its peers), valid for
    127.0.0.1 and localhost, and one client certificate. `mutual`: the
    nodes require client certificates from that CA."""

    ca_file: Path
    node_cert_file: Path
    node_key_file: Path
    client_cert_file: Path
    client_key_file: Path
    mutual: bool = False

    def node_args(self) -> list[str]:
        args = ["--tls-cert", str(self.node_cert_file), "--tls-key", str(self.node_key_file)]
        args += ["--tls-ca", str(self.ca_file)]
        if self.mutual:
            args += ["--tls-client-ca", str(self.ca_file)]
        return args

    def client_options(self) -> dict[str, Path]:
        """Keyword arguments for `Client` and `AsyncClient`, certificate included."""
        return {
            "ca_file": self.ca_file,
            "client_cert": self.client_cert_file,
            "client_key": self.client_key_file,
        }

    def client_context(self, *, with_certificate: bool = True) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        if with_certificate:
            context.load_cert_chain(self.client_cert_file, self.client_key_file)
        return context


def make_cluster_tls(directory: Path, *, mutual: bool = False) -> ClusterTls:
    """A fresh CA and certificates in `directory` (raftsched.pki)."""
    from raftsched.pki import CertificateAuthority, write_public

    authority = CertificateAuthority.create("raftsched test CA")
    write_public(directory / "ca.pem", authority.cert_pem)
    tls = ClusterTls(
        ca_file=directory / "ca.pem",
        node_cert_file=directory / "node.pem",
        node_key_file=directory / "node.key",
        client_cert_file=directory / "client.pem",
        client_key_file=directory / "client.key",
        mutual=mutual,
    )
    authority.issue("node", ["127.0.0.1", "localhost"]).write(tls.node_cert_file, tls.node_key_file)
    authority.issue("test-client").write(tls.client_cert_file, tls.client_key_file)
    return tls


def _authorize(request: urllib.request.Request, token: str | None) -> None:
    """`Authorization: Bearer <token>`; None takes `$RAFTSCHED_TOKEN` (as the
    client does), "" sends none."""
    if token is None:
        token = token_from_env()
    if token:
        request.add_header("Authorization", f"Bearer {token}")


def metrics_text(url: str, token: str | None = None, timeout_s: float = 10.0) -> str:
    """A node's `/metrics` page (`url` is the node's base URL); the token as
    for `http_json`."""
    request = urllib.request.Request(url.rstrip("/") + "/metrics")
    _authorize(request, token)
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        text: str = response.read().decode()
    return text


@dataclass
class NodeProcess:
    id: str
    http_port: int
    raft_port: int
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    # Another release's `src` directory to run instead of this checkout's
    # code (a rolling-upgrade test), or None.
    source_dir: Path | None = None
    # The Python to run the node with (another release's own virtualenv,
    # say), or None for this one.
    python: str | None = None
    scheme: str = "http"
    # This node's own cluster secret file instead of the cluster's, and the
    # secrets it accepts besides (a secret rotation; see `LocalCluster.command`).
    secret_file: Path | None = None
    secret_accept_files: list[Path] = field(default_factory=list)
    # Environment for this node only, over the cluster's (a fault injected
    # into one node, say).
    env: dict[str, str] = field(default_factory=dict)
    # A member added after the start: it learns its peers from the member at
    # this URL (`--join`) instead of `--peer` flags.
    join_url: str | None = None
    # Removed from the cluster (its process may still run): the cluster's
    # checks (leader, digests, convergence) leave it out, and the others'
    # command lines no longer name it.
    removed: bool = False

    @property
    def http_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.http_port}"

    @property
    def raft_address(self) -> str:
        return f"127.0.0.1:{self.raft_port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def serving(self) -> bool:
        """Running, not paused, and a member."""
        return self.alive and not self.paused and not self.removed


def _node_knows(node: NodeProcess, env: Mapping[str, str], flag: str) -> bool:
    """Whether the node's code has the command-line `flag` (an earlier
    release refuses a flag it does not know: `--admin-token-file` came with
    0.3.0, and a node without it has no tokens and serves without them). The
    code is the node's `source_dir`, else the first `PYTHONPATH` entry of
    the cluster's environment that holds a raftsched package, else this one."""
    roots = [node.source_dir] if node.source_dir is not None else []
    roots += [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    for root in roots:
        cli = root / "raftsched" / "cli" / "_node.py"
        if cli.exists():
            try:
                return flag in cli.read_text(encoding="utf-8")
            except OSError:
                return False
    return True


@dataclass
class LocalCluster:
    root: Path
    size: int = 3
    durability: str = "fsync"
    env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    nodes: dict[str, NodeProcess] = field(default_factory=dict)
    tls: ClusterTls | None = None
    # Webhook targets the nodes may deliver to besides public addresses:
    # tests' receivers listen on loopback, which a node refuses by default
    # (docs/security.md, "Webhook targets (SSRF)"). `()` tests the default.
    webhook_allow_cidrs: tuple[str, ...] = WEBHOOK_ALLOW_LOOPBACK
    # Authentication (issue 15): every node is given `<root>/admin.token`
    # (`--admin-token-file`), so the cluster turns authentication on as soon
    # as its version allows tokens. The secret written there is
    # `admin_secret`, else `$RAFTSCHED_TOKEN` (the e2e conftest sets one per
    # session, so that clients, workers and `http_json` carry it by
    # default), else a new one. `write_admin_token=False` leaves the file
    # for the node to generate; `auth=False` gives the nodes no file at all.
    auth: bool = True
    admin_secret: str | None = None
    write_admin_token: bool = True
    # Data shards (docs/shards.md): every node runs `--shards` groups, shard
    # k's Raft port its own plus k × the stride.
    shards: int = 1
    shard_port_stride: int = 100

    def __post_init__(self) -> None:
        _note_created(self)
        self.root.mkdir(parents=True, exist_ok=True)
        self.secret_file = self.root / "secret"
        if not self.secret_file.exists():
            self.secret_file.write_text(secrets.token_urlsafe(32))
            self.secret_file.chmod(0o600)
        self.prepare_admin_token()
        for index in range(1, self.size + 1):
            node_id = f"n{index}"
            self.nodes[node_id] = self._node_process(node_id)

    @functools.cached_property
    def ssl_context(self) -> ssl.SSLContext | None:
        """What the cluster's own checks (leader, readiness, digests) speak
        HTTPS with: the cluster's CA and its client certificate."""
        return None if self.tls is None else self.tls.client_context()

    # -- processes ------------------------------------------------------------

    def prepare_admin_token(self) -> None:
        """Set `admin_token_file` and write the secret there (see `auth`);
        subclasses that build their nodes themselves call it too."""
        self.admin_token_file = self.root / "admin.token"
        if self.auth and self.write_admin_token and not self.admin_token_file.exists():
            secret = self.admin_secret or token_from_env() or ""
            if not looks_like_secret(secret):
                secret = new_secret()
            fd = os.open(self.admin_token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secret + "\n")

    def command(self, node: NodeProcess) -> list[str]:
        args = [
            node.python or sys.executable,
            "-m",
            "raftsched",
            "node",
            "--id",
            node.id,
            "--data-dir",
            str(node.data_dir),
            "--http",
            f"127.0.0.1:{node.http_port}",
            "--raft",
            node.raft_address,
            "--secret-file",
            str(node.secret_file or self.secret_file),
            "--durability",
            self.durability,
        ]
        for path in node.secret_accept_files:
            args += ["--secret-accept-file", str(path)]
        if _node_knows(node, self.env, "--webhook-allow-cidr"):
            for cidr in self.webhook_allow_cidrs:
                args += ["--webhook-allow-cidr", cidr]
        if self.auth and _node_knows(node, self.env, "--admin-token-file"):
            args += ["--admin-token-file", str(self.admin_token_file)]
        if node.join_url is not None:
            args += ["--join", node.join_url]
        else:
            for other in self.nodes.values():
                if other.id != node.id and not other.removed and other.join_url is None:
                    args += ["--peer", f"{other.id}={other.raft_address}@{other.http_url}"]
        if self.tls is not None:
            args += self.tls.node_args()
        if self.shards > 1:
            args += ["--shards", str(self.shards)]
            args += ["--shard-port-stride", str(self.shard_port_stride)]
        return args + self.extra_args

    def start(self, node_id: str | None = None) -> None:
        targets = [self.nodes[node_id]] if node_id else list(self.nodes.values())
        for node in targets:
            if node.alive:
                continue
            env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env, **node.env}
            if node.source_dir is not None:
                # Ahead of the installed package on the import path.
                paths = [str(node.source_dir), env.get("PYTHONPATH", "")]
                env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
            log_file = node.log_path.open("ab")
            # Dies with this process, even if it is SIGKILLed (child_processes).
            node.process = child_processes.popen(
                self.command(node),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            log_file.close()
            node.paused = False

    # -- membership (issue 16) -------------------------------------------------

    def new_node(self, node_id: str | None = None) -> NodeProcess:
        """A node that is not started and not a member yet: add it with
        `POST /v1/cluster/nodes` (its `raft_address` and `http_url`), then
        `start_joining` it."""
        if node_id is None:
            node_id = f"n{len(self.nodes) + 1}"
            while node_id in self.nodes:
                node_id += "x"
        if node_id in self.nodes:
            raise ValueError(f"node {node_id} exists")
        node = self.nodes[node_id] = self._node_process(node_id)
        return node

    def _node_process(self, node_id: str) -> NodeProcess:
        """A node of this cluster, with new ports, not started."""
        return NodeProcess(
            id=node_id,
            http_port=free_port(),
            raft_port=(
                free_port()
                if self.shards == 1
                else free_port_with_shards(self.shards, self.shard_port_stride)
            ),
            data_dir=self.root / node_id,
            log_path=self.root / f"{node_id}.log",
            scheme="http" if self.tls is None else "https",
        )

    def start_joining(self, node_id: str, via_url: str) -> None:
        """Start an added node with `--join via_url`."""
        self.nodes[node_id].join_url = via_url
        self.start(node_id)

    def mark_removed(self, node_id: str) -> None:
        """The node was removed: leave it out of the cluster's checks."""
        self.nodes[node_id].removed = True

    def kill(self, node_id: str, signum: int = signal.SIGKILL) -> None:
        node = self.nodes[node_id]
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signum)
            if signum in (signal.SIGKILL, signal.SIGTERM):
                try:
                    node.process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait(timeout=5)

    def pause(self, node_id: str) -> None:
        self.kill(node_id, signal.SIGSTOP)
        self.nodes[node_id].paused = True

    def resume(self, node_id: str) -> None:
        self.kill(node_id, signal.SIGCONT)
        self.nodes[node_id].paused = False

    def restart(self, node_id: str) -> None:
        self.kill(node_id)
        self.start(node_id)

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.process is None:
                continue
            if node.paused:
                self.resume(node.id)
            if node.process.poll() is None:
                node.process.terminate()
        for node in self.nodes.values():
            if node.process is not None and node.process.poll() is None:
                try:
                    node.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait(timeout=5)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- authentication -------------------------------------------------------

    @property
    def admin_token(self) -> str:
        """The secret of the cluster's first admin token (its admin.token file)."""
        return self.admin_token_file.read_text(encoding="utf-8").strip()

    def _own_token(self) -> str | None:
        """The cluster's admin secret once its file exists, else http_json's default."""
        if self.auth and self.admin_token_file.exists():
            return self.admin_token
        return None

    def auth_on(self, node_id: str) -> bool:
        try:
            status, body, _ = http_json("GET", self.nodes[node_id].http_url + "/readyz")
        except OSError:
            return False
        return status == 200 and body.get("auth") == "on"

    def wait_for_auth(self, timeout_s: float = 30.0) -> None:
        """Wait until every live node requires tokens (its first admin token applied)."""
        live = [n.id for n in self.nodes.values() if n.serving]
        if not wait_for(lambda: all(self.auth_on(node_id) for node_id in live), timeout_s):
            raise TimeoutError(f"authentication not on within {timeout_s}s; logs in {self.root}")

    # -- observation ----------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return [node.http_url for node in self.nodes.values()]

    def live_urls(self) -> list[str]:
        return [n.http_url for n in self.nodes.values() if n.serving]

    def cluster_view(self, node_id: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
        try:
            status, body, _ = http_json(
                "GET",
                self.nodes[node_id].http_url + "/v1/cluster",
                timeout_s=timeout_s,
                context=self.ssl_context,
                token=self._own_token(),
            )
        except OSError:
            return None
        return body if status == 200 else None

    def shard_views(self, node_id: str) -> list[dict[str, Any]] | None:
        """`shards` of the node's `GET /v1/cluster` (docs/shards.md), or None."""
        view = self.cluster_view(node_id, timeout_s=5.0)
        return None if view is None else view.get("shards")

    def shard_leader(self, shard: int) -> str | None:
        """The leader of `shard` as the serving nodes agree on it, or None."""
        seen: set[str | None] = set()
        for node in self.nodes.values():
            if not node.serving:
                continue
            views = self.shard_views(node.id) or []
            entry = next((each for each in views if each.get("shard") == shard), None)
            seen.add(None if entry is None or entry["leader"] is None else entry["leader"]["id"])
        found = seen.pop() if len(seen) == 1 else None
        return found if found is not None and self.nodes[found].serving else None

    def wait_for_shard_leader(
        self, shard: int, timeout_s: float = 30.0, exclude: str | None = None
    ) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.shard_leader(shard)
            if leader is not None and leader != exclude:
                return leader
            time.sleep(0.2)
        raise TimeoutError(f"shard {shard} has no leader within {timeout_s}s; logs in {self.root}")

    def wait_for_shards(self, timeout_s: float = 90.0) -> list[str]:
        """Every shard has a leader and has recorded which shard it is
        (`SetShard`, which needs cluster version 9: from then on its groups
        take every command this release has), as every serving node sees it.
        Returns each shard's leader."""
        deadline = time.monotonic() + timeout_s

        def recorded() -> bool:
            for node in self.nodes.values():
                if not node.serving:
                    continue
                views = self.shard_views(node.id) or []
                if len(views) != self.shards or not all(
                    view.get("identity_recorded") for view in views
                ):
                    return False
            return True

        while not recorded():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the shards did not record their identity within {timeout_s}s; "
                    f"logs in {self.root}"
                )
            time.sleep(0.2)
        left = max(1.0, deadline - time.monotonic())
        return [self.wait_for_shard_leader(shard, timeout_s=left) for shard in range(self.shards)]

    def shard_pid(self, node_id: str, shard: int) -> int | None:
        """The pid of the node's shard process for `shard`, as the node says."""
        views = self.shard_views(node_id) or []
        entry = next((each for each in views if each.get("shard") == shard), None)
        return None if entry is None else entry.get("pid")

    def leader_id(self) -> str | None:
        """The leader as the live nodes agree on it, or None."""
        seen: set[str] = set()
        for node in self.nodes.values():
            if not node.serving:
                continue
            view = self.cluster_view(node.id)
            if view and view.get("leader"):
                seen.add(view["leader"]["id"])
        if len(seen) == 1:
            leader = seen.pop()
            if leader in self.nodes and self.nodes[leader].serving:
                return leader
        return None

    def wait_for_leader(self, timeout_s: float = 30.0, exclude: str | None = None) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.leader_id()
            if leader is not None and leader != exclude:
                try:
                    status, _, _ = http_json(
                        "GET", self.nodes[leader].http_url + "/readyz", context=self.ssl_context
                    )
                except OSError:
                    # The leader just restarted or died: not ready yet.
                    status = 0
                if status == 200:
                    return leader
            time.sleep(0.1)
        raise TimeoutError(f"no leader within {timeout_s}s; logs in {self.root}")

    def digests(self, timeout_s: float = 2.0) -> dict[str, tuple[int, str]]:
        """node id -> (applied index, state digest) for every live node."""
        found: dict[str, tuple[int, str]] = {}
        for node in self.nodes.values():
            if not node.serving:
                continue
            try:
                status, body, _ = http_json(
                    "GET",
                    node.http_url + "/v1/debug/digest",
                    timeout_s=timeout_s,
                    context=self.ssl_context,
                    token=self._own_token(),
                )
            except OSError:
                continue
            if status == 200:
                found[node.id] = (body["applied_index"], body["digest"])
        return found

    def wait_converged(self, timeout_s: float = 30.0) -> str:
        """Wait until every live node reports the same applied index and digest."""
        deadline = time.monotonic() + timeout_s
        last: dict[str, tuple[int, str]] = {}
        while time.monotonic() < deadline:
            last = self.digests()
            expected = sum(1 for n in self.nodes.values() if n.serving)
            if len(last) == expected and len(set(last.values())) == 1:
                return next(iter(last.values()))[1]
            time.sleep(0.2)
        raise AssertionError(f"replicas did not converge: {last}")

    def unexpected_log_errors(self, expected: Iterable[ExpectedLogError] = ()) -> list[LogError]:
        """Unexpected error-level lines in every node's log (see `log_errors`)."""
        expected = tuple(expected)
        return [
            error for node in self.nodes.values() for error in log_errors(node.log_path, expected)
        ]

    def secret_sightings(self, secrets: Mapping[str, str]) -> list[SecretSighting]:
        """Where any of `secrets` (label -> secret) appears in a node log."""
        paths = [node.log_path for node in self.nodes.values()]
        return find_secrets_in_logs(paths, secrets)

    def logs(self) -> str:
        parts = []
        for node in self.nodes.values():
            if node.log_path.exists():
                parts.append(f"--- {node.id} ---\n" + node.log_path.read_text(errors="replace"))
        return "\n".join(parts)


# -- log checks -------------------------------------------------------------
#
# A node that logs at error level, or lets a traceback reach stderr, did
# something wrong even if the test's assertions passed (pysyncobj logs its
# own failures and carries on). Tests and the chaos campaign fail on any
# such line unless they name it as expected, with the reason.

_ERROR_LEVELS: Final = frozenset({"error", "critical"})
_CUT_ERROR_LINE: Final = re.compile(r'^\{"ts": "[^"]*", "level": "(error|critical)"')
_CHAINED_HEADERS: Final = ("During handling", "The above exception")
_TRACEBACK_HEADERS: Final = ("Traceback", *_CHAINED_HEADERS)
# Lines that Python itself writes to stderr when something escaped.
_RAW_ERROR_STARTS: Final = (
    "Traceback (most recent call last):",
    "Fatal Python error",
    "Exception in thread",
    "Exception ignored in",
)


@dataclass(frozen=True, slots=True)
class ExpectedLogError:
    """An error-level log line that a test or a fault causes on purpose."""

    pattern: str  # a regular expression searched in the line's text
    reason: str

    def matches(self, text: str) -> bool:
        return re.search(self.pattern, text) is not None


@dataclass(frozen=True, slots=True)
class LogError:
    path: Path
    line_number: int  # 1-based, where it starts
    text: str  # "logger: message", then the traceback if there is one

    def expected_by(self, expected: Iterable[ExpectedLogError]) -> ExpectedLogError | None:
        return next((entry for entry in expected if entry.matches(self.text)), None)

    def describe(self) -> str:
        """One line: where, the message, and a traceback's exception line."""
        lines = [line for line in self.text.splitlines() if line.strip()]
        summary = lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1].strip()}"
        return f"{self.path}:{self.line_number}: {summary}"


def log_errors(path: Path, expected: Iterable[ExpectedLogError] = ()) -> list[LogError]:
    """Every error-level line in one node log that no `expected` entry matches."""
    expected = tuple(expected)
    return [error for error in read_log_errors(path) if error.expected_by(expected) is None]


def read_log_errors(path: Path) -> list[LogError]:
    """Every error-level line in one node log, expected or not.

    Nodes log one JSON object a line (`raftsched.logs`); a line whose level
    is error or critical counts, its traceback included. Anything else on
    the stream was written around logging: a traceback (with the lines up to
    its exception line) or one of Python's own fatal messages counts too.
    """
    if not path.exists():
        return []
    lines = path.read_text(errors="replace").splitlines()
    found: list[LogError] = []
    index = 0
    while index < len(lines):
        start = index
        text, index = _error_at(lines, index)
        if text is not None:
            found.append(LogError(path, start + 1, text))
    return found


def _error_at(lines: list[str], index: int) -> tuple[str | None, int]:
    """(the error starting at `lines[index]` or None, the index after it)."""
    line = lines[index]
    if line.startswith("{"):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            # Cut off by a kill (and the next run's first line appended).
            if _CUT_ERROR_LINE.search(line):
                return line, index + 1
            entry = None
        if isinstance(entry, dict):
            if str(entry.get("level", "")).lower() not in _ERROR_LEVELS:
                return None, index + 1
            text = f"{entry.get('logger', '')}: {entry.get('msg', '')}"
            if entry.get("exc"):
                text += "\n" + str(entry["exc"])
            return text, index + 1
    if not line.startswith(_RAW_ERROR_STARTS):
        return None, index + 1
    # A traceback runs until its exception line: the first line that is not
    # indented, not blank and not a header; a chained one continues after
    # "During handling ..." or "The above exception ...".
    end = index + 1
    while end < len(lines):
        current = lines[end]
        end += 1
        if not current.strip() or current[0].isspace() or current.startswith(_TRACEBACK_HEADERS):
            continue
        following = end
        while following < len(lines) and not lines[following].strip():
            following += 1
        if following < len(lines) and lines[following].startswith(_CHAINED_HEADERS):
            end = following + 1
            continue
        break
    return "\n".join(lines[index:end]), end


# -- secrets in logs ---------------------------------------------------------
#
# Secrets (the Raft secret, webhook secrets, API token secrets) must never
# reach a log line. An e2e test hands the secrets it used to
# `find_secrets_in_logs` (or `LocalCluster.secret_sightings`) and asserts
# that nothing was found; `assert_no_secrets_in_logs` says where, by label,
# without printing the secret itself.

SECRET_CHARS_MIN_SCANNED: Final = 8


@dataclass(frozen=True, slots=True)
class SecretSighting:
    path: Path
    line_number: int  # 1-based
    label: str  # which secret, as the caller named it; never the secret

    def describe(self) -> str:
        return f"{self.path}:{self.line_number}: the {self.label} secret"


def _secret_forms(secret: str) -> set[str]:
    """The secret as written, as a JSON string body and URL-encoded."""
    from urllib.parse import quote

    return {secret, json.dumps(secret)[1:-1], quote(secret, safe="")}


def find_secrets_in_logs(paths: Iterable[Path], secrets: Mapping[str, str]) -> list[SecretSighting]:
    """Every line of the given logs that contains one of `secrets`."""
    forms: list[tuple[str, str]] = []
    for label, secret in secrets.items():
        if len(secret) < SECRET_CHARS_MIN_SCANNED:
            raise ValueError(f"the {label} secret is too short to look for without false alarms")
        forms += [(label, form) for form in _secret_forms(secret)]
    found: list[SecretSighting] = []
    for path in paths:
        if not path.exists():
            continue
        with path.open(errors="replace") as lines:
            for number, line in enumerate(lines, start=1):
                labels = sorted({label for label, form in forms if form in line})
                found += [SecretSighting(path, number, label) for label in labels]
    return found


def assert_no_secrets_in_logs(cluster: LocalCluster, secrets: Mapping[str, str]) -> None:
    sightings = cluster.secret_sightings(secrets)
    assert not sightings, "secrets in node logs:\n" + "\n".join(
        sighting.describe() for sighting in sightings[:20]
    )


_watches: list[list[LocalCluster]] = []


def _note_created(cluster: LocalCluster) -> None:
    for watch in _watches:
        watch.append(cluster)


@contextlib.contextmanager
def watch_clusters() -> Iterator[list[LocalCluster]]:
    """Collects every `LocalCluster` made inside the block, so that a test
    fixture can check the logs of clusters that tests build themselves."""
    watch: list[LocalCluster] = []
    _watches.append(watch)
    try:
        yield watch
    finally:
        _watches.remove(watch)
