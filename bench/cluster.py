"""Benchmark of a real 3-node cluster on this machine (not a test).

Starts three `raftsched node` processes on loopback with durability on
(`LocalCluster(durability="fsync")`), drives them over HTTP with aiohttp from
this process, and prints one JSON object as its last line.

    .venv/bin/python bench/cluster.py            # about two minutes
    .venv/bin/python bench/cluster.py --quick    # about half a minute

All traffic goes to the leader's URL (a follower would only add a 307 hop).
Every load loop is bounded by a job count and a time limit and stops by
itself; the cluster is stopped and its directory removed at the end.

Figures (keys of the JSON object):
- jobs_per_s_single: jobs taken through submit -> claim -> start -> complete,
  one job per request (POST /v1/jobs, claim with max_jobs=1, the single
  start and complete routes), divided by the phase's wall time. Submitters
  and workers run at the same time; the backlog of submitted-but-unfinished
  jobs is capped so the phase measures a sustained rate, not a queue filling.
- jobs_per_s_batched: the same with POST /v1/jobs/batch (BATCH jobs per
  request), claims with max_jobs=BATCH, and /v1/leases/batch for the starts
  and then the completions.
- submit_p50_ms / submit_p99_ms: single POST /v1/jobs on an otherwise idle
  cluster, one at a time, client-side round trip. submit_loaded_p50_ms /
  submit_loaded_p99_ms: the same during the single-request throughput phase.
- due_to_lease_p50_ms / due_to_lease_p99_ms: after the replicas have applied
  the throughput phases' backlog (settle_s: how long that took), workers are
  already waiting in long-poll claims; jobs are submitted with `run_at` DUE_AHEAD_MS in the
  future. Lag = the wall-clock time this process receives the lease minus
  the job's `run_at` (same machine, same clock). It includes the leader's
  timer, the Tick entry, the claim entry and the HTTP response.
  submit_to_lease_p50_ms / _p99_ms: the same for jobs without run_at, from
  sending the submit to receiving the lease.
- failover_s: median over several runs of: SIGKILL the leader (jobs already
  pending) -> the first claim answered with a lease by the new leader, while
  claimers poll the surviving nodes. failover_runs_s lists every run.
- leader_cpu_ms_per_job_single / _batched: CPU time (user + system) the leader
  process spent per job in each throughput phase; steadier than jobs/s on a
  shared machine, so it is the figure to compare before and after a change.
- cpu_ms_per_job_single / _batched: the same for every process that shares
  the machine (leader, each follower, this load generator, and their total),
  and cores_busy_single / _batched: that total CPU time over the phase's wall
  time. With both cores busy, 1000 / (total / 2) bounds jobs/s on this machine.
- loadavg_before / loadavg_after: /proc/loadavg, since the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from raftsched.testing import LocalCluster, http_json
from raftsched.timefmt import format_ms

BATCH = 100
DUE_AHEAD_MS = 200
JSON_HEADERS = {"Content-Type": "application/json"}
PAYLOAD = {"order": "ord_000000000001", "amount": 1200, "currency": "EUR"}


@dataclass(frozen=True)
class Settings:
    idle_submits: int
    single_jobs: int
    single_time_s: float
    single_submitters: int
    single_workers: int
    batched_jobs: int
    batched_time_s: float
    batched_submitters: int
    batched_workers: int
    backlog_max: int
    due_jobs: int
    due_interval_s: float
    due_workers: int
    failover_runs: int

    @staticmethod
    def for_run(quick: bool) -> Settings:
        if quick:
            return Settings(50, 2_000, 15, 16, 16, 10_000, 15, 4, 4, 2_000, 60, 0.02, 4, 2)
        return Settings(300, 10_000, 40, 32, 32, 60_000, 40, 6, 6, 4_000, 300, 0.02, 8, 5)


def percentile(samples: list[float], fraction: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def log(message: str) -> None:
    print(message, flush=True)


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process so far (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds of the nodes and of this process over one phase."""

    def __init__(self, pids: dict[str, int], leader_id: str) -> None:
        self.pids = pids
        self.leader_id = leader_id
        self.started = (self._nodes(), time.process_time(), time.monotonic())

    def _nodes(self) -> dict[str, float]:
        return {node_id: cpu_s(pid) for node_id, pid in self.pids.items()}

    def per_job(self, jobs: int) -> tuple[dict[str, Any], float]:
        """(CPU ms per job by process, cores busy) since the meter started."""
        nodes_before, own_before, wall_before = self.started
        nodes = {n: cpu - nodes_before[n] for n, cpu in self._nodes().items()}
        own = time.process_time() - own_before
        total = sum(nodes.values()) + own
        jobs = max(1, jobs)

        def per(seconds: float) -> float:
            return round(seconds * 1000 / jobs, 3)

        figures = {
            "leader": per(nodes[self.leader_id]),
            "followers": [per(cpu) for n, cpu in sorted(nodes.items()) if n != self.leader_id],
            "load_generator": per(own),
            "total": per(total),
        }
        return figures, round(total / max(1e-9, time.monotonic() - wall_before), 2)


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def auth_headers() -> dict[str, str]:
    """The cluster's admin token (set in $RAFTSCHED_TOKEN once the cluster exists)."""
    token = os.environ.get("RAFTSCHED_TOKEN", "").strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


