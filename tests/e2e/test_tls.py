"""TLS end to end (docs/security.md): real 3-node clusters serving HTTPS with
certificates made here (raftsched.pki, on `cryptography`), mutual TLS, the
refusal to serve clear text off loopback, and `raftsched dev --tls`."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from e2e_support import cluster_env

from raftsched import child_processes
from raftsched.client import Client, TransportError
from raftsched.testing import (
    ClusterTls,
    LocalCluster,
    free_port,
    free_port_block,
    http_json,
    make_cluster_tls,
    process_running,
    wait_for,
)


def start_cluster(root: Path, tls: ClusterTls) -> LocalCluster:
    cluster = LocalCluster(root / "cluster", size=3, env=cluster_env(), tls=tls)
    cluster.start()
    try:
        cluster.wait_for_leader(timeout_s=30)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture
def https_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = start_cluster(tmp_path, make_cluster_tls(tmp_path / "tls"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def mutual_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = start_cluster(tmp_path, make_cluster_tls(tmp_path / "tls", mutual=True))
    try:
        yield cluster
    finally:
        cluster.stop()


def follower_of(cluster: LocalCluster) -> tuple[str, str]:
    leader = cluster.wait_for_leader()
    follower = next(node_id for node_id in cluster.nodes if node_id != leader)
    return leader, follower


def peers_heard_over_https(cluster: LocalCluster) -> bool:
    """Every node lists its peers with https URLs and has heard their
    versions, which it asks for with its own HTTPS calls (GET /v1/time)."""
    for node_id in cluster.nodes:
        view = cluster.cluster_view(node_id)
        if view is None:
            return False
        for member in view["nodes"]:
            assert member["http_url"].startswith("https://"), view
            if member.get("version") is None:
                return False
    return True


def test_submit_through_a_follower_follows_an_https_redirect(https_cluster: LocalCluster) -> None:
    tls = https_cluster.tls
    assert tls is not None
    body = {"queue": "tls", "payload": {"n": 1}}
    # A follower that does not see the leader as reachable yet (a loaded
    # machine, just after the election) answers 503 no_leader, having
    # proposed nothing: ask again, as a client does.
    deadline = time.monotonic() + 30
    while True:
        leader, follower = follower_of(https_cluster)
        follower_url = https_cluster.nodes[follower].http_url
        assert follower_url.startswith("https://")
        status, answer, headers = http_json(
            "POST", follower_url + "/v1/jobs", body, context=https_cluster.ssl_context
        )
        if status != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert status == 307, answer
    assert headers["Location"] == https_cluster.nodes[leader].http_url + "/v1/jobs"
    # Served over HTTPS: browsers are told to keep to it (api/headers.py).
    assert headers["Strict-Transport-Security"] == "max-age=31536000"
    assert answer["leader"]["http_url"].startswith("https://")

    # The client follows it, verifying the leader against the cluster's CA.
    with Client([follower_url], ca_file=tls.ca_file, retry_budget_s=30) as client:
        job = client.submit("tls", {"n": 2}, idempotency_key="tls-redirect")
        assert client.get_job(job["id"])["status"] == "pending"
    # Without that CA, the system's trust store knows nothing of it.
    untrusting = Client([follower_url], retry_budget_s=1)
    with untrusting, pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
        untrusting.get_job(job["id"])
    # Plain HTTP to an HTTPS port gets no HTTP answer.
    plain = follower_url.replace("https://", "http://")
    with pytest.raises(OSError):
        http_json("GET", plain + "/v1/cluster", timeout_s=2)
    assert wait_for(lambda: peers_heard_over_https(https_cluster), 15)


def test_a_worker_over_tls_completes_a_job(https_cluster: LocalCluster, tmp_path: Path) -> None:
    tls = https_cluster.tls
    assert tls is not None
    # The CA file comes from the environment, as an operator would set it.
    env = {**os.environ, **cluster_env(), "RAFTSCHED_CA_FILE": str(tls.ca_file)}
    log = (tmp_path / "worker.log").open("ab")
    worker = child_processes.popen(
        [sys.executable, "-m", "raftsched", "worker", "--queue", "default",
         "--handler", "raftsched.demo:handle", "--worker-id", "tls-worker",
         "--poll-wait-s", "2", "--shutdown-grace-s", "5",
         "--url", ",".join(https_cluster.urls)],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    log.close()
    try:
        with Client(https_cluster.urls, ca_file=tls.ca_file, retry_budget_s=30) as client:
            job = client.submit("default", {"amount": 7, "sleep_s": 0.05})
            done = client.wait_job(job["id"], timeout_s=30)
        assert done["status"] == "succeeded", done
        assert done["result"]["charge"]["amount"] == 7
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=5)
    assert worker.returncode == 0, (tmp_path / "worker.log").read_text()


def test_nodes_verify_their_peers_with_their_ca(tmp_path: Path) -> None:
    # The nodes trust another CA than the one that signed their certificates:
    # Raft (not HTTP) still elects a leader, but no node learns its peers'
    # versions, and each says why.
    tls = make_cluster_tls(tmp_path / "tls")
    stranger = make_cluster_tls(tmp_path / "stranger")
    cluster = LocalCluster(
        tmp_path / "cluster", size=3, env=cluster_env(), tls=tls,
        extra_args=["--tls-ca", str(stranger.ca_file)],
    )  # fmt: skip
    cluster.start()
    try:
        cluster.wait_for_leader(timeout_s=30)
        assert wait_for(lambda: "TLS with peer https://" in cluster.logs(), 15), cluster.logs()
        for node_id in cluster.nodes:
            view = cluster.cluster_view(node_id)
            assert view is not None
            assert [member["version"] for member in view["nodes"][1:]] == [None, None], view
    finally:
        cluster.stop()
    assert "CERTIFICATE_VERIFY_FAILED" in cluster.logs()


def handshake_and_read(url: str, context: ssl.SSLContext) -> bytes:
    """Open a TLS connection, send a request, read the answer's first bytes."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    with (
        socket.create_connection((parts.hostname, parts.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=parts.hostname) as connection,
    ):
        connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return connection.recv(64)


