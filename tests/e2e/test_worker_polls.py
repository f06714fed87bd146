"""The worker's long poll against a real cluster: a job granted at the end of
a poll still runs."""

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
