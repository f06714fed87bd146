"""Every API call as data: method, path, query, body, whether it is safe to
repeat after an unknown outcome, and how to unwrap the answer.

Both clients (sync and async) execute the same `Call` objects, so the mapping
from Python arguments to HTTP lives here once.

Which calls are repeated after an unknown outcome (timeout, connection reset
after the request was sent), and why:

- reads (GET): always.
- submit / submit_batch: only when every job carries an idempotency key; the
  repeat returns the first job.
- claim: yes. A claim that committed but whose answer was lost grants leases
  nobody works on; they expire as `claimed` leases, which the core treats as a
  safe retry (the handler never started). Repeating only picks more jobs.
- start / heartbeat / complete / fail / lease batch / record effect: yes, they
  are fenced by the lease token and the core returns the first outcome.
- cancel: yes, cancelling is idempotent in effect (a repeat may answer
  `invalid_state` if the first one already cancelled a queued job).
- replay: no. A replayed job may run and be dead-lettered again before the
  repeat arrives, which would then replay it a second time; the caller sees
  `OutcomeUnknown` and decides.

Answers of 503 (`no_leader`, `unavailable`) are repeated for every call:
the contract says nothing was committed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote, urlencode

import orjson
from opentelemetry import propagate

from raftsched import timefmt
from raftsched.client._errors import TransportError

T = TypeVar("T")

JsonObject = dict[str, Any]
Consistency = Literal["linearizable", "stale"]


@dataclass(frozen=True, slots=True)
class Response:
    """One HTTP answer. Header names are lower-cased."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    url: str

    def json(self) -> Any:
        if not self.body:
            return None
        return orjson.loads(self.body)  # a JSONDecodeError is json's ValueError

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def _json_object(response: Response) -> JsonObject:
    body = response.json()
    if not isinstance(body, dict):
        raise TransportError(f"expected a JSON object from {response.url}, got {body!r:.200}")
    return body


def _field(name: str) -> Callable[[Response], Any]:
    def unwrap(response: Response) -> Any:
        body = _json_object(response)
        if name not in body:
            raise TransportError(f"answer from {response.url} lacks {name!r}")
        return body[name]

    return unwrap


def _job_or_body(response: Response) -> JsonObject:
    # Cancel and replay answers are not spelled out in api.md; accept
    # `{"job": Job}` or a bare object.
    body = _json_object(response)
    job = body.get("job")
    return job if isinstance(job, dict) else body


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    method: str
    path: str
    unwrap: Callable[[Response], T]
    query: tuple[tuple[str, str], ...] = ()
    body: Any = None
    # Safe to send again when the first outcome is unknown (see module doc).
    retry_unknown: bool = False
    # Added to the client's timeout: long-polls wait this long on purpose.
    extra_timeout_s: float = 0.0

    @property
    def path_and_query(self) -> str:
        return self.path + ("?" + urlencode(self.query) if self.query else "")


USER_AGENT = "raftsched-client/0.1"


def token_from_env() -> str | None:
    """The bearer secret in `$RAFTSCHED_TOKEN`, the default of every client."""
    return os.environ.get("RAFTSCHED_TOKEN", "").strip() or None


def request_headers(call: Call[Any], request_id: str, token: str | None) -> dict[str, str]:
    """Headers of every send of one call; the request id stays the same across
    retries and redirects so that node logs tie them together."""
    headers = {"Accept": "application/json", "User-Agent": USER_AGENT, "X-Request-Id": request_id}
    if call.body is not None:
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    # The caller's trace context (W3C `traceparent`, `tracestate`, by the
    # global propagator), when a span is current: a submission's jobs keep
    # it, and the node's spans join the caller's trace. Nothing without one
    # (about a microsecond).
    propagate.inject(headers)
    return headers


def encode_body(call: Call[Any]) -> bytes | None:
    if call.body is None:
        return None
    return _ENCODER.encode(call.body).encode()


# `json.dumps` with separators makes an encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def body_size_bytes(body: Any) -> int:
    """The size of `body` as the clients send it: compact JSON, ASCII only
    (so characters are bytes). What a batch is split by to fit a node's
    `max_body_bytes` (the worker's lease batches)."""
    return len(_ENCODER.encode(body))


def _query(consistency: Consistency | None = None, **params: object) -> tuple[tuple[str, str], ...]:
    items = [(key, str(value)) for key, value in params.items() if value is not None]
    if consistency == "stale":
        items.append(("consistency", "stale"))
    return tuple(items)


def _segment(value: str) -> str:
    return quote(value, safe="")


def _drop_none(fields: Mapping[str, Any]) -> JsonObject:
    return {key: value for key, value in fields.items() if value is not None}


# --- jobs -------------------------------------------------------------------

RunAt = str | datetime | int


