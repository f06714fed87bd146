"""Next claims in the worker SDK: reports of finished jobs claim the next ones,
within the worker's concurrency; an old cluster turns them off without losing
an op; leases that arrive while the worker stops are not started."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from fakeleases import FakeLeases, run, running_worker

from raftsched.client import AsyncClient, InvalidRequest, JsonObject, NextClaim, next_claim
from raftsched.worker import JobContext, LeaseBatcher, Worker, WorkerConfig


def _peak_tracking_handler() -> tuple[Any, list[int]]:
    peak = [0]
    active = [0]
    lock = threading.Lock()

    def handler(ctx: JobContext) -> int:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.01)
        with lock:
            active[0] -= 1
        return int(ctx.payload["n"])

    return handler, peak


def test_a_backlog_drains_through_next_claims_within_the_concurrency() -> None:
    handler, peak = _peak_tracking_handler()

    async def scenario(fake: FakeLeases) -> None:
        for n in range(30):
            fake.add(f"job_{n:02}", {"n": n})
        async with running_worker(fake, handler, concurrency=3):
            await fake.wait_for(lambda: all(j.status == "succeeded" for j in fake.jobs.values()))
            claims_to_drain = fake.claims
        assert peak[0] <= 3
        # The first claim fills the slots; from then on each report refills its own.
        assert claims_to_drain <= 3, claims_to_drain
        assert sum(claim["max_jobs"] for claim in fake.nexts) >= 27
        assert all(
            claim["worker_id"] == "w-test" and claim["queues"] == ["q"] and claim["wait_s"] == 0
            for claim in fake.nexts
        )
        for job_id, job in fake.jobs.items():
            assert [op for op, jid in fake.ops if jid == job_id] == ["start", "complete"]
            assert job.result == int(job_id[-2:])

    run(scenario)


def test_reports_in_flight_together_each_claim_their_own_slots() -> None:
    """Reports overlap (each its own batch, each answered 50 ms later): every
    one still claims its job's slot, and the slots are never oversubscribed."""
    handler, peak = _peak_tracking_handler()

    async def scenario(fake: FakeLeases) -> None:
        fake.next_delay_s = 0.05
        for n in range(40):
            fake.add(f"job_{n:02}", {"n": n})
        async with running_worker(fake, handler, concurrency=4, batch_linger_s=0.0):
            await fake.wait_for(lambda: all(j.status == "succeeded" for j in fake.jobs.values()))
            claims_to_drain = fake.claims
        assert peak[0] <= 4
        assert claims_to_drain <= 3, claims_to_drain
        assert max(len(batch) for batch in fake.batches) >= 1

    run(scenario)


def test_an_old_cluster_turns_next_claims_off_and_loses_no_op(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="raftsched.worker")

    async def scenario(fake: FakeLeases) -> None:
        fake.refuse_next = True
        for n in range(10):
            fake.add(f"job_{n}", {"n": n})
        async with running_worker(fake, lambda ctx: "ok", concurrency=2):
            await fake.wait_for(lambda: all(j.status == "succeeded" for j in fake.jobs.values()))
        assert fake.nexts == []
        for job_id in fake.jobs:  # each report was sent again without `next`, once
            assert [op for op, jid in fake.ops if jid == job_id] == ["start", "complete"]

    run(scenario)
    refusals = [r for r in caplog.records if "does not take next claims" in r.getMessage()]
    assert [r.levelno for r in refusals] == [logging.WARNING]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_next_claims_can_be_turned_off() -> None:
    async def scenario(fake: FakeLeases) -> None:
        for n in range(6):
            fake.add(f"job_{n}", {"n": n})
        async with running_worker(fake, lambda ctx: "ok", concurrency=2, next_claims=False):
            await fake.wait_for(lambda: all(j.status == "succeeded" for j in fake.jobs.values()))
        assert fake.nexts == []
        assert fake.claims >= 3  # every slot refilled by a claim of its own

    run(scenario)


