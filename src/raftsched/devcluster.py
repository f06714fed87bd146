"""`raftsched dev`: a local cluster of separate node processes, plus a demo worker.

Layout under the data directory (default ./data/dev):

    secret          the generated cluster secret (mode 0600), reused on every run
    admin.token     the first admin token's secret (mode 0600; `--admin-token-file`)
    worker.token    the demo worker's own token (role worker, queue default), made
                    through the API once authentication is on
    cluster.json    each node's id, http_url, raft_address, pid and data_dir (and
                    the number of shards, with --shards)
    tls/            with --tls: ca.pem (the CA file for clients), ca.key, and
                    each node's n1.pem/n1.key (keys mode 0600); the CA is made
                    once and reused, node certificates are made on every run
    n1/ n2/ ...     each node's data; a second run resumes from it (with
                    --shards S, each node's shard processes' data under
                    n1/shards/1/ ... : docs/shards.md)
    n1.log ...      each child's output (also printed, prefixed with its name)

Ctrl-C, SIGTERM or SIGHUP (the terminal closed) stops the worker first, then
the nodes (SIGTERM, then SIGKILL for any that have not exited after a
timeout). A node that dies on its own is reported and the others keep
running. If the launcher itself is killed outright (SIGKILL), every child
dies with it (see child_processes). When the terminal or the pipe reading
the launcher's output goes away (`make dev | tee`, terminal closed), output
goes on to the logs only.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from raftsched import child_processes
from raftsched.config import is_loopback_host
from raftsched.node.auth import read_or_create_admin_secret
from raftsched.pki import DevTls, dev_certificates
from raftsched.shards import SHARD_PORT_STRIDE, shift_address

STOP_TIMEOUT_S = 10.0
POLL_S = 0.2
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
COLORS = ["36", "33", "35", "32", "34", "31"]


@dataclass(frozen=True, slots=True)
class DevNode:
    id: str
    http_url: str
    http_address: str
    raft_address: str
    data_dir: Path


@dataclass
class Child:
    name: str
    command: list[str]
    process: subprocess.Popen[bytes]
    is_node: bool
    reported_exit: bool = False


def plan_nodes(
    count: int, data_dir: Path, host: str, http_port: int, raft_port: int, *, tls: bool = False
) -> list[DevNode]:
    scheme = "https" if tls else "http"
    return [
        DevNode(
            id=f"n{index + 1}",
            http_url=f"{scheme}://{host}:{http_port + index}",
            http_address=f"{host}:{http_port + index}",
            raft_address=f"{host}:{raft_port + index}",
            data_dir=data_dir / f"n{index + 1}",
        )
        for index in range(count)
    ]


def ensure_secret(path: Path) -> Path:
    """Create the cluster secret once (0600); later runs reuse it."""
    if not path.exists():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(secrets.token_urlsafe(32) + "\n")
    return path


def ensure_admin_token(path: Path) -> str:
    """The admin token's secret, generated once (0600); later runs reuse it."""
    secret, _ = read_or_create_admin_secret(path)
    return secret


def node_command(
    node: DevNode,
    others: Sequence[DevNode],
    secret: Path,
    tls: DevTls | None = None,
    *,
    insecure_http: bool = False,
    shards: int = 1,
) -> list[str]:
    command = [
        sys.executable, "-m", "raftsched.cli", "node", "--id", node.id,
        "--data-dir", str(node.data_dir), "--http", node.http_address,
        "--raft", node.raft_address, "--http-url", node.http_url, "--secret-file", str(secret),
        "--admin-token-file", str(secret.parent / "admin.token"), "--log-format", _log_format(),
        # A developer's webhook receiver runs on this machine: loopback
        # targets are allowed here, never by default (docs/security.md).
        "--webhook-allow-cidr", "127.0.0.0/8", "--webhook-allow-cidr", "::1/128",
    ]  # fmt: skip
    for peer in others:
        command += ["--peer", f"{peer.id}={peer.raft_address}@{peer.http_url}"]
    if tls is not None:
        cert, key = tls.nodes[node.id]
        command += ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(tls.ca_file)]
    elif insecure_http:
        command += ["--insecure-http"]
    if shards > 1:
        command += ["--shards", str(shards)]
    return command


