"""Children started through raftsched.child_processes die with their parent:
started from the main thread, from a thread that has since exited, or forked
without exec (as a node's snapshot writer is), when the parent is SIGKILLed;
and a child whose parent died before it could ask exits at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftsched.child_processes import CHILD_OF_ENV, ORPHANED_EXIT_STATUS
from raftsched.testing import process_running, wait_for

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")

SLEEPER = (
    "from raftsched.child_processes import die_with_parent\n"
    "die_with_parent()\n"
    "print('ready', flush=True)\n"
    "import time; time.sleep(60)\n"
)

PARENT = f"""
import json, os, sys, threading, time
from raftsched import child_processes

import subprocess
sleeper = [sys.executable, "-c", {SLEEPER!r}]

def start_sleeper():
    child = child_processes.popen(sleeper, stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"ready\\n"  # it has called prctl
    return child

from_main = start_sleeper()
started = []
thread = threading.Thread(target=lambda: started.append(start_sleeper()))
thread.start()
thread.join()  # the thread that started this child (and waited for its prctl) is gone
parent_pid = os.getpid()
forked = os.fork()
if forked == 0:
    child_processes.die_with(parent_pid)
    time.sleep(60)
    os._exit(0)
pids = [from_main.pid, started[0].pid, forked]
with open(sys.argv[1] + ".tmp", "w") as handle:
    json.dump(pids, handle)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""


# A one-node Raft whose snapshots take a minute, in the child the adapter
# forks for them (from its tick thread, without exec).
SNAPSHOTTING_PARENT = """
import sys, threading, time
from pathlib import Path
from raftsched.raft import RaftNode
from raftsched.testing import free_port

class SlowSnapshots:
    def __init__(self):
        self.lock = threading.RLock()
    def apply(self, data):
        return None
    def snapshot(self):
        time.sleep(60)
        return [b""]
    def restore(self, data):
        pass

root = Path(sys.argv[1])
node = RaftNode(node_id="solo", raft_address=f"127.0.0.1:{free_port()}", peers={},
                data_dir=root / "data", secret="s" * 32, machine=SlowSnapshots(),
                durability="none", log_compaction_entries=5)
node.start()
deadline = time.monotonic() + 30
while node._snapshot_child is None and time.monotonic() < deadline:
    if node.is_leader():
        done = threading.Event()
        node.propose(b"entry", lambda result, error: done.set())
        done.wait(5)
    time.sleep(0.05)
(root / "pid.tmp").write_text(str(node._snapshot_child))
(root / "pid.tmp").rename(root / "pid")
time.sleep(120)
"""


def test_children_die_when_the_parent_is_sigkilled(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids.json"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(pids_file)])
    pids: list[int] = []
    try:
        assert wait_for(pids_file.exists, 30), "the parent did not start its children"
        pids = json.loads(pids_file.read_text())
        # Give a child that was going to die with its starting thread time to.
        time.sleep(0.5)
        assert [pid for pid in pids if not process_running(pid)] == []
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert wait_for(lambda: not any(process_running(pid) for pid in pids), 5), [
            pid for pid in pids if process_running(pid)
        ]
    finally:
        parent.kill()
        parent.wait(timeout=10)
        for pid in pids:
            if process_running(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_child_whose_parent_is_already_gone_exits_at_once() -> None:
    # The child is told its parent is a process that has exited: as if that
    # parent had died between the fork and the child's prctl.
    exited = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    gone = subprocess.run(
        [sys.executable, "-c", SLEEPER.replace("ready", "still here")],
        env={**os.environ, CHILD_OF_ENV: exited.stdout.strip()},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert gone.returncode == ORPHANED_EXIT_STATUS and gone.stdout == ""
    assert "is gone" in gone.stderr


def test_the_variable_is_not_passed_on_to_grandchildren() -> None:
    script = (
        "import os\n"
        "from raftsched.child_processes import die_with_parent\n"
        "die_with_parent()\n"
        f"print(os.environ.get({CHILD_OF_ENV!r}))\n"
    )
    from raftsched import child_processes

    child = child_processes.popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    output, _ = child.communicate(timeout=30)
    assert child.returncode == 0 and output == b"None\n"


def test_a_snapshot_writer_dies_with_its_node(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    node = subprocess.Popen([sys.executable, "-c", SNAPSHOTTING_PARENT, str(tmp_path)])
    pids: list[int] = []
    try:
        assert wait_for(pid_file.exists, 60), "no snapshot was started"
        pids = [int(pid_file.read_text())]
        assert process_running(pids[0])
        node.send_signal(signal.SIGKILL)
        node.wait(timeout=10)
        assert wait_for(lambda: not process_running(pids[0]), 5), (
            "the snapshot writer outlived its node"
        )
    finally:
        node.kill()
        node.wait(timeout=10)
        for pid in pids:
            if process_running(pid):
                os.kill(pid, signal.SIGKILL)
