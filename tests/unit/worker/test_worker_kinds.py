"""Handlers by kind (worker._kinds) against the in-memory lease server: routing,
the claim's kinds and caps, per-kind concurrency, the dead letter of a job
without a handler, and the fallback while the cluster does not take kinds."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from typing import Any

import pytest
from fakeleases import FakeLeases, run, running_worker

from raftsched.worker import (
    NO_HANDLER_FOR_KIND,
    JobContext,
    NoHandlerForKind,
    Worker,
    WorkerConfig,
)


def _done(fake: FakeLeases, *job_ids: str) -> bool:
    return all(fake.jobs[job_id].status in ("succeeded", "failed") for job_id in job_ids)


def test_each_job_runs_with_its_kinds_handler_and_the_claim_names_the_kinds() -> None:
    ran: dict[str, str] = {}

    def default(ctx: JobContext) -> str:
        ran[ctx.job_id] = f"default:{ctx.kind}"
        return "d"

    def refund(ctx: JobContext) -> str:
        ran[ctx.job_id] = f"refund:{ctx.kind}"
        return "r"

    def setup(worker: Worker) -> None:
        @worker.handler("charge")
        async def charge(ctx: JobContext) -> str:
            ran[ctx.job_id] = f"charge:{ctx.kind}"
            return "c"

    async def scenario(fake: FakeLeases) -> None:
        fake.add("j1", kind="charge")
        fake.add("j2")
        fake.add("j3", kind="refund")
        async with running_worker(fake, {None: default, "refund": refund}, setup=setup) as worker:
            await fake.wait_for(lambda: _done(fake, "j1", "j2", "j3"))
            assert worker.kinds == ["charge", "refund"]
        assert ran == {"j1": "charge:charge", "j2": "default:None", "j3": "refund:refund"}
        assert {job.result for job in fake.jobs.values()} == {"c", "d", "r"}
        assert all(body["kinds"] == ["charge", "refund", None] for body in fake.claim_bodies)
        assert all("kind_max_jobs" not in body for body in fake.claim_bodies)

    run(scenario)


def test_a_worker_without_a_default_handler_never_claims_jobs_without_a_kind() -> None:
    async def scenario(fake: FakeLeases) -> None:
        fake.add("plain")
        fake.add("k", kind="charge")
        async with running_worker(fake, {"charge": lambda ctx: "ok"}):
            await fake.wait_for(lambda: _done(fake, "k"))
            await asyncio.sleep(0.3)
        assert fake.jobs["plain"].status == "pending"
        assert {tuple(body["kinds"]) for body in fake.claim_bodies} == {("charge",)}

    run(scenario)


def test_per_kind_concurrency_bounds_a_kind_while_the_others_use_the_pool() -> None:
    lock = threading.Lock()
    now: Counter[str] = Counter()
    most: Counter[str] = Counter()

    def slow(ctx: JobContext) -> None:
        kind = ctx.kind or "default"
        with lock:
            now[kind] += 1
            most[kind] = max(most[kind], now[kind])
        time.sleep(0.15)
        with lock:
            now[kind] -= 1

    def setup(worker: Worker) -> None:
        worker.handler("email", max_concurrency=3)(slow)

    async def scenario(fake: FakeLeases) -> None:
        for n in range(6):
            fake.add(f"pay{n}", kind="payment")
            fake.add(f"mail{n}", kind="email")
        async with running_worker(
            fake, {"payment": slow}, setup=setup, concurrency=5, kind_concurrency={"payment": 1}
        ):
            await fake.wait_for(lambda: _done(fake, *fake.jobs), timeout_s=20)
        assert most["payment"] == 1 and most["email"] <= 3
        assert most["email"] >= 2  # the pool's other slots worked on meanwhile
        caps = [body.get("kind_max_jobs", {}) for body in fake.claim_bodies]
        assert all(cap.get("payment", 1) <= 1 and cap.get("email", 3) <= 3 for cap in caps)
        # A kind at its limit is left out of the claim, not asked for with 0.
        assert any(body["kinds"] == ["email"] for body in fake.claim_bodies)

    run(scenario)


def test_a_job_of_a_kind_without_a_handler_is_dead_lettered_unstarted() -> None:
    """A claim without kinds (here: the cluster refuses them) may lease any
    job; one this worker cannot run fails permanently, naming the kind."""

    async def scenario(fake: FakeLeases) -> None:
        fake.refuse_kinds = True
        fake.add("mystery", kind="unknown.kind")
        fake.add("plain")
        async with running_worker(fake, {None: lambda ctx: "ok", "charge": lambda ctx: "c"}):
            await fake.wait_for(lambda: _done(fake, "mystery", "plain"))
        assert fake.jobs["plain"].status == "succeeded"
        error = fake.jobs["mystery"].error
        assert error is not None and error["kind"] == "permanent"
        assert error["message"].startswith(f"{NO_HANDLER_FOR_KIND}: worker w-test ")
        assert "'unknown.kind'" in error["message"] and "'charge'" in error["message"]
        assert [op for op, job_id in fake.ops if job_id == "mystery"] == ["fail"]  # not started

    run(scenario)


def test_a_pool_that_dead_letters_unknown_kinds_claims_them_but_keeps_its_limits() -> None:
    """`dead_letter_unknown_kinds`: the claim adds "*" (every other job),
    and a kind at its limit is named with 0 so that "*" leaves it alone."""
    lock = threading.Lock()
    now, most = [0], [0]

    def slow(ctx: JobContext) -> str:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.1)
        with lock:
            now[0] -= 1
        return "paid"

    def setup(worker: Worker) -> None:
        worker.handler("pay", max_concurrency=1)(slow)

    async def scenario(fake: FakeLeases) -> None:
        for n in range(3):
            fake.add(f"pay{n}", kind="pay")
        fake.add("typo", kind="pya")
        fake.add("plain")
        async with running_worker(fake, None, setup=setup, dead_letter_unknown_kinds=True):
            await fake.wait_for(lambda: _done(fake, *fake.jobs), timeout_s=10)
        assert most[0] == 1
        assert [fake.jobs[f"pay{n}"].result for n in range(3)] == ["paid"] * 3
        for dead in ("typo", "plain"):
            error = fake.jobs[dead].error
            assert error is not None and error["message"].startswith(NO_HANDLER_FOR_KIND)
        assert all(body["kinds"][-1] == "*" for body in fake.claim_bodies)
        assert any(body.get("kind_max_jobs", {}).get("pay") == 0 for body in fake.claim_bodies)

    run(scenario)


def test_without_a_default_handler_a_job_without_a_kind_names_that() -> None:
    error = NoHandlerForKind(None, "w1", ["a", "b"], default=False)
    assert "jobs without a kind (no default handler)" in str(error)
    assert "'a', 'b'" in str(error) and NoHandlerForKind.code == NO_HANDLER_FOR_KIND


def test_while_the_cluster_refuses_kinds_a_worker_falls_back_and_probes_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A default handler keeps working on jobs without a kind (the only jobs
    a cluster below version 8 can hold), with plain claims and plain next
    claims; once the cluster takes kinds the worker claims them again."""

    def setup(worker: Worker) -> None:
        worker._routes.probe_s = 0.3
        worker.handler("charge")(lambda ctx: "charged")

    async def scenario(fake: FakeLeases) -> None:
        fake.refuse_kinds = True
        for n in range(6):
            fake.add(f"old{n}", {"n": n})
        with caplog.at_level(logging.INFO, logger="raftsched.worker"):
            async with running_worker(fake, lambda ctx: "done", setup=setup):
                await fake.wait_for(lambda: _done(fake, *fake.jobs))
                plain = [body for body in fake.claim_bodies if "kinds" not in body]
                assert plain, "no claim was made without kinds"
                fake.refuse_kinds = False  # every node upgraded, the version raised
                fake.add("new", kind="charge")
                await fake.wait_for(lambda: _done(fake, "new"), timeout_s=5)
        assert fake.jobs["new"].result == "charged"
        assert all(job.status == "succeeded" for job in fake.jobs.values())
        refusals = [r for r in caplog.records if "does not take job kinds" in r.getMessage()]
        assert len(refusals) == 1 and refusals[0].levelname == "WARNING"
        assert any("takes job kinds now" in r.getMessage() for r in caplog.records)

    run(scenario)


