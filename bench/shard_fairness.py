"""Benchmark: fair share and a concurrency limit across shards (not a test).

Starts a real cluster of 3 nodes x 3 shards on loopback (docs/shards.md,
section 4) and measures two things, one after the other:

1. **Fair share.** Tenants of weights 1, 2 and 3 (`PUT /v1/tenants`, which
   group 0's nodes copy into every shard) each get a backlog in every shard
   of one queue; one worker per shard (`Client(shard=k)`: the worker SDK
   does not poll every shard yet) claims and completes as fast as it can.
   While every tenant still has a backlog everywhere, each tenant's share
   of the completions is compared with its exact weighted share (1/6, 2/6,
   3/6): `fair.share`, `fair.exact`, `fair.max_error` (the largest absolute
   difference). Run twice: the backlogs spread evenly over the shards
   (`even`), and each tenant's backlog mostly in a shard of its own
   (`skewed`, 70 % there): each shard shares its own claims fairly, so the
   cluster's share is the mean of the shards' and drifts from the exact
   one as much as the backlogs are skewed.
2. **A concurrency limit of 6** on a queue whose backlog is mostly in shard
   1 (`--limit-jobs`, 80 % there, 10 % in each other shard), with a worker of
   6 slots per shard holding each job 0.2 s: how many jobs ran at once per
   shard and overall (counted from each claim's answer to its completion's
   request, within the server's lease: never above what the server
   counted), sampled every 20 ms; `limit.peak` must never exceed 6.
   `limit.follow_s` is how long shard 1 took, from the backlog's
   submission, to run 4 or more at once (its quota starts at the equal
   split, 2, and follows the demand at the next rebalance, every 5 s);
   `limit.drain_s` the time to run the whole backlog against
   `limit.ideal_s`, the backlog times 0.2 s over 6.

Prints one JSON object as its last line. About a minute and a half:

    .venv/bin/python bench/shard_fairness.py
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from raftsched.client import Client
from raftsched.node.auth import new_secret
from raftsched.shards import key_shard
from raftsched.testing import LocalCluster, wait_for

SHARDS = 3
WEIGHTS = {"t1": 1, "t2": 2, "t3": 3}
LIMIT = 6
HOLD_S = 0.2


def _clients(cluster: LocalCluster, token: str) -> list[Client]:
    return [
        Client(cluster.urls, timeout_s=20, retry_budget_s=60, token=token, shard=shard)
        for shard in range(SHARDS)
    ]


def _in_line(cluster: LocalCluster, quotas: bool) -> bool:
    for node_id in cluster.nodes:
        views = cluster.shard_views(node_id)
        if views is None or len(views) != SHARDS:
            return False
        for view in views:
            if not view.get("settings_in_line"):
                return False
            if quotas and not view.get("quotas_in_line"):
                return False
    return True


def _submit(client: Client, queue: str, payloads: list[dict[str, Any]], tenant: str) -> None:
    for start in range(0, len(payloads), 200):
        client.submit_batch(
            [
                {"queue": queue, "tenant": tenant, "payload": p}
                for p in payloads[start : start + 200]
            ]
        )


# -- fair share -------------------------------------------------------------------------


def _fair_worker(
    client: Client, queue: str, counts: dict[str, int], lock: threading.Lock, stop: threading.Event
) -> None:
    while not stop.is_set():
        leases = client.claim("fair", [queue], max_jobs=12, wait_s=0.5, lease_s=30)
        for lease in leases:
            if stop.is_set():
                return  # not counted: the window closed
            client.complete(lease["job_id"], lease["fencing_token"], {"ok": True})
            with lock:
                counts[lease["payload"]["tenant"]] += 1


def fair_share(
    clients: list[Client], queue: str, spread: list[list[float]], per_tenant: int, window: int
) -> dict[str, Any]:
    """`spread[t][k]`: the part of tenant t's backlog placed in shard k;
    `window`: the completions counted (while every backlog lasts)."""
    for index, tenant in enumerate(WEIGHTS):
        for shard in range(SHARDS):
            count = round(per_tenant * spread[index][shard])
            payloads = [{"tenant": tenant, "n": n} for n in range(count)]
            _submit(clients[shard], queue, payloads, tenant)
    counts = dict.fromkeys(WEIGHTS, 0)
    lock = threading.Lock()
    stop = threading.Event()
    threads = [
        threading.Thread(target=_fair_worker, args=(clients[k], queue, counts, lock, stop))
        for k in range(SHARDS)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    wait_for(lambda: sum(counts.values()) >= window, 120)
    stop.set()
    for thread in threads:
        thread.join(60)
    elapsed = time.monotonic() - started
    total = sum(counts.values())
    weight_sum = sum(WEIGHTS.values())
    share = {tenant: round(counts[tenant] / total, 4) for tenant in WEIGHTS}
    exact = {tenant: round(WEIGHTS[tenant] / weight_sum, 4) for tenant in WEIGHTS}
    # What per-shard fair share gives when every shard runs alike: the mean
    # over the shards of each shard's weighted share among the tenants it holds.
    mean: dict[str, float] = dict.fromkeys(WEIGHTS, 0.0)
    for shard in range(SHARDS):
        present = [t for i, t in enumerate(WEIGHTS) if spread[i][shard] > 0]
        for tenant in present:
            mean[tenant] += WEIGHTS[tenant] / sum(WEIGHTS[t] for t in present) / SHARDS
    return {
        "completions": total,
        "seconds": round(elapsed, 1),
        "share": share,
        "exact": exact,
        "per_shard_expected": {tenant: round(value, 4) for tenant, value in mean.items()},
        "max_error": round(max(abs(share[t] - exact[t]) for t in WEIGHTS), 4),
    }


# -- a concurrency limit -------------------------------------------------------------------


class Meter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held = [0] * SHARDS
        self.done = 0

    def took(self, shard: int, count: int) -> None:
        with self.lock:
            self.held[shard] += count

    def gave_back(self, shard: int) -> None:
        with self.lock:
            self.held[shard] -= 1
            self.done += 1


def _limited_worker(
    client: Client, shard: int, queue: str, meter: Meter, stop: threading.Event
) -> None:
    slots = threading.Semaphore(LIMIT)
    running: list[threading.Thread] = []

    def run(lease: dict[str, Any]) -> None:
        time.sleep(HOLD_S)
        meter.gave_back(shard)
        client.complete(lease["job_id"], lease["fencing_token"], {"ok": True})
        slots.release()

    while not stop.is_set():
        if not slots.acquire(timeout=0.2):
            continue
        free = 1
        while free < LIMIT and slots.acquire(blocking=False):
            free += 1
        leases = client.claim(f"lim{shard}", [queue], max_jobs=free, wait_s=0.5, lease_s=30)
        meter.took(shard, len(leases))
        for lease in leases:
            thread = threading.Thread(target=run, args=(lease,))
            thread.start()
            running.append(thread)
        for _ in range(free - len(leases)):
            slots.release()
    for thread in running:
        thread.join(30)


def concurrency_limit(
    cluster: LocalCluster, admin: Client, clients: list[Client], jobs: int
) -> dict[str, Any]:
    queue = "limited"
    admin.set_queue(queue, concurrency_limit=LIMIT)
    wait_for(lambda: _in_line(cluster, quotas=True), 60)
    meter = Meter()
    stop = threading.Event()
    threads = [
        threading.Thread(target=_limited_worker, args=(clients[k], k, queue, meter, stop))
        for k in range(SHARDS)
    ]
    for thread in threads:
        thread.start()
    parts = {0: jobs // 10, 1: jobs - 2 * (jobs // 10), 2: jobs // 10}
    submitted = time.monotonic()
    for shard, count in parts.items():
        keys: list[str] = []
        index = 0
        while len(keys) < count:
            key = f"lim-{shard}-{index}"
            index += 1
            if key_shard("default", key, SHARDS) == shard:
                keys.append(key)
        batch = [{"queue": queue, "idempotency_key": key, "payload": {"k": key}} for key in keys]
        for start in range(0, len(batch), 200):
            admin.submit_batch(batch[start : start + 200])
    samples: list[tuple[float, list[int]]] = []
    follow_s = None
    deadline = time.monotonic() + 120
    while meter.done < jobs and time.monotonic() < deadline:
        with meter.lock:
            held = list(meter.held)
        at = time.monotonic() - submitted
        samples.append((at, held))
        if follow_s is None and held[1] >= 4:
            follow_s = at
        time.sleep(0.02)
    drain_s = time.monotonic() - submitted
    stop.set()
    for thread in threads:
        thread.join(60)
    overall = [sum(held) for _, held in samples]
    return {
        "jobs": jobs,
        "backlog_by_shard": parts,
        "peak": max(overall, default=0),
        "peak_by_shard": [max((held[k] for _, held in samples), default=0) for k in range(SHARDS)],
        "mean_running": round(sum(overall) / max(1, len(overall)), 2),
        "follow_s": None if follow_s is None else round(follow_s, 2),
        "drain_s": round(drain_s, 1),
        "ideal_s": round(jobs * HOLD_S / LIMIT, 1),
        "samples": len(samples),
        "never_above_limit": max(overall, default=0) <= LIMIT,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-tenant", type=int, default=3_000, help="each tenant's backlog")
    parser.add_argument(
        "--window", type=int, default=1_500, help="completions counted, while every backlog lasts"
    )
    parser.add_argument("--limit-jobs", type=int, default=180, help="the limited queue's backlog")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="raftsched-shfair-"))
    token = new_secret()
    cluster = LocalCluster(root / "c", size=3, admin_secret=token, shards=SHARDS)
    result: dict[str, Any] = {"shards": SHARDS, "nodes": 3, "weights": WEIGHTS}
    clients: list[Client] = []
    try:
        started = time.monotonic()
        cluster.start()
        cluster.wait_for_leader(timeout_s=90)
        cluster.wait_for_auth(timeout_s=60)
        for shard in range(SHARDS):
            cluster.wait_for_shard_leader(shard, timeout_s=60)
        wait_for(
            lambda: all(
                all(v.get("identity_recorded") for v in cluster.shard_views(n) or [{}])
                for n in cluster.nodes
            ),
            90,
        )
        result["start_s"] = round(time.monotonic() - started, 1)
        clients = _clients(cluster, token)
        with Client(cluster.urls, timeout_s=20, retry_budget_s=60, token=token) as admin:
            for tenant, weight in WEIGHTS.items():
                admin.set_tenant(tenant, weight=weight)
            wait_for(lambda: _in_line(cluster, quotas=False), 60)
            even = [[1 / SHARDS] * SHARDS for _ in WEIGHTS]
            result["fair_even"] = fair_share(
                clients, "fair-even", even, args.per_tenant, args.window
            )
            # t1 only in shard 0, t2 in shards 0 and 1, t3 in every shard.
            skewed = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]]
            result["fair_skewed"] = fair_share(
                clients, "fair-skewed", skewed, args.per_tenant, args.window
            )
            result["limit"] = concurrency_limit(cluster, admin, clients, args.limit_jobs)
        result["total_s"] = round(time.monotonic() - started, 1)
    finally:
        for client in clients:
            client.close()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
