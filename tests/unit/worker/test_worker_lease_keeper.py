"""The lease keeper (`JobRun`) when a renewal fails for a reason that is not
the cluster's answer: a bug in the worker, say. It must keep renewing, and
only once the lease has run out is that an error."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import pytest

from raftsched.client import JsonObject
from raftsched.worker import JobContext
from raftsched.worker._context import Lease
from raftsched.worker._job import JobRun, Returned


class FlakyRenewals:
    """Lease operations answered in process; the first `failures` heartbeats
    raise RuntimeError, as a bug between the keeper and the wire would."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.heartbeats = 0
        self.reports: list[str] = []

    async def op(self, op: Mapping[str, Any]) -> JsonObject:
        if op["op"] == "heartbeat":
            self.heartbeats += 1
            if self.heartbeats <= self.failures:
                raise RuntimeError("renewal bug")
            return {"expires_at": "2030-01-01T00:00:00.000Z", "cancel_requested": False}
        if op["op"] != "start":
            self.reports.append(op["op"])
        return {"status": "running"}

    async def lookup(self, key: str) -> tuple[bool, Any]:
        return False, None

    async def record(self, key: str, job_id: str, fencing_token: int, result: Any) -> Any:
        return result


async def _run(handler: Any, lease_ops: FlakyRenewals, lease_s: float) -> JobRun:
    lease = Lease(job_id="job_1", attempt=1, epoch=1, fencing_token=7, lease_s=lease_s, queue="q")
    loop = asyncio.get_running_loop()
    ctx = JobContext(lease, worker_id="w", loop=loop, ledger=lease_ops)
    run = JobRun(ctx, handler, lease_ops, claim_sent_at=time.monotonic())
    await asyncio.wait_for(run.run(), 10)
    return run


def test_an_unexpected_renewal_failure_is_a_warning_and_renewals_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def handler(ctx: JobContext) -> str:
        await asyncio.sleep(1.5)
        return "done"

    lease_ops = FlakyRenewals(failures=1)
    with caplog.at_level(logging.INFO, logger="raftsched.worker"):
        run = asyncio.run(_run(handler, lease_ops, lease_s=0.6))
    assert run.outcome == Returned("done") and lease_ops.reports == ["complete"]
    assert lease_ops.heartbeats >= 4  # 1.5 s under a 0.6 s lease, after the failure
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage() == "heartbeat failed unexpectedly; renewing again"
    assert warning.exc_info is not None and "renewal bug" in str(warning.exc_info[1])
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_renewals_that_keep_failing_unexpectedly_end_at_the_deadline_as_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cancelled_after: list[float] = []

    async def handler(ctx: JobContext) -> None:
        began = time.monotonic()
        try:
            await asyncio.sleep(60)
        finally:
            cancelled_after.append(time.monotonic() - began)

    lease_ops = FlakyRenewals(failures=1000)
    with caplog.at_level(logging.INFO, logger="raftsched.worker"):
        run = asyncio.run(_run(handler, lease_ops, lease_s=1.0))
    assert run.ctx.cancel_reason == "deadline"
    assert cancelled_after and cancelled_after[0] < 1.0  # before the lease ran out
    assert lease_ops.heartbeats >= 2 and lease_ops.reports == ["fail"]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == ["job lease lost: renewals failed unexpectedly until the deadline"]
