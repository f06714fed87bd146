"""The handler test kit agrees with a real worker on a real cluster.

One payment handler, run twice per job: by `raftsched.testing.run_handler`
on an in-process lease, and by a `Worker` against a three-node cluster. The
kit's outcome must say what the cluster then holds: a success with its
result and its recorded effect, a permanent error that dead-letters with
the same error, and an effect found in the ledger instead of repeated.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from raftsched.client import Client
from raftsched.testing import HandlerOutcome, LocalCluster, run_handler
from raftsched.worker import JobContext, PermanentError, Worker, WorkerConfig

QUEUE = "parity"
# The job status the cluster gives each kit outcome that ends a job.
STATUS_AFTER = {"succeeded": "succeeded", "failed_permanent": "dead_letter"}


class Provider:
    """A payment provider that counts its charges per payment."""

    def __init__(self) -> None:
        self.charges: dict[str, int] = {}
        self.lock = threading.Lock()

    def charge(self, payment: str) -> dict[str, Any]:
        with self.lock:
            self.charges[payment] = self.charges.get(payment, 0) + 1
        return {"charge_id": f"ch_{payment}"}


def payment_handler(provider: Provider) -> Any:
    def pay(ctx: JobContext) -> dict[str, Any]:
        payment = ctx.payload["payment"]
        if ctx.payload.get("card") == "declined":
            raise PermanentError(f"card declined for {payment}")
        charge = ctx.effect(f"charge:{payment}", lambda: provider.charge(payment))
        return {"charge": charge["charge_id"], "amount": ctx.payload["amount"]}

    return pay


def _run_worker(
    cluster: LocalCluster, client: Client, pay: Any, job_ids: list[str], queue: str
) -> None:
    async def work() -> None:
        config = WorkerConfig(cluster.urls, (queue,), worker_id="parity-1", lease_s=10)
        worker = Worker(config, pay)
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            jobs = await asyncio.to_thread(lambda: [client.get_job(j) for j in job_ids])
            if all(job["status"] in STATUS_AFTER.values() for job in jobs):
                break
            await asyncio.sleep(0.2)
        worker.stop()
        await runner

    asyncio.run(work())


def _assert_same(kit: HandlerOutcome, job: dict[str, Any], client: Client) -> None:
    assert job["status"] == STATUS_AFTER[kit.status], (kit, job)
    assert job["result"] == kit.result
    assert kit.report is not None
    if kit.status == "succeeded":
        assert job["last_error"] is None
    else:
        assert job["last_error"]["kind"] == kit.report["error"]["kind"]
        assert job["last_error"]["message"] == kit.message
    for key, result in kit.effects.items():
        effect = client.get_effect(key)
        assert effect["result"] == result and effect["job_id"] == job["id"]


def test_run_handler_and_a_real_worker_agree(cluster: LocalCluster, client: Client) -> None:
    payloads = {
        "paid": {"payment": "p1", "amount": 1200},
        "declined": {"payment": "p2", "amount": 500, "card": "declined"},
    }
    job_ids = {
        name: client.submit(QUEUE, payload, idempotency_key=f"parity:{name}", max_attempts=3)["id"]
        for name, payload in payloads.items()
    }
    kit_provider, real_provider = Provider(), Provider()
    kit = {
        name: run_handler(
            payment_handler(kit_provider),
            payloads[name],
            job_id=job_ids[name],
            queue=QUEUE,
            idempotency_key=f"parity:{name}",
        )
        for name in payloads
    }
    assert kit["paid"].status == "succeeded"
    assert kit["paid"].effects == {"charge:p1": {"charge_id": "ch_p1"}}
    assert kit["declined"].status == "failed_permanent"
    assert kit["declined"].message == "PermanentError: card declined for p2"

    _run_worker(cluster, client, payment_handler(real_provider), list(job_ids.values()), QUEUE)

    for name, job_id in job_ids.items():
        job = client.get_job(job_id)
        assert len(job["attempts"]) == 1, job  # dead-lettered at once, no retries
        _assert_same(kit[name], job, client)
    assert real_provider.charges == kit_provider.charges == {"p1": 1}

    # A second job for the same payment finds the charge in the ledger, on
    # the cluster as in the kit given the cluster's ledger; nobody charges again.
    again_id = client.submit(QUEUE, payloads["paid"], idempotency_key="parity:again")["id"]
    ledger = {"charge:p1": client.get_effect("charge:p1")["result"]}
    kit_again = run_handler(
        payment_handler(kit_provider),
        payloads["paid"],
        job_id=again_id,
        queue=QUEUE,
        effects=ledger,
    )
    assert kit_again.replayed == ("charge:p1",) and kit_again.effects == {}
    _run_worker(cluster, client, payment_handler(real_provider), [again_id], QUEUE)
    again = client.get_job(again_id)
    _assert_same(kit_again, again, client)
    assert client.get_effect("charge:p1")["job_id"] == job_ids["paid"]  # the first writer's
    assert real_provider.charges == kit_provider.charges == {"p1": 1}
