"""Every process that raftsched.testing or the dev launcher starts dies with
its parent, however the parent ends: SIGKILLed (no cleanup runs at all), or,
for the launcher, stopped by SIGTERM or SIGHUP (a closed terminal) as cleanly
as by Ctrl-C. Each test checks that the pids are gone and the ports free."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftsched.testing import free_port_block, http_json, process_running, wait_for

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")

# A test's process, as far as its cluster is concerned: it starts one,
# restarts a node from a thread that then exits (as the chaos nemesis does),
# pauses another, says what it started, and waits to be killed.
LOCAL_CLUSTER_PARENT = """
import json, sys, threading, time
from pathlib import Path
from raftsched.testing import LocalCluster

root = Path(sys.argv[1])
cluster = LocalCluster(root / "cluster", size=3)
cluster.start()
cluster.wait_for_leader(timeout_s=30)
restarter = threading.Thread(target=cluster.restart, args=("n3",))
restarter.start()
restarter.join()
deadline = time.monotonic() + 30
while cluster.cluster_view("n3") is None and time.monotonic() < deadline:
    time.sleep(0.1)  # until the restarted n3 serves (and so holds its ports)
cluster.pause("n2")
started = {
    "pids": [node.process.pid for node in cluster.nodes.values()],
    "ports": [p for node in cluster.nodes.values() for p in (node.http_port, node.raft_port)],
}
(root / "started.tmp").write_text(json.dumps(started))
(root / "started.tmp").rename(root / "started.json")
time.sleep(120)
"""


def listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def assert_gone(pids: list[int], ports: list[int], timeout_s: float = 5.0) -> None:
    assert wait_for(lambda: not any(process_running(pid) for pid in pids), timeout_s), (
        f"still running: {[pid for pid in pids if process_running(pid)]}"
    )
    assert wait_for(lambda: not any(listening(port) for port in ports), timeout_s), (
        f"still held: {[port for port in ports if listening(port)]}"
    )


def reap(parent: subprocess.Popen[bytes], pids: list[int]) -> None:
    """Whatever a failing test left behind: the parent, then its children."""
    if parent.poll() is None:
        parent.kill()
    parent.wait(timeout=10)
    for pid in pids:
        if process_running(pid):
            os.kill(pid, signal.SIGKILL)


def test_local_cluster_nodes_die_when_the_test_process_is_sigkilled(tmp_path: Path) -> None:
    log = (tmp_path / "parent.log").open("wb")
    parent = subprocess.Popen(
        [sys.executable, "-c", LOCAL_CLUSTER_PARENT, str(tmp_path)], stdout=log, stderr=log
    )
    log.close()
    pids: list[int] = []
    try:
        started = tmp_path / "started.json"
        assert wait_for(lambda: started.exists() or parent.poll() is not None, 90)
        assert started.exists(), (tmp_path / "parent.log").read_text()
        layout = json.loads(started.read_text())
        pids, ports = layout["pids"], layout["ports"]
        # n3 was started by a thread that has exited; n2 is stopped (SIGSTOP).
        assert [pid for pid in pids if not process_running(pid)] == []
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert_gone(pids, ports)
    finally:
        reap(parent, pids)


class Launcher:
    """`raftsched dev` on a free block of ports, output to a pipe."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.http_port = free_port_block(6)
        self.raft_port = self.http_port + 3
        self.ports = list(range(self.http_port, self.http_port + 6))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "raftsched.cli", "dev", "--data-dir", str(data_dir),
             "--http-port", str(self.http_port), "--raft-port", str(self.raft_port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.pids: list[int] = []

    def wait_serving(self, timeout_s: float = 60.0) -> None:
        """Until cluster.json names every child and the cluster has a leader."""
        path = self.data_dir / "cluster.json"
        assert wait_for(path.exists, timeout_s), "the launcher wrote no cluster.json"
        layout = json.loads(path.read_text())
        self.pids = [node["pid"] for node in layout["nodes"]] + [layout["worker"]["pid"]]

        def ready() -> bool:
            try:
                status, _, _ = http_json("GET", f"{layout['nodes'][0]['http_url']}/readyz")
            except OSError:
                return False
            return status == 200

        assert wait_for(ready, timeout_s), "the dev cluster never became ready"
        assert [pid for pid in self.pids if not process_running(pid)] == []


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    started = Launcher(tmp_path / "dev")
    try:
        started.wait_serving()
        yield started
    finally:
        if started.process.stdout is not None:
            started.process.stdout.close()
        reap(started.process, started.pids)


def test_dev_children_die_when_the_launcher_is_sigkilled(launcher: Launcher) -> None:
    launcher.process.send_signal(signal.SIGKILL)
    launcher.process.wait(timeout=10)
    assert_gone(launcher.pids, launcher.ports)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_dev_launcher_stops_everything_cleanly_on_sigterm_as_on_ctrl_c(
    launcher: Launcher, signum: int
) -> None:
    launcher.process.send_signal(signum)
    output, _ = launcher.process.communicate(timeout=30)
    text = output.decode()
    assert launcher.process.returncode == 0, text
    assert "dev: stopping" in text and "did not stop" not in text, text
    assert "exited unexpectedly" not in text, text
    assert_gone(launcher.pids, launcher.ports, timeout_s=1)


def test_dev_launcher_stops_cleanly_when_its_terminal_and_tee_are_gone(
    launcher: Launcher,
) -> None:
    # `make dev | tee dev.log` in a terminal that is then closed: the reader
    # of the launcher's output is gone, then the launcher gets SIGHUP.
    assert launcher.process.stdout is not None
    launcher.process.stdout.close()
    started = time.monotonic()
    launcher.process.send_signal(signal.SIGHUP)
    assert launcher.process.wait(timeout=30) == 0
    # Quicker than the launcher's timeout for a child that will not stop.
    assert time.monotonic() - started < 8
    assert_gone(launcher.pids, launcher.ports, timeout_s=1)
    # Each node's output still reached its log, to its graceful end.
    for node_id in ("n1", "n2", "n3"):
        log = (launcher.data_dir / f"{node_id}.log").read_text()
        assert log.count("node stopping") == 1, log[-2000:]
