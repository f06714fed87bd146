"""Reconcile handlers in the worker: a reconciliation lease goes to the
reconciler of its queue (never to the job handler), whose Happened,
DidNotHappen or CannotTell becomes one fenced `reconcile` op; a handler that
raises, returns something else, or has no reconciler gives no answer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakeleases import FakeLeases, run, running_worker

from raftsched.worker import (
    CannotTell,
    Decision,
    DidNotHappen,
    Happened,
    JobContext,
    ReconcileContext,
    Worker,
    WorkerConfig,
)


def never_run(ctx: JobContext) -> None:
    raise AssertionError("a reconciliation lease reached the job handler")


def test_a_sync_reconciler_answers_happened_with_its_effects() -> None:
    seen: list[ReconcileContext] = []

    def reconciler(ctx: ReconcileContext) -> Decision:
        seen.append(ctx)
        return Happened({"charge": "ch_1"}, effects={"charge:1": "ch_1"}, reason="found ch_1")

    async def scenario(fake: FakeLeases) -> None:
        job = fake.add_reconciling("j1", {"payment": 1})
        async with running_worker(fake, never_run) as worker:
            worker.reconciler("q")(reconciler)
            await fake.wait_for(lambda: job.decision is not None)
        assert job.decision is not None
        assert job.decision["decision"] == "happened"
        assert job.decision["result"] == {"charge": "ch_1"}
        assert job.decision["effects"] == [{"key": "charge:1", "result": "ch_1"}]
        assert job.decision["reason"] == "found ch_1"
        assert job.decision["fencing_token"] == job.token
        (ctx,) = seen
        assert ctx.attempt.worker_id == "w-crashed" and ctx.attempt.fencing_token == 7
        assert ctx.effect_keys == ("charge:1",) and ctx.idempotency_key == "key-j1"
        assert ctx.payload == {"payment": 1}

    run(scenario)


@pytest.mark.parametrize(
    ("decision", "expected"),
    [(DidNotHappen("no charge"), "did_not_happen"), (CannotTell("provider down"), "cannot_tell")],
)
def test_an_async_reconciler_answers_by_queue(decision: Decision, expected: str) -> None:
    async def elsewhere(ctx: ReconcileContext) -> Decision:
        raise AssertionError("the reconciler of another queue was asked")

    async def reconciler(ctx: ReconcileContext) -> Decision:
        await asyncio.sleep(0.01)
        return decision

    async def scenario(fake: FakeLeases) -> None:
        job = fake.add_reconciling("j1", queue="audit")
        async with running_worker(fake, never_run) as worker:
            worker.reconciler("other")(elsewhere)
            worker.reconciler("audit")(reconciler)
            assert worker.queues == ("q", "other", "audit")
            await fake.wait_for(lambda: job.decision is not None)
        assert job.decision is not None
        assert job.decision["decision"] == expected
        assert job.decision["reason"] == decision.reason
        assert "result" not in job.decision

    run(scenario)


@pytest.mark.parametrize("outcome", ["raises", "returns junk", "no reconciler"])
def test_no_answer_without_a_decision(outcome: str) -> None:
    def reconciler(ctx: ReconcileContext) -> Any:
        if outcome == "raises":
            raise RuntimeError("provider lookup failed")
        return {"happened": True}

    async def scenario(fake: FakeLeases) -> None:
        job = fake.add_reconciling("j1")
        async with running_worker(fake, never_run) as worker:
            if outcome != "no reconciler":
                worker.reconciler()(reconciler)
            await fake.wait_for(lambda: job.status == "asked")
            await asyncio.sleep(0.2)
        assert job.decision is None
        assert [op for op, _ in fake.ops if op == "reconcile"] == []

    run(scenario)


def test_a_reconciler_for_a_queue_adds_it_to_the_claim() -> None:
    worker = Worker(WorkerConfig(["http://127.0.0.1:9"], ("payments",)), never_run)
    worker.reconciler("payments-audit")(lambda ctx: DidNotHappen())
    worker.reconciler("payments")(lambda ctx: DidNotHappen())
    assert worker.queues == ("payments", "payments-audit")
