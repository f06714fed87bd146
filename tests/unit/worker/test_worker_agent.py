"""The worker against an in-memory lease server: start before the handler,
coalesced lease ops, heartbeats, cancellation for each reason, failure
classification, effects, graceful shutdown."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from fakeleases import FakeLeases, run, running_worker

from raftsched.worker import (
    JobContext,
    PermanentError,
    TransientError,
    WorkerConfig,
    load_handler,
)


def test_sync_jobs_complete_with_coalesced_ops() -> None:
    def handler(ctx: JobContext) -> dict[str, Any]:
        time.sleep(0.05)
        return {"doubled": ctx.payload["n"] * 2, "key": ctx.idempotency_key}

    async def scenario(fake: FakeLeases) -> None:
        for n in range(8):
            fake.add(f"job_{n}", {"n": n})
        async with running_worker(fake, handler, concurrency=8):
            await fake.wait_for(lambda: all(j.status == "succeeded" for j in fake.jobs.values()))
        assert fake.jobs["job_3"].result == {"doubled": 6, "key": "key-job_3"}
        for job_id in fake.jobs:
            assert [op for op, jid in fake.ops if jid == job_id] == ["start", "complete"]
        assert max(len(batch) for batch in fake.batches) > 1

    run(scenario)


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (PermanentError("bad"), {"kind": "permanent", "message": "PermanentError: bad"}),
        (ValueError("flaky"), {"kind": "transient", "message": "ValueError: flaky"}),
        (
            TransientError("busy", retry_after_s=7),
            {"kind": "transient", "message": "TransientError: busy", "retry_after_s": 7},
        ),
    ],
)
def test_failures_are_classified(raised: Exception, expected: dict[str, Any]) -> None:
    def handler(ctx: JobContext) -> None:
        raise raised

    async def scenario(fake: FakeLeases) -> None:
        fake.add("job_1")
        async with running_worker(fake, handler):
            await fake.wait_for(lambda: fake.jobs["job_1"].status == "failed")
        assert fake.jobs["job_1"].error == expected

    run(scenario)


def test_result_that_is_not_json_fails_permanently() -> None:
    async def scenario(fake: FakeLeases) -> None:
        fake.add("job_1")
        async with running_worker(fake, lambda ctx: {1, 2}):
            await fake.wait_for(lambda: fake.jobs["job_1"].status == "failed")
        assert fake.jobs["job_1"].error is not None
        assert fake.jobs["job_1"].error["kind"] == "permanent"

    run(scenario)


def test_heartbeats_keep_a_long_job_and_carry_progress() -> None:
    async def handler(ctx: JobContext) -> str:
        for step in range(6):
            ctx.progress({"step": step})
            await asyncio.sleep(0.25)
        return "done"

    async def scenario(fake: FakeLeases) -> None:
        fake.add("job_1")
        async with running_worker(fake, handler, lease_s=0.9):
            await fake.wait_for(lambda: fake.jobs["job_1"].status == "succeeded")
        job = fake.jobs["job_1"]
        assert job.result == "done"
        assert job.heartbeats >= 3  # 1.5 s of work under a 0.9 s lease
        assert {"step": 0} not in job.progress[1:] and any(job.progress)

    run(scenario)


def test_lost_lease_cancels_sync_handler_and_reports_nothing() -> None:
    seen_cancel = threading.Event()

    def handler(ctx: JobContext) -> str:
        while not ctx.cancelled.wait(0.02):
            pass
        seen_cancel.set()
        assert ctx.cancel_reason == "lease_lost"
        ctx.check_cancelled()
        return "never reported"

    async def scenario(fake: FakeLeases) -> None:
        fake.add("job_1")
        async with running_worker(fake, handler, lease_s=0.6):
            await fake.wait_for(lambda: fake.jobs["job_1"].status == "running")
            fake.lose_lease("job_1")
            await fake.wait_for(seen_cancel.is_set)
            await asyncio.sleep(0.1)
        assert [op for op, _ in fake.ops if op in ("complete", "fail")] == []

    run(scenario)


def test_cancel_request_cancels_async_handler_and_reports_cancelled() -> None:
    async def handler(ctx: JobContext) -> None:
        await asyncio.sleep(60)

    async def scenario(fake: FakeLeases) -> None:
        job = fake.add("job_1")
        async with running_worker(fake, handler, lease_s=0.6):
            await fake.wait_for(lambda: job.status == "running")
            job.cancel_requested = True
            await fake.wait_for(lambda: job.status == "failed")
        assert job.error is not None and job.error["kind"] == "cancelled"

    run(scenario)


def test_own_deadline_cancels_when_heartbeats_stall() -> None:
    cancelled_after: list[float] = []

    async def handler(ctx: JobContext) -> None:
        began = time.monotonic()
        try:
            await asyncio.sleep(60)
        finally:
            cancelled_after.append(time.monotonic() - began)

    async def scenario(fake: FakeLeases) -> None:
        fake.add("job_1")
        fake.stall_heartbeats = True
        async with running_worker(fake, handler, lease_s=1.0, shutdown_grace_s=0.1):
            await fake.wait_for(lambda: bool(cancelled_after))
        assert cancelled_after[0] < 1.0  # before the lease could have run out

    run(scenario)


def test_effect_runs_once_across_attempts() -> None:
    calls: list[int] = []

    def handler(ctx: JobContext) -> Any:
        receipt = ctx.effect("charge:1", lambda: calls.append(ctx.attempt) or {"charged": 5})
        if ctx.attempt == 1:
            raise RuntimeError("crash after the charge")
        return receipt

    async def scenario(fake: FakeLeases) -> None:
        job = fake.add("job_1")
        async with running_worker(fake, handler):
            await fake.wait_for(lambda: job.status == "failed")
            job.status = "pending"  # the cluster would retry it
            await fake.wait_for(lambda: job.status == "succeeded")
        assert calls == [1]
        assert job.result == {"charged": 5}

    run(scenario)


def test_async_effect_with_stale_token_drops_the_job() -> None:
    async def handler(ctx: JobContext) -> Any:
        async def charge() -> str:
            return "charged"

        return await ctx.aeffect("charge:2", charge)

    async def scenario(fake: FakeLeases) -> None:
        job = fake.add("job_1")
        fake.lose_lease_on_effect = True
        async with running_worker(fake, handler):
            await fake.wait_for(lambda: job.status == "running")
            await asyncio.sleep(0.3)
        assert "charge:2" not in fake.effects
        assert [op for op, _ in fake.ops if op in ("complete", "fail")] == []

    run(scenario)


def test_shutdown_lets_running_job_finish() -> None:
    def handler(ctx: JobContext) -> str:
        time.sleep(0.3)
        return "finished"

    async def scenario(fake: FakeLeases) -> None:
        job = fake.add("job_1")
        async with running_worker(fake, handler):
            await fake.wait_for(lambda: job.status == "running")
        assert job.status == "succeeded"  # stop() waited for it

    run(scenario)


def test_shutdown_after_grace_fails_job_as_unknown() -> None:
    def stubborn(ctx: JobContext) -> str:
        time.sleep(30)  # ignores cancellation
        return "too late"

    async def scenario(fake: FakeLeases) -> None:
        job = fake.add("job_1")
        began = time.monotonic()
        async with running_worker(fake, stubborn, shutdown_grace_s=0.2, cancel_wait_s=0.2):
            await fake.wait_for(lambda: job.status == "running")
        assert job.status == "failed"
        assert job.error is not None and job.error["kind"] == "unknown"
        assert time.monotonic() - began < 3

    run(scenario)


def test_concurrency_bounds_claims() -> None:
    peak = 0
    active = 0
    lock = threading.Lock()

    def handler(ctx: JobContext) -> None:
        nonlocal peak, active
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.05)
        with lock:
            active -= 1

    async def scenario(fake: FakeLeases) -> None:
        for n in range(10):
            fake.add(f"job_{n}")
        async with running_worker(fake, handler, concurrency=3):
            await fake.wait_for(lambda: all(j.status == "succeeded" for j in fake.jobs.values()))
        assert peak <= 3

    run(scenario)


def test_load_handler() -> None:
    assert load_handler("raftsched.demo:handle").__name__ == "handle"
    with pytest.raises(ValueError, match="module:function"):
        load_handler("raftsched.demo")
    with pytest.raises(ValueError, match="no 'nope'"):
        load_handler("raftsched.demo:nope")


def test_progress_a_heartbeat_cannot_carry_is_refused_at_the_call() -> None:
    """A value the API would refuse used to be kept and then break the
    heartbeat batch (TypeError while encoding it), which ended renewals for
    good. Now `ctx.progress` raises TypeError and the lease is kept."""
    refused: list[BaseException] = []

    async def handler(ctx: JobContext) -> str:
        for bad in ({"at": {1, 2}}, {"ratio": float("nan")}):
            try:
                ctx.progress(bad)
            except TypeError as error:
                refused.append(error)
        report = {"step": 1}
        ctx.progress(report)
        report["step"] = 2  # the worker sends what was reported, not this
        await asyncio.sleep(1.5)
        return "done"

    async def scenario(fake: FakeLeases) -> None:
        job = fake.add("job_1")
        async with running_worker(fake, handler, lease_s=0.6):
            await fake.wait_for(lambda: job.status == "succeeded")
        assert [str(error).split(":")[0] for error in refused] == [
            "progress must be JSON the API takes"
        ] * 2
        assert "not JSON serializable" in str(refused[0])
        assert "nan is not a JSON number" in str(refused[1])
        assert job.heartbeats >= 4  # 1.5 s of work under a 0.6 s lease
        assert [p for p in job.progress if p is not None] == [{"step": 1}]

    run(scenario)


def test_a_claim_polls_at_most_half_the_lease() -> None:
    """A job granted at the end of a poll still has half its lease: with a
    poll longer than the lease, one granted late was past the worker's own
    deadline (it counts from when the claim was sent) and never started."""

    async def scenario(fake: FakeLeases) -> None:
        async with running_worker(fake, lambda ctx: "ran", lease_s=0.8, poll_wait_s=2.0):
            await fake.wait_for(lambda: fake.claims >= 1)
            await asyncio.sleep(1.0)  # past the first poll's lease, were it still open
            job = fake.add("job_1")
            await fake.wait_for(lambda: job.status == "succeeded")
        assert set(fake.claim_waits) == {0.4}

    run(scenario)
    assert WorkerConfig(["http://x"], ("q",), lease_s=30, poll_wait_s=20).claim_wait_s == 15
    assert WorkerConfig(["http://x"], ("q",), lease_s=60, poll_wait_s=20).claim_wait_s == 20