def worker_command(nodes: Sequence[DevNode], tls: DevTls | None = None) -> list[str]:
    """The demo worker (of a sharded cluster too: it polls every shard)."""
    command = [
        sys.executable, "-m", "raftsched.cli", "worker", "--queue", "default",
        "--handler", "raftsched.demo:handle", "--worker-id", "dev-worker",
        "--url", ",".join(node.http_url for node in nodes), "--log-format", _log_format(),
    ]  # fmt: skip
    if tls is not None:
        command += ["--ca-file", str(tls.ca_file)]
    return command


def _api(
    url: str,
    method: str,
    path: str,
    token: str,
    body: Any = None,
    context: ssl.SSLContext | None = None,
) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=5, context=context) as response:
        return json.loads(response.read())


def ensure_worker_token(
    nodes: Sequence[DevNode],
    admin: str,
    path: Path,
    stop: threading.Event,
    tls: DevTls | None = None,
) -> str | None:
    """The demo worker's own token (role worker, queue `default`): the one in
    `path` while the cluster still accepts it, else a new one made through the
    API (as soon as authentication is on) and kept in `path` (0600)."""
    context = None if tls is None else ssl.create_default_context(cafile=str(tls.ca_file))
    deadline = time.monotonic() + 60
    while not stop.is_set() and time.monotonic() < deadline:
        for node in nodes:
            try:
                ready = _api(node.http_url, "GET", "/readyz", admin, context=context)
                if ready.get("auth") != "on" or ready.get("leader_id") is None:
                    continue
                if path.exists():
                    kept = path.read_text(encoding="utf-8").strip()
                    try:
                        _api(node.http_url, "GET", "/v1/whoami", kept, context=context)
                        return kept
                    except urllib.error.HTTPError as error:
                        if error.code != 401:
                            raise
                body = {"name": "dev-worker", "role": "worker", "queues": ["default"]}
                leader = next(n for n in nodes if n.id == ready["leader_id"])
                created = _api(leader.http_url, "POST", "/v1/tokens", admin, body, context)
                secret = str(created["secret"])
                temporary = path.with_suffix(".tmp")
                descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                    handle.write(secret + "\n")
                temporary.replace(path)
                return secret
            except (OSError, ValueError, StopIteration):
                continue
        stop.wait(0.5)
    return None


def _log_format() -> str:
    """Readable lines for a person at a terminal, JSON when output is captured."""
    return "text" if sys.stdout.isatty() else "json"


def check_layout(path: Path, nodes: Sequence[DevNode], shards: int = 1) -> str | None:
    """A data directory remembers its cluster: refuse a different one."""
    if not path.exists():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        previous = document.get("nodes", [])
    except (OSError, ValueError, AttributeError):
        return None
    before = [(item.get("id"), item.get("raft_address")) for item in previous]
    now = [(node.id, node.raft_address) for node in nodes]
    if before and before != now:
        return (
            f"{path.parent} holds a different cluster ({len(before)} nodes, {before}); "
            "use the same --nodes/--raft-port/--host, another --data-dir, or delete it"
        )
    recorded = document.get("shards", 1)
    if before and recorded != shards:
        return (
            f"{path.parent} holds a cluster of {recorded} shard(s): a cluster's number of "
            f"shards never changes; use --shards {recorded}, another --data-dir, or delete it"
        )
    return None


def busy_ports(nodes: Sequence[DevNode], shards: int = 1) -> list[str]:
    busy = []
    raft = [
        shift_address(node.raft_address, shard, SHARD_PORT_STRIDE)
        for node in nodes
        for shard in range(shards)
    ]
    for address in [node.http_address for node in nodes] + raft:
        host, _, port = address.rpartition(":")
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, int(port)))
            except OSError:
                busy.append(address)
    return busy


