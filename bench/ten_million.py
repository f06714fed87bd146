"""Ten million scheduled jobs in one 3-node cluster on this machine (not a test).

    .venv/bin/python bench/ten_million.py                    # 10,000,000 jobs (an hour or more)
    .venv/bin/python bench/ten_million.py --jobs 1000000
    .venv/bin/python bench/ten_million.py --jobs 50000 --log-compaction-entries 50   # smoke
    make bench-ten-million BENCH_ARGS="--jobs 3000000"

Starts three `raftsched node` processes on loopback with durability on
(`LocalCluster(durability="fsync")`, as bench/cluster.py and bench/hot_minute.py),
their data directories under one temporary directory under --dir (default
/var/tmp), which must be on a disk, not a tmpfs. Then, in order:

1. baseline: the resident memory of every node process (VmRSS, which counts
   the file-backed pages a node maps and has touched) on the idle cluster.
2. load: `--jobs` jobs through POST /v1/jobs/batch, 1,000 per request, from
   `--submitters` load processes (each with `--connections` requests in
   flight). Every job is shaped as bench/core.py and bench/versus make them:
   the ~200-byte JSON payload of bench/versus/common.py, one of 8 queues,
   one of 16 tenants, a 30-character idempotency key, and a `run_at` spread
   uniformly over the next 30 days. A 503 or 504 answer, or no answer, is
   retried with the same request (the keys make it idempotent), a 307 (the
   leader changed) is followed; `load_retries` counts them.
   load_jobs_per_s = jobs / the load's wall time. load_cpu_ms_per_job: CPU
   time (user + system, /proc, as bench/versus/measure.py counts it) per job
   of the leader, the followers (a list's sum), the load processes, their
   total, the whole machine and `other` (the rest of the machine);
   load_cores_busy: the nodes' and the machine's CPU seconds per wall second
   (ours excludes the load processes there). Afterwards the benchmark
   waits until every replica has applied the leader's commit index
   (settle_s).
3. memory: every node's resident memory now, and its growth over the
   baseline per stored job (rss_growth_bytes_per_job), the figure issue 19
   counts (the targets: 250 bytes per packed future job, 500 per live
   pending job).
4. latency while N jobs are stored: `--latency-samples` single submits
   (POST /v1/jobs, one at a time, same job shape, due within 30 days), then
   as many single claims (POST /v1/leases, max_jobs 1, wait_s 0) of a queue
   preloaded with that many due jobs: client round trips, p50 and p99.
5. due to lease: `--due-jobs` jobs with `run_at` spread over `--due-spread-s`
   starting `--due-ahead-s` after their submission, while `--due-workers`
   long-poll claims (max_jobs 100, wait_s 5) wait for them. Lag = the wall
   time the lease arrived minus the job's run_at (one machine, one clock).
6. snapshots at N: waits (at most `--snapshot-wait-s`, 900 s) until every node has
   written a snapshot that started after the load ended (pysyncobj takes one
   after `--log-compaction-entries` entries or 300 s, whichever first), then
   reads each node's /metrics: raftsched_raft_snapshot_duration_seconds
   (encode and write, in the forked child) and, if the node exports them,
   raftsched_raft_snapshot_fork_pause_seconds (its mean), _load_seconds,
   _cow_bytes, _bytes and every other raftsched_raft_snapshot* family
   (null when absent).
   disk: each node's `raft.snapshot` file on disk (snapshot_bytes) and the
   rest of its data directory (other_bytes: the journal, mostly).
   rss_after_snapshot_bytes and _growth_bytes_per_job: step 3's figures again
   now that every node has compacted its log.
7. leader SIGKILL: failover_s = from the SIGKILL until a surviving node
   accepts a write (POST /v1/jobs answered 201, a redirect followed by hand);
   restart_to_ready_s = from starting the killed node again until its
   /readyz answers 200 and it answers GET /v1/jobs/{id}?consistency=stale
   for the first and the last job of the load (its catch-up at N);
   restart_load_s: its raftsched_raft_snapshot_load_seconds.

Memory guard: a thread samples every second the resident memory of every
process of the run (the nodes, their forked snapshot writers, the load
processes and this one). A snapshot writer shares its parent's pages until
either writes them, so only its private pages (/proc/PID/smaps_rollup) are
added. peak_total_bytes / machine_bytes is peak_fraction.
peak_writer_private_bytes_by_node: the largest private memory of one node's
writer (its copy-on-write growth, plus the writer's own buffers), and
peak_node_with_writer_bytes: the largest node RSS plus that at one sample,
what one replica's machine must hold. Past --memory-limit
(0.75 of the machine) the run aborts: the load processes are killed at once,
the nodes are stopped (SIGTERM), every step still running is cancelled,
and the JSON says `aborted`, with the figures measured until then. machine_used_peak_fraction
is the whole machine's (MemTotal - MemAvailable), other users included.

Every wait is bounded; the cluster and the load processes are stopped at
the end, on an error, on Ctrl-C and on SIGTERM. Progress goes to stderr; the
last line of stdout is one JSON object (also with --out FILE, written there).
bench/scale_plot.py draws docs/scale.png from several of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from cluster import auth_headers, loadavg, ms, percentile, settle  # bench/cluster.py
from versus import measure  # bench/versus/measure.py
from versus.common import GO, PAYLOAD, Control, payload_bytes  # bench/versus/common.py
from versus_postgres import REFUSED_FILESYSTEMS, filesystem_of  # bench/versus_postgres.py

from raftsched import child_processes, raft_journal
from raftsched.testing import LocalCluster, metrics_text
from raftsched.timefmt import format_ms

BENCH_DIR = Path(__file__).resolve().parent
T = TypeVar("T")
BATCH = 1000
QUEUES = 8
TENANTS = 16
KEY_CHARS = 30
SPREAD_MS = 30 * 86_400_000
JSON_HEADERS = {"Content-Type": "application/json"}
# Gauges read from each node's /metrics (null in the result when a node lacks one).
SNAPSHOT_GAUGES = {
    "snapshot_encode_s": "raftsched_raft_snapshot_duration_seconds",
    "snapshot_age_s": "raftsched_raft_snapshot_age_seconds",
    "snapshot_load_s": "raftsched_raft_snapshot_load_seconds",
    "snapshot_cow_bytes": "raftsched_raft_snapshot_cow_bytes",
    "snapshot_state_bytes": "raftsched_raft_snapshot_bytes",
}
# The fork pause is a histogram: its mean over the node's snapshots so far.
FORK_PAUSE = "raftsched_raft_snapshot_fork_pause_seconds"


def log(message: str) -> None:
    print(f"[ten_million {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Aborted(Exception):
    """The memory guard stopped the run."""


def idempotency_key(i: int) -> str:
    key = f"ten-million-{i:018d}"
    assert len(key) == KEY_CHARS
    return key


def job_body(i: int, start_ms: int) -> dict[str, Any]:
    """Job i of the load: due at a point spread uniformly (a multiplicative
    hash of i) over the SPREAD_MS after `start_ms`."""
    fraction = ((i * 2_654_435_761) % 4_294_967_296) / 4_294_967_296
    return {
        "queue": f"q{i % QUEUES}",
        "tenant": f"t{i % TENANTS}",
        "idempotency_key": idempotency_key(i),
        "run_at": format_ms(start_ms + 60_000 + int(fraction * SPREAD_MS)),
        "payload": PAYLOAD,
    }


# -- memory ---------------------------------------------------------------------------

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def private_bytes(pid: int) -> int:
    """A forked child's own pages (those it or its parent wrote since the fork)."""
    total = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0
    return total


