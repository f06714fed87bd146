"""The lease batcher: one request for ops that arrive together, each result
routed to its own caller, a failed request failing all of its ops."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakeleases import FakeLeases

from raftsched.client import AsyncClient, LeaseLost, PayloadTooLarge, TransportError
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


def heartbeats(fake: FakeLeases, count: int, progress_bytes: int) -> list[dict[str, Any]]:
    """`count` running jobs' heartbeats, each with a progress of about that size."""
    ops = []
    for index in range(count):
        job = fake.add(f"j{index}")
        job.status, job.token = "running", index + 1
        progress = {"step": index, "note": "x" * progress_bytes}
        ops.append({"op": "heartbeat", "job_id": job.id, "fencing_token": index + 1,
                    "extend_s": 30, "progress": progress})  # fmt: skip
    return ops


async def send_all(
    fake: FakeLeases, ops: list[dict[str, Any]], **settings: Any
) -> tuple[list[Any], LeaseBatcher]:
    async with AsyncClient([fake.url], retry_budget_s=2) as client:
        batcher = LeaseBatcher(client, linger_s=0.02, **settings)
        results = await asyncio.gather(*(batcher.op(op) for op in ops), return_exceptions=True)
        await batcher.close()
    return results, batcher


def test_a_batch_over_the_body_limit_goes_as_requests_that_fit() -> None:
    async def scenario() -> None:
        fake = FakeLeases()
        await fake.start()
        fake.max_body_bytes = 4096
        ops = heartbeats(fake, 60, 200)  # about 16 KB in all
        results, batcher = await send_all(fake, ops, body_bytes_max=4096)
        await fake.stop()
        assert all(isinstance(result, dict) for result in results), results
        assert fake.refused_batches == 0 and len(fake.batches) >= 4
        assert max(fake.batch_sizes) <= 4096
        # Every job renewed once, in the order the ops came.
        assert [op["job_id"] for batch in fake.batches for op in batch] == [
            op["job_id"] for op in ops
        ]
        assert all(job.heartbeats == 1 and job.progress for job in fake.jobs.values())
        assert batcher.body_bytes_max == 4096

    asyncio.run(scenario())


@pytest.mark.parametrize("names_it", [True, False])
def test_a_node_with_a_lower_limit_is_learned_from_its_413(names_it: bool) -> None:
    """The worker assumes 1 MiB; the node takes 4 KiB. Its 413 (naming the
    limit, or not, as a node of 0.7.0) applied nothing: the same ops go again
    in requests that fit, none is lost, and later batches fit at once."""

    async def scenario() -> None:
        fake = FakeLeases()
        await fake.start()
        fake.max_body_bytes, fake.name_body_limit = 4096, names_it
        ops = heartbeats(fake, 60, 200)
        async with AsyncClient([fake.url], retry_budget_s=2) as client:
            batcher = LeaseBatcher(client, linger_s=0.02)
            first = await asyncio.gather(*(batcher.op(op) for op in ops), return_exceptions=True)
            refused = fake.refused_batches
            again = await asyncio.gather(*(batcher.op(op) for op in ops), return_exceptions=True)
            await batcher.close()
        await fake.stop()
        assert all(isinstance(result, dict) for result in [*first, *again])
        assert all(job.heartbeats == 2 for job in fake.jobs.values())
        assert refused >= 1 and fake.refused_batches == refused  # learned once
        assert batcher.body_bytes_max <= 4096
        if names_it:
            assert refused == 1 and batcher.body_bytes_max == 4096

    asyncio.run(scenario())


def test_an_op_too_large_by_itself_fails_alone() -> None:
    async def scenario() -> None:
        fake = FakeLeases()
        await fake.start()
        fake.max_body_bytes = 4096
        ops = heartbeats(fake, 10, 100)
        ops[3]["progress"] = {"note": "y" * 5000}
        results, _ = await send_all(fake, ops, body_bytes_max=4096)
        await fake.stop()
        assert isinstance(results[3], PayloadTooLarge) and results[3].max_body_bytes == 4096
        assert all(isinstance(result, dict) for index, result in enumerate(results) if index != 3)
        assert fake.jobs["j3"].heartbeats == 0
        assert sum(job.heartbeats for job in fake.jobs.values()) == 9

    asyncio.run(scenario())
