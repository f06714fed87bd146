"""Snapshots on a real cluster (issue 19, part 3; not a test). Prints one
JSON object as its last line.

    .venv/bin/python bench/snapshots.py                      # 200,000 jobs, 3 nodes
    .venv/bin/python bench/snapshots.py --jobs 1000000 --nodes 3

It starts a real cluster (`raftsched node` processes, fsync), loads `--jobs`
jobs through the batch API (1,000 a request, ~200-byte payloads, a
30-character idempotency key, `run_at` spread over the next 30 days) and then
reports, from each node's /metrics and /proc:

- the snapshots the load set off (compaction by entries, bytes and time; the
  interval is 5 s here so that each node writes the whole state once the
  load ends): encode seconds, the fork pause (mean and the histogram's
  bound on the largest), the child's copy-on-write growth, the state's size,
  and each node's resident memory;
- restart: a follower is stopped (SIGTERM) and started; `restart_ready_s`
  runs until its /readyz is 200 and it answers a read of a job by id, with
  its own `raftsched_raft_snapshot_load_seconds` beside it;
- catch-up: a follower is stopped, the cluster takes single submissions
  until the leader has cut its journal past the follower's log
  (`--log-compaction-entries 200`), and the follower is started again, to be
  sent the snapshot; `catch_up_ready_s` runs until it is ready
  and serves the newest job; a client keeps submitting through the leader the
  whole time (`serving_*`: its latencies), and `term_changed` says whether any
  node saw an election.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from raftsched.client import Client, job_request
from raftsched.raft_journal import read_journal_entries
from raftsched.testing import LocalCluster, http_json

BATCH = 1000
COMPACTION_ENTRIES = 200
INTERVAL_S = 5.0
NOTE = "n" * 130


def metric_values(url: str, token: str) -> dict[str, float]:
    request = urllib.request.Request(url + "/metrics")
    request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("raftsched_raft_snapshot") or line.startswith("raftsched_raft_term"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def fork_pause_bound(values: dict[str, float]) -> float | None:
    """The smallest histogram bound that holds every fork pause."""
    count = values.get("raftsched_raft_snapshot_fork_pause_seconds_count", 0)
    bounds = []
    for name, value in values.items():
        found = re.match(r'raftsched_raft_snapshot_fork_pause_seconds_bucket\{le="([^"]+)"\}', name)
        if found and value >= count > 0:
            bounds.append(float(found.group(1)))
    return min(bounds) if bounds else None


def node_report(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    node = cluster.nodes[node_id]
    values = metric_values(node.http_url, cluster.admin_token)
    count = values.get("raftsched_raft_snapshot_fork_pause_seconds_count", 0)
    total = values.get("raftsched_raft_snapshot_fork_pause_seconds_sum", 0)
    assert node.process is not None
    return {
        "rss_bytes": rss_bytes(node.process.pid),
        "snapshots_written": values.get('raftsched_raft_snapshots_total{event="written"}'),
        "encode_s": values.get("raftsched_raft_snapshot_duration_seconds"),
        "fork_pause_mean_s": round(total / count, 4) if count else None,
        "fork_pause_max_bound_s": fork_pause_bound(values),
        "cow_bytes": values.get("raftsched_raft_snapshot_cow_bytes"),
        "state_bytes": values.get("raftsched_raft_snapshot_bytes"),
        "load_s": values.get("raftsched_raft_snapshot_load_seconds"),
    }


def load(cluster: LocalCluster, leader: str, jobs: int, clients: int) -> tuple[float, list[str]]:
    now = datetime.now(UTC)
    url = cluster.nodes[leader].http_url

    def batch(start: int) -> list[str]:
        requests = [
            job_request(
                "later",
                {"payment_id": f"pay_{i:012d}", "amount": i % 100_000, "note": NOTE},
                idempotency_key=f"idem-{i:025d}",
                run_at=now + timedelta(days=1 + (i * 29 / jobs)),
            )
            for i in range(start, min(start + BATCH, jobs))
        ]
        with Client([url], retry_budget_s=60) as client:
            return [item["job"]["id"] for item in client.submit_batch(requests)]

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        ids = [job_id for chunk in pool.map(batch, range(0, jobs, BATCH)) for job_id in chunk]
    return time.monotonic() - started, ids


def wait_ready(cluster: LocalCluster, node_id: str, job_id: str, timeout_s: float) -> float:
    url = cluster.nodes[node_id].http_url
    started = time.monotonic()
    with Client([url], retry_budget_s=0) as reader:
        while time.monotonic() - started < timeout_s:
            try:
                status, _, _ = http_json("GET", url + "/readyz", timeout_s=2)
            except OSError:
                status = 0
            if status == 200:
                assert reader.get_job(job_id, consistency="stale")["id"] == job_id
                return time.monotonic() - started
            time.sleep(0.05)
    raise TimeoutError(f"{node_id} not ready in {timeout_s}s")


def terms(cluster: LocalCluster) -> set[int]:
    found = set()
    for node_id in cluster.nodes:
        view = cluster.cluster_view(node_id)
        if view is not None:
            found.add(view["term"])
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--durability", default="fsync")
    parser.add_argument("--root", type=Path, default=None)
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="bench-snapshots-"))
    extra = [
        "--log-compaction-entries", str(COMPACTION_ENTRIES),
        "--log-compaction-interval-s", str(INTERVAL_S),
    ]  # fmt: skip
    result: dict[str, Any] = {"jobs": args.jobs, "nodes": args.nodes}
    with LocalCluster(root, size=args.nodes, durability=args.durability, extra_args=extra) as c:
        # Clients and http_json send $RAFTSCHED_TOKEN.
        os.environ["RAFTSCHED_TOKEN"] = c.admin_token
        leader = c.wait_for_leader(timeout_s=60)
        load_s, ids = load(c, leader, args.jobs, args.clients)
        result["load_s"] = round(load_s, 1)
        result["load_jobs_per_s"] = round(args.jobs / load_s)
        c.wait_converged(timeout_s=120)
        # Each node writes the whole state within the (staggered) interval.
        # (No digests meanwhile: each holds the state's lock for ~1 s.)
        time.sleep(INTERVAL_S * 1.5 + 10)
        result["after_load"] = {node_id: node_report(c, node_id) for node_id in c.nodes}
        result["elections_during_load"] = sorted(terms(c)) != [1]
        leader = c.wait_for_leader(timeout_s=60)
        term = terms(c)
        followers = [node_id for node_id in c.nodes if node_id != leader]
        if followers:
            follower = followers[0]
            c.kill(follower, signal.SIGTERM)
            c.start(follower)
            result["restart_ready_s"] = round(wait_ready(c, follower, ids[-1], 120), 2)
            result["restart"] = node_report(c, follower)

            # Catch-up by snapshot transfer, the leader serving throughout.
            c.kill(follower, signal.SIGTERM)
            follower_last = read_journal_entries(c.nodes[follower].data_dir / "raft")[-1][1]
            leader_raft = c.nodes[leader].data_dir / "raft"
            with Client([c.nodes[leader].http_url], retry_budget_s=30) as client:
                # Until the leader has cut its journal past the follower's
                # log: only a snapshot can bring the follower back.
                for index in range(COMPACTION_ENTRIES * 10):
                    ids.append(client.submit("now", {"i": index})["id"])
                    if index % 50 == 49 and read_journal_entries(leader_raft)[0][1] > follower_last:
                        break
            assert read_journal_entries(leader_raft)[0][1] > follower_last, "no compaction"
            latencies: list[float] = []
            stop = threading.Event()

            def serve() -> None:
                with Client([c.nodes[leader].http_url], retry_budget_s=30) as writer:
                    for index in range(100_000):
                        if stop.is_set():
                            return
                        started = time.perf_counter()
                        writer.submit("during", {"i": index})
                        latencies.append(time.perf_counter() - started)
                        time.sleep(0.01)

            server = threading.Thread(target=serve, daemon=True)
            server.start()
            c.start(follower)
            peak_leader_rss = 0
            leader_process = c.nodes[leader].process
            assert leader_process is not None
            leader_pid = leader_process.pid

            def watch_leader() -> None:
                nonlocal peak_leader_rss
                while not stop.is_set():
                    peak_leader_rss = max(peak_leader_rss, rss_bytes(leader_pid))
                    time.sleep(0.1)

            watcher = threading.Thread(target=watch_leader, daemon=True)
            watcher.start()
            result["catch_up_ready_s"] = round(wait_ready(c, follower, ids[-1], 300), 2)
            stop.set()
            server.join(60)
            c.wait_converged(timeout_s=120)
            result["catch_up"] = node_report(c, follower)
            result["catch_up_leader_peak_rss_bytes"] = peak_leader_rss
            ordered = sorted(latencies)
            result["serving_submits"] = len(ordered)
            result["serving_p50_ms"] = round(statistics.median(ordered) * 1000, 1)
            result["serving_p99_ms"] = round(ordered[int(len(ordered) * 0.99)] * 1000, 1)
            result["serving_max_ms"] = round(ordered[-1] * 1000, 1)
            result["term_changed"] = terms(c) != term
            result["leader_unchanged"] = c.leader_id() == leader
        result["log_errors"] = [e.describe() for e in c.unexpected_log_errors()][:5]
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