def children_of(parents: set[int]) -> list[tuple[int, int]]:
    """(pid, parent pid) of every process whose parent is in `parents`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent in parents:
            found.append((int(entry.name), parent))
    return found


def meminfo() -> dict[str, int]:
    values = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, rest = line.split(":", 1)
        values[name] = int(rest.split()[0]) * 1024
    return values


class MemoryGuard(threading.Thread):
    """Samples the run's memory every second and aborts the run past the limit."""

    def __init__(self, limit_fraction: float, on_abort: Callable[[], None]) -> None:
        super().__init__(name="memory-guard", daemon=True)
        self.machine_bytes = meminfo()["MemTotal"]
        self.limit_bytes = int(limit_fraction * self.machine_bytes)
        self.on_abort = on_abort
        self.stop_nodes: Callable[[], object] = lambda: None
        self.nodes: dict[str, int] = {}  # node id -> pid (updated on a restart)
        self.agents: list[int] = []
        self.peak_total = 0
        self.peak_nodes: dict[str, int] = {}
        self.peak_writer: dict[str, int] = {}  # a node's snapshot writer's private pages
        self.peak_node_and_writer: dict[str, int] = {}
        self.peak_forks = 0
        self.peak_agents = 0
        self.peak_machine_used = 0
        self.samples = 0
        self.reason: str | None = None
        self._stop = threading.Event()

    def sample(self) -> int:
        nodes = {node_id: rss_bytes(pid) for node_id, pid in self.nodes.items()}
        by_pid = {pid: node_id for node_id, pid in self.nodes.items()}
        writers = dict.fromkeys(self.nodes, 0)
        for child, parent in children_of(set(by_pid)):
            writers[by_pid[parent]] += private_bytes(child)
        forks = sum(writers.values())
        agents = sum(rss_bytes(pid) for pid in self.agents) + rss_bytes(os.getpid())
        total = sum(nodes.values()) + forks + agents
        info = meminfo()
        self.peak_machine_used = max(
            self.peak_machine_used, info["MemTotal"] - info["MemAvailable"]
        )
        for node_id, value in nodes.items():
            self.peak_nodes[node_id] = max(self.peak_nodes.get(node_id, 0), value)
            with_writer = value + writers[node_id]
            self.peak_node_and_writer[node_id] = max(
                self.peak_node_and_writer.get(node_id, 0), with_writer
            )
            self.peak_writer[node_id] = max(self.peak_writer.get(node_id, 0), writers[node_id])
        self.peak_forks = max(self.peak_forks, forks)
        self.peak_agents = max(self.peak_agents, agents)
        self.peak_total = max(self.peak_total, total)
        self.samples += 1
        return total

    def run(self) -> None:
        while not self._stop.wait(1.0):
            total = self.sample()
            if total > self.limit_bytes and self.reason is None:
                self.reason = (
                    f"the run's processes hold {total / 2**30:.2f} GiB, over the limit of "
                    f"{self.limit_bytes / 2**30:.2f} GiB"
                )
                log(f"ABORT: {self.reason}")
                self.on_abort()  # the load processes
                self.stop_nodes()

    def check(self) -> None:
        if self.reason is not None:
            raise Aborted(self.reason)

    def stop(self) -> None:
        self._stop.set()

    def figures(self) -> dict[str, Any]:
        return {
            "machine_bytes": self.machine_bytes,
            "memory_limit_bytes": self.limit_bytes,
            "peak_total_bytes": self.peak_total,
            "peak_fraction": round(self.peak_total / self.machine_bytes, 4),
            "peak_node_rss_bytes": dict(sorted(self.peak_nodes.items())),
            "peak_snapshot_writer_private_bytes": self.peak_forks,
            "peak_writer_private_bytes_by_node": dict(sorted(self.peak_writer.items())),
            "peak_node_with_writer_bytes": dict(sorted(self.peak_node_and_writer.items())),
            "peak_load_processes_bytes": self.peak_agents,
            "machine_used_peak_fraction": round(self.peak_machine_used / self.machine_bytes, 4),
            "memory_samples": self.samples,
        }


