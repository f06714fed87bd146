"""A real NATS server with JetStream for the relay tests (the driver shape of
tests/e2e/broker_support.py): Debian's `nats-server` with a store directory
of its own, a user and password, on a free loopback port (or inside a network
namespace). Stopped (and waited for) at the end.

Durability: `sync_interval: always` (an fsync per message) where the server
takes it (2.10 on); Debian's 2.9.10 does not know the option, and then the
store is written at every message but synced by the server every 2 minutes
(its default) and at a graceful stop, which is what `stop()` does
(`durability` says which one a run got). A stop and a restart keep every
message the server confirmed; a power cut could lose the last ones on 2.9.

`received()` reads a destination's stream from its first message to its last
with JetStream's message get API, headers included; `refuse()` points the
stream at another subject, so that no stream captures the destination (the
publisher's refusal "no stream captures the subject") while what it stored
stays, and `accept()` points it back.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import nats
import nats.errors
from broker_support import Received, Restartable, end_process, free_port
from nats.aio.client import Client as NatsClient
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

T = TypeVar("T")

USER = "relay"
DUPLICATE_WINDOW_S = 120.0
NETNS_PORT = 4222


def stream_name(destination: str) -> str:
    """The stream `prepare` makes for a subject (stream names may not hold
    `.`, `*`, `>` or whitespace)."""
    readable = re.sub(r"[^A-Za-z0-9_-]", "_", destination)[:64]
    return f"{readable}-{hashlib.sha256(destination.encode()).hexdigest()[:8]}"


class NatsServer(Restartable):
    kind = "nats"

    def __init__(
        self,
        binary: str,
        root: Path,
        password: str,
        host: str = "127.0.0.1",
        netns: str | None = None,
    ) -> None:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+", password), "a password the config can hold"
        self.binary = binary
        self.root = root
        self.password = password
        self.host = host
        self.netns = netns
        self.port = free_port(host) if netns is None else NETNS_PORT
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.durability = ""
        root.mkdir(parents=True, exist_ok=True)
        self._config = root / "nats.conf"
        self._write_config()

    @property
    def url(self) -> str:
        return f"nats://{USER}:{self.password}@{self._netloc}"

    @property
    def _netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def _write_config(self) -> None:
        """With `sync_interval: always` if this server version takes it."""
        base = [
            f'listen: "{self._netloc}"',
            'server_name: "raftsched-relay-test"',
            f'authorization {{ user: "{USER}", password: "{self.password}" }}',
        ]
        store = json.dumps(str(self.root / "store"))
        limits = "max_memory_store: 64MB, max_file_store: 1GB"
        synced = [*base, f"jetstream {{ store_dir: {store}, {limits}, sync_interval: always }}"]
        self._config.write_text("\n".join(synced) + "\n")
        test = subprocess.run(
            [self.binary, "-t", "-c", str(self._config)], capture_output=True, timeout=30
        )
        if test.returncode == 0:
            self.durability = "sync_interval: always (an fsync per message)"
            return
        self._config.write_text(
            "\n".join([*base, f"jetstream {{ store_dir: {store}, {limits} }}"]) + "\n"
        )
        self.durability = (
            "written at every message, synced every 2 minutes and at a graceful stop "
            "(this nats-server has no sync_interval)"
        )

    def start(self) -> None:
        assert self.process is None
        argv = [self.binary, "-js", "-c", str(self._config)]
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        log = open(self.root / "nats.log", "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 20
        while True:
            try:
                self._run(lambda client: client.request("$JS.API.INFO", b"", timeout=2))
                return
            except (nats.errors.Error, OSError, TimeoutError):
                pass
            assert self.process.poll() is None, "nats-server exited; see nats.log"
            assert time.monotonic() < deadline, "nats-server did not answer"
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM: the server shuts JetStream down (its stores flushed and
        synced) and exits."""
        if self.process is None:
            return
        end_process(self.process)
        self.process = None

    def sink(self, destination: str) -> dict[str, Any]:
        return {"kind": "nats", "url": self.url, "subject": destination}

    def prepare(self, destination: str) -> None:
        """A file-stored stream capturing `destination`, with a duplicate
        window of `DUPLICATE_WINDOW_S`."""

        async def work(client: NatsClient) -> None:
            config = StreamConfig(
                name=stream_name(destination),
                subjects=[destination],
                storage=StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW_S,
                num_replicas=1,
            )
            await client.jetstream().add_stream(config)

        self._run(work)

    def limit(self, destination: str, max_msgs: int) -> None:
        """The destination's stream keeps at most `max_msgs` and refuses more
        (`discard new`): JetStream's "maximum messages exceeded" answer."""

        async def work(client: NatsClient) -> None:
            js = client.jetstream()
            info = await js.stream_info(stream_name(destination))
            config = info.config
            config.max_msgs, config.discard = max_msgs, DiscardPolicy.NEW
            await js.update_stream(config)

        self._run(work)

    def received(self, destination: str) -> list[Received]:
        """Every message the destination's stream holds, in its order."""

        async def work(client: NatsClient) -> list[Received]:
            js = client.jetstream()
            name = stream_name(destination)
            state = (await js.stream_info(name)).state
            rows: list[Received] = []
            if not state.messages:
                return rows
            for seq in range(state.first_seq, state.last_seq + 1):
                try:
                    msg = await js.get_msg(name, seq)
                except NotFoundError:  # removed (limits): not there to read
                    continue
                headers = msg.headers or {}
                rows.append(
                    Received(
                        id=headers["Nats-Msg-Id"],
                        type=headers["Raftsched-Type"],
                        seq=int(headers["Raftsched-Seq"]),
                        tenant=headers.get("Raftsched-Tenant", ""),
                        key=headers.get("Raftsched-Key", ""),
                        shard=int(headers["Raftsched-Shard"]),
                        body=json.loads(msg.data or b"null"),
                    )
                )
            return rows

        return self._run(work)

    def refuse(self, destination: str) -> None:
        """No stream captures `destination` any more (its stream keeps what
        it stored, under another subject until `accept`)."""
        self._point(destination, f"{destination}.refused")

    def accept(self, destination: str) -> None:
        self._point(destination, destination)

    def _point(self, destination: str, subject: str) -> None:
        async def work(client: NatsClient) -> None:
            js = client.jetstream()
            config = (await js.stream_info(stream_name(destination))).config
            config.subjects = [subject]
            await js.update_stream(config)

        self._run(work)

    def dropped_repeats(self) -> int | None:
        """None: JetStream keeps no count of the publishes its duplicate window
        dropped; only the publisher learns it, from the PubAck's `duplicate`
        flag (`JetStreamSink.duplicates_dropped`, logged by the node)."""
        return None

    def _run(self, work: Callable[[NatsClient], Awaitable[T]]) -> T:
        """`work` on a connection of its own, in a thread of its own (so that
        a test may call the driver from inside its own event loop)."""

        async def quiet(_error: Exception) -> None:
            pass  # nats-py would log each at error level; the caller sees them

        async def session() -> T:
            client = await nats.connect(
                self.url,
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0,
                connect_timeout=2,
                error_cb=quiet,
            )
            try:
                return await asyncio.wait_for(work(client), 60)
            finally:
                await client.close()

        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = asyncio.run(session())
            except BaseException as error:  # raised again in the caller's thread
                box["error"] = error

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(timeout=90)
        assert not thread.is_alive(), "a NATS driver call did not finish"
        if "error" in box:
            raise box["error"]
        value: T = box["value"]
        return value