class Http:
    """Raw aiohttp calls to one node: JSON in, (status, JSON) out, no redirects."""

    def __init__(self, base_url: str, connections: int) -> None:
        self.base_url = base_url
        connector = aiohttp.TCPConnector(limit=connections, force_close=False)
        timeout = aiohttp.ClientTimeout(total=30)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, headers=auth_headers()
        )

    async def post(self, path: str, body: Any, base_url: str | None = None) -> tuple[int, Any]:
        url = (base_url or self.base_url) + path
        data = json.dumps(body).encode()
        async with self.session.post(
            url, data=data, headers=JSON_HEADERS, allow_redirects=False
        ) as response:
            raw = await response.read()
            return response.status, (json.loads(raw) if raw else None)

    async def close(self) -> None:
        await self.session.close()


def expect(status: int, body: Any, wanted: tuple[int, ...] = (200, 201)) -> Any:
    if status not in wanted:
        raise RuntimeError(f"unexpected answer {status}: {body}")
    return body


@dataclass
class Pipeline:
    """Shared counters of one throughput phase."""

    target: int
    deadline: float
    submitted: int = 0
    completed: int = 0
    errors: int = 0
    submit_latencies_s: list[float] = field(default_factory=list)
    room: asyncio.Event = field(default_factory=asyncio.Event)

    def running(self) -> bool:
        return self.completed < self.target and time.monotonic() < self.deadline

    async def wait_for_room(self, backlog_max: int) -> None:
        while self.submitted - self.completed >= backlog_max and self.running():
            self.room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.room.wait(), 0.05)

    def done(self, count: int) -> None:
        self.completed += count
        self.room.set()


# -- phases -------------------------------------------------------------------


async def idle_submits(http: Http, count: int) -> list[float]:
    latencies: list[float] = []
    for i in range(count):
        started = time.perf_counter()
        expect(*await http.post("/v1/jobs", {"queue": "idle", "payload": {"i": i}}))
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(0.005)
    return latencies


async def run_phase(
    settings_time_s: float,
    target: int,
    tasks: Callable[[Pipeline], Sequence[Awaitable[None]]],
) -> tuple[Pipeline, float]:
    pipeline = Pipeline(target, time.monotonic() + settings_time_s)
    started = time.monotonic()
    running = [asyncio.ensure_future(task) for task in tasks(pipeline)]
    try:
        while pipeline.running() and not all(t.done() for t in running):
            await asyncio.sleep(0.02)
    finally:
        elapsed = time.monotonic() - started
        for task in running:
            task.cancel()
        results = await asyncio.gather(*running, return_exceptions=True)
    for result in results:
        if isinstance(result, Exception):
            raise result
    return pipeline, elapsed


async def single_submitter(http: Http, queue: str, p: Pipeline, backlog_max: int) -> None:
    while p.running() and p.submitted < p.target:
        await p.wait_for_room(backlog_max)
        p.submitted += 1
        started = time.perf_counter()
        status, body = await http.post("/v1/jobs", {"queue": queue, "payload": PAYLOAD})
        p.submit_latencies_s.append(time.perf_counter() - started)
        if status != 201:
            p.submitted -= 1
            p.errors += 1
            await asyncio.sleep(0.05)