# -- the load processes ---------------------------------------------------------------


def submitter_main(cfg: dict[str, Any]) -> None:
    """One load process: jobs [first, end) in batches, `connections` in flight.
    Its count of jobs stored goes to its Control slot; its figures to `result`."""
    child_processes.die_with_parent()
    control = Control(Path(cfg["control"]), cfg["agents"])
    index = cfg["index"]
    control.set_ready(index)
    deadline = time.monotonic() + 120
    while control.state != GO:  # every load process starts at once
        if time.monotonic() > deadline:
            raise TimeoutError("no GO within 120 s")
        time.sleep(0.01)
    out = asyncio.run(_submit_range(cfg, control, index))
    Path(cfg["result"]).write_text(json.dumps(out))
    control.close()


async def _submit_range(cfg: dict[str, Any], control: Control, index: int) -> dict[str, Any]:
    import orjson

    first, end, start_ms = cfg["first"], cfg["end"], cfg["start_ms"]
    deadline = time.monotonic() + cfg["max_s"]
    batches = asyncio.Queue[int]()
    for base in range(first, end, BATCH):
        batches.put_nowait(base)
    stored = 0
    retries = 0
    ids: dict[int, str] = {}
    headers = {**JSON_HEADERS, **cfg["headers"]}
    connector = aiohttp.TCPConnector(limit=cfg["connections"])
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(base: int) -> None:
            nonlocal stored, retries
            body = orjson.dumps(
                {"jobs": [job_body(i, start_ms) for i in range(base, min(end, base + BATCH))]}
            )
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"submitter {index}: past its {cfg['max_s']} s")
                url = cfg["url"]
                try:
                    async with session.post(
                        url + "/v1/jobs/batch", data=body, headers=headers, allow_redirects=False
                    ) as response:
                        status, raw = response.status, await response.read()
                        location = response.headers.get("Location", "")
                except (aiohttp.ClientError, TimeoutError):
                    status, raw, location = 0, b"", ""
                if status == 307 and "/v1/" in location:  # the leader changed: follow it
                    cfg["url"] = location.split("/v1/", 1)[0]
                    retries += 1
                    continue
                if status == 200:
                    results = orjson.loads(raw)["results"]
                    errors = [r for r in results if "error" in r]
                    if errors:
                        raise RuntimeError(f"refused items: {errors[:2]}")
                    if base == first:
                        ids[first] = results[0]["job"]["id"]
                    if base + len(results) == end:
                        ids[end - 1] = results[-1]["job"]["id"]
                    stored += len(results)
                    control.set_count(index, stored)
                    return
                if status in (0, 503, 504):  # busy, leader changing, outcome unknown
                    retries += 1
                    await asyncio.sleep(0.5)
                    continue
                raise RuntimeError(f"batch answered {status}: {raw[:300]!r}")

        async def loop() -> None:
            while not batches.empty():
                await one(batches.get_nowait())

        await asyncio.gather(*(loop() for _ in range(cfg["connections"])))
    return {"stored": stored, "retries": retries, "ids": {str(k): v for k, v in ids.items()}}


