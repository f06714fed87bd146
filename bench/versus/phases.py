"""The measured phases, driven from the benchmark process.

Every phase starts its load processes (versus.agent), waits until each has
connected, says GO, and, for the throughput phases, lets them run a warm-up
before the measured window opens. The window's figures come from two
snapshots, one as it opens and one as it closes: the workers' completion
counters and every process's CPU time. Then it says STOP, collects what the
processes recorded, and kills any that do not exit in time.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster import ms, percentile  # bench/cluster.py

from raftsched import child_processes
from versus import measure
from versus.agent import DUE_AHEAD_MS, DUE_INTERVAL_S
from versus.common import GO, STOP, Control
from versus.systems import System

BENCH_DIR = Path(__file__).resolve().parents[1]
SUBMITTERS = 2
WORKERS = 8
BACKLOG_MAX = {"single": 2_000, "batched": 10_000}


@dataclass(frozen=True)
class Settings:
    seconds: float  # measured window of a throughput phase
    warmup_s: float
    idle_submits: int
    due_jobs: int
    drain_jobs: dict[str, int]  # backlog preloaded for each variant's drain
    protocol: str  # raftsched workers: "single" or "next"
    pg_prepare: bool
    pg_poll_s: float


class Agents:
    """The load processes of one phase and their control file."""

    def __init__(
        self, directory: Path, specs: list[dict[str, Any]], target: dict[str, Any], max_s: float
    ) -> None:
        directory.mkdir(parents=True)
        self.directory = directory
        self.specs = specs
        self.control = Control(directory / "control", len(specs), create=True)
        paths = [target["pythonpath"]] if target.get("pythonpath") else []
        env = {"PYTHONPATH": ":".join([*paths, str(BENCH_DIR)])}
        self.processes: list[subprocess.Popen[bytes]] = []
        try:
            for index, spec in enumerate(specs):
                cfg = spec | {
                    "index": index,
                    "agents": len(specs),
                    "control": str(directory / "control"),
                    "result": str(directory / f"{index}.json"),
                    "target": target,
                    "max_s": max_s,
                }
                with (directory / f"{index}.log").open("wb") as log:
                    command = [sys.executable, "-m", "versus.agent", json.dumps(cfg)]
                    self.processes.append(
                        child_processes.popen(
                            command, env=_environ(env), stdout=log, stderr=subprocess.STDOUT
                        )
                    )
        except BaseException:
            self.close()
            raise

    def slots(self, role: str) -> list[int]:
        return [i for i, spec in enumerate(self.specs) if spec["role"] == role]

    def pids(self, role: str) -> list[int]:
        return [self.processes[i].pid for i in self.slots(role)]

    def total(self, role: str) -> int:
        return self.control.total(self.slots(role))

    def _failed(self, index: int) -> RuntimeError:
        log = (self.directory / f"{index}.log").read_text(errors="replace")[-2000:]
        code = self.processes[index].returncode
        return RuntimeError(f"{self.specs[index]['role']} {index} exited with {code}: {log}")

    def check(self, done_roles: tuple[str, ...] = ()) -> None:
        """Raise if a process failed, or ended early without being one that
        ends by itself when its work is done (`done_roles`)."""
        for index, process in enumerate(self.processes):
            code = process.poll()
            if code is None:
                continue
            if code != 0 or self.specs[index]["role"] not in done_roles:
                raise self._failed(index)

    def ready(self, timeout_s: float = 120.0) -> None:
        """Wait until every process is connected."""
        deadline = time.monotonic() + timeout_s
        while not all(self.control.ready(i) for i in range(len(self.specs))):
            self.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"load processes not ready in {timeout_s}s")
            time.sleep(0.02)

    def start(self) -> None:
        """Wait until every process is connected, then GO."""
        self.ready()
        self.control.set_state(GO)

    def wait_exit(self, roles: tuple[str, ...], timeout_s: float) -> None:
        """Wait until the processes of `roles` have ended by themselves."""
        deadline = time.monotonic() + timeout_s
        waiting = [self.processes[i] for i, s in enumerate(self.specs) if s["role"] in roles]
        while any(p.poll() is None for p in waiting):
            self.check(roles)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{roles} did not finish in {timeout_s}s")
            time.sleep(0.02)
        self.check(roles)

    def finish(self, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """STOP, wait for every process, and read what each recorded."""
        self.control.set_state(STOP)
        deadline = time.monotonic() + timeout_s
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
        results = []
        for index, process in enumerate(self.processes):
            if process.returncode != 0:
                raise self._failed(index)
            results.append(json.loads((self.directory / f"{index}.json").read_text()))
        return results

    def close(self) -> None:
        self.control.set_state(STOP)
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)
        self.control.close()

    def __enter__(self) -> Agents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _environ(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **extra}


def _roles(system: System, agents: Agents) -> dict[str, list[int]]:
    roles = system.roles()
    for role, name in (("submitter", "submitters"), ("worker", "workers")):
        if agents.slots(role):
            roles[name] = agents.pids(role)
    return roles


def _worker_spec(
    s: Settings, variant: str, queue: str, number: int, **extra: Any
) -> dict[str, Any]:
    return {
        "role": "worker",
        "variant": variant,
        "queue": queue,
        "worker_id": f"{queue}-w{number}",
        "protocol": s.protocol,
        "prepare": s.pg_prepare,
        "poll_s": s.pg_poll_s,
        **extra,
    }


def _protocol(results: list[dict[str, Any]]) -> Any:
    used = sorted({r["protocol_used"] for r in results if "protocol_used" in r})
    fallbacks = sorted({r["fallback"] for r in results if r.get("fallback")})
    return {"protocol_used": used[0] if len(used) == 1 else used, "fallbacks": fallbacks}


def _window(
    system: System,
    agents: Agents,
    s: Settings,
    stop_at_jobs: int | None = None,
) -> dict[str, Any]:
    """The measured window: `s.seconds` after a warm-up, or, for a drain
    (`stop_at_jobs`), from GO until the workers have completed that many
    jobs or `s.seconds` have passed (a warm-up would eat the backlog)."""
    roles = _roles(system, agents)
    if stop_at_jobs is None:
        agents.start()
        time.sleep(s.warmup_s)
        before = measure.snapshot(roles)
    else:
        agents.ready()
        before = measure.snapshot(roles)
        agents.control.set_state(GO)
    done_before = agents.total("worker")
    end = before.at + s.seconds
    while time.monotonic() < end:
        agents.check()
        if stop_at_jobs is not None and agents.total("worker") >= stop_at_jobs:
            break
        time.sleep(0.02)
    after = measure.snapshot(roles)
    jobs = agents.total("worker") - done_before
    window = after.at - before.at
    return {
        "jobs": jobs,
        "window_s": round(window, 2),
        "jobs_per_s": round(jobs / window, 1),
        "cpu_ms_per_job": measure.cpu_per_job(before, after, jobs),
        "cores_busy": measure.cores_busy(before, after),
        "window": (before.at, after.at),
    }


def idle_submit(system: System, root: Path, s: Settings) -> dict[str, Any]:
    """One client, one submit at a time on an otherwise idle system."""
    system.before_phase()
    spec = {"role": "idle", "queue": "idle", "count": s.idle_submits, "prepare": s.pg_prepare}
    with Agents(root / "idle", [spec], system.target(), max_s=120 + s.idle_submits * 0.1) as ag:
        ag.start()
        ag.wait_exit(("idle",), timeout_s=120 + s.idle_submits * 0.1)
        latencies = ag.finish()[0]["latency_s"]
    return {
        "p50_ms": ms(percentile(latencies, 0.5)),
        "p99_ms": ms(percentile(latencies, 0.99)),
        "submits": len(latencies),
    }


def life_cycle(system: System, root: Path, s: Settings, variant: str) -> dict[str, Any]:
    """2 submitters and 8 workers at once; the backlog capped."""
    system.before_phase()
    queue = f"{variant}-life"
    specs = [
        {
            "role": "submitter",
            "variant": variant,
            "queue": queue,
            "backlog_max": BACKLOG_MAX[variant],
            "submitters": list(range(SUBMITTERS)),
            "workers": list(range(SUBMITTERS, SUBMITTERS + WORKERS)),
            "prepare": s.pg_prepare,
        }
        for _ in range(SUBMITTERS)
    ]
    specs += [_worker_spec(s, variant, queue, n) for n in range(WORKERS)]
    max_s = s.warmup_s + s.seconds + 120
    with Agents(root / queue, specs, system.target(), max_s) as agents:
        figures = _window(system, agents, s)
        results = agents.finish()
    opened, closed = figures.pop("window")
    latency = [
        lat
        for r in results[:SUBMITTERS]
        for at, lat in zip(r["sent_at"], r["latency_s"], strict=True)
        if opened <= at <= closed
    ]
    figures["submit_p50_ms"] = ms(percentile(latency, 0.5))
    figures["submit_p99_ms"] = ms(percentile(latency, 0.99))
    figures.update(_protocol(results[SUBMITTERS:]) if system.name == "raftsched" else {})
    figures.update(system.notes())
    return figures


def drain(system: System, root: Path, s: Settings, variant: str) -> dict[str, Any]:
    """A preloaded backlog of `s.drain_jobs[variant]` jobs, then 8 workers
    claim and complete; the window ends early once the backlog is gone."""
    queue, backlog = f"{variant}-drain", s.drain_jobs[variant]
    spec = {"role": "preload", "queue": queue, "count": backlog}
    with Agents(root / f"{queue}-preload", [spec], system.target(), max_s=900) as preloader:
        preloader.start()
        preloader.wait_exit(("preload",), timeout_s=900)
        preload_s = preloader.finish()[0]["preload_s"]
    settle_s = system.settle()
    system.before_phase()
    specs = [_worker_spec(s, variant, queue, n) for n in range(WORKERS)]
    with Agents(root / queue, specs, system.target(), s.warmup_s + s.seconds + 120) as agents:
        figures = _window(system, agents, s, stop_at_jobs=backlog)
        figures["drained"] = agents.total("worker") >= backlog
        results = agents.finish()
    figures.pop("window")
    figures |= {"backlog": backlog, "preload_s": preload_s, "settle_s": settle_s}
    figures.update(_protocol(results) if system.name == "raftsched" else {})
    figures.update(system.notes())
    return figures


def due_to_lease(system: System, root: Path, s: Settings) -> dict[str, Any]:
    """8 workers waiting; jobs due DUE_AHEAD_MS after their submission, one
    every DUE_INTERVAL_S; lag = lease received - due time (one clock)."""
    settle_s = system.settle()
    system.before_phase()
    specs = [_worker_spec(s, "single", "due", n, record_due=True) for n in range(WORKERS)]
    specs.append({"role": "due", "queue": "due", "count": s.due_jobs, "prepare": s.pg_prepare})
    bound_s = 30 + s.due_jobs * DUE_INTERVAL_S * 4 + DUE_AHEAD_MS / 1000
    with Agents(root / "due", specs, system.target(), bound_s + 60) as agents:
        agents.start()
        deadline = time.monotonic() + bound_s
        while agents.total("worker") < s.due_jobs and time.monotonic() < deadline:
            agents.check(("due",))
            time.sleep(0.02)
        results = agents.finish()
    lags = [lag for r in results[:WORKERS] for lag in r["due_lag_ms"]]
    return {
        "p50_ms": round(percentile(lags, 0.5), 2),
        "p99_ms": round(percentile(lags, 0.99), 2),
        "leased": len(lags),
        "expected": s.due_jobs,
        "settle_s": settle_s,
    }
