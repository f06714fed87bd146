"""Failover end to end: jobs keep running while the leader dies, nothing is
lost or done twice, and every replica ends with the same state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from e2e_support import cluster_env

from raftsched import child_processes
from raftsched.client import Client, LeaseLost
from raftsched.testing import LocalCluster, http_json

JOBS = 1000
WORKERS = 4


def start_workers(cluster: LocalCluster, sink: Path, queue: str) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, **cluster_env(), "RAFTSCHED_TEST_SINK": str(sink)}
    workers = []
    for index in range(WORKERS):
        log = (cluster.root / f"worker{index}.log").open("ab")
        workers.append(
            child_processes.popen(
                [sys.executable, "-m", "raftsched", "worker", "--queue", queue,
                 "--handler", "tests.e2e.handlers:effect_once", "--concurrency", "16",
                 "--worker-id", f"w{index}", "--lease-s", "30", "--poll-wait-s", "5",
                 "--shutdown-grace-s", "5", "--url", ",".join(cluster.urls)],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )
        )  # fmt: skip
        log.close()
    return workers


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()


def submit_all(cluster: LocalCluster, queue: str, kill_leader_at: int) -> tuple[list[str], str]:
    """Submit JOBS jobs round-robin through every node (so followers redirect),
    SIGKILL the leader after `kill_leader_at` of them; returns acknowledged ids."""
    acknowledged: dict[int, str] = {}
    killed: list[str] = []
    lock = threading.Lock()
    counter = iter(range(JOBS))

    def submitter(url: str) -> None:
        with Client([url, *cluster.urls], timeout_s=5, retry_budget_s=60) as api:
            for index in counter:
                if index == kill_leader_at:
                    leader = cluster.wait_for_leader()
                    cluster.kill(leader)
                    killed.append(leader)
                job = api.submit(queue, {"i": index}, idempotency_key=f"e2e:{index}")
                with lock:
                    acknowledged[index] = job["id"]

    threads = [threading.Thread(target=submitter, args=(url,)) for url in cluster.urls * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert len(acknowledged) == JOBS
    return [acknowledged[i] for i in range(JOBS)], killed[0]


def wait_all_succeeded(
    client: Client, job_ids: list[str], timeout_s: float
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = {job["id"]: job for job in client.iter_jobs(queue="failover", page_size=1000)}
        done = [jobs[i] for i in job_ids if jobs.get(i, {}).get("status") == "succeeded"]
        if len(done) == len(job_ids) or time.monotonic() > deadline:
            return [jobs.get(i, {"id": i, "status": "missing"}) for i in job_ids]
        time.sleep(0.5)


@pytest.mark.slow
def test_thousand_jobs_survive_leader_kill_with_effects_exactly_once(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    sink = tmp_path / "sink.jsonl"
    workers = start_workers(cluster, sink, "failover")
    try:
        job_ids, killed = submit_all(cluster, "failover", kill_leader_at=JOBS // 2)
        with Client(cluster.live_urls(), retry_budget_s=60) as client:
            jobs = wait_all_succeeded(client, job_ids, timeout_s=120)
            statuses = Counter(job["status"] for job in jobs)
            assert statuses == {"succeeded": JOBS}, statuses
            assert len(set(job_ids)) == JOBS  # one job per idempotency key

            # Each job's side effect ran once, and the ledger holds exactly it.
            effects = Counter(json.loads(line)["job_id"] for line in sink.read_text().splitlines())
            assert set(effects) == set(job_ids)
            assert max(effects.values()) == 1, effects.most_common(3)
            for job in jobs:
                effect = client.get_effect(f"effect:{job['id']}", consistency="stale")
                succeeded = [a for a in job["attempts"] if a["outcome"] == "succeeded"]
                assert len(succeeded) == 1
                # The accepted completion carried the job's newest token.
                newest = max(a["fencing_token"] for a in job["attempts"])
                assert succeeded[0]["fencing_token"] == newest
                assert job["result"] == {"effect_token": effect["fencing_token"]}
    finally:
        stop_workers(workers)

    # The killed node restarts, catches up, and every replica is identical.
    cluster.start(killed)
    cluster.wait_for_leader()
    cluster.wait_converged(timeout_s=60)


def test_no_leader_while_majority_is_down(cluster: LocalCluster) -> None:
    leader = cluster.wait_for_leader()
    survivor = leader
    for node_id in cluster.nodes:
        if node_id != survivor:
            cluster.kill(node_id)
    url = cluster.nodes[survivor].http_url
    deadline = time.monotonic() + 15
    status, body, headers = 0, {}, {}
    while time.monotonic() < deadline:
        status, body, headers = http_json("POST", url + "/v1/jobs", {"queue": "q"}, timeout_s=15)
        if status == 503:
            break
        time.sleep(0.2)
    assert status == 503, (status, body)
    assert body["error"]["code"] in ("no_leader", "unavailable")
    assert headers["Retry-After"]
    status, _, _ = http_json("GET", url + "/readyz")
    assert status == 503


PAUSED_WORKER = textwrap.dedent(
    """
    import json, sys, time
    from raftsched.child_processes import die_with_parent
    from raftsched.client import Client, LeaseLost
    die_with_parent()
    client = Client(sys.argv[1].split(","), retry_budget_s=30)
    [lease] = client.claim("paused-worker", ["pause"], wait_s=10, lease_s=1)
    client.start(lease["job_id"], lease["fencing_token"])
    print(json.dumps(lease), flush=True)
    sys.stdin.readline()  # the test SIGSTOPs us here, then SIGCONTs and writes a line
    try:
        client.complete(lease["job_id"], lease["fencing_token"], {"by": "paused"})
        print("completed", flush=True)
    except LeaseLost:
        print("lease_lost", flush=True)
    """
)


def test_paused_worker_loses_lease_to_a_higher_token(cluster: LocalCluster) -> None:
    with Client(cluster.urls, retry_budget_s=30) as client:
        job = client.submit("pause", {"n": 1}, max_attempts=3)
        paused = child_processes.popen(
            [sys.executable, "-c", PAUSED_WORKER, ",".join(cluster.urls)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, **cluster_env()},
        )  # fmt: skip
        try:
            assert paused.stdout is not None and paused.stdin is not None
            first = json.loads(paused.stdout.readline())
            paused.send_signal(signal.SIGSTOP)
            # The lease (1 s) expires while the worker is frozen; another worker
            # gets the job with a strictly higher token.
            [second] = client.claim("healthy-worker", ["pause"], wait_s=15, lease_s=30)
            assert second["job_id"] == job["id"]
            assert second["fencing_token"] > first["fencing_token"]
            assert second["attempt"] == first["attempt"] + 1
            client.start(job["id"], second["fencing_token"])
            paused.send_signal(signal.SIGCONT)
            paused.stdin.write(b"go\n")
            paused.stdin.flush()
            assert paused.stdout.readline().strip() == b"lease_lost"
            client.complete(job["id"], second["fencing_token"], {"by": "healthy"})
            with pytest.raises(LeaseLost):
                client.heartbeat(job["id"], first["fencing_token"])
            final = client.get_job(job["id"])
            assert final["status"] == "succeeded" and final["result"] == {"by": "healthy"}
            outcomes = [a["outcome"] for a in final["attempts"]]
            assert outcomes == ["lease_expired", "succeeded"]
        finally:
            paused.send_signal(signal.SIGCONT)
            paused.kill()
            paused.wait(timeout=10)


def test_node_that_was_down_catches_up_by_snapshot_after_compaction(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path / "compact", env=cluster_env(), extra_args=["--log-compaction-entries", "20"]
    )
    with cluster:
        leader = cluster.wait_for_leader()
        follower = next(n for n in cluster.nodes if n != leader)
        cluster.kill(follower)
        with Client(cluster.live_urls(), retry_budget_s=30) as client:
            for index in range(150):  # one entry each: far past the compaction point
                client.submit("compact", {"i": index}, idempotency_key=f"c:{index}")
        snapshots = list((cluster.nodes[leader].data_dir / "raft").glob("*snapshot*"))
        assert snapshots, "the leader should have written a snapshot"
        cluster.start(follower)
        cluster.wait_converged(timeout_s=60)
        with Client([cluster.nodes[follower].http_url], retry_budget_s=10) as client:
            jobs = list(client.iter_jobs(queue="compact", consistency="stale"))
        assert len(jobs) == 150
