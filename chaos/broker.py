"""The relay's broker: a real Redis server the harness runs, and its faults.

Debian's `redis-server` runs on the bridge's host address (where the webhook
receiver listens: the nodes reach it from their namespaces, and the nemesis
never cuts that path), on a free port, with a password, a directory of its
own under the run directory (`redis/`) and its data in an append-only file
synced at every write (`appendfsync always`), so a stop or a kill keeps
every entry it confirmed. It is started through `setpriv --pdeathsig KILL`
(when setpriv exists), so a harness killed outright takes it along, as it
takes its nodes.

The broker's faults are a schedule of their own (`broker_schedule`, a pure
function of the seed and the duration, with a random generator of its own so
that the nodes' fault schedule stays fault for fault what it was): one
`broker_restart` per 90 s of the run (at least one), each in its own slice
of 10-85% of the fault phase, the server stopped (`stop`: SIGTERM, Redis
syncs and exits) or killed (`kill`: SIGKILL) for 2-6 s and started again on
the same port and directory. They run beside the nodes' faults (a thread of
their own), noted in the history like them (`fault_start`, `fault_end` in
`history-broker.jsonl`) and counted in the summary's faults.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos.history import Recorder
from chaos.nemesis import Fault
from raftsched import child_processes
from raftsched.testing import free_port, redis_server_argv

REDIS_SERVER = "/usr/bin/redis-server"
BROKER_FAULT = "broker_restart"
BROKER_FAULT_EVERY_S = 90.0
BROKER_WINDOW = (0.1, 0.85)
BROKER_DOWN_S = (2.0, 6.0)
BROKER_FAULT_MIN_DURATION_S = 20.0
START_WAIT_S = 20.0
LAG_READ_S = 1.5  # Relay.lag's two reads, 0.7 s each at most
STOP_WAIT_S = 20.0
PAGE = 1000


def redis_server_binary() -> str | None:
    """Debian's redis-server, or one on the PATH; None when missing."""
    if os.access(REDIS_SERVER, os.X_OK):
        return REDIS_SERVER
    return shutil.which("redis-server")


def missing_reason() -> str | None:
    """Why the relay cannot run here (None: it can)."""
    if redis_server_binary() is None:
        return (
            f"redis-server is not installed ({REDIS_SERVER} missing; apt-get install redis-server)"
        )
    try:
        import redis  # noqa: F401  (the dev extras' client library)
    except ImportError:
        return "the redis Python library is not installed (pip install -e '.[dev]')"
    return None


class RedisBroker:
    """One redis-server, started, stopped, killed and read by the harness."""

    def __init__(self, root: Path, host: str, password: str, binary: str) -> None:
        self.root = root
        self.host = host
        self.password = password
        self.binary = binary
        self.port = free_port(host)
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        # Each restart as the broker's nemesis saw it: how, how long down,
        # and how many events were waiting for the relay just before the
        # server came back (did the outage bite?).
        self.outages: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        # Commands counted by the servers stopped so far (INFO commandstats
        # starts again at every start).
        self._calls_before: dict[str, int] = {}
        root.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{self.host}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        with self.lock:
            self._start()

    def _start(self) -> None:
        assert self.process is None or self.process.poll() is not None
        command = redis_server_argv(self.binary, self.host, self.port, self.root, self.password)
        setpriv = shutil.which("setpriv")
        if setpriv is not None:
            command = [setpriv, "--pdeathsig", "KILL", "--", *command]
        log = (self.root / "redis.log").open("ab")
        try:
            self.process = child_processes.popen(command, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        deadline = time.monotonic() + START_WAIT_S
        while True:
            with contextlib.suppress(Exception):
                if self.client().ping():
                    return
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited; see {self.root / 'redis.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer within 20 s")
            time.sleep(0.05)

    def stop(self, how: str = "stop") -> None:
        """`stop`: SIGTERM (Redis syncs its file and exits); `kill`: SIGKILL.
        The command counts are read first (a kill's last moment may escape
        them: `dropped_repeats` is then a lower bound)."""
        assert how in ("stop", "kill"), how
        with self.lock:
            process = self.process
            if process is None or process.poll() is not None:
                return
            with contextlib.suppress(Exception):
                for name, calls in self._calls_now().items():
                    self._calls_before[name] = self._calls_before.get(name, 0) + calls
            process.send_signal(signal.SIGTERM if how == "stop" else signal.SIGKILL)
            try:
                process.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)

    def restart_after(
        self,
        how: str,
        down_s: float,
        stop_event: threading.Event,
        waiting: Callable[[], int | None] | None = None,
    ) -> dict[str, Any]:
        """Stop (or kill), stay down `down_s` (less when the fault phase
        ends first), start again; the outage's record."""
        started = time.monotonic()
        self.stop(how)
        found: dict[str, int | None] = {}
        # The lag is read during the last LAG_READ_S of the outage, so that a
        # cluster slow to answer never lengthens it: no answer by the end of
        # the hold is recorded as None.
        stop_event.wait(max(0.0, down_s - LAG_READ_S))
        reader = None
        if waiting is not None:
            reader = threading.Thread(
                target=lambda: found.update(events_waiting=waiting()), daemon=True
            )
            reader.start()
        stop_event.wait(max(0.0, started + down_s - time.monotonic()))
        if reader is not None:
            reader.join(timeout=0.2)
        outage: dict[str, Any] = {"how": how, "events_waiting": found.get("events_waiting")}
        outage["down_s"] = round(time.monotonic() - started, 2)
        self.start()
        self.restarts += 1
        self.outages.append(outage)
        return outage

    def calls(self, command: str) -> int:
        """How many times `command` ran (scripts' commands too), over restarts."""
        now = self._calls_now() if self.running else {}
        return self._calls_before.get(command, 0) + now.get(command, 0)

    def dropped_repeats(self) -> int:
        """Every message a relay sent ran one GET of its dedup key in the
        script, and one XADD unless the dedup window dropped it."""
        return self.calls("get") - self.calls("xadd")

    def _calls_now(self) -> dict[str, int]:
        stats = self.client().info("commandstats")
        return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}

    def entries(self, stream: str) -> list[dict[str, Any]]:
        """Every entry of `stream` in stream order: {"entry": its id,
        "fields": {name: value}} as strings (the checker parses them)."""
        client = self.client()
        rows: list[dict[str, Any]] = []
        after = "-"
        for _ in range(100_000):  # bounded: every page moves `after` on
            page = client.xrange(stream, min=after, max="+", count=PAGE)
            for entry_id, fields in page:
                rows.append(
                    {
                        "entry": entry_id.decode(),
                        "fields": {
                            k.decode(): v.decode(errors="replace") for k, v in fields.items()
                        },
                    }
                )
            if len(page) < PAGE:
                break
            after = "(" + page[-1][0].decode()
        return rows

    def client(self) -> Any:
        import redis

        return redis.Redis(host=self.host, port=self.port, password=self.password, socket_timeout=5)

    def close(self) -> None:
        """At the end of the run: a graceful stop."""
        self.stop("stop")


