"""Child processes that die with their parent, however the parent ends.

A parent killed with SIGKILL runs no cleanup, so its children must be told by
the kernel: on Linux, `prctl(PR_SET_PDEATHSIG, SIGKILL)` makes the kernel
kill a process when its parent dies. Three facts shape how it is used here:

- The setting belongs to the child and must be made after the fork. Setting
  it in `preexec_fn` is not safe in a parent with threads, so the child sets
  it itself, first thing at its own startup, when `CHILD_OF_ENV` in its
  environment names the pid of the parent that started it (`die_with_parent`).
  Python starts in a fraction of a second; a parent that dies in that window
  is caught by comparing `getppid()` with that pid after `prctl`.
- The "parent" is the *thread* that forked. A child started from a thread
  that later exits (a chaos nemesis thread restarting a node) would be killed
  with that thread, so `popen` starts children from the main thread or, when
  called from any other, from one spawner thread that lives as long as the
  process does.
- SIGKILL, not SIGTERM: a node paused with SIGSTOP must die too, and nodes
  are built to survive being killed (the journal is the truth).

A child that forks without exec (a node's snapshot writer) calls
`die_with(parent_pid)` right after the fork. Elsewhere than Linux there is no
death signal (only the check at startup): children there outlive a killed
parent.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO

CHILD_OF_ENV = "RAFTSCHED_CHILD_OF"
# Exit status of a child whose parent was already gone when it started.
ORPHANED_EXIT_STATUS = 70
PR_SET_PDEATHSIG = 1

_spawner: ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def popen(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdin: int | IO[bytes] | None = None,
    stdout: int | IO[bytes] | None = None,
    stderr: int | IO[bytes] | None = None,
    start_new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start `command`, whose entry point calls `die_with_parent`, so that it
    dies with this process: its environment names this process as parent."""
    child_env = {**(os.environ if env is None else env), CHILD_OF_ENV: str(os.getpid())}

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(command),
            env=child_env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=start_new_session,
        )

    if threading.current_thread() is threading.main_thread():
        return start()
    return _spawner_thread().submit(start).result()


def _spawner_thread() -> ThreadPoolExecutor:
    """One worker thread that never exits before the process does (the
    module keeps the executor, so it is never collected and shut down)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="child-spawner")
        return _spawner


def die_with_parent() -> None:
    """In a child's entry point: die with the parent that `popen` started us
    from, if it did. The variable is removed, so our own children do not
    mistake our parent for theirs."""
    named = os.environ.pop(CHILD_OF_ENV, None)
    if named is None or not named.isdigit():
        return
    die_with(int(named))


def die_with(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent thread exits,
    and exit now if `parent_pid` is no longer our parent (it died first)."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    if os.getppid() != parent_pid:
        sys.stderr.write(
            f"raftsched: parent process {parent_pid} is gone "
            f"(parent is now {os.getppid()}); exiting\n"
        )
        sys.stderr.flush()
        os._exit(ORPHANED_EXIT_STATUS)
