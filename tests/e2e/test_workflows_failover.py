"""Workflows survive repeated leader SIGKILLs: every workflow finishes, every
step's job exists once and has exactly one accepted completion."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from raftsched.client import Client
from raftsched.client._errors import RaftschedError
from raftsched.testing import LocalCluster

WORKFLOWS = 150
KILLS = 3


def _work(urls: list[str], stop: threading.Event, worker_id: str) -> None:
    """Claim steps, echo their inputs as the result; tolerate any failure."""
    with Client(urls, timeout_s=5, retry_budget_s=10) as client:
        while not stop.is_set():
            try:
                leases = client.claim(
                    worker_id, ["first", "second"], max_jobs=20, wait_s=1, lease_s=3
                )
            except RaftschedError:
                time.sleep(0.2)
                continue
            for lease in leases:
                time.sleep(0.02)  # keep work in flight across the kills
                result = {"step": lease["step"], "inputs": lease["inputs"]}
                try:
                    client.start(lease["job_id"], lease["fencing_token"])
                    client.complete(lease["job_id"], lease["fencing_token"], result)
                except RaftschedError:
                    pass  # the lease expires and another attempt runs


@pytest.mark.slow
def test_leader_killed_repeatedly_while_workflows_run(
    cluster: LocalCluster, client: Client
) -> None:
    ids = []
    for index in range(WORKFLOWS):
        workflow = client.submit_workflow(
            {
                "idempotency_key": f"wf:{index}",
                "steps": [
                    {"name": "a", "queue": "first", "payload": {"n": index}},
                    {"name": "b", "queue": "second", "depends_on": ["a"]},
                ],
            }
        )
        ids.append(workflow["id"])
    stop = threading.Event()
    workers = [
        threading.Thread(target=_work, args=(cluster.urls, stop, f"w{i}"), daemon=True)
        for i in range(2)
    ]
    for worker in workers:
        worker.start()
    try:
        for _ in range(KILLS):
            time.sleep(1)
            done = len(client.list_workflows(status="succeeded", limit=1000)["workflows"])
            assert done < WORKFLOWS, "the kill must land while workflows run"
            leader = cluster.wait_for_leader(timeout_s=30)
            cluster.kill(leader)
            cluster.wait_for_leader(timeout_s=30, exclude=leader)
            cluster.restart(leader)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            running = client.list_workflows(status="running", limit=1000)["workflows"]
            if not running:
                break
            time.sleep(0.5)
    finally:
        stop.set()
        for worker in workers:
            worker.join(10)
    for workflow_id in ids:
        workflow = client.get_workflow(workflow_id)
        assert workflow["status"] == "succeeded", workflow
        a, b = workflow["steps"]["a"], workflow["steps"]["b"]
        assert b["result"]["inputs"] == {"a": a["result"]}
        jobs = client.list_jobs(workflow_id=workflow_id)["jobs"]
        assert sorted(job["step"] for job in jobs) == ["a", "b"]  # each created once
        for job in jobs:
            full: dict[str, Any] = client.get_job(job["id"])
            succeeded = [a for a in full["attempts"] if a["outcome"] == "succeeded"]
            assert len(succeeded) == 1, full
    cluster.wait_converged(timeout_s=30)