def test_mutual_tls_refuses_a_client_without_a_certificate(mutual_cluster: LocalCluster) -> None:
    tls = mutual_cluster.tls
    assert tls is not None and tls.mutual
    leader, follower = follower_of(mutual_cluster)
    url = mutual_cluster.nodes[follower].http_url

    # Without a certificate the server drops the connection in the TLS
    # handshake (with TLS 1.3, as soon as the client's empty certificate
    # message arrives, which is just after the client thinks it is done):
    # no HTTP byte is ever answered. TLS 1.2 fails inside the handshake.
    for version in (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2):
        anonymous_context = tls.client_context(with_certificate=False)
        anonymous_context.maximum_version = version
        try:
            answer = handshake_and_read(url, anonymous_context)
        except (ssl.SSLError, ConnectionResetError):
            answer = b""
        assert answer == b"", version
    assert handshake_and_read(url, tls.client_context()).startswith(b"HTTP/1.1 200")

    anonymous = Client([url], ca_file=tls.ca_file, retry_budget_s=1)
    with anonymous, pytest.raises(TransportError):
        anonymous.request("GET", "/v1/cluster")
    # With one, everything works, redirects to the leader included; and the
    # nodes reach each other, showing their own certificates.
    with Client([url], **tls.client_options(), retry_budget_s=30) as client:
        job = client.submit("mtls", {"n": 1})
        assert client.get_job(job["id"])["id"] == job["id"]
    # The files named by the environment, as the CLI reads them.
    files = tls.client_options()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAFTSCHED_CA_FILE", str(files["ca_file"]))
        env.setenv("RAFTSCHED_CLIENT_CERT", str(files["client_cert"]))
        env.setenv("RAFTSCHED_CLIENT_KEY", str(files["client_key"]))
        with Client([url], retry_budget_s=30) as client:
            assert client.get_job(job["id"])["id"] == job["id"]
        unset = Client([url], client_cert="", client_key="", retry_budget_s=1)
        with unset, pytest.raises(TransportError):  # "" turns the certificate off
            unset.request("GET", "/v1/cluster")
    assert wait_for(lambda: peers_heard_over_https(mutual_cluster), 15)


def node_command(tmp_path: Path, http: str, *extra: str) -> list[str]:
    secret = tmp_path / "secret"
    secret.write_text("s" * 24)
    return [
        sys.executable, "-m", "raftsched", "node", "--id", "n1",
        "--data-dir", str(tmp_path / "n1"), "--http", http,
        "--raft", f"127.0.0.1:{free_port()}", "--secret-file", str(secret), *extra,
    ]  # fmt: skip