def job_request(
    queue: str,
    payload: Any = None,
    *,
    idempotency_key: str | None = None,
    run_at: RunAt | None = None,
    delay_s: float | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    backoff: Mapping[str, float] | None = None,
    lease_s: float | None = None,
    deadline_s: float | None = None,
    tenant: str | None = None,
    ordering_key: str | None = None,
    correlation_id: str | None = None,
    labels: Mapping[str, str] | None = None,
    on_unknown: Literal["retry", "reconcile"] | None = None,
    reconcile_queue: str | None = None,
    kind: str | None = None,
) -> JsonObject:
    """The body of one job submission; `run_at` may be RFC 3339 text, an aware
    datetime or Unix milliseconds. `on_unknown` and `reconcile_queue` need a
    cluster of release 0.5.0 or later (cluster version 5); `kind` one of
    0.8.0 or later (cluster version 8): an older cluster answers
    `ClusterVersionTooLow`, and the job is not submitted (docs/api.md, "Job
    kinds": sent without its kind, any worker's default handler would run
    it). Each is sent only when given."""
    return _drop_none(
        {
            "queue": queue,
            "payload": payload,
            "idempotency_key": idempotency_key,
            "run_at": _format_run_at(run_at),
            "delay_s": delay_s,
            "priority": priority,
            "max_attempts": max_attempts,
            "backoff": dict(backoff) if backoff is not None else None,
            "lease_s": lease_s,
            "deadline_s": deadline_s,
            "tenant": tenant,
            "ordering_key": ordering_key,
            "correlation_id": correlation_id,
            "labels": dict(labels) if labels is not None else None,
            "on_unknown": on_unknown,
            "reconcile_queue": reconcile_queue,
            "kind": kind,
        }
    )


def _format_run_at(run_at: RunAt | None) -> str | None:
    if run_at is None or isinstance(run_at, str):
        return run_at
    if isinstance(run_at, datetime):
        return timefmt.format_datetime(run_at)
    return timefmt.format_ms(run_at)


def submit(request: JsonObject) -> Call[JsonObject]:
    return Call(
        "POST",
        "/v1/jobs",
        _field("job"),
        body=request,
        retry_unknown=request.get("idempotency_key") is not None,
    )


def submit_batch(requests: Sequence[Mapping[str, Any]]) -> Call[list[JsonObject]]:
    jobs = [dict(request) for request in requests]
    keyed = all(job.get("idempotency_key") is not None for job in jobs)
    body = {"jobs": jobs}
    return Call("POST", "/v1/jobs/batch", _field("results"), body=body, retry_unknown=keyed)


def get_job(job_id: str, consistency: Consistency | None) -> Call[JsonObject]:
    return Call("GET", f"/v1/jobs/{_segment(job_id)}", _job_or_body, _query(consistency))


def list_jobs(
    *,
    queue: str | None,
    status: str | None,
    tenant: str | None,
    schedule_id: str | None,
    workflow_id: str | None,
    limit: int | None,
    cursor: str | None,
    consistency: Consistency | None,
    kind: str | None = None,
) -> Call[JsonObject]:
    query = _query(
        consistency,
        queue=queue,
        status=status,
        tenant=tenant,
        schedule_id=schedule_id,
        workflow_id=workflow_id,
        kind=kind,
        limit=limit,
        cursor=cursor,
    )
    return Call("GET", "/v1/jobs", _json_object, query)


def cancel_job(job_id: str, reason: str | None) -> Call[JsonObject]:
    body = _drop_none({"reason": reason})
    path = f"/v1/jobs/{_segment(job_id)}/cancel"
    return Call("POST", path, _job_or_body, body=body, retry_unknown=True)


def replay_job(job_id: str, reason: str) -> Call[JsonObject]:
    path = f"/v1/jobs/{_segment(job_id)}/replay"
    return Call("POST", path, _job_or_body, body={"reason": reason})


def job_history(job_id: str, consistency: Consistency | None) -> Call[list[JsonObject]]:
    path = f"/v1/jobs/{_segment(job_id)}/history"
    return Call("GET", path, _field("events"), _query(consistency))


def reconciliation(
    hours: int | None, limit: int | None, consistency: Consistency | None
) -> Call[JsonObject]:
    """The reconciliation report over the last `hours` (docs/reconciliation.md)."""
    query = _query(consistency, hours=hours, limit=limit)
    return Call("GET", "/v1/reconciliation", _json_object, query, retry_unknown=True)


# --- leases -----------------------------------------------------------------


def claim(
    worker_id: str,
    queues: Sequence[str],
    max_jobs: int,
    wait_s: float,
    lease_s: float,
    kinds: Sequence[str | None] | None = None,
    kind_max_jobs: Mapping[str, int] | None = None,
) -> Call[list[JsonObject]]:
    body: JsonObject = {
        "worker_id": worker_id,
        "queues": list(queues),
        "max_jobs": max_jobs,
        "wait_s": wait_s,
        "lease_s": lease_s,
    }
    body.update(kinds_body(kinds, kind_max_jobs))
    leases = _field("leases")
    return Call("POST", "/v1/leases", leases, body=body, retry_unknown=True, extra_timeout_s=wait_s)


