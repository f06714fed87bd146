"""A real RabbitMQ broker for the relay tests: Debian's `rabbitmq-server`
(3.10), started by the test with everything of its own under `root`, so
that two can run at once (pytest-xdist runs test files in parallel) and
nothing is left running at the end:

- its node name (`relay<amqp port>@localhost`), AMQP port, Erlang
  distribution port (listening on 127.0.0.1 only) and its own `epmd` on a
  port of its own, started here (`-start_epmd false`: the node never starts
  a shared daemon that would outlive the test) and stopped with the node;
- RABBITMQ_MNESIA_BASE, RABBITMQ_LOG_BASE, the config file, the enabled
  plugins file (none) and HOME (its Erlang cookie) under `root`, and
  /etc/rabbitmq's env file not read;
- a user `raftsched-relay` with the password (never `guest`) and a vhost
  `relay`, made by the config's `default_user` on the first boot; an
  exchange `raftsched.relay` (direct, durable) declared at every start.

Debian's /usr/sbin/rabbitmq-server is a wrapper that, for root, switches
to the `rabbitmq` user and its home; the driver runs the script it runs,
/usr/lib/rabbitmq/bin/rabbitmq-server, as the test's user. A stop is
SIGTERM to that script, which stops the node gracefully (what it confirmed
is on disk); then anything left in the server's process group is killed.

The test's own AMQP calls use aio-pika, each on an event loop of its own
in a thread, so the driver can be called from inside `asyncio.run` too.
A destination is a quorum queue of that name bound to the exchange with
that routing key; `refuse` unbinds it (a mandatory publish is returned
unroutable), `accept` binds it again.

With `netns`, the broker and its epmd run in that network namespace on the
usual ports (5672, 25672, 4369), the broker listening on `host`; epmd and
the distribution port use the namespace's loopback, which must be up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import quote

import aio_pika
from broker_support import Received, Restartable, free_port, netns_argv

from raftsched.node.sink_rabbitmq import KEY_HEADER, SEQ_HEADER, SHARD_HEADER, TENANT_HEADER

USER: Final = "raftsched-relay"
VHOST: Final = "relay"
EXCHANGE: Final = "raftsched.relay"
BOOT_TIMEOUT_S: Final = 120.0
STOP_TIMEOUT_S: Final = 60.0

T = TypeVar("T")


def _server_script(binary: str) -> Path:
    """The script that Debian's /usr/sbin/rabbitmq-server runs. That one is a
    link to rabbitmq-script-wrapper, which runs /usr/lib/rabbitmq/bin/<the
    name it was called by>, as the `rabbitmq` user; called by its own name it
    would run itself, again and again. So: the `rabbitmq-server` beside the
    link's target, else `binary` itself where it is no such link."""
    given = Path(binary)
    script = given.resolve().parent / "rabbitmq-server"
    if not script.is_file():
        script = given
    if script.resolve().name == "rabbitmq-script-wrapper":
        raise AssertionError(f"{binary}: no rabbitmq-server script beside its wrapper")
    return script


