"""Benchmark of a real 3-node cluster of S data shards (docs/shards.md, section 8).

For each S in `--shards` (default 1,2,4) it starts three `raftsched node
--shards S` processes on loopback with durability on, waits until every
shard has a leader (and, with S > 1, has recorded its shard), drives the
cluster over HTTP with aiohttp from this process, stops it, and goes on to
the next S. It prints one JSON object as its last line.

    .venv/bin/python bench/shards.py                 # about 4 minutes
    .venv/bin/python bench/shards.py --quick         # about 1.5 minutes
    .venv/bin/python bench/shards.py --shards 1,4

The load is the same for every S: the same number of submitters and
workers in all, split evenly over the shards. Each shard's submitters and
workers talk to the node that hosts that shard's leader and name the shard
(`Raftsched-Shard: k`), as the worker SDK's per-shard pollers do, so no
request pays a redirect. Every load loop is bounded by a job count and a
time limit.

Figures, per S (`runs[i]`):
- jobs_per_s_single / _batched: jobs taken through submit -> claim -> start
  -> complete, one job per request (single) or BATCH per request (batched:
  `POST /v1/jobs/batch`, claims of BATCH, `/v1/leases/batch` for the starts
  and the completions), over the phase's wall time.
- shard_leader_cpu_ms_per_job_single / _batched: for each shard, the CPU
  time (user + system) of the process that leads it (group 0's node process
  for shard 0, the shard process for k >= 1) divided by the jobs that shard
  completed. The design's claim is that this stays flat as S grows: each
  shard's leader does the same work per job whatever S is, so with more
  cores the shards' leaders run in parallel. Shard 0's leader is group 0's
  node process, which is also its machine's HTTP front for every shard, so
  its figure includes that routing: compare the shards k >= 1.
- node_cpu_ms_per_job_*: CPU per job (all jobs) of the node processes
  (group 0, HTTP, authentication and the routing to shard processes), the
  front every request crosses; shard processes' own CPU is
  shard_processes_cpu_ms_per_job_*. total_cpu_ms_per_job_* adds this load
  generator. cores_busy_*: all that CPU over the wall time (the machine has
  os.cpu_count() cores).
- shard_leader_busy_cpu_ms_per_job_*: the same less what each leader
  spends idle (measured for IDLE_S before the phases: election timers,
  heartbeats, the once-a-second polls of its peers), which a slow phase
  would otherwise charge to its few jobs.
- leader_idle_cpu_per_s: that idle rate, CPU seconds per second, by shard.
- `--load per-shard` gives every shard the loops the settings give the
  whole cluster (so S times the offered load), to compare shards that are
  each as busy as the one shard of S = 1; the default splits the same loops
  over the shards.
- leaders_by_node: how many shards each node leads (pysyncobj elects
  whoever times out first; there is no balancing, docs/shards.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from cluster import (
    Pipeline,
    batch_submitter,
    batch_worker,
    cpu_s,
    loadavg,
    log,
    single_submitter,
    single_worker,
)

from raftsched.testing import LocalCluster

JSON_HEADERS = {"Content-Type": "application/json"}
IDLE_S = 5.0


@dataclass(frozen=True)
class Settings:
    single_jobs: int
    single_time_s: float
    submitters: int
    workers: int
    batched_jobs: int
    batched_time_s: float
    batch_submitters: int
    batch_workers: int
    backlog_max: int

    @staticmethod
    def for_run(quick: bool) -> Settings:
        if quick:
            return Settings(2_000, 12, 16, 16, 8_000, 12, 4, 4, 2_000)
        return Settings(8_000, 30, 32, 32, 40_000, 30, 8, 8, 4_000)


class ShardHttp:
    """Raw aiohttp calls to the node hosting one shard's leader, naming the
    shard on every request."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, shard: int) -> None:
        self.session = session
        self.base_url = base_url
        self.headers = {**JSON_HEADERS, "Raftsched-Shard": str(shard)}

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        async with self.session.post(
            self.base_url + path,
            data=json.dumps(body).encode(),
            headers=self.headers,
            allow_redirects=False,
        ) as response:
            raw = await response.read()
            return response.status, (json.loads(raw) if raw else None)


@dataclass
class ShardPipeline:
    """One phase's counters for all shards together, and each shard's own."""

    total: Pipeline
    completed: list[int]

    def of(self, shard: int) -> ShardCounter:
        """What bench/cluster.py's worker loops count into, for one shard."""
        return ShardCounter(self, shard)


@dataclass
class ShardCounter:
    """A shard's view of the phase: it runs while the phase does, and a job
    it completes counts for the shard and for the whole phase."""

    phase: ShardPipeline
    shard: int

    def running(self) -> bool:
        return self.phase.total.running()

    def done(self, count: int) -> None:
        self.phase.completed[self.shard] += count
        self.phase.total.done(count)


