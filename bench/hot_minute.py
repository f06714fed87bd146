"""The hot minute: a million jobs due in the same second (not a test).

Starts a 3-node cluster on loopback with durability on (fsync), submits
`--jobs` jobs (default 1,000,000) to queue `hot` with one `run_at` a little
in the future (POST /v1/jobs/batch, 1,000 per request, several connections),
then, from that instant, measures:

- runnable_s: from `run_at` until every hot job is runnable or leased (the
  leader's Ticks, bounded by TICK_ITEMS_MAX jobs each, made them pending);
  polled with GET /v1/queues/hot (depth + running).
- leased_s: from `run_at` until every hot job is leased, with `--workers`
  connections claiming `max_jobs=1000` each in a loop (leases of an hour, so
  none expires during the run). leased_per_s = jobs / leased_s.
- unrelated_p99_ms (and _p50_ms, _max_ms, count): meanwhile one more worker
  claims jobs of an unrelated queue one at a time, heartbeats each and
  completes it; the client-side round trip of every claim and heartbeat.

    .venv/bin/python bench/hot_minute.py                 # 1,000,000 jobs
    .venv/bin/python bench/hot_minute.py --jobs 100000

`--packed-horizon-s H` first sets the time wheel (PUT /v1/wheel) to a
horizon of H seconds in buckets of `--packed-bucket-s`, and picks `run_at`
far enough ahead that every hot job is stored packed when submitted
(issue 19: the hot minute when its jobs were packed beforehand, an hour in
production; here the horizon is scaled down so the run takes minutes). The
output adds packed_max (GET /v1/wheel polled during the submissions),
packed_at_run_at (still packed when they came due: 0 means every job was
hydrated ahead of time) and hydrated_s (from the first hydration until none
was packed).

Prints progress on stderr and one JSON object as its last line.
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
from pathlib import Path
from typing import Any

import aiohttp

from raftsched.testing import LocalCluster, metrics_text
from raftsched.timefmt import format_ms

JSON_HEADERS = {"Content-Type": "application/json"}
BATCH = 1000
HOT, OTHER = "hot", "other"
LEASE_S = 3600


def log(message: str) -> None:
    print(f"[hot_minute {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(samples: list[float], fraction: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class Http:
    def __init__(self, base_url: str, connections: int) -> None:
        self.base_url = base_url
        self.leader_moves = 0
        connector = aiohttp.TCPConnector(limit=connections)
        token = os.environ.get("RAFTSCHED_TOKEN", "").strip()
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=120),
            headers={"Authorization": f"Bearer {token}"} if token else {},
        )

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request; a 307 naming a new leader moves every later request
        there (as the SDK does) and is answered by the new leader."""
        data = None if body is None else json.dumps(body).encode()
        for _ in range(3):
            async with self.session.request(
                method, self.base_url + path, data=data, headers=JSON_HEADERS, allow_redirects=False
            ) as response:
                raw = await response.read()
                answer = json.loads(raw) if raw else None
            leader = (answer or {}).get("leader") if response.status == 307 else None
            if not isinstance(leader, dict) or not leader.get("http_url"):
                return response.status, answer
            if self.base_url != leader["http_url"]:
                log(f"leader moved to {leader.get('id')}: {leader['http_url']}")
                self.base_url = leader["http_url"]
                self.leader_moves += 1
        return response.status, answer

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = await self.call(method, path, body)
        if status not in (200, 201):
            raise RuntimeError(f"{method} {path}: {status} {str(answer)[:300]}")
        return answer

    async def close(self) -> None:
        await self.session.close()


async def submit_all(http: Http, jobs: int, run_at_ms: int, connections: int) -> float:
    run_at = format_ms(run_at_ms)
    batches = asyncio.Queue[int]()
    for base in range(0, jobs, BATCH):
        batches.put_nowait(min(BATCH, jobs - base))
    started = time.monotonic()

    async def submitter() -> None:
        while not batches.empty():
            n = batches.get_nowait()
            body = {"jobs": [{"queue": HOT, "run_at": run_at, "lease_s": LEASE_S}] * n}
            answer = await http.ok("POST", "/v1/jobs/batch", body)
            if any("error" in item for item in answer["results"]):
                raise RuntimeError(f"a submission was refused: {answer['results'][:1]}")

    await asyncio.gather(*(submitter() for _ in range(connections)))
    return time.monotonic() - started


async def wait_runnable(http: Http, jobs: int, stop: asyncio.Event) -> float:
    while not stop.is_set():
        view = (await http.ok("GET", f"/v1/queues/{HOT}?consistency=stale"))["queue"]
        if view["depth"] + view["running"] >= jobs:
            return time.time()
        await asyncio.sleep(0.05)
    return time.time()


