"""Reconciliation of unknown outcomes over HTTP, with the worker SDK.

A three-node cluster; a queue made safe with one setting (`PUT /v1/queues`
with `on_unknown: reconcile`); a fake provider that cannot deduplicate (a
charge count per payment). Workers "crash" after the provider call and
before recording it (their lease simply lapses), or before the call; a
reconciler registered with `@worker.reconciler(queue)` looks at the
provider. Every payment ends charged exactly once, and each decision is in
the job's history with the reconciling worker, its token and its evidence.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

from raftsched.client import Client, Conflict, LeaseLost
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.testing import LocalCluster
from raftsched.worker import (
    DidNotHappen,
    Happened,
    JobContext,
    ReconcileContext,
    Worker,
    WorkerConfig,
)

QUEUE = "payments-rc"


class Provider:
    """Charges per payment id; no deduplication at all."""

    def __init__(self) -> None:
        self.charges: Counter[str] = Counter()
        self.lock = threading.Lock()

    def charge(self, payment: str) -> str:
        with self.lock:
            self.charges[payment] += 1
            return f"ch_{payment}_{self.charges[payment]}"

    def find(self, payment: str) -> str | None:
        with self.lock:
            count = self.charges[payment]
        return f"ch_{payment}_{count}" if count else None


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _reconcile_lease_gone(client: Client, job_id: str) -> bool:
    """No reconciliation lease is out: the job's lease lapsed, or the job left
    `reconciling` (its `reconciliation` is gone then). One read: two could see
    `reconciling` first and then a job already dead-lettered."""
    job = client.get_job(job_id)
    return job["status"] != "reconciling" or job["reconciliation"]["lease"] is None


def _crash_after(client: Client, provider: Provider, job_id: str, charge: bool) -> int:
    """A worker that takes the job, maybe calls the provider, and dies
    before recording anything: its short lease lapses while running."""
    (lease,) = client.claim("doomed", [QUEUE], max_jobs=1, wait_s=5, lease_s=1)
    assert lease["job_id"] == job_id, lease
    client.start(job_id, lease["fencing_token"])
    if charge:
        provider.charge(client.get_job(job_id)["payload"]["payment"])
    return int(lease["fencing_token"])


def test_unknown_outcomes_are_reconciled_and_every_payment_is_charged_once(
    cluster: LocalCluster, client: Client
) -> None:
    _wait(
        lambda: client.cluster().get("cluster_version") == COMMAND_VERSION_MAX,
        30,
        "the cluster version to reach this release's",
    )
    queue = client.set_queue(QUEUE, on_unknown="reconcile")
    assert queue["on_unknown"] == "reconcile"
    # A PUT of other settings (or the dashboard's pause) keeps the reconciliation.
    assert client.set_queue(QUEUE, concurrency_limit=10)["on_unknown"] == "reconcile"
    provider = Provider()
    charged = client.submit(QUEUE, {"payment": "p1"}, idempotency_key="p1", lease_s=1)["id"]
    spared = client.submit(QUEUE, {"payment": "p2"}, idempotency_key="p2", lease_s=1)["id"]
    assert client.get_job(charged)["on_unknown"] == "reconcile"

    first_token = _crash_after(client, provider, charged, charge=True)
    _crash_after(client, provider, spared, charge=False)
    _wait(
        lambda: {client.get_job(j)["status"] for j in (charged, spared)} == {"reconciling"},
        15,
        "both jobs to be reconciling",
    )
    job = client.get_job(charged)
    assert job["reconciliation"]["attempt"] == 1
    assert job["attempts"][0]["outcome"] == "lease_expired"
    try:  # the crashed attempt's token cannot answer for it
        client.reconcile(charged, first_token, "happened")
    except LeaseLost:
        pass
    else:
        raise AssertionError("the unknown attempt's own token answered its reconciliation")

    def charge(ctx: JobContext) -> dict[str, Any]:
        payment = ctx.payload["payment"]
        receipt = ctx.effect(f"charge:{payment}", lambda: provider.charge(payment))
        return {"charge": receipt}

    def was_charged(ctx: ReconcileContext) -> Happened | DidNotHappen:
        assert ctx.attempt.worker_id == "doomed" and ctx.attempt.started_at is not None
        payment = ctx.payload["payment"]
        found = provider.find(payment)
        if found is None:
            return DidNotHappen(f"the provider has no charge for {payment}")
        return Happened(
            {"charge": found},
            effects={f"charge:{payment}": found},
            reason=f"the provider lists {found}",
        )

    async def work() -> None:
        config = WorkerConfig(cluster.urls, (QUEUE,), worker_id="reconciler-1", lease_s=5)
        worker = Worker(config, charge)
        worker.reconciler(QUEUE)(was_charged)
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            jobs = await asyncio.to_thread(lambda: [client.get_job(j) for j in (charged, spared)])
            if all(j["status"] == "succeeded" for j in jobs):
                break
            await asyncio.sleep(0.2)
        worker.stop()
        await runner

    asyncio.run(work())

    assert provider.charges == {"p1": 1, "p2": 1}
    happened = client.get_job(charged)
    assert happened["status"] == "succeeded"
    assert happened["result"] == {"charge": "ch_p1_1"}
    assert client.get_effect("charge:p1")["result"] == "ch_p1_1"
    decision = client.job_history(charged)[-1]
    assert decision["event"] == "complete" and decision["actor"] == "reconciler-1"
    assert decision["from_status"] == "reconciling"
    assert decision["detail"] == "reconciled happened: the provider lists ch_p1_1"
    assert decision["fencing_token"] > first_token

    exported = ""
    for url in cluster.urls:
        with Client([url], timeout_s=10) as node:
            exported += node.request("GET", "/metrics").body.decode()
    assert 'raftsched_reconcile_decisions_total{decision="happened"} 1.0' in exported
    assert 'raftsched_reconcile_decisions_total{decision="did_not_happen"} 1.0' in exported

    retried = client.get_job(spared)
    assert retried["status"] == "succeeded" and len(retried["attempts"]) == 2
    tokens = [a["fencing_token"] for a in retried["attempts"]]
    assert tokens == sorted(tokens)
    events = [(e["event"], e["to_status"]) for e in client.job_history(spared)]
    assert ("outcome_unknown", "reconciling") in events
    assert ("requeue", "pending") in events or ("retry", "retry_wait") in events


def test_a_stale_reconciliation_token_is_lease_lost(client: Client) -> None:
    job_id = client.submit("plain-rc", {"n": 1})["id"]
    (lease,) = client.claim("w", ["plain-rc"], max_jobs=1, wait_s=5)
    try:
        client.reconcile(job_id, lease["fencing_token"], "did_not_happen")
    except LeaseLost:
        pass
    else:
        raise AssertionError("a job lease token answered a reconciliation")
    assert client.get_job(job_id)["status"] == "claimed"


def test_an_unreconciled_dead_letter_needs_the_operators_word_to_replay(client: Client) -> None:
    queue = "ledger-rc"
    _wait(
        lambda: client.cluster().get("cluster_version") == COMMAND_VERSION_MAX,
        30,
        "the cluster version to reach this release's",
    )
    job_id = client.submit(queue, {"entry": 1}, on_unknown="reconcile")["id"]
    (lease,) = client.claim("w1", [queue], max_jobs=1, wait_s=5)
    client.start(job_id, lease["fencing_token"])
    failed = client.fail(job_id, lease["fencing_token"], kind="unknown", message="timed out")
    assert failed["status"] == "reconciling"
    (ask,) = client.claim("r1", [queue], max_jobs=1, wait_s=5)
    assert ask["reconcile"]["fencing_token"] == lease["fencing_token"]
    assert ask["reconcile"]["worker_id"] == "w1"
    answer = client.reconcile(job_id, ask["fencing_token"], "cannot_tell", reason="ledger down")
    assert answer["status"] == "dead_letter"
    assert client.get_job(job_id)["last_error"]["kind"] == "unreconciled"
    try:
        client.request("POST", f"/v1/jobs/{job_id}/replay", body={"reason": "again"})
    except Conflict as error:
        assert error.code == "invalid_state"
    else:
        raise AssertionError("an unreconciled dead letter was replayed without a word")
    # Back to its reconcilers on an operator's request; they still cannot tell.
    again = client.request(
        "POST", f"/v1/jobs/{job_id}/reconcile", body={"reason": "the ledger is back"}
    ).json()
    assert again["job"]["status"] == "reconciling"
    (second,) = client.claim("r2", [queue], max_jobs=1, wait_s=5)
    assert second["reconcile"]["attempt"] == 1 and second["fencing_token"] > ask["fencing_token"]
    answer = client.reconcile(job_id, second["fencing_token"], "cannot_tell", reason="still down")
    assert answer["status"] == "dead_letter"
    overview = client.request("GET", "/v1/overview").json()
    marked = {j["id"]: j["unreconciled"] for j in overview["dead_letters"]}
    assert marked[job_id] is True
    body = {"reason": "ledger checked by hand: no entry", "reconciled": True}
    replayed = client.request("POST", f"/v1/jobs/{job_id}/replay", body=body).json()
    assert replayed["job"]["status"] == "pending"
    last = client.job_history(job_id)[-1]
    assert last["event"] == "replay"
    assert last["detail"] == "reconciled by operator: ledger checked by hand: no entry"


def test_reconciliations_nobody_answers_end_unreconciled_and_are_counted(
    cluster: LocalCluster, client: Client
) -> None:
    queue = "silent-rc"
    _wait(
        lambda: client.cluster().get("cluster_version") == COMMAND_VERSION_MAX,
        30,
        "the cluster version to reach this release's",
    )
    job_id = client.submit(
        queue, {"n": 1}, on_unknown="reconcile", backoff={"initial_s": 0.1, "max_s": 0.1}
    )["id"]
    (lease,) = client.claim("w1", [queue], max_jobs=1, wait_s=5)
    client.start(job_id, lease["fencing_token"])
    client.fail(job_id, lease["fencing_token"], kind="unknown")
    for _ in range(5):  # a reconciler that takes the question and never answers
        (ask,) = client.claim("mute", [queue], max_jobs=1, wait_s=10, lease_s=0.5)
        assert ask["reconcile"] is not None
        _wait(
            lambda: _reconcile_lease_gone(client, job_id), 10, "the reconciliation lease to expire"
        )
    _wait(lambda: client.get_job(job_id)["status"] == "dead_letter", 10, "the dead letter")
    assert client.get_job(job_id)["last_error"]["kind"] == "unreconciled"
    exported = ""
    for url in cluster.urls:
        with Client([url], timeout_s=10) as node:
            exported += node.request("GET", "/metrics").body.decode()
    assert 'raftsched_dead_letters_total{reason="unreconciled"} 1.0' in exported
