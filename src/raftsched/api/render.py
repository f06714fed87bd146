"""Core records to API JSON: RFC 3339 times, payloads back to JSON values.

Rendering happens under the node's state lock (the caller holds it), so it
reads a consistent job; it copies everything it returns.
"""

from __future__ import annotations

from typing import Any

from raftsched.api.validation import unpack_json
from raftsched.core.jobs.reconcile_book import book_of, on_unknown, reconcile_queue
from raftsched.core.jobs.trace_book import trace_of
from raftsched.core.kernel.results import Effect, Lease, ReconcileTarget
from raftsched.core.kernel.state import State
from raftsched.timefmt import format_ms


def time_or_none(ms: int | None) -> str | None:
    return None if ms is None else format_ms(ms)


def _error(error: Any) -> dict[str, Any] | None:
    if error is None:
        return None
    kind, message = error
    return {"kind": kind, "message": message}


def job(record: Any, state: State | None = None) -> dict[str, Any]:
    """A Job object; with the state, also how an unknown outcome of it is
    handled and its open reconciliation (`reconcile`), and the trace
    context it was submitted with (`trace_context`)."""
    body = _job(record)
    if state is not None:
        body.update(reconcile(state, record))
        body.update(trace_context(trace_of(state, record.id)))
    return body


def trace_context(trace: tuple[str, str | None] | None) -> dict[str, str | None]:
    """`traceparent` and `tracestate` of a Job or a Lease: the W3C trace
    context its submission carried (cluster version 8), or nulls."""
    if trace is None:
        return {"traceparent": None, "tracestate": None}
    return {"traceparent": trace[0], "tracestate": trace[1]}


def reconcile(state: State, record: Any) -> dict[str, Any]:
    """`on_unknown` and `reconcile_queue` as in force for the job (its own,
    else its queue's or tenant's default), and `reconciliation` while it is
    reconciling: the attempt asked about, expired tries, the current lease."""
    body: dict[str, Any] = {
        "on_unknown": on_unknown(state, record),
        "reconcile_queue": reconcile_queue(state, record),
    }
    task = book_of(state).tasks.get(record.id)
    if task is not None:
        lease = task.lease
        body["reconciliation"] = {
            "attempt": task.attempt,
            "queue": task.queue,
            "tries": task.tries,
            "available_at": format_ms(task.available_at_ms),
            "lease": None
            if lease is None
            else {
                "worker_id": lease[0],
                "epoch": lease[1],
                "fencing_token": lease[2],
                "expires_at": format_ms(lease[3]),
            },
        }
    return body


def _job(record: Any) -> dict[str, Any]:
    lease = record.lease
    return {
        "id": record.id,
        "queue": record.queue,
        "tenant": record.tenant,
        "status": record.status,
        "priority": record.priority,
        "payload": unpack_json(record.payload),
        "idempotency_key": record.idempotency_key,
        "ordering_key": record.ordering_key,
        "correlation_id": record.correlation_id,
        "labels": dict(record.labels),
        "created_at": format_ms(record.created_at_ms),
        "updated_at": format_ms(record.updated_at_ms),
        "run_at": time_or_none(record.run_at_ms),
        "next_run_at": time_or_none(record.next_run_at_ms),
        "deadline_at": time_or_none(record.deadline_at_ms),
        "max_attempts": record.max_attempts,
        "attempts_made": record.attempts_made,
        "cancel_requested": record.cancel_requested,
        "lease": None
        if lease is None
        else {
            "worker_id": lease.worker_id,
            "epoch": lease.epoch,
            "fencing_token": lease.fencing_token,
            "expires_at": format_ms(lease.expires_at_ms),
        },
        "result": unpack_json(record.result),
        "last_error": _error(record.last_error),
        "schedule_id": record.schedule_id,
        "workflow_id": record.workflow_id,
        "step": record.step,
        "kind": record.kind,
        "attempts": [attempt(a) for a in record.attempts],
    }


def attempt(record: Any) -> dict[str, Any]:
    return {
        "number": record.number,
        "worker_id": record.worker_id,
        "epoch": record.epoch,
        "fencing_token": record.fencing_token,
        "claimed_at": time_or_none(record.claimed_at_ms),
        "started_at": time_or_none(record.started_at_ms),
        "ended_at": time_or_none(record.ended_at_ms),
        "outcome": record.outcome,
        "error": _error(record.error),
    }


def history_event(record: Any) -> dict[str, Any]:
    return {
        "at": format_ms(record.at_ms),
        "event": record.event,
        "from_status": record.from_status,
        "to_status": record.to_status,
        "actor": record.actor,
        "epoch": record.epoch,
        "fencing_token": record.fencing_token,
        "detail": record.detail,
    }


def lease(
    grant: Lease,
    kind: str | None = None,
    *,
    trace: tuple[str, str | None] | None = None,
    schedule_id: str | None = None,
) -> dict[str, Any]:
    """A Lease object; `kind` is its job's, `trace` its job's trace context,
    `schedule_id` the schedule that fired it (the core's grant carries none
    of them: a job's never change, so the caller reads them off the state,
    `core.job_trace`)."""
    return {
        "job_id": grant.job_id,
        "attempt": grant.attempt,
        "epoch": grant.epoch,
        "fencing_token": grant.fencing_token,
        "expires_at": format_ms(grant.expires_at_ms),
        "lease_s": grant.lease_ms / 1000,
        "queue": grant.queue,
        "payload": unpack_json(grant.payload),
        "idempotency_key": grant.idempotency_key,
        "ordering_key": grant.ordering_key,
        "correlation_id": grant.correlation_id,
        "workflow_id": grant.workflow_id,
        "step": grant.step,
        "schedule_id": schedule_id,
        "kind": kind,
        "inputs": unpack_json(grant.inputs) if grant.inputs is not None else {},
        **trace_context(trace),
        **({} if grant.reconcile is None else {"reconcile": reconcile_target(grant.reconcile)}),
    }


def reconcile_target(target: ReconcileTarget) -> dict[str, Any]:
    """The attempt whose outcome a reconciliation lease asks about."""
    return {
        "attempt": target.attempt,
        "fencing_token": target.fencing_token,
        "worker_id": target.worker_id,
        "started_at": time_or_none(target.started_at_ms),
        "effect_keys": list(target.effect_keys),
        "queue": target.queue,
    }


def effect(record: Effect) -> dict[str, Any]:
    return {
        "key": record.key,
        "job_id": record.job_id,
        "fencing_token": record.fencing_token,
        "epoch": record.epoch,
        "result": unpack_json(record.result),
        "recorded_at": format_ms(record.recorded_at_ms),
    }