async def single_worker(http: Http, queue: str, worker_id: str, p: Pipeline) -> None:
    claim = {"worker_id": worker_id, "queues": [queue], "max_jobs": 1, "wait_s": 1}
    while p.running():
        body = expect(*await http.post("/v1/leases", claim))
        for lease in body["leases"]:
            job_id, token = lease["job_id"], lease["fencing_token"]
            prefix = f"/v1/leases/{job_id}"
            expect(*await http.post(prefix + "/start", {"fencing_token": token}))
            done = {"fencing_token": token, "result": {"ok": True}}
            expect(*await http.post(prefix + "/complete", done))
            p.done(1)


async def batch_submitter(http: Http, queue: str, p: Pipeline, backlog_max: int) -> None:
    jobs = [{"queue": queue, "payload": PAYLOAD}] * BATCH
    while p.running() and p.submitted < p.target:
        await p.wait_for_room(backlog_max)
        p.submitted += BATCH
        started = time.perf_counter()
        status, body = await http.post("/v1/jobs/batch", {"jobs": jobs})
        p.submit_latencies_s.append(time.perf_counter() - started)
        if status != 200 or any("error" in r for r in body["results"]):
            raise RuntimeError(f"batch submit failed: {status} {str(body)[:300]}")


async def batch_worker(http: Http, queue: str, worker_id: str, p: Pipeline) -> None:
    claim = {"worker_id": worker_id, "queues": [queue], "max_jobs": BATCH, "wait_s": 1}
    while p.running():
        body = expect(*await http.post("/v1/leases", claim))
        leases = body["leases"]
        if not leases:
            continue
        for op, extra in (("start", {}), ("complete", {"result": {"ok": True}})):
            ops = [
                {"op": op, "job_id": lease["job_id"], "fencing_token": lease["fencing_token"]}
                | extra
                for lease in leases
            ]
            answer = expect(*await http.post("/v1/leases/batch", {"ops": ops}))
            failed = [r for r in answer["results"] if "error" in r]
            if failed:
                raise RuntimeError(f"lease batch {op} failed: {failed[:3]}")
        p.done(len(leases))


async def due_to_lease(http: Http, settings: Settings) -> dict[str, list[float]]:
    """Waiting workers; jobs due DUE_AHEAD_MS after submission, then immediate jobs."""
    lags: dict[str, list[float]] = {"due": [], "due_at": [], "immediate": []}
    phase_started = time.monotonic()
    expected = settings.due_jobs * 2
    sent_at: dict[int, float] = {}
    finished = asyncio.Event()
    deadline = time.monotonic() + 30 + settings.due_jobs * settings.due_interval_s * 4

    async def worker(worker_id: str) -> None:
        claim = {"worker_id": worker_id, "queues": ["due"], "max_jobs": 1, "wait_s": 5}
        while not finished.is_set() and time.monotonic() < deadline:
            body = expect(*await http.post("/v1/leases", claim))
            received_ms = time.time() * 1000
            for lease in body["leases"]:
                payload = lease["payload"]
                if "run_at_ms" in payload:
                    lags["due"].append((received_ms - payload["run_at_ms"]) / 1000)
                    lags["due_at"].append(time.monotonic() - phase_started)
                else:
                    lags["immediate"].append((received_ms - sent_at[payload["n"]]) / 1000)
                token = lease["fencing_token"]
                prefix = f"/v1/leases/{lease['job_id']}"
                expect(*await http.post(prefix + "/start", {"fencing_token": token}))
                expect(*await http.post(prefix + "/complete", {"fencing_token": token}))
            if len(lags["due"]) + len(lags["immediate"]) >= expected:
                finished.set()

    workers = [asyncio.ensure_future(worker(f"due-{i}")) for i in range(settings.due_workers)]
    await asyncio.sleep(0.5)  # every worker is now parked in its long-poll
    for _ in range(settings.due_jobs):
        run_at_ms = int(time.time() * 1000) + DUE_AHEAD_MS
        body = {"queue": "due", "run_at": format_ms(run_at_ms), "payload": {"run_at_ms": run_at_ms}}
        expect(*await http.post("/v1/jobs", body))
        await asyncio.sleep(settings.due_interval_s)
    await asyncio.sleep(DUE_AHEAD_MS / 1000 + 0.2)
    for n in range(settings.due_jobs):
        sent_at[n] = time.time() * 1000
        expect(*await http.post("/v1/jobs", {"queue": "due", "payload": {"n": n}}))
        await asyncio.sleep(settings.due_interval_s)
    try:
        await asyncio.wait_for(finished.wait(), max(1.0, deadline - time.monotonic()))
    except TimeoutError:
        log(f"due-to-lease: only {len(lags['due']) + len(lags['immediate'])}/{expected} leased")
    finished.set()
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    return lags