def write_cluster_json(
    path: Path,
    nodes: Sequence[DevNode],
    children: Sequence[Child],
    tls: DevTls | None = None,
    shards: int = 1,
) -> None:
    pids = {child.name: child.process.pid for child in children}
    document: dict[str, Any] = {
        "nodes": [
            {
                "id": node.id,
                "http_url": node.http_url,
                "raft_address": node.raft_address,
                "pid": pids.get(node.id),
                "data_dir": str(node.data_dir),
            }
            for node in nodes
        ],
        "worker": {"pid": pids["worker"]} if "worker" in pids else None,
        "secret_file": str(path.parent / "secret"),
        "ca_file": None if tls is None else str(tls.ca_file),
    }
    if shards > 1:
        document["shards"] = shards
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    temporary.replace(path)


class Output:
    """Prints each child's lines with its name, and appends them to its log."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._color = sys.stdout.isatty()

    def say(self, text: str) -> None:
        with self._lock:
            try:
                print(text, flush=True)
            except OSError:
                # Nobody reads our output any more (the terminal closed, or
                # the `tee` we were piped to died). Keep going, logs only:
                # stopping the children must not fail on a print.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    def forward(self, name: str, index: int, stream: IO[bytes], log_path: Path) -> None:
        label = f"{name:<6}|"
        if self._color:
            label = f"\033[{COLORS[index % len(COLORS)]}m{label}\033[0m"
        with log_path.open("ab") as log:
            for raw in iter(stream.readline, b""):
                log.write(raw)
                log.flush()
                self.say(f"{label} {raw.decode('utf-8', errors='replace').rstrip()}")


def spawn(
    name: str, index: int, command: list[str], is_node: bool, data_dir: Path, output: Output
) -> Child:
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # A session of its own: Ctrl-C reaches only the launcher, which then stops
    # the children in order (worker first) instead of all at once. If the
    # launcher is killed instead, the child dies with it.
    process = child_processes.popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=environment,
        start_new_session=True,
    )
    assert process.stdout is not None
    threading.Thread(
        target=output.forward,
        args=(name, index, process.stdout, data_dir / f"{name}.log"),
        daemon=True,
    ).start()
    return Child(name, command, process, is_node)


def stop_children(children: Sequence[Child], output: Output) -> None:
    """Worker first (it reports what it was running), then the nodes."""
    for group in ([c for c in children if not c.is_node], [c for c in children if c.is_node]):
        alive = [child for child in group if child.process.poll() is None]
        for child in alive:
            child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in alive:
            try:
                child.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                output.say(f"dev: {child.name} did not stop in {STOP_TIMEOUT_S:.0f} s; killing it")
                child.process.kill()
                child.process.wait()


def watch(children: Sequence[Child], stop: threading.Event, output: Output) -> None:
    while not stop.wait(POLL_S):
        for child in children:
            code = child.process.poll()
            if code is not None and not child.reported_exit:
                child.reported_exit = True
                output.say(
                    f"dev: {child.name} exited unexpectedly with code {code}; "
                    f"the others keep running (see its .log)"
                )


def print_banner(
    nodes: Sequence[DevNode],
    data_dir: Path,
    output: Output,
    tls: DevTls | None = None,
    shards: int = 1,
) -> None:
    urls = ",".join(node.http_url for node in nodes)
    lines = [f"dev: {len(nodes)} nodes, data in {data_dir}"]
    if shards > 1:
        lines[0] += (
            f"; {shards} shards (each node runs group 0 and {shards - 1} shard processes, "
            "and the demo worker polls every shard: docs/shards.md)"
        )
    lines += [
        f"  {node.id}  {node.http_url}  raft {node.raft_address}  {node.data_dir}" for node in nodes
    ]
    default = ",".join(f"http://127.0.0.1:{8701 + i}" for i in range(3))
    url_hint = "" if urls == default else f"  export RAFTSCHED_URL={urls}"
    ca_hint = [] if tls is None else [f"  export RAFTSCHED_CA_FILE={tls.ca_file.resolve()}"]
    lines += [
        "try:",
        *([url_hint] if url_hint else []),
        *ca_hint,
        f"  raftsched whoami    # the CLI finds {data_dir}/admin.token from this directory;",
        f"                      # elsewhere: export RAFTSCHED_TOKEN=$(cat {data_dir}/admin.token)",
        "  raftsched submit default --payload '{\"amount\": 1200}'",
        '  raftsched submit default --payload \'{"fail": "transient"}\' --max-attempts 3',
        "  raftsched jobs list"
        + ("    # shard 0's jobs: lists are group 0's for now" if shards > 1 else ""),
        "  raftsched cluster status",
        "  raftsched tokens create ci --role submitter --tenant default   # more tokens",
        f"dashboard: {nodes[0].http_url}/ (token: {data_dir}/admin.token)",
        f"logs: {data_dir}/<name>.log   Ctrl-C stops everything",
    ]
    if tls is not None:
        lines += [
            f"TLS: the nodes' certificates come from the CA in {tls.ca_file}; give it to the",
            "  CLI and workers (--ca-file or RAFTSCHED_CA_FILE) and, for the dashboard, trust",
            "  it in your browser or accept its warning once per node.",
        ]
    output.say("\n".join(lines))


def run_dev(
    *,
    nodes: int = 3,
    data_dir: Path = Path("data/dev"),
    http_port: int = 8701,
    raft_port: int = 9701,
    worker: bool = True,
    host: str = "127.0.0.1",
    tls: bool = False,
    insecure_http: bool = False,
    shards: int = 1,
) -> int:
    output = Output()
    if not tls and not insecure_http and not is_loopback_host(host):
        print(
            f"error: --host {host} is not a loopback address: use --tls to serve HTTPS, "
            "or --insecure-http to serve plain HTTP there anyway",
            file=sys.stderr,
        )
        return 2
    data_dir.mkdir(parents=True, exist_ok=True)
    plan = plan_nodes(nodes, data_dir, host, http_port, raft_port, tls=tls)
    problem = check_layout(data_dir / "cluster.json", plan, shards)
    busy = busy_ports(plan, shards)
    if problem or busy:
        print(f"error: {problem or 'ports in use: ' + ', '.join(busy)}", file=sys.stderr)
        return 2
    secret = ensure_secret(data_dir / "secret")
    certificates = (
        dev_certificates(data_dir / "tls", [node.id for node in plan], [host]) if tls else None
    )
    admin = ensure_admin_token(data_dir / "admin.token")
    stop = threading.Event()
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda *_: stop.set())
    children = []
    for index, node in enumerate(plan):
        others = [peer for peer in plan if peer is not node]
        command = node_command(
            node, others, secret, certificates, insecure_http=insecure_http, shards=shards
        )
        children.append(spawn(node.id, index, command, True, data_dir, output))
    if worker:
        # The demo worker has a token of its own, made through the API once
        # the cluster has bootstrapped its admin token from admin.token.
        token = ensure_worker_token(plan, admin, data_dir / "worker.token", stop, certificates)
        if token is None:
            output.say("dev: authentication did not come on within 60 s; no demo worker")
        else:
            # It learns the shards from the cluster and polls each of them.
            command = worker_command(plan, certificates) + ["--token", token]
            children.append(spawn("worker", len(plan), command, False, data_dir, output))
    write_cluster_json(data_dir / "cluster.json", plan, children, certificates, shards)
    print_banner(plan, data_dir, output, certificates, shards)
    try:
        watch(children, stop, output)
    finally:
        output.say("dev: stopping")
        stop_children(children, output)
    return 0
