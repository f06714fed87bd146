"""The raftsched cluster under test: `raftsched.testing.LocalCluster`, except
that each node runs inside its own network namespace (`ip netns exec`, which
execs, so the process id is the node's and the harness stays its parent: the
node dies with the harness, see raftsched.child_processes) and under
libfaketime with its own clock-offset file, the monotonic clock left real.

Namespaces are *slots*: the network is built with more slots than the
cluster starts with, so that the nemesis can add members and replace them by
new ones (each new member gets a fresh slot, hence a fresh id `n<slot>`,
address and data directory; ids are never reused within a run). Every slot's
URL is known from the start, so clients and workers are given all of them
and reach whoever is a member now (a slot without a node refuses the
connection at once; a removed node answers 503).

Besides, per node: an older release to run (`python`, `source_dir`: the
mixed-version phase), a data directory on a size-limited tmpfs (disk-full
faults), and an `LD_PRELOAD` shim that fails the journal's fsync once a
trigger file exists (fsync faults). The cluster also watches its processes:
every exit is recorded once, as expected (the harness killed or stopped it,
or an fsync fault was injected and it exited 74, the documented fail-stop)
or not.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.net import Network
from raftsched.shards import SHARD_HEADER
from raftsched.testing import LocalCluster, NodeProcess, http_json, process_running

HTTP_PORT = 8080
RAFT_PORT = 9090
SHIM_DIR = Path(__file__).resolve().parent / "shim"
REPO_ROOT = Path(__file__).resolve().parent.parent
FSYNC_SHIM_SOURCE = REPO_ROOT / "tests" / "faults" / "fsync_eio.c"
EXIT_STORAGE_FAILED = 74  # raftsched.raft_journal.EXIT_STORAGE_FAILED (EX_IOERR)
# How long a node's shard processes may outlive the node's own exit.
SHARD_EXIT_WAIT_S = 5.0


@dataclass
class NsNode(NodeProcess):
    index: int = 0  # the slot: namespace, address
    ip: str = ""
    clock_file: Path = Path()
    fsync_trigger: Path = Path()
    fsync_hits: Path = Path()  # the shim appends each failed call's name
    # The release it runs ("current", or the previous release's version).
    release: str = "current"
    # tmpfs mounted on its data directory (disk-full faults).
    tmpfs: bool = False
    # Set when the harness kills or stops the process (an expected exit),
    # and the exit status an injected fault makes expected.
    stopped_by_harness: bool = False
    expected_exit_code: int | None = None
    # The process whose exit was reported (the same object, not its pid:
    # a restart must never make the old exit look unreported).
    reported: subprocess.Popen[bytes] | None = None
    extra_logs: list[Path] = field(default_factory=list)

    @property
    def http_url(self) -> str:
        return f"http://{self.ip}:{self.http_port}"

    @property
    def raft_address(self) -> str:
        return f"{self.ip}:{self.raft_port}"


class NsCluster(LocalCluster):
    """Build with `NsCluster(root, size, env=..., net=..., faketime=...)`;
    `net.size` slots, the first `size` of them members at the start."""

    net: Network
    faketime: str | None

    def __init__(
        self,
        root: Path,
        size: int,
        net: Network,
        faketime: str | None,
        env: dict[str, str] | None = None,
        fsync_shim: Path | None = None,
        tmpfs_size: str | None = None,
        shards: int = 1,
    ) -> None:
        self.net = net
        self.faketime = faketime
        self.fsync_shim = fsync_shim
        self.tmpfs_size = tmpfs_size
        self.mounts: list[Path] = []
        self.exits: list[dict[str, Any]] = []
        self._undrained: list[dict[str, Any]] = []
        self._exit_lock = threading.Lock()
        super().__init__(root=root, size=size, env=dict(env or {}), shards=shards)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.secret_file = self.root / "secret"
        self.secret_file.write_text(secrets.token_urlsafe(32))
        self.secret_file.chmod(0o600)
        self.prepare_admin_token()
        (self.root / "clock").mkdir(exist_ok=True)
        (self.root / "faults").mkdir(exist_ok=True)
        for index in range(1, self.size + 1):
            self._make_node(index)

    def _make_node(self, index: int) -> NsNode:
        node = NsNode(
            id=f"n{index}",
            http_port=HTTP_PORT,
            raft_port=RAFT_PORT,
            data_dir=self.root / f"n{index}",
            log_path=self.root / f"n{index}.log",
            index=index,
            ip=self.net.node_ip(index),
            clock_file=self.root / "clock" / f"n{index}",
            fsync_trigger=self.root / "faults" / f"fail-fsync-n{index}",
            fsync_hits=self.root / "faults" / f"fsync-hits-n{index}",
        )
        node.clock_file.write_text("+0\n")
        if self.tmpfs_size is not None:
            node.tmpfs = self._mount_tmpfs(node.data_dir)
        self.nodes[node.id] = node
        return node

    def _mount_tmpfs(self, path: Path) -> bool:
        path.mkdir(parents=True, exist_ok=True)
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.tmpfs_size},mode=0755", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if mounted.returncode != 0:
            print(f"chaos: no tmpfs for {path}: {mounted.stderr.strip()}", file=sys.stderr)
            return False
        self.mounts.append(path)
        return True

    def unmount_all(self) -> None:
        """Lazy: a process that outlived the run may still hold files."""
        for path in self.mounts:
            subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)
        self.mounts.clear()

    # -- membership -----------------------------------------------------------

    def free_slot(self) -> int | None:
        used = {node.index for node in self.ns_nodes()}
        return next((i for i in range(1, self.net.size + 1) if i not in used), None)

    def new_node(self, node_id: str | None = None) -> NsNode:
        """A node on a fresh slot (its own namespace, address and data
        directory), not started and not a member: add it, then
        `start_joining` it."""
        slot = self.free_slot()
        if slot is None:
            raise RuntimeError("no free slot for a new node")
        return self._make_node(slot)

    def forget(self, node_id: str) -> None:
        """A node that was never added (its add was refused): its slot stays
        taken (ids are not reused), its directory is left for the record."""
        self.nodes[node_id].removed = True

    def ns_nodes(self) -> list[NsNode]:
        return [node for node in self.nodes.values() if isinstance(node, NsNode)]

    def members(self) -> list[NsNode]:
        """The nodes that are members (not removed), in slot order."""
        return sorted((n for n in self.ns_nodes() if not n.removed), key=lambda n: n.index)

    def member_urls(self) -> list[str]:
        return [node.http_url for node in self.members()]

    def slot_urls(self) -> list[str]:
        """Every slot's URL, members or not yet (see the module docstring)."""
        return [f"http://{self.net.node_ip(i)}:{HTTP_PORT}" for i in range(1, self.net.size + 1)]

    # -- processes --------------------------------------------------------------

    def command(self, node: NodeProcess) -> list[str]:
        assert isinstance(node, NsNode)
        source = node.source_dir or REPO_ROOT / "src"
        env = [
            "PYTHONUNBUFFERED=1",
            # The nodes run this checkout's code, whatever is installed in the
            # venv (a bisect runs an older checkout with today's venv), or the
            # previous release's (the mixed-version phase).
            "PYTHONPATH=" + os.pathsep.join(map(str, (SHIM_DIR, source, REPO_ROOT))),
        ]
        preload = []
        if self.fsync_shim is not None:
            preload.append(str(self.fsync_shim))
            env += [
                f"RAFTSCHED_FAULT_FSYNC_TRIGGER={node.fsync_trigger}",
                f"RAFTSCHED_FAULT_FSYNC_SUFFIX=/{node.id}/raft/raft.journal",
                f"RAFTSCHED_FAULT_FSYNC_HITS={node.fsync_hits}",
            ]
        if self.faketime:
            preload.append(self.faketime)
            env += [
                f"FAKETIME_TIMESTAMP_FILE={node.clock_file}",
                "FAKETIME_CACHE_DURATION=1",
                "FAKETIME_DONT_FAKE_MONOTONIC=1",
            ]
        if preload:
            env.append("LD_PRELOAD=" + " ".join(preload))
        env += [f"{key}={value}" for key, value in node.env.items()]
        args = ["ip", "netns", "exec", self.net.namespace(node.index), "env", *env]
        args += [node.python or sys.executable, "-m", "raftsched", "node", "--id", node.id]
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
        if self.shards > 1:
            # Shard k's Raft port is the node's + k x stride on the node's own
            # address: the partitions (iptables on the sender's address, every
            # port) cut every group's traffic between two nodes alike.
            args += ["--shards", str(self.shards)]
            args += ["--shard-port-stride", str(self.shard_port_stride)]
        if node.join_url is not None:
            args += ["--join", node.join_url]
        else:
            # Where it starts; a restarted node takes the current membership
            # from its journal and snapshot (docs/operations.md).
            for other in self.ns_nodes():
                if other.id != node.id and not other.removed and other.join_url is None:
                    args += ["--peer", f"{other.id}={other.raft_address}@{other.http_url}"]
        return args

    def start(self, node_id: str | None = None) -> None:
        """One node, or every member that is not running (never a removed one)."""
        targets = [node_id] if node_id else [n.id for n in self.members()]
        for target in targets:
            node = self.nodes[target]
            assert isinstance(node, NsNode)
            if node.alive:
                continue
            # Under the lock: another thread's reap must see either the old
            # process with the harness's flag or the new one without it.
            with self._exit_lock:
                self._reap_locked()
                node.stopped_by_harness = False
                super().start(target)

    def shard_pids(self, node_id: str) -> dict[int, int]:
        """shard -> pid of the node's running shard processes: its children
        (from /proc, so this works while the node is stopped too), named by
        the node's `GET /v1/cluster` when it answers, else by start order."""
        node = self.ns_node(node_id)
        process = node.process
        if process is None or process.poll() is not None:
            return {}
        children = _children(process.pid)
        found: dict[int, int] = {}
        view = self.shard_views(node_id) if not node.paused else None
        by_pid = {int(v["pid"]): int(v["shard"]) for v in view or [] if v.get("pid")}
        for pid in children:
            if pid in by_pid:
                found[by_pid[pid]] = pid
        if not found:
            found = {i + 1: pid for i, pid in enumerate(sorted(children))}
        return found

    def kill_with_shards(self, node_id: str, signum: int = signal.SIGKILL) -> dict[str, Any]:
        """`kill` the node, and see that its shard processes went with it
        (a SIGKILLed node's die by the kernel's parent-death signal, a
        SIGTERMed node stops its own): {pids: the shard processes it ran,
        left: those still running SHARD_EXIT_WAIT_S after the node's exit}."""
        pids = sorted(self.shard_pids(node_id).values()) if self.shards > 1 else []
        self.kill(node_id, signum)
        deadline = time.monotonic() + SHARD_EXIT_WAIT_S
        left = [pid for pid in pids if process_running(pid)]
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [pid for pid in left if process_running(pid)]
        return {"pids": pids, "left": left}

    def pause(self, node_id: str) -> None:
        """SIGSTOP the node and its shard processes: a stopped machine (or VM)
        stops every process on it. Each shard process is in a session of its
        own, so it is stopped by its pid."""
        pids = list(self.shard_pids(node_id).values())
        super().pause(node_id)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def resume(self, node_id: str) -> None:
        for pid in self.shard_pids(node_id).values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        super().resume(node_id)

    def member_views(self, node_id: str, timeout_s: float = 5.0) -> dict[str, Any]:
        """shard -> the node's `GET /v1/cluster` for that group alone
        (`Raftsched-Shard: k`; shard 0: without the header, so with
        `shards` and `membership.shards_behind`), None where it did not
        answer."""
        views: dict[str, Any] = {"0": self.cluster_view(node_id, timeout_s=timeout_s)}
        for shard in range(1, self.shards):
            try:
                status, body, _ = http_json(
                    "GET", self.nodes[node_id].http_url + "/v1/cluster", timeout_s=timeout_s,
                    token=self.admin_token, headers={SHARD_HEADER: str(shard)},
                )  # fmt: skip
            except OSError:
                body, status = None, 0
            views[str(shard)] = body if status == 200 else None
        return views

    def shard_digests(self, timeout_s: float = 5.0) -> dict[int, dict[str, tuple[int, str]]]:
        """shard -> node id -> (applied index, digest) of every serving node
        (`/v1/debug/digest` with the `Raftsched-Shard` header)."""
        found: dict[int, dict[str, tuple[int, str]]] = {}
        for shard in range(self.shards):
            found[shard] = {}
            for node in self.members():
                if not node.serving:
                    continue
                try:
                    status, body, _ = http_json(
                        "GET", node.http_url + "/v1/debug/digest", timeout_s=timeout_s,
                        token=self.admin_token, headers={SHARD_HEADER: str(shard)},
                    )  # fmt: skip
                except OSError:
                    continue
                if status == 200:
                    found[shard][node.id] = (body["applied_index"], body["digest"])
        return found

    def kill(self, node_id: str, signum: int = signal.SIGKILL) -> None:
        node = self.nodes[node_id]
        if signum in (signal.SIGKILL, signal.SIGTERM) and isinstance(node, NsNode):
            with self._exit_lock:
                self._reap_locked()  # an exit before this kill is not the harness's doing
                node.stopped_by_harness = True
        super().kill(node_id, signum)

    def stop(self) -> None:
        for node in self.ns_nodes():
            node.stopped_by_harness = True
        super().stop()

    def reap_exits(self) -> list[dict[str, Any]]:
        """Exits not reported yet: {node, code, expected, release}; each
        process is reported once. Expected: the harness killed or stopped
        it, or it exited with the status its injected fault calls for."""
        with self._exit_lock:
            return self._reap_locked()

    def _reap_locked(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for node in self.ns_nodes():
            process = node.process
            if process is None or node.reported is process:
                continue
            code = process.poll()
            if code is None:
                continue
            node.reported = process
            expected = node.stopped_by_harness or (
                node.expected_exit_code is not None and code == node.expected_exit_code
            )
            record = {"node": node.id, "code": code, "expected": expected,
                      "release": node.release, "t": time.time()}  # fmt: skip
            if node.expected_exit_code is not None and not node.stopped_by_harness:
                record["injected_fault_exit"] = node.expected_exit_code
            found.append(record)
        self.exits.extend(found)
        self._undrained.extend(found)
        return found

    def drain_exits(self) -> list[dict[str, Any]]:
        """Every exit found (by any `reap_exits`) since the last drain."""
        self.reap_exits()
        with self._exit_lock:
            found, self._undrained = self._undrained, []
        return found

    # -- faults -----------------------------------------------------------------

    def node(self, index: int) -> NsNode:
        found = self.nodes[f"n{index}"]
        assert isinstance(found, NsNode)
        return found

    def ns_node(self, node_id: str) -> NsNode:
        found = self.nodes[node_id]
        assert isinstance(found, NsNode)
        return found

    def set_clock_offset(self, index: int, offset_s: float) -> None:
        """libfaketime re-reads the file at most once a second
        (FAKETIME_CACHE_DURATION=1; docs/chaos.md says why not on every call)."""
        path = self.node(index).clock_file
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+.3f}\n")
        tmp.replace(path)

    def fsync_fault(self, node_id: str, on: bool) -> None:
        """Arm or disarm the shim: the node's journal fsync fails with EIO
        while its trigger file exists."""
        node = self.ns_node(node_id)
        if on:
            node.expected_exit_code = EXIT_STORAGE_FAILED
            node.fsync_hits.unlink(missing_ok=True)
            node.fsync_trigger.touch()
        else:
            node.fsync_trigger.unlink(missing_ok=True)

    def fsync_fault_hits(self, node_id: str) -> list[str]:
        """The calls the shim failed since the node was last armed."""
        path = self.ns_node(node_id).fsync_hits
        return path.read_text().split() if path.exists() else []


def _children(pid: int) -> list[int]:
    """The direct children of `pid` (every thread's), from /proc."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return sorted(set(found))


def build_fsync_shim(out: Path) -> Path | None:
    """tests/faults/fsync_eio.c compiled with cc, or None without a compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not FSYNC_SHIM_SOURCE.exists():
        return None
    library = out / "fsync_eio.so"
    with contextlib.suppress(subprocess.CalledProcessError):
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(FSYNC_SHIM_SOURCE),
             "-ldl"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        return library
    return None


def fill_disk(directory: Path) -> Path:
    """Write one file until the filesystem is full (a real ENOSPC for the
    node on it); removing the file gives the space back."""
    filler = directory / "chaos-filler"
    chunk = b"\xa5" * (256 * 1024)
    with open(filler, "wb", buffering=0) as handle:
        while True:
            try:
                handle.write(chunk)
            except OSError:
                break
        with contextlib.suppress(OSError):  # the last pages, smaller than a chunk
            while handle.write(b"\xa5" * 4096):
                pass
    return filler
