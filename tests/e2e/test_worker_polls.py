"""The worker's long poll against a real cluster: a job granted at the end of
a poll still runs, and a stopped worker leaves no poll behind that takes a
job submitted after it stopped."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from raftsched.client import Client
from raftsched.testing import LocalCluster
from raftsched.worker import JobContext, Worker, WorkerConfig


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_job_granted_late_in_a_poll_longer_than_the_lease_runs(
    cluster: LocalCluster, client: Client
) -> None:
    """poll_wait_s 6 > lease_s 2. The worker's deadline counts from when it
    sent the claim; a job granted 3 s into a 6 s poll was past it, never
    started, expired and came back to the next poll the same way."""
    queue = "late-grant"
    ran: list[int] = []

    def handle(ctx: JobContext) -> str:
        ran.append(ctx.attempt)
        return "ran"

    async def work() -> dict[str, Any]:
        config = WorkerConfig(
            cluster.urls, (queue,), worker_id="late", lease_s=2.0, poll_wait_s=6.0
        )
        worker = Worker(config, handle)
        runner = asyncio.create_task(worker.run())
        try:
            await asyncio.sleep(3.0)  # well into the first poll, past a lease from its start
            job_id = (await asyncio.to_thread(client.submit, queue, {"n": 1}))["id"]
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                job = await asyncio.to_thread(client.get_job, job_id)
                if job["status"] == "succeeded":
                    return job
                await asyncio.sleep(0.1)
            return job
        finally:
            worker.stop()
            await asyncio.wait_for(runner, 30)

    job = asyncio.run(work())
    assert job["status"] == "succeeded", job
    assert len(job["attempts"]) == 1 and ran == [1], job


def test_a_stopped_worker_leaves_no_poll_that_takes_a_new_job(
    cluster: LocalCluster, client: Client
) -> None:
    queue = "after-stop"

    async def run_and_stop() -> float:
        config = WorkerConfig(cluster.urls, (queue,), worker_id="stopped", poll_wait_s=20.0)
        worker = Worker(config, lambda ctx: "never")
        runner = asyncio.create_task(worker.run())
        await asyncio.sleep(1.0)  # its claim is long-polling on the cluster now
        stopped_at = time.monotonic()
        worker.stop()
        await asyncio.wait_for(runner, 10)
        return time.monotonic() - stopped_at

    assert asyncio.run(run_and_stop()) < 2.0  # stop did not wait for the poll
    job_id = client.submit(queue, {"n": 1})["id"]
    time.sleep(1.0)  # a poll left behind would have been granted it by now
    assert client.get_job(job_id)["status"] == "pending"
    (lease,) = client.claim("next-worker", [queue], max_jobs=1, wait_s=5)
    assert lease["job_id"] == job_id and lease["attempt"] == 1
