"""Real toy-node processes on real loopback sockets, cleaned up even on failure."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raftsched import child_processes
from raftsched.testing import free_port

TOY_NODE = Path(__file__).with_name("toy_node.py")
SECRET = "raft-test-secret-0123456789abcdef"


class ToyNode:
    def __init__(
        self,
        node_id: str,
        raft_address: str,
        peers: dict[str, str],
        data_dir: Path,
        *,
        secret: str = SECRET,
        durability: str = "fsync",
        compaction: int = 5000,
        compaction_bytes: int = 64 * 1024 * 1024,
        compaction_interval_s: float = 300.0,
        connection_timeout_s: float = 3.5,
        env: dict[str, str] | None = None,
    ) -> None:
        self.node_id = node_id
        self.raft_address = raft_address
        self.peers = peers
        self.data_dir = data_dir
        self.secret = secret
        self.durability = durability
        self.compaction = compaction
        self.compaction_bytes = compaction_bytes
        self.compaction_interval_s = compaction_interval_s
        self.connection_timeout_s = connection_timeout_s
        self.env = env or {}
        self.control_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{node_id}.log"

    def start(self) -> None:
        command = [
            sys.executable,
            str(TOY_NODE),
            "--id", self.node_id,
            "--raft", self.raft_address,
            "--data-dir", str(self.data_dir),
            "--secret", self.secret,
            "--control-port", str(self.control_port),
            "--durability", self.durability,
            "--compaction", str(self.compaction),
            "--compaction-bytes", str(self.compaction_bytes),
            "--compaction-interval", str(self.compaction_interval_s),
            "--connection-timeout", str(self.connection_timeout_s),
        ]  # fmt: skip
        for peer_id, address in self.peers.items():
            command += ["--peer", f"{peer_id}={address}"]
        with open(self.log_path, "ab") as log:
            self.process = child_processes.popen(
                command, stdout=log, stderr=log, env={**os.environ, **self.env}
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                self.request({"op": "status"}, timeout_s=1)
                return
            except OSError as error:
                if self.process.poll() is not None:
                    log_text = self.log_path.read_text()
                    raise RuntimeError(f"{self.node_id} exited: {log_text}") from error
                time.sleep(0.05)
        raise RuntimeError(f"{self.node_id} did not open its control port")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(5)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def request(self, message: dict[str, Any], timeout_s: float = 10) -> Any:
        with socket.create_connection(("127.0.0.1", self.control_port), timeout=timeout_s) as conn:
            conn.sendall(json.dumps(message).encode() + b"\n")
            reply = conn.makefile("rb").readline()
        if not reply:
            raise ConnectionError(f"{self.node_id} closed the control connection")
        return json.loads(reply)

    def status(self) -> dict[str, Any]:
        return dict(self.request({"op": "status"}))

    def state(self) -> dict[str, Any]:
        return dict(self.request({"op": "state"}))

    def propose(self, data: bytes, timeout_s: float = 5) -> dict[str, Any]:
        return dict(self.request({"op": "propose", "data": data.hex(), "timeout_s": timeout_s}))


class Cluster:
    def __init__(self, root: Path, size: int = 3, **node_options: Any) -> None:
        ids = [chr(ord("a") + i) for i in range(size)]
        addresses = {node_id: f"127.0.0.1:{free_port()}" for node_id in ids}
        self.nodes = {
            node_id: ToyNode(
                node_id,
                addresses[node_id],
                {peer: address for peer, address in addresses.items() if peer != node_id},
                root / node_id,
                **node_options,
            )
            for node_id in ids
        }

    def start(self) -> None:
        for node in self.nodes.values():
            node.start()

    def kill_all(self) -> None:
        """SIGKILL every node at once (a power cut), then reap them."""
        for node in self.nodes.values():
            if node.alive and node.process is not None:
                node.process.send_signal(signal.SIGKILL)
        for node in self.nodes.values():
            node.kill()

    def live(self) -> list[ToyNode]:
        return [node for node in self.nodes.values() if node.alive]

    def wait_leader(self, timeout_s: float = 15, exclude: str | None = None) -> ToyNode:
        """A live node that leads and that every other live node (but `exclude`) follows."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            statuses = {n.node_id: n.status() for n in self.live() if n.node_id != exclude}
            leaders = [i for i, s in statuses.items() if s["role"] == "leader"]
            if len(leaders) == 1 and all(s["leader_id"] == leaders[0] for s in statuses.values()):
                return self.nodes[leaders[0]]
            time.sleep(0.1)
        raise AssertionError(f"no agreed leader within {timeout_s}s: {statuses}")

    def propose_on_leader(self, data: bytes, timeout_s: float = 10) -> dict[str, Any]:
        """Propose through whichever node leads, retrying while leadership moves."""
        deadline = time.monotonic() + timeout_s
        reply: dict[str, Any] = {}
        while time.monotonic() < deadline:
            leader = self.wait_leader(timeout_s=max(0.5, deadline - time.monotonic()))
            reply = leader.propose(data)
            if reply["ok"]:
                return reply
            time.sleep(0.1)
        raise AssertionError(f"could not commit {data!r}: {reply}")

    def wait_converged(
        self, expected: Callable[[list[bytes]], bool] = lambda _: True, timeout_s: float = 15
    ) -> list[bytes]:
        """Wait until every live node has the same state and `expected` holds."""
        deadline = time.monotonic() + timeout_s
        states: dict[str, Any] = {}
        while time.monotonic() < deadline:
            states = {node.node_id: node.state() for node in self.live()}
            digests = {state["digest"] for state in states.values()}
            if len(digests) == 1:
                entries = [bytes.fromhex(e) for e in next(iter(states.values()))["entries"]]
                if expected(entries):
                    return entries
            time.sleep(0.1)
        summary = {i: (len(s["entries"]), s["digest"][:8]) for i, s in states.items()}
        raise AssertionError(f"nodes did not converge within {timeout_s}s: {summary}")