def test_a_node_off_loopback_without_tls_refuses_to_start(tmp_path: Path) -> None:
    port = free_port("0.0.0.0")
    done = subprocess.run(
        node_command(tmp_path, f"0.0.0.0:{port}"), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "0.0.0.0" in done.stderr and "not a loopback address" in done.stderr
    assert "--insecure-http" in done.stderr and "--tls-cert" in done.stderr
    assert "Traceback" not in done.stderr
    # It stopped before doing anything: no data directory, nothing bound.
    assert not (tmp_path / "n1").exists()
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", port))


def test_a_node_whose_tls_files_do_not_load_refuses_to_start(tmp_path: Path) -> None:
    tls = make_cluster_tls(tmp_path / "tls")
    done = subprocess.run(
        node_command(
            tmp_path, f"127.0.0.1:{free_port()}",
            "--tls-cert", str(tls.node_cert_file), "--tls-key", str(tls.client_key_file),
        ),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "cannot load --tls-cert" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "n1").exists()


class DevLauncher:
    """`raftsched dev --tls` on a free block of ports."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.http_port = free_port_block(6)
        self.ports = list(range(self.http_port, self.http_port + 6))
        self.process = child_processes.popen(
            [sys.executable, "-m", "raftsched.cli", "dev", "--tls",
             "--data-dir", str(data_dir), "--http-port", str(self.http_port),
             "--raft-port", str(self.http_port + 3)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.pids: list[int] = []

    def layout(self) -> dict[str, Any]:
        path = self.data_dir / "cluster.json"
        assert wait_for(path.exists, 60), "the launcher wrote no cluster.json"
        layout: dict[str, Any] = json.loads(path.read_text())
        self.pids = [node["pid"] for node in layout["nodes"]] + [layout["worker"]["pid"]]
        return layout

    def stop(self) -> str:
        self.process.send_signal(signal.SIGTERM)
        output, _ = self.process.communicate(timeout=30)
        return output.decode()

    def reap(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        for pid in self.pids:
            if process_running(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_dev_tls_serves_https_to_the_cli_the_worker_and_the_dashboard(tmp_path: Path) -> None:
    launcher = DevLauncher(tmp_path / "dev")
    try:
        layout = launcher.layout()
        ca_file = Path(layout["ca_file"])
        urls = [node["http_url"] for node in layout["nodes"]]
        assert all(url.startswith("https://127.0.0.1:") for url in urls)
        for key in [ca_file.with_name("ca.key"), *ca_file.parent.glob("n*.key")]:
            assert key.stat().st_mode & 0o777 == 0o600, key
        # The dev cluster's own admin token (it makes one; not the session's).
        admin = (launcher.data_dir / "admin.token").read_text().strip()
        with Client(urls, ca_file=ca_file, retry_budget_s=30, token=admin) as client:
            job = client.submit("default", {"amount": 5, "sleep_s": 0.05})
            done = client.wait_job(job["id"], timeout_s=30)  # the demo worker ran it
        assert done["status"] == "succeeded", done
        context = ssl.create_default_context(cafile=ca_file)
        status, _, headers = http_json("GET", urls[0] + "/v1/cluster", context=context, token=admin)
        assert status == 200
        dashboard = urlsplit(urls[0])
        page = handshake_and_read(f"https://{dashboard.netloc}/", context)
        assert page.startswith(b"HTTP/1.1 200")
        # The CLI, given the CA file through the environment.
        cli = subprocess.run(
            [sys.executable, "-m", "raftsched", "--json", "jobs", "get", job["id"]],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "RAFTSCHED_URL": ",".join(urls),
                 "RAFTSCHED_CA_FILE": str(ca_file), "RAFTSCHED_TOKEN": admin},
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        assert json.loads(cli.stdout)["status"] == "succeeded"
        output = launcher.stop()
        assert launcher.process.returncode == 0, output
        assert f"RAFTSCHED_CA_FILE={ca_file.resolve()}" in output
        assert "exited unexpectedly" not in output, output
        assert wait_for(lambda: not any(process_running(pid) for pid in launcher.pids), 5)
    finally:
        launcher.reap()
    for node_id in ("n1", "n2", "n3"):
        log = (launcher.data_dir / f"{node_id}.log").read_text()
        assert '"level": "error"' not in log, log[-3000:]
