"""Builders for hand-made histories and final states (chaos checker tests)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # `chaos` is a top-level package beside src/


def iso(ms: int) -> str:
    seconds, millis = divmod(ms, 1000)
    import datetime as dt

    stamp = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{millis:03d}Z"


def op(
    op_id: str,
    f: str,
    kind: str,
    t0: float,
    t1: float,
    args: dict[str, Any] | None = None,
    result: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": op_id,
        "process": op_id.split(":")[0],
        "f": f,
        "invoke_t": t0,
        "complete_t": t1,
        "type": kind,
        "args": args or {},
        "result": result or {},
    }


def submit(op_id: str, t0: float, t1: float, key: str, job_id: str, kind: str = "ok") -> Any:
    args = {"path": "/v1/jobs", "body": {"idempotency_key": key}}
    result = {"status": 201, "body": {"job": {"id": job_id}}} if kind == "ok" else {}
    return op(op_id, "submit", kind, t0, t1, args, result)


def read(op_id: str, t0: float, t1: float, job_id: str, job: dict[str, Any] | None) -> Any:
    args = {"path": f"/v1/jobs/{job_id}", "body": None}
    if job is None:
        return op(op_id, "read", "fail", t0, t1, args, {"status": 404, "body": {}})
    return op(op_id, "read", "ok", t0, t1, args, {"status": 200, "body": {"job": job}})


def claim(op_id: str, t0: float, t1: float, job_id: str, token: int, attempt: int = 1) -> Any:
    lease = {"job_id": job_id, "fencing_token": token, "attempt": attempt, "epoch": 1}
    return op(op_id, "claim", "ok", t0, t1, {"path": "/v1/leases"}, {"body": {"leases": [lease]}})


def lease_op(
    op_id: str,
    f: str,
    t0: float,
    t1: float,
    job_id: str,
    token: int,
    kind: str = "ok",
    replayed: bool = False,
) -> Any:
    args = {"path": f"/v1/leases/{job_id}/{f}", "body": {"fencing_token": token}}
    body: dict[str, Any] = {"replayed": replayed} if kind == "ok" else {}
    return op(op_id, f, kind, t0, t1, args, {"body": body})


def effect(op_id: str, t0: float, t1: float, key: str, job_id: str, token: int, **kw: Any) -> Any:
    args = {"path": "/v1/effects", "body": {"key": key, "job_id": job_id, "fencing_token": token}}
    recorded = kw.get("recorded_token", token)
    body = {"effect": {"job_id": job_id, "fencing_token": recorded}}
    body["replayed"] = kw.get("replayed", False)
    return op(op_id, "effect", "ok", t0, t1, args, {"body": body})


def attempt(number: int, token: int, epoch: int, claimed_ms: int, ended_ms: int | None) -> Any:
    return {
        "number": number,
        "fencing_token": token,
        "epoch": epoch,
        "claimed_at": iso(claimed_ms),
        "ended_at": None if ended_ms is None else iso(ended_ms),
        "outcome": "lease_expired" if ended_ms is not None else None,
    }


def job(job_id: str, status: str = "succeeded", key: str | None = None, attempts: Any = ()) -> Any:
    return {
        "id": job_id,
        "status": status,
        "idempotency_key": key or f"key-{job_id}",
        "attempts": list(attempts),
    }


def final(*jobs: Any, effects: Any = None, nodes: Any = None) -> dict[str, Any]:
    return {
        "jobs": list(jobs),
        "effects": effects or {},
        "nodes": nodes if nodes is not None else {},
        "unreachable": [],
    }


# -- features: schedules, workflows, the outbox, flow limits ---------------------


def done(
    number: int, token: int, claimed_ms: int, ended_ms: int, outcome: str = "succeeded"
) -> Any:
    """An attempt that ended with `outcome`."""
    found = attempt(number, token, 1, claimed_ms, ended_ms)
    found["outcome"] = outcome
    return found


def occurrence(nominal_ms: int, decision: str, job_id: str | None, decided_ms: int = 0) -> Any:
    return {
        "nominal_time": iso(nominal_ms),
        "decided_at": iso(decided_ms or nominal_ms),
        "decision": decision,
        "job_id": job_id,
        "reason": None,
    }


def schedule_job(job_id: str, schedule_id: str, nominal_ms: int) -> Any:
    found = job(job_id, key=f"schedule:{schedule_id}:{nominal_ms}")
    found["schedule_id"] = schedule_id
    return found


def schedule_view(
    records_oldest_first: list[Any], buffered: tuple[int, ...] = (), **calendar: Any
) -> Any:
    """A schedule as final.json holds it: the API lists records newest first."""
    schedule = {
        "interval_s": None,
        "cron": None,
        "buffered": [iso(b) for b in buffered],
        **calendar,
    }
    return {"schedule": schedule, "occurrences": list(reversed(records_oldest_first))}


def step_job(
    job_id: str, workflow_id: str, step: str, created_ms: int, attempts: Any, **kw: Any
) -> Any:
    found = job(job_id, status=kw.get("status", "succeeded"), attempts=attempts)
    found |= {"workflow_id": workflow_id, "step": step, "created_at": iso(created_ms)}
    found["payload"] = kw.get("payload", {})
    return found