PER_SHARD = False
"""`--load per-shard`: each shard gets the loops the settings give the
whole cluster (so S times the load), instead of a share of them."""


def spread(total: int, shards: int) -> list[int]:
    """`total` loops split over the shards as evenly as integers allow (or,
    with `--load per-shard`, `total` for every shard)."""
    if PER_SHARD:
        return [total] * shards
    return [total // shards + (1 if k < total % shards else 0) for k in range(shards)]


async def run_phase(
    shards: int,
    time_s: float,
    target: int,
    tasks: Callable[[ShardPipeline], Sequence[Awaitable[None]]],
) -> tuple[ShardPipeline, float]:
    pipeline = ShardPipeline(Pipeline(target, time.monotonic() + time_s), [0] * shards)
    started = time.monotonic()
    running = [asyncio.ensure_future(task) for task in tasks(pipeline)]
    try:
        while pipeline.total.running() and not all(t.done() for t in running):
            await asyncio.sleep(0.02)
    finally:
        elapsed = time.monotonic() - started
        for task in running:
            task.cancel()
        results = await asyncio.gather(*running, return_exceptions=True)
    for result in results:
        if isinstance(result, Exception) and not isinstance(result, asyncio.CancelledError):
            raise result
    return pipeline, elapsed


class Meter:
    """CPU seconds of every process of the cluster and of this one, over a phase."""

    def __init__(
        self,
        leaders: list[int],
        nodes: list[int],
        shard_processes: list[int],
        idle_rates: list[float],
    ) -> None:
        self.leaders, self.nodes, self.shard_processes = leaders, nodes, shard_processes
        # CPU seconds per second each leader spends with no load (timers,
        # heartbeats, the once-a-second polls), subtracted for the _busy figure.
        self.idle_rates = idle_rates
        self.started = self._sample()

    def _sample(self) -> tuple[list[float], float, float, float, float]:
        return (
            [cpu_s(pid) for pid in self.leaders],
            sum(cpu_s(pid) for pid in self.nodes),
            sum(cpu_s(pid) for pid in self.shard_processes),
            time.process_time(),
            time.monotonic(),
        )

    def figures(self, p: ShardPipeline, phase: str) -> dict[str, Any]:
        leaders0, nodes0, shards0, own0, wall0 = self.started
        leaders1, nodes1, shards1, own1, wall1 = self._sample()
        jobs = max(1, p.total.completed)
        per_shard = [
            round((after - before) * 1000 / max(1, done), 3)
            for before, after, done in zip(leaders0, leaders1, p.completed, strict=True)
        ]
        elapsed = wall1 - wall0
        busy = [
            round(max(0.0, after - before - idle * elapsed) * 1000 / max(1, done), 3)
            for before, after, done, idle in zip(
                leaders0, leaders1, p.completed, self.idle_rates, strict=True
            )
        ]
        total = (nodes1 - nodes0) + (shards1 - shards0) + (own1 - own0)
        return {
            f"shard_leader_cpu_ms_per_job_{phase}": per_shard,
            f"shard_leader_busy_cpu_ms_per_job_{phase}": busy,
            f"node_cpu_ms_per_job_{phase}": round((nodes1 - nodes0) * 1000 / jobs, 3),
            f"shard_processes_cpu_ms_per_job_{phase}": round((shards1 - shards0) * 1000 / jobs, 3),
            f"load_generator_cpu_ms_per_job_{phase}": round((own1 - own0) * 1000 / jobs, 3),
            f"total_cpu_ms_per_job_{phase}": round(total * 1000 / jobs, 3),
            f"cores_busy_{phase}": round(total / max(1e-9, wall1 - wall0), 2),
            f"jobs_by_shard_{phase}": list(p.completed),
        }


async def load(
    shards: int,
    leader_urls: list[str],
    meter_for: Callable[[], Meter],
    settings: Settings,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    connector = aiohttp.TCPConnector(limit=512)
    token = os.environ.get("RAFTSCHED_TOKEN", "")
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=30),
        headers={"Authorization": f"Bearer {token}"} if token else {},
    ) as session:
        https = [ShardHttp(session, leader_urls[k], k) for k in range(shards)]
        s = settings

        def single(p: ShardPipeline) -> list[Awaitable[None]]:
            loops: list[Awaitable[None]] = []
            for k, n in enumerate(spread(s.submitters, shards)):
                loops += [
                    single_submitter(https[k], "single", p.total, s.backlog_max) for _ in range(n)
                ]
            for k, n in enumerate(spread(s.workers, shards)):
                loops += [single_worker(https[k], "single", f"w{k}-{i}", p.of(k)) for i in range(n)]
            return loops

        def batched(p: ShardPipeline) -> list[Awaitable[None]]:
            loops: list[Awaitable[None]] = []
            for k, n in enumerate(spread(s.batch_submitters, shards)):
                loops += [
                    batch_submitter(https[k], "batched", p.total, s.backlog_max) for _ in range(n)
                ]
            for k, n in enumerate(spread(s.batch_workers, shards)):
                loops += [batch_worker(https[k], "batched", f"b{k}-{i}", p.of(k)) for i in range(n)]
            return loops

        for phase, time_s, target, tasks in (
            ("single", s.single_time_s, s.single_jobs, single),
            ("batched", s.batched_time_s, s.batched_jobs, batched),
        ):
            meter = meter_for()
            pipeline, elapsed = await run_phase(shards, time_s, target, tasks)
            out[f"jobs_per_s_{phase}"] = round(pipeline.total.completed / elapsed, 1)
            out.update(meter.figures(pipeline, phase))
            out[f"errors_{phase}"] = pipeline.total.errors
            log(
                f"S={shards} {phase}: {pipeline.total.completed} jobs in {elapsed:.1f} s = "
                f"{out[f'jobs_per_s_{phase}']} jobs/s; shard leaders' CPU ms/job "
                f"{out[f'shard_leader_cpu_ms_per_job_{phase}']}; nodes' "
                f"{out[f'node_cpu_ms_per_job_{phase}']}"
            )
    return out


