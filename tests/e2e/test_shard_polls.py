"""One worker polls every shard (docs/shards.md, section 4), on 3 real nodes
× 3 shards.

A `raftsched worker` process without `--shard`, with a worker token (which
may not read `/v1/cluster`: it learns the shards from `/v1/time`) and 4
slots, completes jobs placed in every shard and never runs more than 4 at
once. Then the process that leads shard 1 is killed with SIGKILL: the
worker keeps completing the other shards' jobs while shard 1 elects a
leader, and completes shard 1's again after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e_support import cluster_env

from raftsched import child_processes
from raftsched.client import Client, RaftschedError
from raftsched.shards import shard_of_id
from raftsched.testing import LocalCluster, http_json, log_errors, process_running, wait_for

SHARDS = 3
QUEUE = "polled"
CONCURRENCY = 4
# As in test_shards_isolation: the longest a healthy shard may go without a
# job run while another elects a leader, on a loaded 2-core machine.
HEALTHY_GAP_MAX_S = 3.0


def _runs(sink: Path) -> list[dict[str, Any]]:
    if not sink.exists():
        return []
    return [json.loads(line) for line in sink.read_text().splitlines() if line.strip()]


def _shard_runs(sink: Path, shard: int) -> list[float]:
    return sorted(run["at"] for run in _runs(sink) if shard_of_id(run["job_id"]) == shard)


class Feeder(threading.Thread):
    """Submit a job to `shard` every `period_s` until stopped (a client that
    names the shard; during an election its submissions wait it out)."""

    def __init__(self, urls: list[str], shard: int, stop: threading.Event) -> None:
        super().__init__(name=f"feed-shard-{shard}", daemon=True)
        self.urls, self.shard, self.stop = urls, shard, stop
        self.submitted = 0

    def run(self) -> None:
        with Client(self.urls, timeout_s=10, retry_budget_s=30, shard=self.shard) as client:
            while not self.stop.wait(0.1):
                try:
                    client.submit(QUEUE, {"fed": self.submitted})
                    self.submitted += 1
                except RaftschedError:
                    continue  # unavailable for now


def _longest_gap(times: list[float], start: float, end: float) -> float:
    inside = [start, *(t for t in times if start < t < end), end]
    return max(later - earlier for earlier, later in zip(inside, inside[1:], strict=False))


def _worker(
    cluster: LocalCluster, token: str, log_path: Path, sink: Path
) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return child_processes.popen(
            [sys.executable, "-m", "raftsched", "worker", "--queue", QUEUE,
             "--handler", "tests.e2e.handlers:counted", "--concurrency", str(CONCURRENCY),
             "--worker-id", "w-every-shard", "--poll-wait-s", "2", "--lease-s", "10",
             "--shutdown-grace-s", "5", "--log-format", "json",
             "--url", ",".join(cluster.urls)],
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, **cluster_env(), "RAFTSCHED_TOKEN": token,
                 "RAFTSCHED_TEST_SINK": str(sink), "RAFTSCHED_TEST_PAUSE_S": "0.05"},
        )  # fmt: skip


def _until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    assert wait_for(predicate, timeout_s), what


@pytest.mark.expect_log_errors(
    r"shard process 1 \(pid \d+\) exited with status -9",
    reason="the test kills shard 1's leading process with SIGKILL; its node says so",
)
def test_one_worker_serves_every_shard_and_outlives_a_shard_leader(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c", size=3, env=cluster_env(), shards=SHARDS)
    sink, worker_log = tmp_path / "runs.jsonl", tmp_path / "worker.log"
    stop = threading.Event()
    feeders = [Feeder(cluster.urls, shard, stop) for shard in range(SHARDS)]
    cluster.start()
    try:
        cluster.wait_for_leader(timeout_s=90)
        cluster.wait_for_auth(timeout_s=60)
        for shard in range(SHARDS):
            cluster.wait_for_shard_leader(shard, timeout_s=60)
        # What a worker token reads the number of shards from (public).
        for url in cluster.urls:
            status, body, _ = http_json("GET", url + "/v1/time", token="")
            assert status == 200 and body["shards"] == SHARDS
        with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as admin:
            token = admin.create_token("poller", "worker", queues=[QUEUE])["secret"]
            worker = _worker(cluster, token, worker_log, sink)
            try:
                # Jobs without keys go round the shards: one worker runs them all.
                ids = [admin.submit(QUEUE, {"i": i})["id"] for i in range(30)]
                assert {shard_of_id(job_id) for job_id in ids} == set(range(SHARDS))

                def all_done() -> bool:
                    return all(admin.get_job(job_id)["status"] == "succeeded" for job_id in ids)

                _until(all_done, 90, "the worker did not complete every shard's jobs")
                runs = _runs(sink)
                assert sorted(run["job_id"] for run in runs) == sorted(ids)  # each once

                # A steady stream into every shard; then shard 1 loses its leader.
                for feeder in feeders:
                    feeder.start()
                _until(
                    lambda: all(len(_shard_runs(sink, shard)) >= 15 for shard in range(SHARDS)),
                    60,
                    "the fed jobs did not run in every shard",
                )
                leader = cluster.wait_for_shard_leader(1)
                pid = cluster.shard_pid(leader, 1)
                assert pid is not None and process_running(pid)
                killed_at = time.time()
                os.kill(pid, signal.SIGKILL)

                # A job submitted to shard 1 now is accepted once it has a
                # leader again, and the worker runs it.
                with Client(cluster.urls, timeout_s=10, retry_budget_s=60, shard=1) as shard1:
                    probe = shard1.submit(QUEUE, {"after": "election"})["id"]
                assert shard_of_id(probe) == 1

                def probe_ran() -> bool:
                    return any(run["job_id"] == probe for run in _runs(sink))

                _until(probe_ran, 60, "the worker never ran shard 1's jobs again")
                recovered_at = next(run["at"] for run in _runs(sink) if run["job_id"] == probe)
                gaps = {
                    shard: _longest_gap(_shard_runs(sink, shard), killed_at, recovered_at)
                    for shard in (0, 2)
                }
                print(f"shard 1 back after {recovered_at - killed_at:.2f} s; other gaps {gaps}")
                for shard, gap in gaps.items():
                    assert gap < HEALTHY_GAP_MAX_S, (
                        f"the worker ran no job of shard {shard} for {gap:.2f} s while "
                        f"shard 1 was without a leader for {recovered_at - killed_at:.2f} s"
                    )
                stop.set()
                for feeder in feeders:
                    feeder.join(timeout=60)
                fed = sum(feeder.submitted for feeder in feeders)

                def fed_done() -> bool:
                    return len(_runs(sink)) >= len(ids) + fed + 1

                _until(fed_done, 60, "fed jobs left unrun")
            finally:
                stop.set()
                worker.send_signal(signal.SIGTERM)
                worker.wait(timeout=60)
    finally:
        stop.set()
        cluster.stop()
    assert worker.returncode == 0
    # The slot pool was never exceeded, whichever shards the jobs came from.
    assert max(run["running"] for run in _runs(sink)) <= CONCURRENCY
    text = worker_log.read_text()
    assert "claiming from every shard" in text
    # The dead leader cost warnings, never an error.
    assert log_errors(worker_log) == [], text[-3000:]