def kinds_body(
    kinds: Sequence[str | None] | None, kind_max_jobs: Mapping[str, int] | None
) -> JsonObject:
    """A claim's `kinds` and `kind_max_jobs`, each only when given (a cluster
    below version 8 takes neither: `ClusterVersionTooLow`)."""
    body: JsonObject = {}
    if kinds is not None:
        body["kinds"] = list(kinds)
    if kind_max_jobs:
        body["kind_max_jobs"] = dict(kind_max_jobs)
    return body


def lease_op(job_id: str, op: str, body: JsonObject) -> Call[JsonObject]:
    path = f"/v1/leases/{_segment(job_id)}/{op}"
    return Call("POST", path, _json_object, body=body, retry_unknown=True)


def start_body(fencing_token: int) -> JsonObject:
    return {"fencing_token": fencing_token}


def heartbeat_body(
    fencing_token: int, extend_s: float | None, progress: Mapping[str, Any] | None
) -> JsonObject:
    return _drop_none(
        {
            "fencing_token": fencing_token,
            "extend_s": extend_s,
            "progress": dict(progress) if progress is not None else None,
        }
    )


def complete_body(fencing_token: int, result: Any) -> JsonObject:
    return {"fencing_token": fencing_token, "result": result}


FailureKind = Literal["transient", "permanent", "unknown", "cancelled"]


def fail_body(
    fencing_token: int, kind: FailureKind, message: str, retry_after_s: float | None
) -> JsonObject:
    error = _drop_none({"kind": kind, "message": message, "retry_after_s": retry_after_s})
    return {"fencing_token": fencing_token, "error": error}


ReconcileDecision = Literal["happened", "did_not_happen", "cannot_tell"]


def reconcile_body(
    fencing_token: int,
    decision: ReconcileDecision,
    result: Any,
    effects: Mapping[str, Any] | None,
    reason: str,
) -> JsonObject:
    """A reconcile handler's answer; `effects` maps effect keys to results."""
    body: JsonObject = {"fencing_token": fencing_token, "decision": decision, "reason": reason}
    if decision == "happened":
        body["result"] = result
        if effects:
            body["effects"] = [{"key": key, "result": value} for key, value in effects.items()]
    return body


def lease_batch(ops: Sequence[Mapping[str, Any]]) -> Call[list[JsonObject]]:
    body = {"ops": [dict(op) for op in ops]}
    return Call("POST", "/v1/leases/batch", _field("results"), body=body, retry_unknown=True)


# --- effects ----------------------------------------------------------------


def record_effect(key: str, job_id: str, fencing_token: int, result: Any) -> Call[JsonObject]:
    body = {"key": key, "job_id": job_id, "fencing_token": fencing_token, "result": result}
    return Call("POST", "/v1/effects", _json_object, body=body, retry_unknown=True)


def get_effect(key: str, consistency: Consistency | None) -> Call[JsonObject]:
    path = f"/v1/effects/{_segment(key)}"
    return Call("GET", path, _effect_or_body, _query(consistency))


def _effect_or_body(response: Response) -> JsonObject:
    body = _json_object(response)
    effect = body.get("effect")
    return effect if isinstance(effect, dict) else body


# --- cluster ----------------------------------------------------------------


def cluster(consistency: Consistency | None) -> Call[JsonObject]:
    return Call("GET", "/v1/cluster", _json_object, _query(consistency))


def add_node(node_id: str, raft_address: str, http_url: str) -> Call[JsonObject]:
    """`{"kind": "add", ...}`, the change (admin). Not repeated after an
    unknown outcome: a repeat of a committed add is refused as a duplicate."""
    body = {"id": node_id, "raft_address": raft_address, "http_url": http_url}
    return Call("POST", "/v1/cluster/nodes", _field("change"), body=body)


def remove_node(node_id: str) -> Call[JsonObject]:
    """`{"kind": "remove", ...}`, the change (admin)."""
    return Call("DELETE", f"/v1/cluster/nodes/{quote(node_id, safe='')}", _field("change"))


def metrics() -> Call[str]:
    return Call("GET", "/metrics", Response.text)


def raw(
    method: str,
    path: str,
    *,
    query: Mapping[str, object] | None = None,
    body: Any = None,
    retry_unknown: bool | None = None,
) -> Call[Response]:
    """Any other endpoint (schedules, workflows, queues, events...). GETs are
    repeated after an unknown outcome unless told otherwise."""
    safe = method.upper() in ("GET", "HEAD") if retry_unknown is None else retry_unknown
    items = tuple((key, str(value)) for key, value in (query or {}).items() if value is not None)
    return Call(method.upper(), path, _identity, items, body, retry_unknown=safe)


def _identity(response: Response) -> Response:
    return response