class Submitters:
    """The load processes of the load phase and their control file."""

    def __init__(self, directory: Path, cfgs: list[dict[str, Any]]) -> None:
        directory.mkdir(parents=True)
        self.directory = directory
        self.control = Control(directory / "control", len(cfgs), create=True)
        self.processes: list[subprocess.Popen[bytes]] = []
        paths = [str(BENCH_DIR), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        for index, cfg in enumerate(cfgs):
            cfg |= {
                "index": index,
                "agents": len(cfgs),
                "control": str(directory / "control"),
                "result": str(directory / f"{index}.json"),
            }
            with (directory / f"{index}.log").open("wb") as out:
                command = [sys.executable, str(Path(__file__).resolve()), "--submitter"]
                self.processes.append(
                    child_processes.popen(
                        [*command, json.dumps(cfg)], env=env, stdout=out, stderr=subprocess.STDOUT
                    )
                )

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def start(self, timeout_s: float = 120.0) -> None:
        """Wait until every load process has started, then GO."""
        deadline = time.monotonic() + timeout_s
        while not all(self.control.ready(i) for i in range(len(self.processes))):
            failure = self.failed()
            if failure:
                raise RuntimeError(failure)
            if time.monotonic() > deadline:
                raise TimeoutError(f"load processes not started in {timeout_s} s")
            time.sleep(0.02)
        self.control.set_state(GO)

    def stored(self) -> int:
        return self.control.total(list(range(len(self.processes))))

    def failed(self) -> str | None:
        for index, process in enumerate(self.processes):
            if process.poll() not in (None, 0):
                tail = (self.directory / f"{index}.log").read_text(errors="replace")[-1500:]
                return f"submitter {index} exited with {process.returncode}: {tail}"
        return None

    def done(self) -> bool:
        return all(p.poll() == 0 for p in self.processes)

    def results(self) -> list[dict[str, Any]]:
        return [
            json.loads((self.directory / f"{i}.json").read_text())
            for i in range(len(self.processes))
        ]

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()

    def close(self) -> None:
        self.kill()
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        self.control.close()


def load(
    cluster: LocalCluster, leader: str, args: argparse.Namespace, guard: MemoryGuard, home: Path
) -> dict[str, Any]:
    start_ms = int(time.time() * 1000)
    per = -(-args.jobs // args.submitters)
    per = -(-per // BATCH) * BATCH  # whole batches per process
    cfgs = [
        {
            "first": first,
            "end": min(args.jobs, first + per),
            "start_ms": start_ms,
            "url": cluster.nodes[leader].http_url,
            "connections": args.connections,
            "headers": auth_headers(),
            "max_s": args.load_time_limit_s,
        }
        for first in range(0, args.jobs, per)
    ]
    roles = {
        "leader": [guard.nodes[leader]],
        "followers": [pid for node_id, pid in sorted(guard.nodes.items()) if node_id != leader],
    }
    cpu_before, own_before = measure.snapshot(roles), sum(os.times()[:4])
    submitters = Submitters(home / "load", cfgs)
    guard.agents = submitters.pids
    guard.on_abort = submitters.kill
    try:
        submitters.start()
        started = time.monotonic()
        last_report = started
        deadline = started + args.load_time_limit_s + 30
        while not submitters.done():
            guard.check()
            failure = submitters.failed()
            if failure:
                raise RuntimeError(failure)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the load did not finish in {args.load_time_limit_s} s")
            time.sleep(0.2)
            if time.monotonic() - last_report >= 10:
                last_report = time.monotonic()
                count = submitters.stored()
                rate = count / (last_report - started)
                log(
                    f"load: {count:,}/{args.jobs:,} jobs ({rate:,.0f}/s); memory now "
                    f"{guard.peak_total / 2**30:.2f} GiB peak"
                )
        elapsed = time.monotonic() - started
        results = submitters.results()
    finally:
        submitters.close()
        guard.agents = []
    # The load processes have been reaped: their CPU time is in this process's
    # children's time (os.times), beside this process's own.
    cpu_after, own = measure.snapshot(roles), sum(os.times()[:4]) - own_before
    cpu = measure.cpu_per_job(cpu_before, cpu_after, args.jobs)
    cpu["load_processes"] = round(own * 1000 / args.jobs, 3)
    cpu["total"] = round(cpu["total"] + cpu["load_processes"], 3)
    cpu["other"] = round(cpu["other"] - cpu["load_processes"], 3)
    ids = [v for r in results for k, v in sorted(r["ids"].items(), key=lambda kv: int(kv[0]))]
    stored = sum(r["stored"] for r in results)
    if stored != args.jobs:
        raise RuntimeError(f"stored {stored} of {args.jobs} jobs")
    log(f"load: {stored:,} jobs in {elapsed:.1f} s = {stored / elapsed:,.0f} jobs/s")
    return {
        "load_s": round(elapsed, 2),
        "load_jobs_per_s": round(stored / elapsed, 1),
        "load_retries": sum(r["retries"] for r in results),
        "load_cpu_ms_per_job": cpu,
        "load_cores_busy": measure.cores_busy(cpu_before, cpu_after),
        "sample_job_ids": [ids[0], ids[-1]] if ids else [],
    }


# -- HTTP phases ----------------------------------------------------------------------


class Http:
    """JSON over one aiohttp session, no redirects followed."""

    def __init__(self, connections: int = 64) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=30),
            headers=auth_headers(),
        )

    async def call(self, method: str, url: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        async with self.session.request(
            method, url, data=data, headers=JSON_HEADERS, allow_redirects=False
        ) as response:
            raw = await response.read()
            try:
                return response.status, (json.loads(raw) if raw else None)
            except ValueError:
                return response.status, raw[:200]

    async def ok(self, method: str, url: str, body: Any = None) -> Any:
        status, answer = await self.call(method, url, body)
        if status not in (200, 201):
            raise RuntimeError(f"{method} {url}: {status} {str(answer)[:300]}")
        return answer

    async def close(self) -> None:
        await self.session.close()


async def latencies(url: str, count: int, jobs: int, guard: MemoryGuard) -> dict[str, Any]:
    """Single submits, then single claims of a preloaded queue, one at a time."""
    http = Http()
    start_ms = int(time.time() * 1000)
    submits: list[float] = []
    claims: list[float] = []
    try:
        for n in range(count):
            guard.check()
            body = job_body(jobs + n, start_ms)
            started = time.perf_counter()
            await http.ok("POST", url + "/v1/jobs", body)
            submits.append(time.perf_counter() - started)
        now = format_ms(start_ms)
        for base in range(0, count, BATCH):
            items = [
                {**job_body(jobs + count + i, start_ms), "queue": "claim-latency", "run_at": now}
                for i in range(base, min(count, base + BATCH))
            ]
            await http.ok("POST", url + "/v1/jobs/batch", {"jobs": items})
        claim = {"worker_id": "latency", "queues": ["claim-latency"], "max_jobs": 1, "wait_s": 0}
        claim["lease_s"] = 3600
        deadline = time.monotonic() + 60 + count * 0.5
        while len(claims) < count and time.monotonic() < deadline:
            guard.check()
            started = time.perf_counter()
            answer = await http.ok("POST", url + "/v1/leases", claim)
            elapsed = time.perf_counter() - started
            if answer["leases"]:
                claims.append(elapsed)
            else:
                await asyncio.sleep(0.05)  # the batch not yet due on the leader's clock
    finally:
        await http.close()
    return {
        "submit_p50_ms": ms(percentile(submits, 0.5)),
        "submit_p99_ms": ms(percentile(submits, 0.99)),
        "submit_count": len(submits),
        "claim_p50_ms": ms(percentile(claims, 0.5)),
        "claim_p99_ms": ms(percentile(claims, 0.99)),
        "claim_count": len(claims),
    }


async def due_to_lease(url: str, args: argparse.Namespace, guard: MemoryGuard) -> dict[str, Any]:
    """Long-poll workers waiting; `due_jobs` jobs come due over `due_spread_s`."""
    http = Http()
    lags: list[float] = []
    expected = args.due_jobs
    finished = asyncio.Event()
    deadline = time.monotonic() + args.due_ahead_s + args.due_spread_s + 120

    async def worker(name: str) -> None:
        claim = {"worker_id": name, "queues": ["due"], "max_jobs": 100, "wait_s": 5}
        claim["lease_s"] = 3600
        while not finished.is_set() and time.monotonic() < deadline:
            status, body = await http.call("POST", url + "/v1/leases", claim)
            received_ms = time.time() * 1000
            if status != 200:
                log(f"due worker {name}: claim answered {status}: {str(body)[:200]}")
                await asyncio.sleep(0.1)
                continue
            for lease in body["leases"]:
                lags.append((received_ms - lease["payload"]["run_at_ms"]) / 1000)
            if len(lags) >= expected:
                finished.set()

    workers = [asyncio.ensure_future(worker(f"due-{i}")) for i in range(args.due_workers)]
    try:
        await asyncio.sleep(0.5)  # every worker parked in its long-poll
        first_ms = int(time.time() * 1000) + int(args.due_ahead_s * 1000)
        spread_ms = int(args.due_spread_s * 1000)
        for base in range(0, expected, BATCH):
            items = []
            for i in range(base, min(expected, base + BATCH)):
                run_at_ms = first_ms + spread_ms * i // max(1, expected)
                items.append(
                    {
                        "queue": "due",
                        "tenant": f"t{i % TENANTS}",
                        "idempotency_key": f"due-{first_ms}-{i:012d}"[:KEY_CHARS],
                        "run_at": format_ms(run_at_ms),
                        "payload": {**PAYLOAD, "run_at_ms": run_at_ms},
                    }
                )
            await http.ok("POST", url + "/v1/jobs/batch", {"jobs": items})
        late = time.time() * 1000 > first_ms
        while not finished.is_set() and time.monotonic() < deadline:
            guard.check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), 1.0)
    finally:
        finished.set()
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await http.close()
    return {
        "due_to_lease_p50_ms": ms(percentile(lags, 0.5)),
        "due_to_lease_p99_ms": ms(percentile(lags, 0.99)),
        "due_to_lease_max_ms": ms(max(lags, default=float("nan"))),
        "due_leased": len(lags),
        "due_expected": expected,
        "due_submitted_late": late,
    }