def broker_schedule(seed: int, duration_s: float) -> list[Fault]:
    """The broker's restarts: a pure function of the seed and the duration."""
    if duration_s < BROKER_FAULT_MIN_DURATION_S:
        return []
    rng = random.Random(f"chaos-broker-{seed}")
    count = max(1, round(duration_s / BROKER_FAULT_EVERY_S))
    low, high = duration_s * BROKER_WINDOW[0], duration_s * BROKER_WINDOW[1]
    width = (high - low) / count
    faults = []
    for index in range(count):
        down_s = round(rng.uniform(*BROKER_DOWN_S), 1)
        at_s = low + index * width + rng.uniform(0.0, max(0.0, width - down_s))
        how = rng.choice(["stop", "kill"])
        faults.append(Fault(round(at_s, 1), BROKER_FAULT, down_s, {"how": how}))
    return faults


class BrokerNemesis(threading.Thread):
    """Applies the broker's schedule beside the nodes' nemesis."""

    def __init__(
        self,
        broker: RedisBroker,
        faults: list[Fault],
        history: Recorder,
        started_at: float,
        waiting: Callable[[], int | None] | None = None,
    ) -> None:
        super().__init__(name="broker-nemesis", daemon=True)
        self.broker = broker
        self.faults = faults
        self.history = history
        self.started_at = started_at
        self.waiting = waiting  # the relay's events not yet published (Relay.lag)
        self.stop_event = threading.Event()
        self.applied: list[dict[str, Any]] = []
        self.errors: list[str] = []

    def run(self) -> None:
        for fault in self.faults:
            if self.stop_event.wait(max(0.0, self.started_at + fault.at_s - time.time())):
                return
            self._apply(fault)

    def _apply(self, fault: Fault) -> None:
        started = time.time()
        how = fault.params["how"]
        self.history.note("fault_start", {"kind": fault.kind, **fault.params})
        outage: dict[str, Any] = {}
        try:
            # A fault cut short by the end of the fault phase still restarts
            # the server (heal() would otherwise).
            outage = self.broker.restart_after(how, fault.hold_s, self.stop_event, self.waiting)
            outcome = "restarted"
        except Exception as error:  # keep going: one failed fault is not a failed run
            outcome = f"failed: {error!r}"
            self.errors.append(f"{fault.describe()}: {error!r}")
        held_s = time.time() - started
        record = {"kind": fault.kind, "held_s": round(held_s, 2), "outcome": outcome}
        waiting = {"events_waiting": outage.get("events_waiting")}
        self.history.note("fault_end", {**record, "how": how, **waiting})
        self.applied.append({**record, "held_s": held_s, **fault.params})

    def heal(self) -> None:
        """A server not running (a failed restart) is started again."""
        if not self.broker.running:
            try:
                self.broker.start()
            except Exception as error:
                self.errors.append(f"healing the broker: {error!r}")
