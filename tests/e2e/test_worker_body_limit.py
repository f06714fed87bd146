"""A worker whose lease batch would not fit one request body, against real
nodes with a small `--max-body-bytes`: it learns the limit from the node's
413 and splits its batches, and no lease is lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import cluster_env

from raftsched.client import Client
from raftsched.testing import LocalCluster, metrics_text
from raftsched.worker import JobContext, Worker, WorkerConfig

# 64 leases' heartbeats are about 5.5 KB without progress and 25 KB with
# it, their completions about 6 KB: none of these batches fits one request.
BODY_BYTES_MAX = 4096
JOBS = 64
LEASE_S = 3.0
PROGRESS_BYTES = 300


@pytest.fixture
def small_bodies(tmp_path: Path) -> Iterator[LocalCluster]:
    local = LocalCluster(
        tmp_path / "cluster",
        env=cluster_env(),
        extra_args=["--max-body-bytes", str(BODY_BYTES_MAX)],
    )
    local.start()
    try:
        local.wait_for_leader(timeout_s=30)
        local.wait_for_auth(timeout_s=30)
        yield local
    finally:
        local.stop()


def refused_batches(cluster: LocalCluster) -> int:
    """413s the nodes answered to lease batches."""
    total = 0
    for url in cluster.urls:
        for line in metrics_text(url).splitlines():
            if (
                line.startswith("raftsched_http_request_duration_seconds_count{")
                and 'route="/v1/leases/batch"' in line
                and 'status="413"' in line
            ):
                total += int(float(line.split()[-1]))
    return total


def test_heartbeats_of_many_leases_fit_the_node_body_limit(small_bodies: LocalCluster) -> None:
    cluster = small_bodies
    queue = "big-progress"
    with Client(cluster.urls, timeout_s=10) as client:
        job_ids = []
        for first in range(0, JOBS, 16):
            requests = [{"queue": queue, "payload": {"n": n}} for n in range(first, first + 16)]
            job_ids += [result["job"]["id"] for result in client.submit_batch(requests)]
        started = asyncio.Event()
        running = 0

        async def handle(ctx: JobContext) -> dict[str, Any]:
            nonlocal running
            running += 1
            if running == JOBS:
                started.set()
            await started.wait()  # every lease is held at once
            # Longer than a lease: renewed three times, progress with each.
            for step in range(4):
                ctx.progress({"step": step, "note": "p" * PROGRESS_BYTES})
                await asyncio.sleep(LEASE_S / 3)
            return {"n": ctx.payload["n"]}

        async def work() -> None:
            config = WorkerConfig(
                cluster.urls, (queue,), worker_id="big", concurrency=JOBS, lease_s=LEASE_S
            )
            worker = Worker(config, handle)
            runner = asyncio.create_task(worker.run())
            try:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    jobs = await asyncio.to_thread(
                        lambda: [client.get_job(job_id) for job_id in job_ids]
                    )
                    if all(job["status"] == "succeeded" for job in jobs):
                        return
                    await asyncio.sleep(0.5)
            finally:
                worker.stop()
                await asyncio.wait_for(runner, 40)

        asyncio.run(work())
        jobs = [client.get_job(job_id) for job_id in job_ids]
    assert started.is_set()
    # No lease was lost: every job succeeded on its first attempt.
    assert [job["status"] for job in jobs] == ["succeeded"] * JOBS
    assert all(len(job["attempts"]) == 1 for job in jobs), [job["attempts"] for job in jobs]
    assert sorted(job["result"]["n"] for job in jobs) == list(range(JOBS))
    # The test did reach the limit: the node refused a batch (nothing
    # applied), and the worker went on with requests that fit.
    assert refused_batches(cluster) >= 1