async def first_write(urls: list[str], timeout_s: float) -> float | None:
    """Monotonic time the first of `urls` accepted a write (a follower's 307
    to the leader followed; aiohttp keeps the method and body), polling every
    20 ms; None after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    body = json.dumps({"queue": "failover", "idempotency_key": f"failover-{time.time_ns()}"})
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=2), headers={**auth_headers(), **JSON_HEADERS}
    ) as session:
        while time.monotonic() < deadline:
            for url in urls:
                try:
                    async with session.post(url + "/v1/jobs", data=body) as response:
                        status = response.status
                        await response.read()
                except (aiohttp.ClientError, TimeoutError):
                    status = 0
                if status in (200, 201):
                    return time.monotonic()
            await asyncio.sleep(0.02)
    return None


async def ready_with_reads(url: str, job_ids: list[str], timeout_s: float) -> float | None:
    """Monotonic time `url` answered /readyz 200 and every job of `job_ids` by id."""
    http = Http()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                status, _ = await http.call("GET", url + "/readyz")
                if status == 200:
                    answers = [
                        (await http.call("GET", f"{url}/v1/jobs/{job_id}?consistency=stale"))[0]
                        for job_id in job_ids
                    ]
                    if all(answer == 200 for answer in answers):
                        return time.monotonic()
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.05)
    finally:
        await http.close()
    return None


# -- what the nodes expose ------------------------------------------------------------


def metric_values(text: str) -> dict[str, float]:
    """name (with labels) -> value, for every sample line of a /metrics text."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                values[name] = float(value)
    return values


