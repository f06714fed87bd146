"""Checker 15 (charges per payment <= 1) and the payments scenario's pieces
that need no root: a clean reconciled history passes every checker; a double
charge, a lost or unfinished payment, a dead letter that is not
`unreconciled`, a success without a charge and a double completion are
flagged; reconciliation leases are judged by checkers 3 and 5; the fake
provider really does not deduplicate; the crash windows are a function of
the seed."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import chaos_support as s
from chaos.checkers import check_all, fencing_tokens, no_overlapping_leases
from chaos.httpops import send
from chaos.payment_checkers import charges_per_payment_at_most_one, reconcile_decisions
from chaos.payments import CRASH_WINDOW_P, PAYMENTS_QUEUE, crash_window, payment_request
from chaos.provider import Provider, read_provider_log
from chaos.summary import summarize

# -- builders ----------------------------------------------------------------------


def submit_payment(op_id: str, t: float, number: int, job_id: str) -> dict[str, Any]:
    args = {"path": "/v1/jobs", "body": payment_request(1, number)}
    result = {"status": 201, "body": {"job": {"id": job_id}}}
    return s.op(op_id, "submit_payment", "ok", t, t + 0.1, args, result)


def reconcile_claim(
    op_id: str, t: float, job_id: str, token: int, attempt: int, attempt_token: int
) -> dict[str, Any]:
    lease = {"job_id": job_id, "fencing_token": token, "attempt": attempt, "epoch": 1}
    lease["reconcile"] = {"attempt": attempt, "fencing_token": attempt_token}
    return s.op(
        op_id, "claim", "ok", t, t + 0.1, {"path": "/v1/leases"}, {"body": {"leases": [lease]}}
    )


def reconcile(
    op_id: str, t: float, job_id: str, token: int, decision: str, replayed: bool = False
) -> dict[str, Any]:
    args = {
        "path": f"/v1/leases/{job_id}/reconcile",
        "body": {"fencing_token": token, "decision": decision},
    }
    return s.op(op_id, "reconcile", "ok", t, t + 0.1, args, {"body": {"replayed": replayed}})


def charge(payment: str, number: int, job_id: str, token: int, t: float) -> dict[str, Any]:
    return {
        "t": t,
        "kind": "charge",
        "payment": payment,
        "charge": f"ch_{payment}_{number}",
        "number": number,
        "job_id": job_id,
        "fencing_token": token,
        "worker_id": "w0",
    }


def payment_job(job_id: str, status: str, attempts: Any, kind: str | None = None) -> Any:
    found = s.job(job_id, status=status, attempts=attempts)
    found["queue"] = PAYMENTS_QUEUE
    found["last_error"] = {"kind": kind, "message": "x"} if kind else None
    return found


def expired(number: int, token: int, claimed_ms: int) -> Any:
    return s.done(number, token, claimed_ms, claimed_ms + 2_000, outcome="lease_expired")


def clean() -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """p1: its worker died after charging; reconciled `happened`.
    p2: charged and completed. p3: died after charging, the provider's
    lookup did not answer; `cannot_tell`, dead-lettered unreconciled."""
    ops = [
        submit_payment("payments:1", 0.0, 1, "p1"),
        submit_payment("payments:2", 0.5, 2, "p2"),
        submit_payment("payments:3", 1.0, 3, "p3"),
        s.claim("w0:1", 1.0, 1.1, "p1", 10),
        s.lease_op("w0:2", "start", 1.2, 1.3, "p1", 10),
        reconcile_claim("w1:1", 4.0, "p1", 11, 1, 10),
        reconcile("w1:2", 4.2, "p1", 11, "happened"),
        reconcile("w1:3", 4.4, "p1", 11, "happened", replayed=True),
        s.claim("w2:1", 2.0, 2.1, "p2", 12),
        s.lease_op("w2:2", "complete", 2.5, 2.6, "p2", 12),
        s.claim("w3:1", 3.0, 3.1, "p3", 13),
        reconcile_claim("w2:3", 6.0, "p3", 14, 1, 13),
        reconcile("w2:4", 6.2, "p3", 14, "cannot_tell"),
    ]
    jobs = [
        payment_job("p1", "succeeded", [expired(1, 10, 1_000)]),
        payment_job("p2", "succeeded", [s.done(1, 12, 2_000, 2_600)]),
        payment_job("p3", "dead_letter", [expired(1, 13, 3_000)], kind="unreconciled"),
    ]
    digest = {"digest": "d", "applied_index": 9, "jobs": jobs}
    final = s.final(*jobs, nodes={"n1": digest, "n2": digest})
    log = [
        charge("pay-1", 1, "p1", 10, 1.4),
        {"t": 4.1, "kind": "lookup", "payment": "pay-1", "charges": ["ch_pay-1_1"]},
        charge("pay-2", 1, "p2", 12, 2.3),
        charge("pay-3", 1, "p3", 13, 3.4),
    ]
    return ops, final, log


def problems(check: Any) -> list[str]:
    return [example["problem"] for example in check.examples]


# -- checker 15 ----------------------------------------------------------------------


def test_a_clean_reconciled_history_passes_every_checker() -> None:
    ops, final, log = clean()
    checks = check_all(ops, final, [], [], [], log)
    assert checks[-2].name == "15_charges_per_payment_at_most_one"
    assert {c.name: c.anomalies for c in checks} == {c.name: 0 for c in checks}


def test_a_payment_charged_twice_is_flagged() -> None:
    """The negative control's signature: the worker died after charging,
    the job was retried, and the retry charged again."""
    ops, final, log = clean()
    log.append(charge("pay-1", 2, "p1", 15, 5.0))
    check = charges_per_payment_at_most_one(ops, final, log)
    assert problems(check) == ["payment charged more than once"]
    assert check.examples[0]["payment"] == "pay-1"
    assert [c[2] for c in check.examples[0]["charges"]] == [10, 15]


def test_a_lost_payment_and_one_still_reconciling_are_flagged() -> None:
    ops, final, log = clean()
    ops.append(submit_payment("payments:4", 7.0, 4, "p4"))
    final["jobs"][0]["status"] = "reconciling"
    check = charges_per_payment_at_most_one(ops, final, log)
    assert sorted(problems(check)) == ["acknowledged payment lost", "payment not succeeded"]


def test_a_payment_dead_for_another_reason_is_flagged() -> None:
    ops, final, log = clean()
    final["jobs"][2]["last_error"]["kind"] = "permanent"
    check = charges_per_payment_at_most_one(ops, final, log)
    assert problems(check) == ["payment dead-lettered, not unreconciled"]


def test_a_payment_succeeded_without_a_charge_is_flagged() -> None:
    ops, final, log = clean()
    log = [record for record in log if record["payment"] != "pay-2"]
    check = charges_per_payment_at_most_one(ops, final, log)
    assert problems(check) == ["payment succeeded without a charge"]


def test_a_payment_completed_by_its_worker_and_a_reconciler_is_flagged() -> None:
    ops, final, log = clean()
    ops.append(s.lease_op("w0:3", "complete", 4.5, 4.6, "p1", 10))
    check = charges_per_payment_at_most_one(ops, final, log)
    assert problems(check) == ["payment completed more than once"]
    assert check.examples[0]["ops"] == ["w1:2", "w0:3"]


def test_decisions_are_counted_from_the_histories() -> None:
    history = [
        {"event": "claim", "from_status": "reconciling", "detail": "reconcile attempt 1 (try 1)"},
        {"event": "reconcile_expired", "from_status": "reconciling", "detail": None},
        {"event": "retry", "from_status": "reconciling", "detail": "reconciled did_not_happen"},
        {"event": "complete", "from_status": "reconciling", "detail": "reconciled happened: x"},
    ]
    final = {"payments": {"histories": {"p1": history, "p2": history[3:]}}}
    assert reconcile_decisions(final) == {
        "did_not_happen": 1,
        "happened": 2,
        "lease_expired_unanswered": 1,
    }


# -- checkers 3 and 5 on reconciliation leases ------------------------------------------


def test_a_bad_reconciliation_lease_is_flagged_by_checker_3() -> None:
    ops, final, _ = clean()
    ops += [
        reconcile_claim("w3:2", 8.0, "p2", 12, 1, 12),  # an attempt's token, not above it
        reconcile_claim("w3:3", 8.5, "p1", 20, 2, 10),  # p1 has no attempt 2
    ]
    assert sorted(problems(fencing_tokens(ops, final))) == [
        "reconciliation asks about an attempt the job does not have",
        "reconciliation token is also an attempt's",
        "reconciliation token not above its attempt's",
    ]


def test_a_reconcile_decision_on_a_superseded_lease_is_flagged_by_checker_5() -> None:
    ops, final, _ = clean()
    ops += [
        s.claim("w3:2", 5.0, 5.1, "p1", 16, attempt=2),
        reconcile("w1:9", 6.0, "p1", 11, "happened"),
    ]
    check = no_overlapping_leases(ops, final)
    assert problems(check) == ["stale token accepted after a newer lease was granted"]
    assert check.examples[0]["f"] == "reconcile"


# -- the summary ---------------------------------------------------------------------


def test_the_summary_reports_the_payments(tmp_path: Path) -> None:
    ops, final, log = clean()
    log.append(charge("pay-2", 2, "p2", 15, 5.0))
    final["payments"] = {
        "policy": "reconcile",
        "queue": {"on_unknown": "reconcile"},
        "histories": {
            "p1": [
                {"event": "complete", "from_status": "reconciling", "detail": "reconciled happened"}
            ]
        },
    }
    note = {"type": "note", "t": 1.0, "process": "w0", "id": "w0:note"}
    events = [
        note | {"f": "payments_enabled", "value": {"policy": "reconcile", "cluster_version": 5}},
        note | {"f": "crash_window", "value": {"how": "kill"}},
        note | {"f": "crash_window", "value": {"how": "stall"}},
        note | {"f": "worker_exit", "value": {"worker": "w0", "code": -9, "expected": True}},
    ]
    args = argparse.Namespace(
        seed=3, nodes=3, workers=2, clients=2, unsafe_ignore_fencing=False,
        recovery_bound_s=60.0, out=tmp_path,
    )  # fmt: skip
    summary = summarize(args, ops, events, final, [], [], [], 1.0, [], 10.0, provider_log=log)
    json.dumps(summary)
    assert summary["payments"] == {
        "policy": "reconcile",
        "queue_on_unknown": "reconcile",
        "enabled": True,
        "enabled_at_cluster_version": 5,
        "submitted": 3,
        "acknowledged": 3,
        "jobs_by_status": {"dead_letter": 1, "succeeded": 2},
        "unreconciled_dead_letters": 1,
        "crash_window": {"kill": 1, "stall": 1},
        "charges_not_started_late_lease": 0,
        "worker_restarts": 1,
        "worker_exits_unexpected": 0,
        "reconciliations": {"happened": 1},
        "charges": 4,
        "payments_charged": 3,
        "max_charges_per_payment": 2,
        "payments_charged_more_than_once": 1,
    }


# -- the provider and the scenario's seed ------------------------------------------------


def test_the_provider_charges_every_call_and_answers_lookups(tmp_path: Path) -> None:
    provider = Provider(tmp_path / "provider.jsonl", seed=1).start()
    try:
        body = {"job_id": "p1", "fencing_token": 7, "worker_id": "w0"}
        first = send("POST", provider.url + "/charge/pay-1", body)
        second = send("POST", provider.url + "/charge/pay-1", body | {"fencing_token": 9})
        found = send("GET", provider.url + "/charges/pay-1")
        none = send("GET", provider.url + "/charges/pay-2")
    finally:
        provider.stop()
    assert (first[0], first[1]) == (200, {"charge": "ch_pay-1_1", "number": 1})
    assert second[1] == {"charge": "ch_pay-1_2", "number": 2}  # no deduplication
    assert found[1]["charges"] == ["ch_pay-1_1", "ch_pay-1_2"]
    assert (none[0], none[1]["charges"]) == (200, [])
    log = read_provider_log(tmp_path / "provider.jsonl")
    assert [(r["kind"], r.get("fencing_token")) for r in log] == [
        ("charge", 7),
        ("charge", 9),
        ("lookup", None),
        ("lookup", None),
    ]


def test_the_provider_lookup_is_unavailable_for_a_seeded_share_of_payments(tmp_path: Path) -> None:
    provider = Provider(tmp_path / "provider.jsonl", seed=5, lookup_unavailable_p=0.1).start()
    try:
        unavailable = [f"pay-{n}" for n in range(1, 400) if provider.lookup_unavailable(f"pay-{n}")]
        status, body, _ = send("GET", provider.url + "/charges/" + unavailable[0])
    finally:
        provider.stop()
    assert 20 <= len(unavailable) <= 60
    assert (status, body["error"]) == (503, "lookup_unavailable")
    again = Provider(tmp_path / "again.jsonl", seed=5, lookup_unavailable_p=0.1).start()
    again.stop()
    payments = [f"pay-{n}" for n in range(1, 400)]
    assert [p for p in payments if again.lookup_unavailable(p)] == unavailable


def test_crash_windows_are_a_function_of_the_seed() -> None:
    choices = [crash_window(3, n) for n in range(1, 1001)]
    assert choices == [crash_window(3, n) for n in range(1, 1001)]
    assert choices != [crash_window(4, n) for n in range(1, 1001)]
    counts = Counter(choices)
    for how, share in CRASH_WINDOW_P.items():
        assert abs(counts[how] / 1000 - share) < 0.05, counts
    plain = next(n for n, how in enumerate(choices, 1) if how is None)
    assert "crash_window" not in payment_request(3, plain)["payload"]
    killed = next(n for n, how in enumerate(choices, 1) if how == "kill")
    request = payment_request(3, killed)
    assert request["payload"] == {"payment": f"pay-{killed}", "crash_window": "kill"}
    assert (request["queue"], request["idempotency_key"]) == (PAYMENTS_QUEUE, f"pay-{killed}")
