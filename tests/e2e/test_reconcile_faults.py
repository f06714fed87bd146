"""Exactly one charge per payment under worker crashes, with a provider that
cannot deduplicate (issue 17, step 7).

A fake provider (an HTTP server in the test) counts charges per payment id
and never deduplicates. Worker processes (`raftsched worker --reconciler`)
charge it, then pause before recording the charge in the effects ledger;
the test SIGKILLs the worker in that window, or SIGSTOPs it until its lease
has expired (and later SIGCONTs it: the zombie's record and completion are
fenced off). With `on_unknown: reconcile` on the queue every payment is
charged exactly once: the reconciler finds the charge and completes the
job. The same faults with `retry` (the default) charge some payments twice:
the negative control, so the test can see the double charge it prevents.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from e2e_support import cluster_env

from raftsched import child_processes
from raftsched.client import Client
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.testing import LocalCluster

PAYMENTS = 10
FAULTED = 6  # payments whose first charge is followed by a fault
LEASE_S = 2.0
WORKERS = 3


class Provider:
    def __init__(self) -> None:
        self.charges: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                payment = self.path.removeprefix("/charge/")
                with provider.lock:
                    made = provider.charges.setdefault(payment, [])
                    made.append(f"ch_{payment}_{len(made) + 1}")
                    self._answer({"charge": made[-1]})

            def do_GET(self) -> None:  # noqa: N802
                payment = self.path.removeprefix("/charges/")
                with provider.lock:
                    self._answer({"charges": list(provider.charges.get(payment, []))})

            def _answer(self, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def counts(self, prefix: str) -> Counter[str]:
        with self.lock:
            return Counter(
                {p: len(made) for p, made in self.charges.items() if p.startswith(prefix)}
            )


@pytest.fixture
def provider() -> Iterator[Provider]:
    made = Provider()
    yield made
    made.server.shutdown()


class Workers:
    """Worker processes of one queue, restarted when the test kills one."""

    def __init__(self, cluster: LocalCluster, queue: str, sink: Path, provider: Provider) -> None:
        self.cluster, self.queue, self.sink = cluster, queue, sink
        self.env = {
            **os.environ,
            **cluster_env(),
            "RAFTSCHED_TEST_SINK": str(sink),
            "RAFTSCHED_TEST_PROVIDER": provider.url,
            "RAFTSCHED_TEST_CHARGE_PAUSE_S": "0.5",
        }
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.started = 0
        for _ in range(WORKERS):
            self.start()

    def start(self) -> None:
        index = self.started
        self.started += 1
        log = (self.cluster.root / f"{self.queue}-worker{index}.log").open("ab")
        process = child_processes.popen(
            [sys.executable, "-m", "raftsched", "worker", "--queue", self.queue,
             "--handler", "tests.e2e.handlers:charge_provider",
             "--reconciler", f"{self.queue}=tests.e2e.handlers:provider_reconciler",
             "--concurrency", "1", "--worker-id", f"{self.queue}-w{index}",
             "--lease-s", str(LEASE_S), "--poll-wait-s", "1", "--shutdown-grace-s", "1",
             "--url", ",".join(self.cluster.urls)],
            stdout=log, stderr=subprocess.STDOUT, env=self.env,
        )  # fmt: skip
        log.close()
        self.processes[process.pid] = process

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


def _charged_lines(sink: Path) -> list[dict[str, object]]:
    if not sink.exists():
        return []
    return [json.loads(line) for line in sink.read_text().splitlines() if line]


def _run(
    cluster: LocalCluster, client: Client, provider: Provider, tmp_path: Path, policy: str
) -> tuple[Counter[str], dict[str, str], list[str]]:
    """Charge PAYMENTS payments on a queue with `policy` while killing and
    stopping workers right after their provider call; returns the charges
    per payment, the jobs' final statuses and the faults injected."""
    queue = f"pay-{policy}"
    client.set_queue(queue, on_unknown=policy)
    jobs = {
        client.submit(
            queue,
            {"payment": f"{policy}-{n}"},
            idempotency_key=f"{policy}-{n}",
            max_attempts=20,
            backoff={"initial_s": 0.1, "max_s": 0.5, "jitter_s": 0},
        )["id"]: f"{policy}-{n}"
        for n in range(PAYMENTS)
    }
    sink = tmp_path / f"{policy}.sink"
    workers = Workers(cluster, queue, sink, provider)
    faulted: set[str] = set()
    faults: list[str] = []
    stopped: list[tuple[float, int]] = []
    statuses: dict[str, str] = {}
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            for line in _charged_lines(sink):
                payment, pid = str(line["charged"]), int(line["pid"])  # type: ignore[call-overload]
                if payment in faulted or len(faulted) >= FAULTED:
                    continue
                faulted.add(payment)
                process = workers.processes.get(pid)
                if process is None or process.poll() is not None:
                    continue
                if len(faulted) % 2:  # SIGKILL between the provider and the ledger
                    process.send_signal(signal.SIGKILL)
                    process.wait(timeout=5)
                    workers.start()
                    faults.append(f"SIGKILL after charging {payment}")
                else:  # SIGSTOP until its lease is long gone; it wakes a zombie
                    process.send_signal(signal.SIGSTOP)
                    stopped.append((time.monotonic() + 3 * LEASE_S, pid))
                    workers.start()
                    faults.append(f"SIGSTOP after charging {payment}")
            for wake_at, pid in list(stopped):
                if time.monotonic() >= wake_at:
                    workers.processes[pid].send_signal(signal.SIGCONT)
                    stopped.remove((wake_at, pid))
            statuses = {job_id: client.get_job(job_id)["status"] for job_id in jobs}
            if not stopped and all(s in ("succeeded", "dead_letter") for s in statuses.values()):
                break
            time.sleep(0.1)
    finally:
        workers.stop()
    return provider.counts(f"{policy}-"), statuses, faults


def test_reconcile_charges_every_payment_once_and_retry_charges_twice(
    cluster: LocalCluster, client: Client, provider: Provider, tmp_path: Path
) -> None:
    deadline = time.monotonic() + 30
    while client.cluster().get("cluster_version") != COMMAND_VERSION_MAX:
        assert time.monotonic() < deadline, "the cluster version was not raised"
        time.sleep(0.2)

    charges, statuses, faults = _run(cluster, client, provider, tmp_path, "reconcile")
    print("reconcile:", faults, dict(charges))
    assert len(faults) >= FAULTED - 1, faults  # the faults did happen
    assert set(statuses.values()) == {"succeeded"}, statuses
    assert charges == {f"reconcile-{n}": 1 for n in range(PAYMENTS)}, charges
    reconciled = [
        job_id
        for job_id in statuses
        if any(e["from_status"] == "reconciling" for e in client.job_history(job_id))
    ]
    assert len(reconciled) >= FAULTED - 1, reconciled

    # The negative control: the same faults, retried blindly.
    charges, statuses, faults = _run(cluster, client, provider, tmp_path, "retry")
    print("retry:", faults, dict(charges))
    assert len(faults) >= FAULTED - 1, faults
    doubled = [payment for payment, count in charges.items() if count >= 2]
    assert len(doubled) >= FAULTED - 1, charges  # the double charges reconcile prevents
