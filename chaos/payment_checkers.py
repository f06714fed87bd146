"""Checker 15: charges per payment <= 1 (the payments scenario, chaos/payments.py).

The provider cannot deduplicate, so its log is the ground truth: a payment
charged twice was paid twice, whatever the cluster's state says. With the
payments queue on `on_unknown: reconcile` that must never happen; on
`retry` (the negative control) it does, for every payment whose worker died
or stalled after charging. A pure function of the history, the final state
and the provider's log, like the other checkers (chaos/checkers.py).

Inputs besides `ops` and `final` (see chaos/checkers.py):
- `provider_log`: chaos.provider's log: `{"kind": "charge", "payment",
  "charge", "number", "job_id", "fencing_token", "worker_id", "t"}` per
  charge, `{"kind": "lookup", ...}` per reconciler's question.
- `final["payments"]`: {"policy", "enabled", "queue": the queue's settings
  at the end, "histories": {job id: the job's history}}.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Final

from chaos.checkers import Check

Op = dict[str, Any]
# A dead letter a payment may end as: its reconciler could not tell (or its
# reconciliation leases ran out), and a human must look at the provider.
UNRECONCILED: Final = "unreconciled"


def charges_by_payment(provider_log: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    charges: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in provider_log:
        if record.get("kind") == "charge":
            charges[str(record["payment"])].append(record)
    return charges


def acknowledged_payments(ops: list[Op]) -> dict[str, str]:
    """payment id -> the job id an acknowledged submit answered."""
    acked: dict[str, str] = {}
    for op in ops:
        if op["f"] == "submit_payment" and op["type"] == "ok":
            payment = str(op["args"]["body"]["payload"]["payment"])
            acked[payment] = str(op["result"]["body"]["job"]["id"])
    return acked


def charges_per_payment_at_most_one(
    ops: list[Op], final: dict[str, Any], provider_log: list[dict[str, Any]]
) -> Check:
    """No payment charged twice; every acknowledged payment ended
    `succeeded` with exactly one charge, or dead-lettered `unreconciled`
    (a reconciler could not tell: a human's turn) -- never lost, never
    pending, never dead for another reason; and no payment job was
    completed twice (by its worker and by a reconciler, say)."""
    check = Check("15_charges_per_payment_at_most_one")
    charges = charges_by_payment(provider_log)
    for payment, made in sorted(charges.items()):
        if len(made) > 1:
            check.flag(
                problem="payment charged more than once",
                payment=payment,
                charges=[
                    (c["charge"], c.get("job_id"), c.get("fencing_token"), c.get("worker_id"))
                    for c in made
                ],
            )
    jobs = {job["id"]: job for job in final.get("jobs", [])}
    for payment, job_id in sorted(acknowledged_payments(ops).items()):
        job = jobs.get(job_id)
        where = {"payment": payment, "job_id": job_id}
        if job is None:
            check.flag(problem="acknowledged payment lost", **where)
        elif job["status"] == "succeeded":
            if not charges.get(payment):
                check.flag(problem="payment succeeded without a charge", **where)
        elif job["status"] == "dead_letter":
            kind = (job.get("last_error") or {}).get("kind")
            if kind != UNRECONCILED:
                check.flag(problem="payment dead-lettered, not unreconciled", kind=kind, **where)
        else:
            check.flag(problem="payment not succeeded", status=job["status"], **where)
    _completed_once(ops, check)
    return check


def _completed_once(ops: list[Op], check: Check) -> None:
    """First (non-replayed) completions per payment job: the worker's
    `complete` and a reconciler's `happened` each count."""
    payment_jobs = set(acknowledged_payments(ops).values())
    completions: dict[str, list[str]] = defaultdict(list)
    for op in ops:
        if op["type"] != "ok" or op["f"] not in ("complete", "reconcile"):
            continue
        job_id = str(op["args"]["path"]).split("/")[3]
        body = op["args"].get("body") or {}
        if job_id not in payment_jobs or op["result"]["body"].get("replayed"):
            continue
        if op["f"] == "complete" or body.get("decision") == "happened":
            completions[job_id].append(op["id"])
    for job_id, by in sorted(completions.items()):
        if len(by) > 1:
            check.flag(problem="payment completed more than once", job_id=job_id, ops=by)


def reconcile_decisions(final: dict[str, Any]) -> dict[str, int]:
    """Decisions in the payment jobs' histories (`reconciled <decision>`),
    and reconciliation leases that expired unanswered."""
    counts: dict[str, int] = defaultdict(int)
    for events in ((final.get("payments") or {}).get("histories") or {}).values():
        for event in events:
            detail = str(event.get("detail") or "")
            if event.get("from_status") == "reconciling" and detail.startswith("reconciled "):
                counts[detail.removeprefix("reconciled ").split(":")[0]] += 1
            elif event.get("event") == "reconcile_expired":
                counts["lease_expired_unanswered"] += 1
    return dict(sorted(counts.items()))