class RabbitMQServer(Restartable):
    kind = "rabbitmq"

    def __init__(
        self,
        binary: str,
        root: Path,
        password: str,
        host: str = "127.0.0.1",
        netns: str | None = None,
    ) -> None:
        self.script = _server_script(binary)
        self.root = root
        self.password = password
        self.host = host
        self.netns = netns
        if netns is None:
            self.port, self.dist_port, self.epmd_port = free_port(host), free_port(), free_port()
        else:  # a namespace of its own: the usual ports
            self.port, self.dist_port, self.epmd_port = 5672, 25672, 4369
        self.node_name = f"relay{self.port}@localhost"
        self.restarts = 0
        self.boot_seconds: list[float] = []  # each start's, until it answered AMQP
        self.process: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None
        self._received: dict[str, list[Received]] = {}
        self._queues: set[str] = set()  # the destinations prepared
        root.mkdir(parents=True, exist_ok=True)
        (root / "home").mkdir(exist_ok=True)

    @property
    def url(self) -> str:
        return f"amqp://{USER}:{quote(self.password, safe='')}@{self.host}:{self.port}/{VHOST}"

    # -- the process ------------------------------------------------------------

    def start(self) -> None:
        assert self.process is None
        self._write_config()
        began = time.monotonic()
        self.epmd = subprocess.Popen(
            self._argv(["epmd", "-address", "127.0.0.1", "-port", str(self.epmd_port)]),
            env=self._env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._wait_for_epmd()
        out = open(self.root / "server.out", "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            self._argv([str(self.script)]),
            env=self._env(),
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: see stop()
        )
        out.close()
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        while not self._answers():
            if self.process.poll() is not None:
                self.stop()
                raise AssertionError(f"rabbitmq-server exited; see {self.root}/server.out, log/")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError("rabbitmq-server did not answer")
            time.sleep(0.1)
        self._run(self._declare_exchange)
        self.boot_seconds.append(time.monotonic() - began)

    def stop(self) -> None:
        """SIGTERM to the server script: it stops the node gracefully. Then
        whatever is left of its process group (nothing, normally) is killed,
        and its epmd stopped."""
        process, self.process = self.process, None
        if process is not None:
            process.terminate()
            _end(process, STOP_TIMEOUT_S)
        epmd, self.epmd = self.epmd, None
        if epmd is not None:
            epmd.terminate()
            _end(epmd, 10)

    def _argv(self, argv: list[str]) -> list[str]:
        return netns_argv(self.netns, argv)

    def _env(self) -> dict[str, str]:
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("RABBITMQ_", "ERL_")) and name != "NOTIFY_SOCKET"
        }
        root = self.root
        env.update(
            HOME=str(root / "home"),  # its Erlang cookie
            ERL_EPMD_PORT=str(self.epmd_port),
            RABBITMQ_NODENAME=self.node_name,
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(root / "mnesia"),
            RABBITMQ_LOG_BASE=str(root / "log"),
            RABBITMQ_CONFIG_FILE=str(root / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(root / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(root / "enabled_plugins"),
            RABBITMQ_CONF_ENV_FILE=str(root / "rabbitmq-env.conf"),  # none: not /etc's
            RABBITMQ_PID_FILE=str(root / "rabbitmq.pid"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=(
                "-start_epmd false -kernel inet_dist_use_interface {127,0,0,1}"
            ),
        )
        return env

    def _write_config(self) -> None:
        (self.root / "enabled_plugins").write_text("[].\n")
        (self.root / "rabbitmq.conf").write_text(
            "\n".join(
                [
                    f"listeners.tcp.1 = {self.host}:{self.port}",
                    f"default_user = {USER}",
                    f"default_pass = {self.password}",
                    f"default_vhost = {VHOST}",
                    "default_permissions.configure = .*",
                    "default_permissions.read = .*",
                    "default_permissions.write = .*",
                    "loopback_users = none",
                    "disk_free_limit.absolute = 50MB",
                    "log.console = false",
                    "log.file.level = info",
                    "",
                ]
            )
        )

    def _wait_for_epmd(self) -> None:
        deadline = time.monotonic() + 20
        while True:
            assert self.epmd is not None and self.epmd.poll() is None, "epmd exited"
            names = subprocess.run(
                self._argv(["epmd", "-port", str(self.epmd_port), "-names"]),
                env=self._env(),
                capture_output=True,
                check=False,
                timeout=10,
            )
            if names.returncode == 0:
                return
            assert time.monotonic() < deadline, "epmd did not answer"
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                pass
        except OSError:
            return False
        try:
            self._run(self._ping)
        except Exception:  # still booting: the listener opens before the vhost is ready
            return False
        return True

    # -- the broker's side of a destination ---------------------------------------

    def sink(self, destination: str) -> dict[str, Any]:
        return {
            "kind": "rabbitmq",
            "url": self.url,
            "exchange": EXCHANGE,
            "routing_key": destination,
        }

    def prepare(self, destination: str) -> None:
        async def declare(channel: Any) -> None:
            queue = await channel.declare_queue(
                destination, durable=True, arguments={"x-queue-type": "quorum"}
            )
            await queue.bind(EXCHANGE, destination)

        self._run(lambda: self._on_channel(declare))
        self._queues.add(destination)

    def received(self, destination: str) -> list[Received]:
        """Consumes (and acks) what the queue holds now, after what earlier
        calls consumed: every message the broker delivered, redeliveries too."""
        kept = self._received.setdefault(destination, [])
        if destination not in self._queues:
            return list(kept)  # not prepared: nothing keeps what is published to it

        async def consume(channel: Any) -> None:
            queue = await channel.get_queue(destination, ensure=False)
            for _ in range(1_000_000):  # bounded: far above any test's count
                message = await queue.get(no_ack=False, fail=False, timeout=10)
                if message is None:
                    return
                kept.append(_received(message))
                await message.ack()

        self._run(lambda: self._on_channel(consume))
        return list(kept)

    def refuse(self, destination: str) -> None:
        async def unbind(channel: Any) -> None:
            queue = await channel.get_queue(destination, ensure=False)
            await queue.unbind(EXCHANGE, destination)

        self._run(lambda: self._on_channel(unbind))

    def accept(self, destination: str) -> None:
        async def bind(channel: Any) -> None:
            queue = await channel.get_queue(destination, ensure=False)
            await queue.bind(EXCHANGE, destination)

        self._run(lambda: self._on_channel(bind))

    def dropped_repeats(self) -> int | None:
        """RabbitMQ drops no repeats: every republished message is delivered."""
        return None

    # -- AMQP from the test -------------------------------------------------------

    async def _ping(self) -> None:
        connection = await aio_pika.connect(self.url, timeout=5)
        await connection.close()

    async def _declare_exchange(self) -> None:
        async def declare(channel: Any) -> None:
            await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True)

        await self._on_channel(declare)

    async def _on_channel(self, work: Callable[[Any], Coroutine[Any, Any, None]]) -> None:
        connection = await aio_pika.connect(self.url, timeout=10)
        try:
            await work(await connection.channel())
        finally:
            await connection.close()

    def _run(self, work: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Runs `work` on an event loop of its own, in a thread (the caller may
        be inside `asyncio.run` itself)."""
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append((True, asyncio.run(asyncio.wait_for(work(), 60))))
            except BaseException as error:  # handed to the caller's thread
                outcome.append((False, error))

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(timeout=90)
        assert outcome, "an AMQP call of the test did not end"
        succeeded, value = outcome[0]
        if not succeeded:
            raise value
        result: T = value
        return result


def _received(message: Any) -> Received:
    headers = message.headers or {}

    def text(name: str) -> str:
        value = headers.get(name, "")
        return value.decode() if isinstance(value, bytes) else str(value)

    return Received(
        id=str(message.message_id),
        type=str(message.type),
        seq=int(headers[SEQ_HEADER]),
        tenant=text(TENANT_HEADER),
        key=text(KEY_HEADER),
        shard=int(headers[SHARD_HEADER]),
        body=json.loads(message.body),
    )


def _end(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Wait up to `timeout_s` for `process` (a group leader this driver
    started) to exit, then SIGKILL whatever is left of its process group,
    then reap it. It is reaped only at the end, so its id (the group's) cannot
    be another process's meanwhile."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exited = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if exited is not None:
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # normally: nothing left
    process.wait(timeout=10)