async def first_lease(urls: list[str], timeout_s: float) -> float | None:
    """Poll every URL for a lease on queue `failover`; monotonic time of the first."""
    found = asyncio.Event()
    when: list[float] = []
    deadline = time.monotonic() + timeout_s
    claim = {"worker_id": "failover", "queues": ["failover"], "max_jobs": 1, "wait_s": 1}
    http = Http(urls[0], 16)

    async def poll(url: str) -> None:
        while not found.is_set() and time.monotonic() < deadline:
            try:
                status, body = await http.post("/v1/leases", claim, base_url=url)
            except (aiohttp.ClientError, TimeoutError):
                status, body = 0, None
            if status == 200 and body["leases"]:
                when.append(time.monotonic())
                found.set()
                return
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(asyncio.gather(*(poll(url) for url in urls)), timeout_s + 5)
    except TimeoutError:
        pass
    finally:
        await http.close()
    return min(when) if when else None


def failover_runs(cluster: LocalCluster, runs: int) -> list[float]:
    times: list[float] = []
    for run in range(runs):
        leader = cluster.wait_for_leader(timeout_s=60)
        leader_url = cluster.nodes[leader].http_url
        for _ in range(3):
            status, body, _ = http_json("POST", leader_url + "/v1/jobs", {"queue": "failover"})
            expect(status, body)
        survivors = [n.http_url for n in cluster.nodes.values() if n.id != leader]
        started = time.monotonic()
        cluster.kill(leader)
        granted = asyncio.run(first_lease(survivors, timeout_s=30))
        if granted is None:
            log(f"failover run {run + 1}: no lease within 30 s")
        else:
            times.append(granted - started)
            log(
                f"failover run {run + 1}: killed {leader}, first lease after "
                f"{granted - started:.3f} s"
            )
        cluster.start(leader)
        cluster.wait_for_leader(timeout_s=60)
        cluster.wait_converged(timeout_s=60)
    return times


# -- main -----------------------------------------------------------------------


async def settle(urls: list[str], timeout_s: float = 60.0) -> float:
    """Wait until every replica has applied what the leader has committed.

    After the throughput phases the followers are still applying their
    backlog, and while pysyncobj applies it their tick threads answer no
    appends; the due-to-lease phase measures the lag on a settled cluster.
    Returns how long that took."""
    started = time.monotonic()
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=5), headers=auth_headers()
    ) as session:
        while time.monotonic() - started < timeout_s:
            views = []
            for url in urls:
                async with session.get(url + "/v1/cluster") as response:
                    views.append(await response.json())
            leader_commit = max(view["commit_index"] for view in views)
            if all(view["applied_index"] >= leader_commit for view in views):
                break
            await asyncio.sleep(0.1)
    return round(time.monotonic() - started, 2)


