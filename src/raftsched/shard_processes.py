"""The node process's shard processes: started, watched, restarted, stopped.

A node of a sharded cluster (`--shards S`, docs/shards.md) runs group 0
itself and one child process per shard 1..S-1 (`python -m
raftsched.shard_process`), each a full member of its shard's Raft group.
The child is given its configuration (`NodeConfig.for_shard`, which holds
the cluster secret) as JSON on its standard input, never in its arguments.
Its output goes where the node's goes, each line naming `<node>/s<k>`.

- **Started** with the node, before it serves: the node's `/readyz` is not
  ready until every local shard replica is.
- **Watched**: a child that exits is logged at error level with its exit
  status and started again after a backoff that doubles from 0.5 s to 30 s,
  back to 0.5 s once a child has stayed up 30 s.
- **Stopped** with the node: SIGTERM, then SIGKILL for one that has not
  exited after `STOP_TIMEOUT_S`.
- **Dies with the node**: a child asks the kernel to kill it when its parent
  dies (`child_processes`), so a SIGKILLed node leaves no shard behind.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import time
from typing import Final

from raftsched import child_processes
from raftsched.config import NodeConfig, config_to_json

log = logging.getLogger("raftsched.shards")

BACKOFF_INITIAL_S: Final = 0.5
BACKOFF_MAX_S: Final = 30.0
# A child that ran this long had started well: the next restart waits the
# initial backoff again.
STABLE_S: Final = 30.0
STOP_TIMEOUT_S: Final = 10.0
POLL_S: Final = 0.1


class ShardProcess:
    """One shard's child process, restarted whenever it exits."""

    def __init__(self, config: NodeConfig, shard: int) -> None:
        self.shard = shard
        self.config = config.for_shard(shard)
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        process = self.process
        return None if process is None or process.poll() is not None else process.pid

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._spawn()
        self._task = loop.create_task(self._watch())

    def _spawn(self) -> None:
        command = [sys.executable, "-m", "raftsched.shard_process"]
        # A session of its own: a terminal's Ctrl-C reaches the node only,
        # which then stops its shard processes itself (and they die with it).
        process = child_processes.popen(command, stdin=subprocess.PIPE, start_new_session=True)
        assert process.stdin is not None
        try:
            process.stdin.write(json.dumps(config_to_json(self.config)).encode())
            process.stdin.close()
        except OSError as error:  # it died at once; the watcher sees its exit
            log.warning("could not hand shard %d its configuration: %s", self.shard, error)
        self.process = process
        log.info("started shard process %d (pid %d)", self.shard, process.pid)

    async def _watch(self) -> None:
        backoff_s = BACKOFF_INITIAL_S
        while not self._stopping:
            started = time.monotonic()
            process = self.process
            assert process is not None
            while process.poll() is None and not self._stopping:
                await asyncio.sleep(POLL_S)
            if self._stopping:
                return
            if time.monotonic() - started >= STABLE_S:
                backoff_s = BACKOFF_INITIAL_S
            log.error(
                "shard process %d (pid %d) exited with status %s; starting it again in %.1f s",
                self.shard,
                process.pid,
                _status(process.returncode),
                backoff_s,
                extra={"shard": self.shard, "exit_status": process.returncode},
            )
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)
            if self._stopping:
                return
            self.restarts += 1
            self._spawn()

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        if process.poll() is None:
            log.warning(
                "shard process %d did not stop in %.0f s; killing it", self.shard, STOP_TIMEOUT_S
            )
            process.kill()
            await asyncio.to_thread(process.wait)


def _status(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            return f"{returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            return str(returncode)
    return str(returncode)


class ShardProcesses:
    """Every shard process of this node (shards 1..S-1)."""

    def __init__(self, config: NodeConfig) -> None:
        self.children = {shard: ShardProcess(config, shard) for shard in range(1, config.shards)}

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        for child in self.children.values():
            child.start(loop)

    def pid(self, shard: int) -> int | None:
        child = self.children.get(shard)
        return None if child is None else child.pid

    async def stop(self) -> None:
        await asyncio.gather(*(child.stop() for child in self.children.values()))