def test_without_a_default_handler_a_worker_falling_back_claims_nothing() -> None:
    def setup(worker: Worker) -> None:
        worker._routes.probe_s = 0.2

    async def scenario(fake: FakeLeases) -> None:
        fake.refuse_kinds = True
        fake.add("plain")
        async with running_worker(fake, {"charge": lambda ctx: "c"}, setup=setup):
            await asyncio.sleep(1.0)
        assert fake.jobs["plain"].status == "pending"
        assert fake.claim_bodies and all("kinds" in body for body in fake.claim_bodies)
        assert len(fake.claim_bodies) <= 8  # a probe every 0.2 s, not a busy loop

    run(scenario)


def test_a_next_claim_of_kinds_refused_leaves_the_reports_standing() -> None:
    async def scenario(fake: FakeLeases) -> None:
        for n in range(4):
            fake.add(f"j{n}")
        async with running_worker(fake, lambda ctx: "ok", concurrency=2) as worker:
            await fake.wait_for(lambda: fake.nexts)  # next claims of kinds go out
            fake.refuse_kinds = True
            for n in range(4, 10):
                fake.add(f"j{n}")
            await fake.wait_for(lambda: _done(fake, *fake.jobs), timeout_s=10)
            assert worker._routes.falling_back
        assert all(job.status == "succeeded" for job in fake.jobs.values())

    run(scenario)


@pytest.mark.parametrize(
    "make",
    [
        lambda w: w.handler("two words")(print),
        lambda w: w.handler("k" * 129)(print),
        lambda w: w.handler(None, max_concurrency=2)(print),
        lambda w: w.handler("a", max_concurrency=0)(print),
    ],
)
def test_a_bad_kind_or_limit_is_refused_when_registered(make: Any) -> None:
    worker = Worker(WorkerConfig(["http://127.0.0.1:9"], ("q",)))
    with pytest.raises(ValueError):
        make(worker)


def test_a_worker_needs_a_handler_and_limits_name_kinds_it_has() -> None:
    with pytest.raises(ValueError, match="kind"):
        WorkerConfig(["http://127.0.0.1:9"], ("q",), kind_concurrency={"a b": 1}).validate()
    bare = Worker(WorkerConfig(["http://127.0.0.1:9"], ("q",)))
    with pytest.raises(ValueError, match="needs a handler"):
        asyncio.run(bare.run())
    limited = Worker(
        WorkerConfig(["http://127.0.0.1:9"], ("q",), kind_concurrency={"email": 2}), print
    )
    with pytest.raises(ValueError, match="without a handler"):
        asyncio.run(limited.run())