async def hot_worker(http: Http, name: str, counts: dict[str, int], jobs: int) -> None:
    body = {"worker_id": name, "queues": [HOT], "max_jobs": BATCH, "wait_s": 2, "lease_s": LEASE_S}
    while counts["leased"] < jobs:
        try:
            status, answer = await http.call("POST", "/v1/leases", body)
        except (aiohttp.ClientError, TimeoutError) as error:
            counts["errors"] += 1
            log(f"{name}: claim failed: {error!r}")
            continue
        if status != 200:
            counts["errors"] += 1
            log(f"{name}: claim answered {status}: {str(answer)[:200]}")
            await asyncio.sleep(0.1)
            continue
        counts["leased"] += len(answer["leases"])


async def unrelated_worker(http: Http, latencies_s: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        body = {"worker_id": "unrelated", "queues": [OTHER], "max_jobs": 1, "wait_s": 1}
        try:
            leases = (await http.ok("POST", "/v1/leases", body))["leases"]
            latencies_s.append(time.perf_counter() - started)
            for lease in leases:
                path = f"/v1/leases/{lease['job_id']}"
                token = {"fencing_token": lease["fencing_token"]}
                started = time.perf_counter()
                await http.ok("POST", path + "/heartbeat", token)
                latencies_s.append(time.perf_counter() - started)
                await http.ok("POST", path + "/complete", token)
        except (aiohttp.ClientError, TimeoutError, RuntimeError) as error:
            latencies_s.append(time.perf_counter() - started)  # counted, not hidden
            log(f"unrelated: {error!r}")
        await asyncio.sleep(0.02)


async def watch_wheel(http: Http, stop: asyncio.Event, figures: dict[str, Any]) -> None:
    """How many jobs the wheel holds packed, polled until `stop`: the most,
    and when the count last fell from its peak to zero (hydration)."""
    hydrating_since: float | None = None
    while not stop.is_set():
        # A stale read of the node that answers: a linearizable one waits
        # for the leader's confirmation, which a loaded leader may refuse
        # (503) for a moment. Less the probe's batch, due in an hour.
        status, answer = await http.call("GET", "/v1/wheel?consistency=stale")
        if status != 200:
            await asyncio.sleep(0.5)
            continue
        packed = answer["wheel"]["packed_jobs"] - figures["baseline"]
        now = time.time()
        if packed > figures["packed_max"]:
            figures["packed_max"] = packed
        elif packed < figures["packed_max"] and hydrating_since is None:
            hydrating_since = now
        if hydrating_since is not None and packed == 0 and "hydrated_at" not in figures:
            figures["hydration_started_at"] = hydrating_since
            figures["hydrated_at"] = now
        figures["packed_now"] = packed
        await asyncio.sleep(0.5)


async def run(leader_url: str, args: argparse.Namespace) -> dict[str, Any]:
    http = Http(leader_url, args.workers + args.submitters + 4)
    wheel: dict[str, Any] = {"packed_max": 0, "baseline": 0}
    wheel_stop = asyncio.Event()
    watcher: asyncio.Future[None] | None = None
    try:
        if args.packed_horizon_s is not None:
            setting = {"horizon_s": args.packed_horizon_s, "bucket_s": args.packed_bucket_s}
            await http.ok("PUT", "/v1/wheel", setting)
        await http.ok("POST", "/v1/jobs/batch", {"jobs": [{"queue": OTHER}] * 1000})
        # Pace: submit one batch to estimate the rate, then pick run_at.
        probe_started = time.monotonic()
        await submit_all(http, BATCH, int(time.time() * 1000) + 3_600_000, 1)
        per_job_s = (time.monotonic() - probe_started) / BATCH
        lead_s = args.lead_s or max(10.0, 3.0 * per_job_s * args.jobs + 10)
        if args.packed_horizon_s is not None:
            # Packed only if the bucket starts beyond now + horizon until the
            # last submission: the submissions' time, then the horizon and a
            # bucket more.
            lead_s = max(
                lead_s,
                2.0 * per_job_s * args.jobs + args.packed_horizon_s + 2 * args.packed_bucket_s,
            )
        run_at_ms = int((time.time() + lead_s) * 1000)
        if args.packed_horizon_s is not None:
            wheel["baseline"] = (await http.ok("GET", "/v1/wheel"))["wheel"]["packed_jobs"]
            watcher = asyncio.ensure_future(watch_wheel(http, wheel_stop, wheel))
        log(f"submitting {args.jobs} jobs due in {lead_s:.0f} s")
        submit_s = await submit_all(http, args.jobs, run_at_ms, args.submitters)
        late = time.time() * 1000 > run_at_ms
        log(f"submitted in {submit_s:.1f} s ({args.jobs / submit_s:.0f}/s); late={late}")
        await asyncio.sleep(max(0.0, run_at_ms / 1000 - time.time()))
        packed_at_run_at = wheel.get("packed_now")
        stop = asyncio.Event()
        counts = {"leased": 0, "errors": 0}
        latencies_s: list[float] = []
        unrelated = asyncio.ensure_future(unrelated_worker(http, latencies_s, stop))
        runnable = asyncio.ensure_future(wait_runnable(http, args.jobs, stop))
        workers = [
            asyncio.ensure_future(hot_worker(http, f"hot{i}", counts, args.jobs))
            for i in range(args.workers)
        ]
        deadline = time.monotonic() + args.time_limit_s
        while counts["leased"] < args.jobs and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            if unrelated.done() and unrelated.exception() is not None:
                raise RuntimeError("the unrelated worker failed") from unrelated.exception()
        leased_at = time.time()
        stop.set()
        runnable_at = await runnable
        for task in [*workers, unrelated]:
            task.cancel()
        await asyncio.gather(*workers, unrelated, return_exceptions=True)
        run_at_s = run_at_ms / 1000
        leased_s = leased_at - run_at_s
        packed: dict[str, Any] = {}
        if watcher is not None:
            wheel_stop.set()
            await watcher
            packed = {
                "packed_horizon_s": args.packed_horizon_s,
                "packed_bucket_s": args.packed_bucket_s,
                "packed_max": wheel["packed_max"],
                "packed_at_run_at": packed_at_run_at,
                "hydrated_s": round(wheel["hydrated_at"] - wheel["hydration_started_at"], 2)
                if "hydrated_at" in wheel
                else None,
                "hydrated_before_run_at_s": round(run_at_s - wheel["hydrated_at"], 2)
                if "hydrated_at" in wheel
                else None,
            }
        return {
            **packed,
            "leader_moves_seen": http.leader_moves,
            "jobs": args.jobs,
            "leased": counts["leased"],
            "claim_errors": counts["errors"],
            "submit_s": round(submit_s, 2),
            "submitted_late": late,
            "runnable_s": round(runnable_at - run_at_s, 2),
            "leased_s": round(leased_s, 2),
            "leased_per_s": round(counts["leased"] / leased_s) if leased_s > 0 else None,
            "unrelated_p50_ms": round(percentile(latencies_s, 0.5) * 1000, 1),
            "unrelated_p99_ms": round(percentile(latencies_s, 0.99) * 1000, 1),
            "unrelated_max_ms": round(max(latencies_s, default=float("nan")) * 1000, 1),
            "unrelated_count": len(latencies_s),
        }
    finally:
        wheel_stop.set()
        if watcher is not None and not watcher.done():
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        await http.close()


def node_figures(base_url: str) -> dict[str, float]:
    """Collections and their time in one node process, and on the leader
    the entries it proposed and their commit time (from /metrics)."""
    text = metrics_text(base_url)
    figures: dict[str, float] = {}
    for line in text.splitlines():
        for name, key in (
            ("raftsched_gc_pause_seconds_total", "seconds"),
            ("raftsched_gc_pause_max_seconds", "max_s"),
            ("raftsched_gc_collections_total", "count"),
        ):
            if line.startswith(name + "{"):
                generation = line.split('generation="')[1].split('"')[0]
                figures[f"gen{generation}_{key}"] = round(float(line.split()[-1]), 3)
        for name in ("raftsched_raft_commit_seconds", "raftsched_raft_entry_commands"):
            for suffix in ("_sum", "_count"):
                if line.startswith(name + suffix + " "):
                    figures[name.removeprefix("raftsched_raft_") + suffix] = round(
                        float(line.split()[-1]), 3
                    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=4, help="hot claim connections")
    parser.add_argument("--submitters", type=int, default=4, help="submit connections")
    parser.add_argument("--lead-s", type=float, help="run_at this far ahead (default: estimated)")
    parser.add_argument("--time-limit-s", type=float, default=1800)
    parser.add_argument(
        "--packed-horizon-s", type=float, help="pack the hot jobs first (time wheel horizon)"
    )
    parser.add_argument("--packed-bucket-s", type=float, default=10.0)
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory")
    parser.add_argument("--src", type=Path, help="run the nodes from this source tree")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="raftsched-hot-"))
    result: dict[str, Any] = {"cpus": os.cpu_count(), "durability": "fsync"}
    env = {"PYTHONPATH": str(args.src.resolve())} if args.src else {}
    cluster = LocalCluster(root, size=3, durability="fsync", env=env)
    os.environ["RAFTSCHED_TOKEN"] = cluster.admin_token  # every call of the run carries it
    try:
        cluster.start()
        leader = cluster.wait_for_leader(timeout_s=60)
        time.sleep(1.0)
        result["loadavg_before"] = Path("/proc/loadavg").read_text().strip()
        try:
            result.update(asyncio.run(run(cluster.nodes[leader].http_url, args)))
        except RuntimeError as error:  # e.g. 504 leader_changed during the submissions
            result["error"] = str(error)[:500]
        result["leader_changed"] = cluster.wait_for_leader(timeout_s=10) != leader
        result["nodes"] = {id: node_figures(node.http_url) for id, node in cluster.nodes.items()}
        result["loadavg_after"] = Path("/proc/loadavg").read_text().strip()
    finally:
        cluster.stop()
        if args.keep:
            log(f"cluster directory kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
