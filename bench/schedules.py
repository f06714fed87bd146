"""Schedules benchmark: the hot minute on a real 3-node cluster, and idle Tick cost.

    .venv/bin/python bench/schedules.py [--schedules 100000]

1. A 3-node LocalCluster (durability fsync) gets N schedules, created over HTTP
   through `POST /v1/schedules/batch` (1,000 per request, 4 requests at a
   time). Every schedule is `interval_s = 1 day` with the same `start_at`, so
   all N first occurrences fall on one instant (the hot minute, compressed to
   one second).
2. Meanwhile a worker keeps claiming and completing jobs from another queue;
   `claim_p99_ms_during` is the p99 claim latency between the instant and the
   moment all N occurrences were decided (`fire_all_s` after the instant,
   read from the leader's `raftsched_schedule_occurrences{decision="fired"}`).
3. `tick_s_idle`: the cost of applying one Tick to an in-process core state
   holding N schedules of which none is due (median of 50).

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from raftsched.client import Client
from raftsched.testing import LocalCluster
from raftsched.timefmt import format_ms, now_ms

BATCH = 1000
HOT_QUEUE = "hot"
OTHER_QUEUE = "other"


def create_all(client: Client, count: int, start_at: str, prefix: str = "hot") -> float:
    def batch(first: int) -> None:
        bodies = [
            {
                "id": f"{prefix}-{i:06d}",
                "interval_s": 86_400,
                "start_at": start_at,
                "catchup": {"grace_s": 3600},
                "job": {"queue": HOT_QUEUE},
            }
            for i in range(first, min(first + BATCH, count))
        ]
        results = client.create_schedules(bodies)
        assert all("error" not in result for result in results), results[:3]

    started = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(batch, range(0, count, BATCH)))
    return time.perf_counter() - started


def fired_total(client: Client, url: str) -> int:
    text = client.request("GET", "/metrics", retry_unknown=True).text()
    for line in text.splitlines():
        if line.startswith('raftsched_schedule_occurrences{decision="fired"}'):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def claim_loop(client: Client, stop: threading.Event, samples: list[tuple[float, float]]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        leases = client.claim("bench-worker", [OTHER_QUEUE], max_jobs=1, wait_s=0)
        elapsed_ms = (time.perf_counter() - started) * 1000
        samples.append((time.time(), elapsed_ms))
        for lease in leases:
            client.complete(lease["job_id"], lease["fencing_token"], {"ok": True})
        if not leases:
            client.submit(OTHER_QUEUE, {"n": 1})


def hot_minute(count: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="raftsched-bench-schedules-"))
    cluster = LocalCluster(root / "cluster", size=3, durability="fsync")
    cluster.start()
    try:
        cluster.wait_for_leader(timeout_s=60)
        with Client(
            cluster.urls, timeout_s=60, retry_budget_s=120, token=cluster.admin_token
        ) as client:
            client.submit_batch([{"queue": OTHER_QUEUE} for _ in range(500)])
            # Estimate creation speed on 2% more schedules (idle: a day ahead),
            # then set the instant far enough out for all N to exist by then.
            pilot = max(BATCH, count // 50)
            pilot_s = create_all(client, pilot, format_ms(now_ms() + 86_400_000), "pilot")
            estimate_s = pilot_s * count / pilot
            target_ms = now_ms() + int((estimate_s * 1.5 + 20) * 1000)
            create_s = create_all(client, count, format_ms(target_ms))
            print(f"created {count} schedules in {create_s:.1f} s", file=sys.stderr)
            if now_ms() >= target_ms:
                print("warning: creation overran the instant", file=sys.stderr)
            stop = threading.Event()
            samples: list[tuple[float, float]] = []
            worker = threading.Thread(target=claim_loop, args=(client, stop, samples))
            worker.start()
            while now_ms() < target_ms:
                time.sleep(0.05)
            leader_url = cluster.nodes[cluster.wait_for_leader()].http_url
            # A scrape holds the state lock briefly; poll gently so as not to
            # slow the firing being measured.
            while fired_total(client, leader_url) < count:
                time.sleep(0.25)
            fire_all_s = (now_ms() - target_ms) / 1000
            stop.set()
            worker.join()
            window_s = (target_ms / 1000, target_ms / 1000 + fire_all_s)
            during = sorted(ms for at, ms in samples if window_s[0] <= at <= window_s[1])
            p99 = during[min(len(during) - 1, int(len(during) * 0.99))] if during else None
            return {
                "schedules": count,
                "create_s": round(create_s, 1),
                "fire_all_s": round(fire_all_s, 2),
                "claim_p99_ms_during": None if p99 is None else round(p99, 1),
                "claims_during": len(during),
            }
    finally:
        cluster.stop()


def idle_tick(count: int) -> float:
    from raftsched.core import apply_entry, new_state
    from raftsched.core.kernel.commands import Entry, JobSpec, Tick
    from raftsched.core.schedules.commands import CreateSchedule, ScheduleSpec

    state = new_state()
    start_ms = 1_800_000_000_000
    commands = tuple(
        CreateSchedule(ScheduleSpec(f"s{i}", JobSpec("q"), cron="0 0 1 1 *")) for i in range(count)
    )
    for first in range(0, count, 10_000):
        apply_entry(state, Entry(1, start_ms, commands[first : first + 10_000]))
    durations = []
    for k in range(50):
        entry = Entry(1, start_ms + 1000 * (k + 1), (Tick(),))
        started = time.perf_counter()
        apply_entry(state, entry)
        durations.append(time.perf_counter() - started)
    return statistics.median(durations)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=100_000)
    args = parser.parse_args()
    result = hot_minute(args.schedules)
    result["tick_s_idle"] = round(idle_tick(args.schedules), 6)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
