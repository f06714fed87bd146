"""What claiming from several shards costs (docs/shards.md, section 4): a
worker long-polling each shard, or one claim fanned out to every shard.

Starts 3 `raftsched node --shards 3` processes on loopback (each with its
two shard processes) and runs a phase per consumer below under each load
(LOADS: "steady", every shard busy; "trickle", every shard mostly idle): a
submitter puts the load's jobs/s without keys (so they go round the
shards) for DURATION seconds, and a consumer claims them (max_jobs SLOTS,
long polls of WAIT_S) and completes each at once (`POST /v1/leases/batch`:
start, complete, at the node hosting its shard's leader). Only how the
consumer claims differs:

- per_shard: a long-poll loop per shard, each naming its shard
  (`Raftsched-Shard: k`), as the worker SDK does.
- fanout_first: one claim at a time, sent to all S shards at once, as a
  node that fans a worker's claim out to every shard would send it; the
  first answer with leases ends the claim and the other polls are dropped
  (their connections closed, which ends a long poll without a grant; a
  grant made before the shard noticed lapses unstarted and its job runs a
  lease later); the consumer takes whatever came.
- fanout_all: the same claim to all S shards at once, taking every answer:
  the next claim waits for the slowest shard (an idle shard holds it for
  WAIT_S), but no grant is dropped. The cheapest a fan-out can be.

No node fan-out is built: these consumers cost the shards what one would
(its node would add its own share on top: S requests per claim).

    .venv/bin/python bench/shard_claims.py            # about 100 s
    .venv/bin/python bench/shard_claims.py --quick    # about 70 s

Figures per load and consumer (keys of the JSON object on the last line,
`<load>.<consumer>.<figure>`; `<load>.fanout_*_over_per_shard` the ratios):
- jobs: jobs completed in the phase; claim_requests: claim requests sent
  (each HTTP request, a redirect followed counted again);
  claim_requests_per_job; empty_claims: claim answers without a lease.
- leaders_cpu_ms_per_job: CPU time (user + system) of the processes that
  lead a shard (group 0's leading node process, shards 1 and 2's leading
  shard processes) per completed job; cluster_cpu_ms_per_job: every node
  and shard process; the load generator's own CPU is apart
  (load_generator_cpu_ms_per_job).
- lease_p50_ms / lease_p99_ms: from sending a job's submit to receiving its
  lease (a lease lost to a dropped poll shows as a lease-long wait).
- unfinished: jobs submitted in the phase but not completed by its end
  (after waiting LEASE_S + 2 s for stragglers).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from raftsched.testing import LocalCluster

SHARDS = 3
SLOTS = 10
WAIT_S = 5.0
LEASE_S = 5.0


# The loads, in jobs/s: every shard busy, or every shard mostly idle.
LOADS = {"steady": 40.0, "trickle": 3.0}


@dataclass(frozen=True)
class Settings:
    duration_s: float

    @staticmethod
    def for_run(quick: bool) -> Settings:
        return Settings(duration_s=5.0 if quick else 10.0)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process so far (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def percentile(samples: list[float], fraction: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 1)


@dataclass
class Topology:
    """Which process leads each shard, and where to send its requests."""

    leader_urls: dict[int, str]  # shard -> the HTTP URL of the node hosting its leader
    leader_pids: dict[int, int]  # shard -> the pid of the process that leads it
    all_pids: list[int]  # every node and shard process


def topology(cluster: LocalCluster) -> Topology:
    urls: dict[int, str] = {}
    pids: dict[int, int] = {}
    for shard in range(SHARDS):
        leader = cluster.wait_for_shard_leader(shard, timeout_s=60)
        node = cluster.nodes[leader]
        urls[shard] = node.http_url
        if shard == 0:
            assert node.process is not None
            pids[shard] = node.process.pid
        else:
            pid = cluster.shard_pid(leader, shard)
            assert pid is not None
            pids[shard] = pid
    every: list[int] = []
    for node_id, node in cluster.nodes.items():
        assert node.process is not None
        every.append(node.process.pid)
        for shard in range(1, SHARDS):
            pid = cluster.shard_pid(node_id, shard)
            assert pid is not None
            every.append(pid)
    return Topology(urls, pids, every)


@dataclass
class Phase:
    queue: str  # a queue of its own: jobs a phase left behind stay there
    submitted_at: dict[str, float] = field(default_factory=dict)
    leased_after_ms: list[float] = field(default_factory=list)
    completed: set[str] = field(default_factory=set)
    claim_requests: int = 0
    empty_claims: int = 0
    done: bool = False


class Http:
    def __init__(self, token: str) -> None:
        self.session = aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=WAIT_S + 20),
        )

    async def post(
        self, url: str, body: Any, shard: int | None = None, phase: Phase | None = None
    ) -> tuple[int, Any]:
        """POST, following 307s (method and body kept), at most 5 hops."""
        headers = {} if shard is None else {"Raftsched-Shard": str(shard)}
        data = json.dumps(body).encode()
        for _ in range(5):
            if phase is not None:
                phase.claim_requests += 1
            async with self.session.post(
                url, data=data, headers=headers, allow_redirects=False
            ) as response:
                if response.status == 307:
                    url = response.headers["Location"]
                    continue
                raw = await response.read()
                return response.status, (json.loads(raw) if raw else None)
        return 0, None

    async def close(self) -> None:
        await self.session.close()


async def submitter(
    http: Http, url: str, phase: Phase, settings: Settings, rate_per_s: float
) -> None:
    period_s = 1.0 / rate_per_s
    loop = asyncio.get_running_loop()
    start = loop.time()
    sent = 0
    pending: set[asyncio.Task[None]] = set()

    async def one() -> None:
        sent_at = time.monotonic()
        try:
            status, body = await http.post(
                url + "/v1/jobs", {"queue": phase.queue, "lease_s": LEASE_S}
            )
        except (aiohttp.ClientError, TimeoutError):
            return
        if status == 201:
            phase.submitted_at[body["job"]["id"]] = sent_at

    while loop.time() - start < settings.duration_s:
        task = asyncio.ensure_future(one())
        pending.add(task)
        task.add_done_callback(pending.discard)
        sent += 1
        await asyncio.sleep(max(0.0, start + sent * period_s - loop.time()))
    await asyncio.gather(*pending, return_exceptions=True)


async def complete(http: Http, topo: Topology, shard: int, leases: list[Any], phase: Phase) -> None:
    now = time.monotonic()
    ops: list[dict[str, Any]] = []
    for lease in leases:
        submitted = phase.submitted_at.get(lease["job_id"])
        if submitted is not None:
            phase.leased_after_ms.append((now - submitted) * 1000)
        token = lease["fencing_token"]
        ops.append({"op": "start", "job_id": lease["job_id"], "fencing_token": token})
        ops.append({"op": "complete", "job_id": lease["job_id"], "fencing_token": token})
    try:
        status, body = await http.post(topo.leader_urls[shard] + "/v1/leases/batch", {"ops": ops})
    except (aiohttp.ClientError, TimeoutError):
        return
    if status != 200:
        return
    for op, result in zip(ops, body["results"], strict=True):
        if op["op"] == "complete" and result.get("status") == "succeeded":
            phase.completed.add(op["job_id"])


def claim_body(queue: str) -> dict[str, Any]:
    return {
        "worker_id": "bench",
        "queues": [queue],
        "max_jobs": SLOTS,
        "wait_s": WAIT_S,
        "lease_s": LEASE_S,
    }


async def claim(http: Http, topo: Topology, shard: int, phase: Phase) -> tuple[int, list[Any]]:
    """(shard, the leases one claim naming `shard` brought: none if it failed)."""
    try:
        status, body = await http.post(
            topo.leader_urls[shard] + "/v1/leases", claim_body(phase.queue), shard, phase
        )
    except (aiohttp.ClientError, TimeoutError):
        await asyncio.sleep(0.2)
        return shard, []
    if status != 200:
        await asyncio.sleep(0.2)
        return shard, []
    return shard, body.get("leases", [])


async def per_shard(http: Http, topo: Topology, phase: Phase) -> None:
    async def loop(shard: int) -> None:
        while not phase.done:
            _, leases = await claim(http, topo, shard, phase)
            if not leases:
                phase.empty_claims += 1
                continue
            await complete(http, topo, shard, leases, phase)

    await asyncio.gather(*(loop(shard) for shard in range(SHARDS)))


async def fanout_first(http: Http, topo: Topology, phase: Phase) -> None:
    await _fanout(http, topo, phase, wait_all=False)


async def fanout_all(http: Http, topo: Topology, phase: Phase) -> None:
    await _fanout(http, topo, phase, wait_all=True)


async def _fanout(http: Http, topo: Topology, phase: Phase, *, wait_all: bool) -> None:
    while not phase.done:
        polls = {asyncio.ensure_future(claim(http, topo, shard, phase)) for shard in range(SHARDS)}
        taken: list[tuple[int, list[Any]]] = []
        try:
            while polls and (wait_all or not any(leases for _, leases in taken)):
                finished, polls = await asyncio.wait(polls, return_when=asyncio.FIRST_COMPLETED)
                taken += [task.result() for task in finished]
        finally:
            for task in polls:  # dropped: its connection closes, its poll ends
                task.cancel()
            await asyncio.gather(*polls, return_exceptions=True)
        phase.empty_claims += sum(1 for _, leases in taken if not leases) + len(polls)
        await asyncio.gather(
            *(complete(http, topo, shard, leases, phase) for shard, leases in taken if leases)
        )


CONSUMERS = {"per_shard": per_shard, "fanout_first": fanout_first, "fanout_all": fanout_all}


async def run_phase(
    load: str, mode: str, token: str, topo: Topology, submit_url: str, settings: Settings
) -> dict[str, Any]:
    http = Http(token)
    phase = Phase(f"bench-{load}-{mode}")
    consumer = CONSUMERS[mode]
    try:
        cpu_before = {pid: cpu_s(pid) for pid in topo.all_pids}
        own_before = time.process_time()
        consuming = asyncio.ensure_future(consumer(http, topo, phase))
        await submitter(http, submit_url, phase, settings, LOADS[load])
        deadline = time.monotonic() + LEASE_S + 2
        while time.monotonic() < deadline and not phase.completed >= set(phase.submitted_at):
            await asyncio.sleep(0.1)
        phase.done = True
        cpu = {pid: cpu_s(pid) - before for pid, before in cpu_before.items()}
        own = time.process_time() - own_before
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)
    finally:
        await http.close()
    jobs = max(1, len(phase.completed))

    def per_job_ms(seconds: float) -> float:
        return round(seconds * 1000 / jobs, 3)

    return {
        "jobs": len(phase.completed),
        "unfinished": len(set(phase.submitted_at) - phase.completed),
        "claim_requests": phase.claim_requests,
        "claim_requests_per_job": round(phase.claim_requests / jobs, 3),
        "empty_claims": phase.empty_claims,
        "leaders_cpu_ms_per_job": per_job_ms(sum(cpu[pid] for pid in topo.leader_pids.values())),
        "cluster_cpu_ms_per_job": per_job_ms(sum(cpu.values())),
        "load_generator_cpu_ms_per_job": per_job_ms(own),
        "lease_p50_ms": percentile(phase.leased_after_ms, 0.5),
        "lease_p99_ms": percentile(phase.leased_after_ms, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short phases (about 70 s in all)")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory")
    args = parser.parse_args()
    settings = Settings.for_run(args.quick)
    # A short root: each shard's Unix socket path must fit in 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="rs-shc-"))
    result: dict[str, Any] = {
        "quick": args.quick,
        "cpus": os.cpu_count(),
        "shards": SHARDS,
        "loads_per_s": LOADS,
        "duration_s": settings.duration_s,
        "slots": SLOTS,
        "wait_s": WAIT_S,
        "loadavg_before": loadavg(),
    }
    cluster = LocalCluster(root / "c", size=3, shards=SHARDS)
    token = cluster.admin_token
    os.environ["RAFTSCHED_TOKEN"] = token  # the cluster's own reads carry it
    try:
        cluster.start()
        cluster.wait_for_leader(timeout_s=90)
        cluster.wait_for_auth(timeout_s=60)
        topo = topology(cluster)
        time.sleep(1.0)  # let the take-overs settle: "idle" means idle
        for load, rate in LOADS.items():
            figures: dict[str, Any] = {}
            for mode in CONSUMERS:
                log(f"phase {load} {mode}: {rate:g} jobs/s for {settings.duration_s:g} s")
                figures[mode] = asyncio.run(
                    run_phase(load, mode, token, topo, cluster.urls[0], settings)
                )
                log(json.dumps(figures[mode]))
            per = figures["per_shard"]
            for mode in ("fanout_first", "fanout_all"):
                figures[f"{mode}_over_per_shard"] = {
                    key: round(figures[mode][key] / per[key], 2) if per[key] else None
                    for key in (
                        "claim_requests_per_job",
                        "leaders_cpu_ms_per_job",
                        "cluster_cpu_ms_per_job",
                    )
                }
            result[load] = figures
        result["spread"] = {shard: url for shard, url in topo.leader_urls.items()}
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