def snapshot_metrics(url: str) -> dict[str, Any]:
    """The snapshot figures one node exports; null for the families it lacks."""
    try:
        values = metric_values(metrics_text(url, token=os.environ.get("RAFTSCHED_TOKEN")))
    except OSError as error:
        return {"error": str(error)}
    out: dict[str, Any] = {
        key: (round(values[name], 4) if name in values else None)
        for key, name in SNAPSHOT_GAUGES.items()
    }
    forks = values.get(f"{FORK_PAUSE}_count")
    out["snapshot_fork_pause_s"] = round(values[f"{FORK_PAUSE}_sum"] / forks, 4) if forks else None
    # Whatever else the node says about its snapshots (copy-on-write growth, ...).
    out["other"] = {
        name: round(value, 4)
        for name, value in values.items()
        if name.startswith("raftsched_raft_snapshot")
        and not name.startswith((*SNAPSHOT_GAUGES.values(), FORK_PAUSE))
    }
    return out


def disk_figures(data_dir: Path) -> dict[str, int]:
    snapshot = 0
    other = 0
    for path in data_dir.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file():
                if path.name == raft_journal.SNAPSHOT_NAME:
                    snapshot += path.stat().st_size
                else:
                    other += path.stat().st_size
    return {"snapshot_bytes": snapshot, "other_bytes": other}


def wait_for_snapshots(
    cluster: LocalCluster, since: float, timeout_s: float, guard: MemoryGuard
) -> bool:
    """Wait until every node wrote a snapshot it started after `since` (monotonic)."""
    deadline = time.monotonic() + timeout_s
    last_report = 0.0
    while True:
        fresh = {}
        for node_id, node in cluster.nodes.items():
            figures = snapshot_metrics(node.http_url)
            age, took = figures.get("snapshot_age_s"), figures.get("snapshot_encode_s")
            # It started (now - age - took) after `since`.
            fresh[node_id] = (
                age is not None and took is not None and age + took < time.monotonic() - since
            )
        if all(fresh.values()):
            return True
        if time.monotonic() > deadline:
            log(f"snapshots: not every node wrote one in {timeout_s:.0f} s: {fresh}")
            return False
        if time.monotonic() - last_report > 30:
            last_report = time.monotonic()
            log(f"snapshots: waiting for a snapshot at N on every node ({fresh})")
        guard.check()
        time.sleep(1.0)


def node_pids(cluster: LocalCluster) -> dict[str, int]:
    pids = {}
    for node_id, node in cluster.nodes.items():
        if node.process is not None and node.process.poll() is None:
            pids[node_id] = node.process.pid
    return pids


# -- main -----------------------------------------------------------------------------


def guarded(coroutine: Coroutine[Any, Any, T], guard: MemoryGuard) -> T:
    """Run `coroutine`, cancelled as soon as the memory guard aborts the run."""

    async def watch() -> T:
        task = asyncio.ensure_future(coroutine)
        while not task.done():
            await asyncio.wait({task}, timeout=0.5)
            if guard.reason is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                guard.check()
        return task.result()

    return asyncio.run(watch())


