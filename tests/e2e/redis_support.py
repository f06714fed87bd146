"""A real Redis server for the relay tests: Debian's `redis-server` on a free
loopback port (or in a network namespace of its own) with a directory of its
own, its stream kept in an append-only file synced at every write, so that a
stop and a restart keep every entry it confirmed. Stopped (and waited for)
at the end. The driver shape every broker shares is in broker_support.py."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import redis
from broker_support import Received, Restartable, end_process, free_port, netns_argv

from raftsched.testing import redis_server_argv

PORT_IN_NAMESPACE = 6379


class RedisServer(Restartable):
    kind = "redis"

    def __init__(
        self,
        binary: str,
        root: Path,
        password: str,
        host: str = "127.0.0.1",
        netns: str | None = None,
    ) -> None:
        self.binary = binary
        self.root = root
        self.password = password
        self.host = host
        self.netns = netns
        self.port = free_port() if netns is None else PORT_IN_NAMESPACE
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        # Commands counted by the servers stopped so far (INFO commandstats
        # starts again at every start).
        self._calls_before: dict[str, int] = {}
        root.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{self.host}:{self.port}/0"

    def sink(self, destination: str) -> dict[str, Any]:
        return {"kind": "redis", "url": self.url, "stream": destination, "maxlen": 1_000_000}

    def prepare(self, destination: str) -> None:
        """Nothing: `XADD` makes the stream."""

    def received(self, destination: str) -> list[Received]:
        rows = []
        for _, fields in self.client().xrange(destination):
            entry = {name.decode(): value.decode() for name, value in fields.items()}
            rows.append(
                Received(
                    entry["id"],
                    entry["type"],
                    int(entry["seq"]),
                    entry["tenant"],
                    entry["key"],
                    int(entry["shard"]),
                    json.loads(entry["data"]),
                )
            )
        return rows

    def refuse(self, destination: str) -> None:
        """A key of the wrong type: `XADD` answers WRONGTYPE."""
        self.client().set(destination, "a string, not a stream")

    def accept(self, destination: str) -> None:
        self.client().delete(destination)

    def dropped_repeats(self) -> int:
        """Every message the relay sent ran one GET of its dedup key in the
        script, and one XADD unless the window dropped it."""
        return self.calls("get") - self.calls("xadd")

    def start(self) -> None:
        assert self.process is None
        log = open(self.root / "redis.log", "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            netns_argv(
                self.netns,
                redis_server_argv(self.binary, self.host, self.port, self.root, self.password),
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 20
        while True:
            try:
                if self.client().ping():
                    return
            except redis.exceptions.RedisError:
                pass
            assert self.process.poll() is None, "redis-server exited; see redis.log"
            assert time.monotonic() < deadline, "redis-server did not answer"
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM: Redis syncs its append-only file and exits."""
        if self.process is None:
            return
        try:
            # Writes (the relay's scripts) wait from here, so that the counts
            # read are the server's last.
            self.client().execute_command("CLIENT", "PAUSE", "30000", "WRITE")
            for name, calls in self._calls_now().items():
                self._calls_before[name] = self._calls_before.get(name, 0) + calls
        except redis.exceptions.RedisError:
            pass
        end_process(self.process)
        self.process = None

    def calls(self, command: str) -> int:
        """How many times `command` ran (scripts' commands too), over restarts."""
        return self._calls_before.get(command, 0) + self._calls_now().get(command, 0)

    def _calls_now(self) -> dict[str, int]:
        stats = self.client().info("commandstats")
        return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}

    def client(self) -> Any:
        return redis.Redis(host=self.host, port=self.port, password=self.password, socket_timeout=5)