def run_one(shards: int, settings: Settings, src: Path | None) -> dict[str, Any]:
    # A short root: a shard process's Unix socket path must fit in 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="rs-sh-", dir="/tmp"))
    env = {"PYTHONPATH": str(src.resolve())} if src else {}
    cluster = LocalCluster(root / "c", size=3, durability="fsync", env=env, shards=shards)
    os.environ["RAFTSCHED_TOKEN"] = cluster.admin_token
    try:
        cluster.start()
        leaders = [cluster.wait_for_leader(timeout_s=90)]  # one shard: group 0
        cluster.wait_for_auth(timeout_s=60)
        if shards > 1:
            leaders = cluster.wait_for_shards(timeout_s=90)
        time.sleep(1.0)
        node_pids = {}
        for node_id, node in cluster.nodes.items():
            assert node.process is not None
            node_pids[node_id] = node.process.pid
        shard_pids = [
            pid
            for node_id in cluster.nodes
            for k in range(1, shards)
            if (pid := cluster.shard_pid(node_id, k)) is not None
        ]
        leader_pids = [
            node_pids[leader] if k == 0 else cluster.shard_pid(leader, k)
            for k, leader in enumerate(leaders)
        ]
        if any(pid is None for pid in leader_pids):
            raise RuntimeError(f"a shard leader's process is unknown: {leader_pids}")
        leader_urls = [cluster.nodes[leader].http_url for leader in leaders]
        result: dict[str, Any] = {
            "shards": shards,
            "leaders_by_node": {n: leaders.count(n) for n in sorted(cluster.nodes)},
        }

        leader_list = [int(p) for p in leader_pids if p]
        idle_before = [cpu_s(pid) for pid in leader_list]
        time.sleep(IDLE_S)
        idle_rates = [
            (cpu_s(pid) - before) / IDLE_S
            for pid, before in zip(leader_list, idle_before, strict=True)
        ]
        result["leader_idle_cpu_per_s"] = [round(rate, 4) for rate in idle_rates]

        def meter() -> Meter:
            return Meter(leader_list, list(node_pids.values()), shard_pids, idle_rates)

        result.update(asyncio.run(load(shards, leader_urls, meter, settings)))
        # Changed leaders during the run would make the per-shard CPU figure wrong.
        now = (
            [cluster.leader_id()]
            if shards == 1
            else [cluster.shard_leader(k) for k in range(shards)]
        )
        result["leaders_changed"] = [
            after != before for after, before in zip(now, leaders, strict=True)
        ]
        return result
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="shorter phases")
    parser.add_argument("--shards", default="1,2,4", help="comma-separated values of S")
    parser.add_argument(
        "--load",
        choices=("total", "per-shard"),
        default="total",
        help="total: the same loops for every S, split over the shards; per-shard: "
        "every shard gets them all (S times the load)",
    )
    parser.add_argument(
        "--src", type=Path, help="run the nodes from this source tree (before/after comparisons)"
    )
    args = parser.parse_args()
    global PER_SHARD
    PER_SHARD = args.load == "per-shard"
    settings = Settings.for_run(args.quick)
    counts = [int(part) for part in args.shards.split(",")]
    result: dict[str, Any] = {
        "quick": args.quick,
        "cpus": os.cpu_count(),
        "loadavg_before": loadavg(),
        "durability": "fsync",
        "load": args.load,
        "runs": [],
    }
    for shards in counts:
        result["runs"].append(run_one(shards, settings, args.src))
    result["loadavg_after"] = loadavg()
    print(json.dumps(result), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