def run(
    cluster: LocalCluster, args: argparse.Namespace, guard: MemoryGuard, out: dict[str, Any]
) -> None:
    """The steps of the module doc; their figures go into `out` as they come,
    so that a run that fails or aborts still reports the ones it has."""
    cluster.start()
    leader = cluster.wait_for_leader(timeout_s=60)
    guard.nodes = node_pids(cluster)
    time.sleep(2.0)  # let the take-over settle before the baseline
    out["leader"] = leader
    baseline = {node_id: rss_bytes(pid) for node_id, pid in guard.nodes.items()}
    out["baseline_rss_bytes"] = baseline
    log(f"cluster up, leader {leader}; baseline RSS {baseline}")

    out.update(load(cluster, leader, args, guard, Path(cluster.root)))
    load_ended = time.monotonic()
    out["settle_s"] = guarded(settle(cluster.urls, timeout_s=args.settle_time_limit_s), guard)
    guard.check()
    after = {node_id: rss_bytes(pid) for node_id, pid in guard.nodes.items()}
    out["rss_bytes"] = after
    out["rss_growth_bytes_per_job"] = {
        node_id: round((after[node_id] - baseline[node_id]) / args.jobs, 1) for node_id in after
    }
    log(
        "memory after the load: "
        + ", ".join(
            f"{n} {after[n] / 2**20:,.0f} MiB (+{out['rss_growth_bytes_per_job'][n]} B/job)"
            for n in sorted(after)
        )
    )
    leader = cluster.wait_for_leader(timeout_s=60)  # the same, unless it changed in the load
    leader_url = cluster.nodes[leader].http_url

    out.update(guarded(latencies(leader_url, args.latency_samples, args.jobs, guard), guard))
    log(
        f"latency at N: submit p50 {out['submit_p50_ms']} ms p99 {out['submit_p99_ms']} ms; "
        f"claim p50 {out['claim_p50_ms']} ms p99 {out['claim_p99_ms']} ms"
    )
    out.update(guarded(due_to_lease(leader_url, args, guard), guard))
    log(
        f"due-to-lease at N: p50 {out['due_to_lease_p50_ms']} ms p99 "
        f"{out['due_to_lease_p99_ms']} ms ({out['due_leased']}/{out['due_expected']})"
    )

    out["snapshot_at_n"] = wait_for_snapshots(cluster, load_ended, args.snapshot_wait_s, guard)
    out["snapshots"] = {n: snapshot_metrics(node.http_url) for n, node in cluster.nodes.items()}
    out["disk"] = {n: disk_figures(node.data_dir) for n, node in cluster.nodes.items()}
    # Again once every node has compacted its log (entries no longer held in memory).
    later = {node_id: rss_bytes(pid) for node_id, pid in guard.nodes.items()}
    out["rss_after_snapshot_bytes"] = later
    out["rss_after_snapshot_growth_bytes_per_job"] = {
        node_id: round((later[node_id] - baseline[node_id]) / args.jobs, 1) for node_id in later
    }
    encode = [f["snapshot_encode_s"] for f in out["snapshots"].values()]
    out["snapshot_encode_s_max"] = max((e for e in encode if e is not None), default=None)
    pauses = [f["snapshot_fork_pause_s"] for f in out["snapshots"].values()]
    out["snapshot_fork_pause_s_max"] = max((p for p in pauses if p is not None), default=None)
    out["snapshot_bytes_max"] = max(d["snapshot_bytes"] for d in out["disk"].values())
    log(
        f"snapshots: encode {encode} s, fork pause {pauses} s, "
        f"{out['snapshot_bytes_max'] / 2**20:,.1f} MiB on disk"
    )

    if args.no_failover:
        return
    leader = cluster.wait_for_leader(timeout_s=60)
    survivors = [node.http_url for node_id, node in cluster.nodes.items() if node_id != leader]
    killed_at = time.monotonic()
    cluster.kill(leader)  # SIGKILL
    guard.nodes = node_pids(cluster)
    wrote = guarded(first_write(survivors, args.failover_time_limit_s), guard)
    out["killed"] = leader
    out["failover_s"] = None if wrote is None else round(wrote - killed_at, 3)
    log(f"failover: killed leader {leader}; a write accepted after {out['failover_s']} s")
    guard.check()
    restarted_at = time.monotonic()
    cluster.start(leader)
    guard.nodes = node_pids(cluster)
    ready = guarded(
        ready_with_reads(
            cluster.nodes[leader].http_url, out["sample_job_ids"], args.restart_time_limit_s
        ),
        guard,
    )
    out["restart_to_ready_s"] = None if ready is None else round(ready - restarted_at, 3)
    out["restart_load_s"] = snapshot_metrics(cluster.nodes[leader].http_url)["snapshot_load_s"]
    out["rss_after_restart_bytes"] = rss_bytes(guard.nodes[leader])
    log(
        f"restart: {leader} ready and reading jobs after {out['restart_to_ready_s']} s "
        f"(snapshot load {out['restart_load_s']} s)"
    )


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through every cleanup below


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000_000)
    parser.add_argument("--submitters", type=int, default=3, help="load processes")
    parser.add_argument("--connections", type=int, default=2, help="requests in flight each")
    parser.add_argument("--latency-samples", type=int, default=1000)
    parser.add_argument("--due-jobs", type=int, default=5000)
    parser.add_argument("--due-ahead-s", type=float, default=5.0)
    parser.add_argument("--due-spread-s", type=float, default=5.0)
    parser.add_argument("--due-workers", type=int, default=4)
    parser.add_argument("--snapshot-wait-s", type=float, default=900.0)
    parser.add_argument(
        "--log-compaction-entries", type=int, help="the nodes' option (default: theirs)"
    )
    parser.add_argument("--memory-limit", type=float, default=0.75, help="of the machine")
    parser.add_argument("--load-time-limit-s", type=float, default=4 * 3600)
    parser.add_argument("--settle-time-limit-s", type=float, default=600)
    parser.add_argument("--failover-time-limit-s", type=float, default=60)
    parser.add_argument("--restart-time-limit-s", type=float, default=900)
    parser.add_argument("--no-failover", action="store_true")
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="parent of the data")
    parser.add_argument("--keep", action="store_true", help="keep the data and logs")
    parser.add_argument("--src", type=Path, help="run the nodes from this source tree")
    parser.add_argument("--out", type=Path, help="also write the JSON object to this file")
    parser.add_argument("--submitter", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.submitter is None:
        if not 1 <= args.jobs <= 100_000_000:
            parser.error("--jobs 1..100,000,000")
        if not 1 <= args.submitters <= 16 or not 1 <= args.connections <= 16:
            parser.error("--submitters and --connections 1..16")
        if not 0.001 <= args.memory_limit <= 0.95:
            parser.error("--memory-limit 0.001..0.95")
        if args.latency_samples < 1 or args.due_jobs < 1 or args.due_workers < 1:
            parser.error("--latency-samples, --due-jobs, --due-workers at least 1")
    return args


def main() -> None:
    args = parse_args()
    if args.submitter is not None:
        submitter_main(json.loads(args.submitter))
        return
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    args.dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="raftsched-tenm-", dir=args.dir))
    result: dict[str, Any] = {
        "jobs": args.jobs,
        "cpus": os.cpu_count(),
        "durability": "fsync",
        "loadavg_before": loadavg(),
        "settings": {
            "submitters": args.submitters,
            "connections": args.connections,
            "batch": BATCH,
            "queues": QUEUES,
            "tenants": TENANTS,
            "payload_bytes": payload_bytes(),
            "idempotency_key_chars": KEY_CHARS,
            "spread_days": SPREAD_MS // 86_400_000,
            "latency_samples": args.latency_samples,
            "due_jobs": args.due_jobs,
            "due_ahead_s": args.due_ahead_s,
            "due_spread_s": args.due_spread_s,
            "log_compaction_entries": args.log_compaction_entries,
            "memory_limit": args.memory_limit,
            "src": str(args.src.resolve()) if args.src else None,
        },
    }
    env = {"PYTHONPATH": str(args.src.resolve())} if args.src else {}
    extra = []
    if args.log_compaction_entries is not None:
        extra = ["--log-compaction-entries", str(args.log_compaction_entries)]
    cluster = LocalCluster(root, size=3, durability="fsync", env=env, extra_args=extra)
    os.environ["RAFTSCHED_TOKEN"] = cluster.admin_token  # every call of the run carries it
    guard = MemoryGuard(args.memory_limit, lambda: None)
    guard.stop_nodes = lambda: [
        node.process.terminate()
        for node in cluster.nodes.values()
        if node.process is not None and node.process.poll() is None
    ]
    code = 0
    try:
        fs = result["filesystem"] = filesystem_of(root)
        if fs["type"] in REFUSED_FILESYSTEMS:
            raise RuntimeError(f"{root} is on a {fs['type']}; give --dir on a disk")
        log(f"data under {root} ({fs['type']} at {fs['mount']}); {args.jobs:,} jobs")
        guard.start()
        run(cluster, args, guard, result)
    except Aborted as error:
        result["aborted"] = str(error)
        code = 2
    except (RuntimeError, TimeoutError, OSError, aiohttp.ClientError) as error:
        result["error"] = f"{type(error).__name__}: {error}"[:3000]
        log(f"ERROR {result['error']}")
        code = 1
    except (KeyboardInterrupt, SystemExit) as error:  # Ctrl-C, SIGTERM, SIGHUP
        result["error"] = f"interrupted ({type(error).__name__} {error})"
        log(f"stopping: {result['error']}")
        code = 130
    finally:
        guard.stop()
        cluster.stop()
        if args.keep:
            log(f"kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    if guard.reason is not None and "aborted" not in result:
        result["aborted"] = guard.reason
        code = 2
    result.update(guard.figures())
    result["loadavg_after"] = loadavg()
    line = json.dumps(result)
    if args.out:
        args.out.write_text(line + "\n")
    print(line, flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
