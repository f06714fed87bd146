"""Network namespaces, a bridge, and iptables partitions between them.

Every node lives in its own namespace with one veth leg on a bridge that this
run creates; the host side of the bridge has an address too, so clients,
workers and the sink (all on the host) reach every node. Partitions are
iptables DROP rules in a `CHAOS` chain inside the *receiving* node's
namespace, matched on the sender's address: a rule in B's namespace with
source A drops A->B only (a one-way drop); both rules cut the pair. Traffic
from the host address is never dropped, as in Jepsen: the nemesis cuts the
cluster, not the observer.

Names carry a per-run index `k` (bridge `rsck<k>`, namespaces `rsck<k>n<i>`,
subnet 10.77.<k>.0/24) so concurrent runs do not clash; a state file under
STATE_DIR records which process owns them, so a later run removes whatever
a crashed run left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

STATE_DIR = Path("/run/raftsched-chaos")
SUBNET_PREFIX = "10.77"
INDEX_MAX = 250
APT_PACKAGES = ("iptables", "faketime", "libfaketime")
FAKETIME_LIBRARY_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=30)


def ensure_tools() -> None:
    """Install iptables and libfaketime through apt if missing (idempotent)."""
    missing = shutil.which("iptables") is None or not faketime_library()
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", *APT_PACKAGES], check=True, env=env, timeout=600
    )
    if shutil.which("iptables") is None or not faketime_library():
        raise RuntimeError("iptables or libfaketime still missing after apt-get install")


def faketime_library() -> str | None:
    import glob

    found = sorted(glob.glob(FAKETIME_LIBRARY_GLOB))
    return found[0] if found else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Network:
    index: int
    size: int
    state_file: Path = field(init=False)
    ready: bool = False

    def __post_init__(self) -> None:
        self.state_file = STATE_DIR / f"{self.index}.json"

    # -- names ----------------------------------------------------------------

    @property
    def bridge(self) -> str:
        return f"rsck{self.index}"

    @property
    def host_ip(self) -> str:
        return f"{SUBNET_PREFIX}.{self.index}.1"

    def namespace(self, node: int) -> str:
        return f"rsck{self.index}n{node}"

    def node_ip(self, node: int) -> str:
        return f"{SUBNET_PREFIX}.{self.index}.{10 + node}"

    def _veth(self, node: int) -> tuple[str, str]:
        return f"rsck{self.index}v{node}h", f"rsck{self.index}v{node}c"

    # -- setup and teardown -------------------------------------------------

    @classmethod
    def create(cls, size: int) -> Network:
        """Claim a free index (the bridge creation is the lock) and build it."""
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        cleanup_leftovers()
        for index in range(1, INDEX_MAX + 1):
            if (STATE_DIR / f"{index}.json").exists():
                continue
            net = cls(index, size)
            if sh("ip", "link", "add", net.bridge, "type", "bridge", check=False).returncode:
                continue
            net._write_state()
            try:
                net._build()
            except BaseException:
                net.teardown()
                raise
            return net
        raise RuntimeError("no free chaos network index")

    def _write_state(self) -> None:
        namespaces = [self.namespace(i) for i in range(1, self.size + 1)]
        state = {"pid": os.getpid(), "bridge": self.bridge, "namespaces": namespaces}
        self.state_file.write_text(json.dumps(state))

    def _build(self) -> None:
        sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        # With br_netfilter loaded, bridged frames traverse the host's FORWARD
        # chain; make sure a DROP policy there (docker sets one) lets ours by.
        sh("iptables", "-I", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT")
        for node in range(1, self.size + 1):
            ns = self.namespace(node)
            host_leg, ns_leg = self._veth(node)
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", host_leg, "type", "veth", "peer", "name", ns_leg)
            sh("ip", "link", "set", ns_leg, "netns", ns)
            sh("ip", "link", "set", host_leg, "master", self.bridge)
            sh("ip", "link", "set", host_leg, "up")
            self.exec(node, "ip", "addr", "add", f"{self.node_ip(node)}/24", "dev", ns_leg)
            self.exec(node, "ip", "link", "set", ns_leg, "up")
            self.exec(node, "ip", "link", "set", "lo", "up")
            self.exec(node, "iptables", "-N", "CHAOS")
            self.exec(node, "iptables", "-I", "INPUT", "-j", "CHAOS")
        self.ready = True

    def teardown(self) -> None:
        """Remove everything this run made; never raises (used on failure paths)."""
        for node in range(1, self.size + 1):
            ns = self.namespace(node)
            _kill_namespace_processes(ns)
            sh("ip", "netns", "del", ns, check=False)
        sh(
            "iptables", "-D", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT",
            check=False,
        )  # fmt: skip
        sh("ip", "link", "del", self.bridge, check=False)
        self.state_file.unlink(missing_ok=True)
        self.ready = False

    # -- partitions -------------------------------------------------------

    def exec(self, node: int, *args: str) -> None:
        sh("ip", "netns", "exec", self.namespace(node), *args)

    def drop(self, sender: int, receiver: int) -> None:
        """Drop every packet from `sender` to `receiver` (one direction)."""
        self.exec(receiver, "iptables", "-A", "CHAOS", "-s", self.node_ip(sender), "-j", "DROP")

    def cut(self, a: int, b: int) -> None:
        self.drop(a, b)
        self.drop(b, a)

    def heal(self) -> None:
        for node in range(1, self.size + 1):
            self.exec(node, "iptables", "-F", "CHAOS")


def _kill_namespace_processes(ns: str) -> None:
    result = sh("ip", "netns", "pids", ns, check=False)
    for text in result.stdout.split():
        if text.isdigit():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(text), 9)


def cleanup_leftovers() -> list[str]:
    """Remove networks (and their node processes) whose owning run is dead."""
    removed: list[str] = []
    if not STATE_DIR.exists():
        return removed
    for path in sorted(STATE_DIR.glob("*.json")):
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if _pid_alive(int(state.get("pid", 0))):
            continue
        net = Network(int(path.stem), len(state.get("namespaces", [])))
        net.teardown()
        removed.append(net.bridge)
    return removed
