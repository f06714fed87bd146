"""The raftsched cluster under test: `raftsched.testing.LocalCluster`, except
that each node runs inside its own network namespace (`ip netns exec`, which
execs, so the process id is the node's and the harness stays its parent: the
node dies with the harness, see raftsched.child_processes) and under
libfaketime with its own clock-offset file, the monotonic clock left real."""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from chaos.net import Network
from raftsched.testing import LocalCluster, NodeProcess

HTTP_PORT = 8080
RAFT_PORT = 9090
SHIM_DIR = Path(__file__).resolve().parent / "shim"
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class NsNode(NodeProcess):
    index: int = 0
    ip: str = ""
    clock_file: Path = Path()

    @property
    def http_url(self) -> str:
        return f"http://{self.ip}:{self.http_port}"

    @property
    def raft_address(self) -> str:
        return f"{self.ip}:{self.raft_port}"


class NsCluster(LocalCluster):
    """Build with `NsCluster(root, size, env=..., net=..., faketime=...)`."""

    net: Network
    faketime: str | None

    def __init__(
        self,
        root: Path,
        size: int,
        net: Network,
        faketime: str | None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.net = net
        self.faketime = faketime
        super().__init__(root=root, size=size, env=dict(env or {}))

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.secret_file = self.root / "secret"
        self.secret_file.write_text(secrets.token_urlsafe(32))
        self.secret_file.chmod(0o600)
        self.prepare_admin_token()
        (self.root / "clock").mkdir(exist_ok=True)
        for index in range(1, self.size + 1):
            node = NsNode(
                id=f"n{index}",
                http_port=HTTP_PORT,
                raft_port=RAFT_PORT,
                data_dir=self.root / f"n{index}",
                log_path=self.root / f"n{index}.log",
                index=index,
                ip=self.net.node_ip(index),
                clock_file=self.root / "clock" / f"n{index}",
            )
            node.clock_file.write_text("+0\n")
            self.nodes[node.id] = node

    def command(self, node: NodeProcess) -> list[str]:
        assert isinstance(node, NsNode)
        env = [
            "PYTHONUNBUFFERED=1",
            # The nodes run this checkout's code, whatever is installed in the
            # venv (a bisect runs an older checkout with today's venv).
            "PYTHONPATH=" + os.pathsep.join(map(str, (SHIM_DIR, REPO_ROOT / "src", REPO_ROOT))),
        ]
        if self.faketime:
            env += [
                f"LD_PRELOAD={self.faketime}",
                f"FAKETIME_TIMESTAMP_FILE={node.clock_file}",
                "FAKETIME_NO_CACHE=1",
                "FAKETIME_DONT_FAKE_MONOTONIC=1",
            ]
        args = ["ip", "netns", "exec", self.net.namespace(node.index), "env", *env]
        args += [sys.executable, "-m", "raftsched", "node", "--id", node.id]
        args += ["--data-dir", str(node.data_dir), "--http", f"{node.ip}:{node.http_port}"]
        args += ["--raft", node.raft_address, "--secret-file", str(self.secret_file)]
        args += ["--durability", self.durability, "--log-format", "json"]
        # Namespaced 10.77.x addresses are not loopback, but the chaos network
        # is private to this machine: plain HTTP is what it tests.
        args += ["--insecure-http"]
        # The webhook receiver (chaos/receiver.py) listens on the bridge's host
        # address, a private one: allowed as a target, nothing else is.
        args += ["--webhook-allow-cidr", f"{self.net.host_ip}/32"]
        args += ["--admin-token-file", str(self.admin_token_file)]
        for other in self.nodes.values():
            if other.id != node.id:
                args += ["--peer", f"{other.id}={other.raft_address}@{other.http_url}"]
        return args

    def node(self, index: int) -> NsNode:
        found = self.nodes[f"n{index}"]
        assert isinstance(found, NsNode)
        return found

    def set_clock_offset(self, index: int, offset_s: float) -> None:
        """libfaketime re-reads the file on every clock call (FAKETIME_NO_CACHE)."""
        path = self.node(index).clock_file
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+.3f}\n")
        tmp.replace(path)
