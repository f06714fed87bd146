"""The lease batcher: one request for ops that arrive together, each result
routed to its own caller, a failed request failing all of its ops."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakeleases import FakeLeases

from raftsched.client import AsyncClient, LeaseLost, TransportError
from raftsched.worker import LeaseBatcher


def test_concurrent_ops_share_one_request_and_get_their_own_answers() -> None:
    async def scenario() -> None:
        fake = FakeLeases()
        await fake.start()
        for name in ("a", "b", "c"):
            fake.add(name).status = "claimed"
        fake.jobs["a"].token, fake.jobs["b"].token, fake.jobs["c"].token = 1, 2, 3
        async with AsyncClient([fake.url]) as client:
            batcher = LeaseBatcher(client, linger_s=0.02)
            ops: list[dict[str, Any]] = [
                {"op": "start", "job_id": "a", "fencing_token": 1},
                {"op": "heartbeat", "job_id": "b", "fencing_token": 2, "extend_s": 5},
                {"op": "start", "job_id": "c", "fencing_token": 99},  # stale token
            ]
            results = await asyncio.gather(*(batcher.op(op) for op in ops), return_exceptions=True)
            await batcher.close()
        await fake.stop()
        assert len(fake.batches) == 1 and len(fake.batches[0]) == 3
        assert fake.jobs["a"].status == "running" and fake.jobs["b"].heartbeats == 1
        assert isinstance(results[2], LeaseLost)
        assert isinstance(results[1], dict) and results[1]["cancel_requested"] is False

    asyncio.run(scenario())


def test_max_ops_flushes_without_waiting() -> None:
    async def scenario() -> None:
        fake = FakeLeases()
        await fake.start()
        for index in range(4):
            job = fake.add(f"j{index}")
            job.status, job.token = "claimed", index
        async with AsyncClient([fake.url]) as client:
            batcher = LeaseBatcher(client, linger_s=10, max_ops=2)
            ops = [{"op": "start", "job_id": f"j{i}", "fencing_token": i} for i in range(4)]
            await asyncio.wait_for(asyncio.gather(*(batcher.op(op) for op in ops)), 5)
        await fake.stop()
        assert [len(batch) for batch in fake.batches] == [2, 2]

    asyncio.run(scenario())


def test_unreachable_cluster_fails_every_op() -> None:
    async def scenario() -> None:
        async with AsyncClient(["http://127.0.0.1:9"], retry_budget_s=0.2) as client:
            batcher = LeaseBatcher(client)
            ops = [{"op": "start", "job_id": f"j{i}", "fencing_token": i} for i in range(2)]
            results = await asyncio.gather(*(batcher.op(op) for op in ops), return_exceptions=True)
        assert all(isinstance(result, TransportError) for result in results)

    asyncio.run(scenario())


def test_worker_config_is_checked() -> None:
    from raftsched.worker import WorkerConfig

    with pytest.raises(ValueError, match="queue"):
        WorkerConfig(["http://x:1"], ()).validate()
    with pytest.raises(ValueError, match="concurrency"):
        WorkerConfig(["http://x:1"], ("q",), concurrency=0).validate()
