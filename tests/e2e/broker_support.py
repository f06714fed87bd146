"""What every broker the relay tests start shares (docs/relays.md, section 6):
the rows a broker kept (`Received`), free loopback ports (this
pytest-xdist worker's share), and a network
namespace of its own for a broker that a test partitions from the nodes.

A `BrokerNamespace` is one namespace with one veth pair: the host leg
10.78.<k>.1/30, the broker's leg 10.78.<k>.2/30. The nodes, the workers and
the test itself stay on the host and reach the broker at `broker_ip`. A
partition is iptables DROP rules inside the namespace, both ways, so that
the relay's connections hang and time out (as across a real network) rather
than being refused. The index `k` is taken by creating the namespace (the
name is unique), and a state file records the owner's pid, so that a later
run removes what a crashed run left behind; chaos/net.py's namespaces use
10.77.<k>, so the two never clash.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raftsched.testing import free_port  # this pytest-xdist worker's share of ports

__all__ = [
    "BrokerNamespace",
    "Received",
    "Restartable",
    "broker_namespace",
    "end_process",
    "free_port",
    "netns_argv",
]

STATE_DIR = Path("/run/raftsched-brokers")
INDEX_MAX = 250


@dataclass(frozen=True)
class Received:
    """One message a broker kept for a destination, as its consumer sees it."""

    id: str  # the event id (evt_<seq>, evt<k>_<seq>)
    type: str
    seq: int
    tenant: str
    key: str
    shard: int
    body: dict[str, Any]  # the JSON body (the webhook envelope)


class Restartable:
    """A broker driver's `restart`, from its own `stop` and `start`."""

    restarts: int

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def restart(self, down_s: float) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()
        self.restarts += 1


def end_process(process: subprocess.Popen[bytes], timeout_s: float = 20) -> None:
    """SIGTERM, then SIGKILL if `process` has not exited within `timeout_s`."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=30)


def netns_argv(netns: str | None, argv: list[str]) -> list[str]:
    """`argv`, run inside `netns` when one is given."""
    return argv if netns is None else ["ip", "netns", "exec", netns, *argv]


class BrokerNamespace:
    def __init__(self, index: int) -> None:
        self.index = index
        self.name = f"rsbr{index}"
        self.host_leg = f"rsbr{index}h"
        self.broker_leg = f"rsbr{index}b"
        self.host_ip = f"10.78.{index}.1"
        self.broker_ip = f"10.78.{index}.2"
        self.partitioned = False

    @classmethod
    def create(cls) -> BrokerNamespace:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        _remove_leftovers()
        for index in range(1, INDEX_MAX):
            if _sh("ip", "netns", "add", f"rsbr{index}", check=False).returncode == 0:
                space = cls(index)
                (STATE_DIR / str(index)).write_text(str(os.getpid()))
                try:
                    space._build()
                except BaseException:
                    space.remove()
                    raise
                return space
        raise RuntimeError("no free broker namespace index")

    def _build(self) -> None:
        _sh("ip", "link", "add", self.host_leg, "type", "veth", "peer", "name", self.broker_leg)
        _sh("ip", "link", "set", self.broker_leg, "netns", self.name)
        _sh("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_leg)
        _sh("ip", "link", "set", self.host_leg, "up")
        self.exec("ip", "addr", "add", f"{self.broker_ip}/30", "dev", self.broker_leg)
        self.exec("ip", "link", "set", self.broker_leg, "up")
        self.exec("ip", "link", "set", "lo", "up")

    def exec(self, *args: str) -> None:
        _sh("ip", "netns", "exec", self.name, *args)

    def partition(self) -> None:
        """Drop everything between the host and the broker, both ways."""
        self.exec("iptables", "-I", "INPUT", "-s", self.host_ip, "-j", "DROP")
        self.exec("iptables", "-I", "OUTPUT", "-d", self.host_ip, "-j", "DROP")
        self.partitioned = True

    def heal(self) -> None:
        self.exec("iptables", "-F", "INPUT")
        self.exec("iptables", "-F", "OUTPUT")
        self.partitioned = False

    def remove(self) -> None:
        _remove(self.index)


def _remove(index: int) -> None:
    name = f"rsbr{index}"
    pids = _sh("ip", "netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)
    _sh("ip", "link", "del", f"rsbr{index}h", check=False)  # its peer goes with it
    _sh("ip", "netns", "del", name, check=False)
    (STATE_DIR / str(index)).unlink(missing_ok=True)


def _remove_leftovers() -> None:
    """The namespaces of runs whose process is gone."""
    for state in STATE_DIR.iterdir():
        try:
            owner = int(state.read_text())
            os.kill(owner, 0)
        except (ValueError, ProcessLookupError):
            _remove(int(state.name))
        except PermissionError:
            continue


@contextlib.contextmanager
def broker_namespace() -> Iterator[BrokerNamespace]:
    """A namespace for one broker; skips, loudly, where none can be made."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("iptables") is None:
        pytest.skip(
            "relay partition tests SKIPPED: they need root, iproute2 and iptables "
            "(a network namespace for the broker)"
        )
    space = BrokerNamespace.create()
    try:
        yield space
    finally:
        space.remove()