def test_leases_granted_while_stopping_are_not_started(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="raftsched.worker")

    async def scenario(fake: FakeLeases) -> None:
        fake.add("job_1")
        fake.next_delay_s = 0.5
        config = WorkerConfig([fake.url], ("q",), worker_id="w-test", concurrency=1,
                              lease_s=5.0, poll_wait_s=0.2)  # fmt: skip
        worker = Worker(config, lambda ctx: "done")
        task = asyncio.create_task(worker.run())
        # job_1's report carries a next claim, answered 0.5 s later: job_2
        # appears meanwhile and the worker is told to stop.
        await fake.wait_for(lambda: len(fake.nexts) == 1)
        fake.add("job_2")
        worker.stop()
        await asyncio.wait_for(task, 10)
        assert fake.jobs["job_1"].status == "succeeded"
        assert fake.jobs["job_2"].status == "claimed"  # granted, never started
        assert [op for op, jid in fake.ops if jid == "job_2"] == []

    run(scenario)
    assert any("lease not started" in r.getMessage() for r in caplog.records)


class Recorder:
    """A NextClaims that asks for one job and records what happens, in order."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def ask(self, ops: Sequence[JsonObject]) -> NextClaim | None:
        self.events.append(("ask", [op["op"] for op in ops]))
        return next_claim("q", max_jobs=1, worker_id="w-rec")

    def granted(
        self,
        ops: Sequence[JsonObject],
        claim: NextClaim,
        leases: list[JsonObject],
        sent_at: float,
    ) -> None:
        self.events.append(("granted", [lease["job_id"] for lease in leases]))

    def refused(self, error: InvalidRequest) -> None:
        self.events.append(("refused", error.details.get("field")))


def test_the_batcher_hands_over_leases_before_it_answers_the_ops() -> None:
    async def scenario() -> None:
        fake = FakeLeases()
        await fake.start()
        done = fake.add("done")
        done.status, done.token = "running", 1
        fake.add("waiting")
        recorder = Recorder()
        async with AsyncClient([fake.url]) as client:
            batcher = LeaseBatcher(client, linger_s=0.01, next_claims=recorder)
            answer = await batcher.op({"op": "complete", "job_id": "done", "fencing_token": 1})
            recorder.events.append(("answered", answer is not None))
            await batcher.close()
        await fake.stop()
        assert recorder.events == [
            ("ask", ["complete"]),
            ("granted", ["waiting"]),
            ("answered", True),
        ]
        assert fake.nexts == [{"queues": ["q"], "max_jobs": 1, "wait_s": 0.0, "worker_id": "w-rec"}]

    asyncio.run(scenario())


def test_the_batcher_releases_a_claim_whose_request_failed() -> None:
    async def scenario() -> None:
        recorder = Recorder()
        async with AsyncClient(["http://127.0.0.1:9"], retry_budget_s=0.2) as client:
            batcher = LeaseBatcher(client, next_claims=recorder)
            with pytest.raises(Exception, match="."):
                await batcher.op({"op": "fail", "job_id": "j", "fencing_token": 1,
                                  "error": {"kind": "transient"}})  # fmt: skip
        assert recorder.events == [("ask", ["fail"]), ("granted", [])]

    asyncio.run(scenario())


def test_the_batcher_resends_without_next_when_refused() -> None:
    async def scenario() -> None:
        fake = FakeLeases()
        await fake.start()
        fake.refuse_next = True
        job = fake.add("a")
        job.status, job.token = "running", 3
        recorder = Recorder()
        async with AsyncClient([fake.url]) as client:
            batcher = LeaseBatcher(client, linger_s=0.01, next_claims=recorder)
            await batcher.op({"op": "complete", "job_id": "a", "fencing_token": 3})
            await batcher.close()
        await fake.stop()
        assert recorder.events == [("ask", ["complete"]), ("refused", "next"), ("granted", [])]
        assert fake.ops == [("complete", "a")] and job.status == "succeeded"

    asyncio.run(scenario())
