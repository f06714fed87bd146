"""The dev launcher: its plan, its secret, its layout check, and a real run
(start, serve, stop cleanly, resume from the same data)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from raftsched import child_processes, devcluster, pki
from raftsched.client import Client
from raftsched.testing import free_port_block, http_json, wait_for


def test_plan_and_commands(tmp_path: Path) -> None:
    plan = devcluster.plan_nodes(3, tmp_path, "127.0.0.1", 8701, 9701)
    assert [(n.id, n.http_url, n.raft_address) for n in plan] == [
        ("n1", "http://127.0.0.1:8701", "127.0.0.1:9701"),
        ("n2", "http://127.0.0.1:8702", "127.0.0.1:9702"),
        ("n3", "http://127.0.0.1:8703", "127.0.0.1:9703"),
    ]
    command = devcluster.node_command(plan[0], plan[1:], tmp_path / "secret")
    assert command[1:5] == ["-m", "raftsched.cli", "node", "--id"]
    assert command.count("--peer") == 2
    assert "n2=127.0.0.1:9702@http://127.0.0.1:8702" in command
    worker = devcluster.worker_command(plan)
    assert "raftsched.demo:handle" in worker and "default" in worker


def test_plan_and_commands_with_tls(tmp_path: Path) -> None:
    plan = devcluster.plan_nodes(2, tmp_path, "127.0.0.1", 8701, 9701, tls=True)
    assert [node.http_url for node in plan] == ["https://127.0.0.1:8701", "https://127.0.0.1:8702"]
    certificates = pki.dev_certificates(tmp_path / "tls", ["n1", "n2"], ["127.0.0.1"])
    command = devcluster.node_command(plan[0], plan[1:], tmp_path / "secret", certificates)
    assert "n2=127.0.0.1:9702@https://127.0.0.1:8702" in command
    flags = dict(zip(command, command[1:], strict=False))
    assert flags["--tls-cert"] == str(tmp_path / "tls" / "n1.pem")
    assert flags["--tls-key"] == str(tmp_path / "tls" / "n1.key")
    assert flags["--tls-ca"] == str(tmp_path / "tls" / "ca.pem")
    worker = devcluster.worker_command(plan, certificates)
    assert worker[worker.index("--ca-file") + 1] == str(tmp_path / "tls" / "ca.pem")


def test_dev_off_loopback_needs_tls_or_insecure_http(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert devcluster.run_dev(data_dir=tmp_path / "dev", host="0.0.0.0") == 2
    assert "--host 0.0.0.0 is not a loopback address" in capsys.readouterr().err
    assert not (tmp_path / "dev").exists()
    plan = devcluster.plan_nodes(1, tmp_path, "0.0.0.0", 8701, 9701)
    command = devcluster.node_command(plan[0], [], tmp_path / "secret", insecure_http=True)
    assert command[-1] == "--insecure-http"


def test_secret_is_private_and_reused(tmp_path: Path) -> None:
    path = devcluster.ensure_secret(tmp_path / "secret")
    first = path.read_text()
    assert len(first.strip()) >= 16
    assert path.stat().st_mode & 0o777 == 0o600
    assert devcluster.ensure_secret(path).read_text() == first


def test_layout_check_refuses_a_different_cluster(tmp_path: Path) -> None:
    three = devcluster.plan_nodes(3, tmp_path, "127.0.0.1", 8701, 9701)
    path = tmp_path / "cluster.json"
    assert devcluster.check_layout(path, three) is None
    path.write_text(json.dumps({"nodes": [
        {"id": n.id, "raft_address": n.raft_address} for n in three
    ]}))  # fmt: skip
    assert devcluster.check_layout(path, three) is None
    five = devcluster.plan_nodes(5, tmp_path, "127.0.0.1", 8701, 9701)
    assert "different cluster" in (devcluster.check_layout(path, five) or "")


def test_a_sharded_dev_cluster_names_its_shards(tmp_path: Path) -> None:
    plan = devcluster.plan_nodes(3, tmp_path, "127.0.0.1", 8701, 9701)
    command = devcluster.node_command(plan[0], plan[1:], tmp_path / "secret", shards=3)
    assert command[command.index("--shards") + 1] == "3"
    assert "--shards" not in devcluster.node_command(plan[0], plan[1:], tmp_path / "secret")
    # One demo worker polls every shard: it names none.
    assert "--shard" not in devcluster.worker_command(plan)
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"nodes": [
        {"id": n.id, "raft_address": n.raft_address} for n in plan
    ], "shards": 3}))  # fmt: skip
    assert devcluster.check_layout(path, plan, 3) is None
    assert "--shards 3" in (devcluster.check_layout(path, plan, 1) or "")


def launch(data_dir: Path, http_port: int, raft_port: int) -> subprocess.Popen[bytes]:
    # Dies with this test process, and its nodes with it (child_processes).
    return child_processes.popen(
        [sys.executable, "-m", "raftsched.cli", "dev", "--data-dir", str(data_dir),
         "--http-port", str(http_port), "--raft-port", str(raft_port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def stop(launcher: subprocess.Popen[bytes]) -> str:
    launcher.send_signal(signal.SIGTERM)
    output, _ = launcher.communicate(timeout=30)
    assert launcher.returncode == 0
    return output.decode()


def ready(url: str) -> bool:
    """The node answers /readyz 200 (a leader is known, and it caught up)."""
    try:
        return http_json("GET", url + "/readyz", timeout_s=2)[0] == 200
    except OSError:
        return False


def wait_ready(launcher: subprocess.Popen[bytes], urls: list[str]) -> None:
    # Three nodes and a worker start in 5-10 s on a loaded machine; the
    # client's retry budget is for a running cluster's hiccups, not for that.
    assert wait_for(lambda: launcher.poll() is not None or any(map(ready, urls)), 120)
    assert launcher.poll() is None, "the dev launcher exited while starting"


def pids_alive(data_dir: Path) -> list[int]:
    layout = json.loads((data_dir / "cluster.json").read_text())
    pids = [node["pid"] for node in layout["nodes"]] + [layout["worker"]["pid"]]
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(pid)
    return alive


@pytest.mark.slow
@pytest.mark.e2e
def test_dev_runs_a_job_stops_cleanly_and_resumes(tmp_path: Path) -> None:
    data_dir = tmp_path / "dev"
    # The launcher takes consecutive ports: one free block for both kinds.
    http_port = free_port_block(6)
    raft_port = http_port + 3
    urls = [f"http://127.0.0.1:{http_port + i}" for i in range(3)]
    launcher = launch(data_dir, http_port, raft_port)
    try:
        wait_ready(launcher, urls)
        # The launcher writes admin.token before it starts the nodes.
        admin = (data_dir / "admin.token").read_text().strip()
        with Client(urls, retry_budget_s=30, token=admin) as client:
            job = client.submit("default", {"amount": 3}, idempotency_key="dev-test")
            done = client.wait_job(job["id"], timeout_s=30)
            assert done["status"] == "succeeded"
            assert done["result"]["charge"]["amount"] == 3
    finally:
        output = stop(launcher)
    assert "dev: stopping" in output and "n1    |" in output
    assert pids_alive(data_dir) == []

    launcher = launch(data_dir, http_port, raft_port)
    try:
        wait_ready(launcher, urls)
        with Client(urls, retry_budget_s=30, token=admin) as client:
            assert client.get_job(job["id"])["status"] == "succeeded"
    finally:
        stop(launcher)