async def load_phases(
    leader_url: str, pids: dict[str, int], leader_id: str, settings: Settings, urls: list[str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    http = Http(leader_url, 256)
    try:
        idle = await idle_submits(http, settings.idle_submits)
        out["submit_p50_ms"] = ms(percentile(idle, 0.5))
        out["submit_p99_ms"] = ms(percentile(idle, 0.99))
        log(f"idle submit: p50 {out['submit_p50_ms']} ms, p99 {out['submit_p99_ms']} ms")

        s = settings
        meter = CpuMeter(pids, leader_id)
        single, elapsed = await run_phase(
            s.single_time_s,
            s.single_jobs,
            lambda p: (
                [
                    single_submitter(http, "single", p, s.backlog_max)
                    for _ in range(s.single_submitters)
                ]
                + [single_worker(http, "single", f"single-{i}", p) for i in range(s.single_workers)]
            ),
        )
        out["jobs_per_s_single"] = round(single.completed / elapsed, 1)
        out["cpu_ms_per_job_single"], out["cores_busy_single"] = meter.per_job(single.completed)
        out["leader_cpu_ms_per_job_single"] = out["cpu_ms_per_job_single"]["leader"]
        out["single_jobs_completed"] = single.completed
        out["single_elapsed_s"] = round(elapsed, 2)
        out["submit_loaded_p50_ms"] = ms(percentile(single.submit_latencies_s, 0.5))
        out["submit_loaded_p99_ms"] = ms(percentile(single.submit_latencies_s, 0.99))
        log(
            f"single: {single.completed} jobs in {elapsed:.1f} s = "
            f"{out['jobs_per_s_single']} jobs/s; submit under load p50 "
            f"{out['submit_loaded_p50_ms']} ms p99 {out['submit_loaded_p99_ms']} ms"
        )

        meter = CpuMeter(pids, leader_id)
        batched, elapsed = await run_phase(
            s.batched_time_s,
            s.batched_jobs,
            lambda p: (
                [
                    batch_submitter(http, "batched", p, s.backlog_max)
                    for _ in range(s.batched_submitters)
                ]
                + [batch_worker(http, "batched", f"batch-{i}", p) for i in range(s.batched_workers)]
            ),
        )
        out["jobs_per_s_batched"] = round(batched.completed / elapsed, 1)
        out["cpu_ms_per_job_batched"], out["cores_busy_batched"] = meter.per_job(batched.completed)
        out["leader_cpu_ms_per_job_batched"] = out["cpu_ms_per_job_batched"]["leader"]
        out["batched_jobs_completed"] = batched.completed
        out["batched_elapsed_s"] = round(elapsed, 2)
        out["batch_submit_p50_ms"] = ms(percentile(batched.submit_latencies_s, 0.5))
        log(
            f"batched: {batched.completed} jobs in {elapsed:.1f} s = "
            f"{out['jobs_per_s_batched']} jobs/s"
        )

        out["settle_s"] = await settle(urls)
        lags = await due_to_lease(http, s)
        worst = sorted(zip(lags["due"], lags["due_at"], strict=True), reverse=True)[:8]
        log(
            "due-to-lease worst (lag ms @ s into the phase): "
            + ", ".join(f"{ms(lag)} @ {at:.2f}" for lag, at in worst)
        )
        out["due_to_lease_p50_ms"] = ms(percentile(lags["due"], 0.5))
        out["due_to_lease_p99_ms"] = ms(percentile(lags["due"], 0.99))
        out["submit_to_lease_p50_ms"] = ms(percentile(lags["immediate"], 0.5))
        out["submit_to_lease_p99_ms"] = ms(percentile(lags["immediate"], 0.99))
        log(
            f"due-to-lease: p50 {out['due_to_lease_p50_ms']} ms p99 "
            f"{out['due_to_lease_p99_ms']} ms ({len(lags['due'])} jobs); submit-to-lease p50 "
            f"{out['submit_to_lease_p50_ms']} ms p99 {out['submit_to_lease_p99_ms']} ms"
        )
    finally:
        await http.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short run (about 30 s)")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory")
    parser.add_argument("--no-failover", action="store_true", help="skip the failover runs")
    parser.add_argument(
        "--src", type=Path, help="run the nodes from this source tree (before/after comparisons)"
    )
    args = parser.parse_args()
    settings = Settings.for_run(args.quick)
    root = Path(tempfile.mkdtemp(prefix="raftsched-bench-"))
    result: dict[str, Any] = {
        "quick": args.quick,
        "cpus": os.cpu_count(),
        "loadavg_before": loadavg(),
        "durability": "fsync",
    }
    env = {"PYTHONPATH": str(args.src.resolve())} if args.src else {}
    cluster = LocalCluster(root, size=3, durability="fsync", env=env)
    os.environ["RAFTSCHED_TOKEN"] = cluster.admin_token  # every call of the run carries it
    try:
        cluster.start()
        leader = cluster.wait_for_leader(timeout_s=60)
        time.sleep(1.0)  # let the take-over settle: "idle" means idle
        pids: dict[str, int] = {}
        for node_id, node in cluster.nodes.items():
            assert node.process is not None
            pids[node_id] = node.process.pid
        result.update(
            asyncio.run(
                load_phases(cluster.nodes[leader].http_url, pids, leader, settings, cluster.urls)
            )
        )
        if args.no_failover or settings.failover_runs == 0:
            result["failover_s"] = None
        else:
            runs = failover_runs(cluster, settings.failover_runs)
            result["failover_s"] = round(statistics.median(runs), 3) if runs else None
            result["failover_runs_s"] = [round(t, 3) for t in runs]
        result["loadavg_after"] = loadavg()
    finally:
        cluster.stop()
        if args.keep:
            log(f"cluster directory kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
