"""`/v1/jobs`: submit (one or a batch), read, list, cancel, replay, history,
and the effects a job recorded."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from raftsched import core
from raftsched.api import render, scope
from raftsched.api.errors import ApiError, from_rejection, invalid
from raftsched.api.jsonbody import json_response
from raftsched.api.principal import principal_of
from raftsched.api.requests import (
    actor,
    body_bytes,
    cursors_wanted,
    node_of,
    optional_body,
    prepare_read,
    propose,
    propose_audited,
    read_json,
)
from raftsched.api.trace_headers import with_trace_context
from raftsched.api.validation import (
    BATCH_JOBS_MAX,
    KIND_RULE,
    boolean,
    is_kind,
    parse_job,
    path_id,
    query_integer,
    reason,
    reject_unknown,
    require_object,
)
from raftsched.core.jobs.commands import (
    CancelJob,
    ReplayJob,
    ReplayReconciled,
    RequestReconcile,
    SubmitJobs,
)
from raftsched.core.kernel.commands import Command, JobSpec
from raftsched.core.kernel.results import (
    Ack,
    CancelAccepted,
    Rejected,
    Replayed,
    SubmitItem,
    Submitted,
)
from raftsched.limits import LIST_LIMIT_MAX

routes = web.RouteTableDef()


def _job_json(request: web.Request, job_id: str) -> dict[str, Any]:
    with node_of(request).reading() as state:
        job = core.get_job(state, job_id)
        if job is None:
            # Purged between commit and render (retention); rare but possible.
            raise ApiError("not_found", f"job {job_id} no longer exists")
        return render.job(job, state)


async def _submit(request: web.Request, specs: list[JobSpec], size_bytes: int) -> Submitted:
    specs = with_trace_context(request, specs)  # the traceparent header (cluster version 8)
    job_ids = node_of(request).new_ids("job", len(specs))
    result = await propose(request, SubmitJobs(tuple(specs), job_ids), Submitted, size_bytes)
    _count_queue_full(request, specs, result.items)
    return result


def _count_queue_full(
    request: web.Request, specs: Sequence[JobSpec], items: Sequence[SubmitItem | Rejected]
) -> None:
    """Count the submissions that tenant backpressure refused (flow-control metrics)."""
    counter = node_of(request).metrics.flow_rejected
    for spec, item in zip(specs, items, strict=True):
        if isinstance(item, Rejected) and item.code == "queue_full":
            counter.labels(spec.tenant, spec.queue).inc()


@routes.post("/v1/jobs")
async def submit_job(request: web.Request) -> web.Response:
    spec = parse_job(await read_json(request))
    scope.require_tenant(request, (spec.tenant,))
    result = await _submit(request, [spec], body_bytes(request))
    item = result.items[0]
    if isinstance(item, Rejected):
        raise from_rejection(item)
    body = {"job": _job_json(request, item.job_id)}
    if item.created:
        return json_response(body, status=201)
    return json_response(body, status=200, headers={"Idempotent-Replayed": "true"})


@routes.post("/v1/jobs/batch")
async def submit_batch(request: web.Request) -> web.Response:
    body = require_object(await read_json(request))
    _, specs = parse_batch(request, body)
    return json_response(await batch_answer(request, specs, body_bytes(request)))


def parse_batch(request: web.Request, body: Mapping[str, Any]) -> tuple[list[Any], list[JobSpec]]:
    """A batch's job requests and their specs, validated and scoped whole
    (raises its 400 or 403): the batch commits together, so one bad request
    fails the call and nothing is proposed. A node of several shards checks
    the whole batch here before it proposes any shard's part."""
    reject_unknown(body, frozenset({"jobs"}))
    jobs = body.get("jobs")
    if not isinstance(jobs, list) or not 1 <= len(jobs) <= BATCH_JOBS_MAX:
        raise invalid("jobs", f"must be a list of 1 to {BATCH_JOBS_MAX} job requests")
    specs = [parse_job(job, prefix=f"jobs[{i}].") for i, job in enumerate(jobs)]
    scope.require_tenant(request, {spec.tenant for spec in specs})
    return jobs, specs


async def batch_answer(
    request: web.Request, specs: list[JobSpec], size_bytes: int
) -> dict[str, Any]:
    """Submit validated specs as one command; the answer's `results`."""
    result = await _submit(request, specs, size_bytes)
    results: list[dict[str, Any]] = []
    for item in result.items:
        if isinstance(item, SubmitItem):
            entry: dict[str, Any] = {"job": _job_json(request, item.job_id)}
            if not item.created:
                entry["replayed"] = True
            results.append(entry)
        else:
            results.append(from_rejection(item).body())
    return {"results": results}


@routes.get("/v1/jobs/{job_id}")
async def get_job(request: web.Request) -> web.Response:
    headers = await prepare_read(request)
    job_id = request.match_info["job_id"]
    principal = principal_of(request)
    with node_of(request).reading() as state:
        job = core.get_job(state, job_id)
        if job is None or not scope.visible_job(principal, job):
            raise ApiError("not_found", f"no job {job_id}")
        body = {"job": render.job(job, state)}
    return json_response(body, headers=headers)


LIST_QUERY = frozenset(
    {
        "queue",
        "status",
        "tenant",
        "schedule_id",
        "workflow_id",
        "correlation_id",
        "idempotency_key",
        "kind",
        "limit",
        "cursor",
        "consistency",
    }
)


def check_list_query(query: Mapping[str, str]) -> int:
    """Check `GET /v1/jobs`'s query but its cursor (400 naming the field);
    the page size. A node of several shards checks it before it asks any
    shard (api.shard_reads), and reads its own kind of cursor."""
    reject_unknown(query, LIST_QUERY)
    status = query.get("status")
    if status is not None and status not in core.JOB_STATUSES:
        raise invalid("status", "unknown status")
    kind = query.get("kind")
    if kind is not None and not is_kind(kind):
        raise invalid("kind", KIND_RULE)
    limit = query_integer(query, "limit", 1, LIST_LIMIT_MAX, default=50)
    assert limit is not None
    return limit


def digit_cursor(query: Mapping[str, str]) -> str | None:
    """A one-shard list's cursor: the seq it continues below (400 otherwise)."""
    cursor = query.get("cursor")
    if cursor is not None and not (cursor.isascii() and cursor.isdigit()):
        raise invalid("cursor", "not a cursor this API returned")
    return cursor


@routes.get("/v1/jobs")
async def list_jobs(request: web.Request) -> web.Response:
    body, headers = await list_answer(request, request.query, cursors_wanted(request))
    return json_response(body, headers=headers)


async def list_answer(
    request: web.Request, query: Mapping[str, str], with_cursors: bool = False
) -> tuple[dict[str, Any], dict[str, str]]:
    """A page of jobs as `query` (checked) asks, and the answer's headers;
    `with_cursors` adds `cursors`, the cursor after each job (a node of
    several shards merges the shards' pages with them, api.shard_reads)."""
    limit = check_list_query(query)
    cursor = digit_cursor(query)
    headers = await prepare_read(request)
    key = query.get("idempotency_key")
    if key is not None:
        return _by_idempotency_key(request, query, key, with_cursors), headers
    status, kind = query.get("status"), query.get("kind")
    principal = principal_of(request)
    with node_of(request).reading() as state:
        jobs, next_cursor = core.list_jobs(
            state,
            queue=query.get("queue"),
            status=status,
            tenant=query.get("tenant"),
            limit=limit,
            cursor=cursor,
            schedule_id=query.get("schedule_id"),
            workflow_id=query.get("workflow_id"),
            correlation_id=query.get("correlation_id"),
            kind=kind,
            tenants=principal.tenants,
            queues=principal.queues,
        )
        body: dict[str, Any] = {
            "jobs": [render.job(job, state) for job in jobs],
            "next_cursor": next_cursor,
        }
    if with_cursors:
        body["cursors"] = [str(job.seq) for job in jobs]
    return body, headers


def _by_idempotency_key(
    request: web.Request, query: Mapping[str, str], key: str, with_cursors: bool
) -> dict[str, Any]:
    """An idempotency key names at most one job per tenant (default tenant
    when none is given); the other filters still apply to it."""
    with node_of(request).reading() as state:
        job = core.find_by_idempotency_key(state, query.get("tenant", "default"), key)
        wanted = {
            "queue": query.get("queue"),
            "status": query.get("status"),
            "schedule_id": query.get("schedule_id"),
            "workflow_id": query.get("workflow_id"),
            "correlation_id": query.get("correlation_id"),
            "kind": query.get("kind"),
        }
        if job is not None and any(
            value is not None and getattr(job, name) != value for name, value in wanted.items()
        ):
            job = None
        if job is not None and not scope.visible_job(principal_of(request), job):
            job = None
        body: dict[str, Any] = {
            "jobs": [] if job is None else [render.job(job, state)],
            "next_cursor": None,
        }
        if with_cursors:
            body["cursors"] = [] if job is None else [str(job.seq)]
        return body


def _reason(body: Mapping[str, Any]) -> str:
    reject_unknown(body, frozenset({"reason"}))
    return reason(body)


@routes.post("/v1/jobs/{job_id}/cancel")
async def cancel_job(request: web.Request) -> web.Response:
    reason = _reason(await optional_body(request))
    job_id = path_id(request.match_info["job_id"])
    scope.require_job(request, job_id)
    who = actor(request, "api")
    await propose_audited(request, CancelJob(job_id, reason, actor=who), CancelAccepted)
    return json_response({"job": _job_json(request, job_id)})


@routes.post("/v1/jobs/{job_id}/replay")
async def replay_job(request: web.Request) -> web.Response:
    """Replay needs a reason: it reruns work that failed for good, and the
    audit trail and the job's history say why. A dead letter whose last
    attempt's outcome is unknown and was never reconciled also needs
    `"reconciled": true`, the operator's word that its effect was checked
    (core.jobs.reconcile_book.awaits_reconciliation); without it, 409."""
    body = await optional_body(request)
    reject_unknown(body, frozenset({"reason", "reconciled"}))
    reconciled = boolean(body, "reconciled", False)
    reason = _reason({k: v for k, v in body.items() if k == "reason"})
    if not reason.strip():
        raise invalid("reason", "a replay needs a reason")
    job_id = path_id(request.match_info["job_id"])
    scope.require_job(request, job_id)
    who = actor(request, "operator")
    command: Command = ReplayJob(job_id, reason, actor=who)
    if reconciled:
        command = ReplayReconciled(job_id, reason, actor=who)
    await propose_audited(request, command, Replayed)
    return json_response({"job": _job_json(request, job_id)})


@routes.post("/v1/jobs/{job_id}/reconcile")
async def reconcile_job(request: web.Request) -> web.Response:
    """Send an unreconciled dead letter back to its reconcilers (a decision
    then settles it, instead of `"reconciled": true` on a replay); needs a
    reason, like a replay."""
    reason = _reason(await optional_body(request))
    if not reason.strip():
        raise invalid("reason", "sending a job back to reconciliation needs a reason")
    job_id = path_id(request.match_info["job_id"])
    scope.require_job(request, job_id)
    who = actor(request, "operator")
    await propose_audited(request, RequestReconcile(job_id, reason, actor=who), Ack)
    return json_response({"job": _job_json(request, job_id)})


@routes.get("/v1/jobs/{job_id}/history")
async def job_history(request: web.Request) -> web.Response:
    headers = await prepare_read(request)
    job_id = request.match_info["job_id"]
    principal = principal_of(request)
    with node_of(request).reading() as state:
        job = core.get_job(state, job_id)
        events = core.job_history(state, job_id)
        if events is None or job is None or not scope.visible_job(principal, job):
            raise ApiError("not_found", f"no job {job_id}")
        body = {"events": [render.history_event(event) for event in events]}
    return json_response(body, headers=headers)


# Effects one job recorded, at most this many per page (a job rarely records
# more than a handful: one per external action).
EFFECTS_LIMIT_MAX = LIST_LIMIT_MAX


@routes.get("/v1/jobs/{job_id}/effects")
async def job_effects(request: web.Request) -> web.Response:
    """The job's entries in the effects ledger, oldest first. Scoped as
    `GET /v1/effects/{key}` is: an effect belongs to the job that recorded
    it, so a job outside the caller's tenants or queues is `404`."""
    reject_unknown(request.query, frozenset({"limit", "consistency"}))
    limit = query_integer(request.query, "limit", 1, EFFECTS_LIMIT_MAX, default=100)
    assert limit is not None
    headers = await prepare_read(request)
    job_id = request.match_info["job_id"]
    principal = principal_of(request)
    with node_of(request).reading() as state:
        job = core.get_job(state, job_id)
        effects = core.job_effects(state, job_id)
        if effects is None or job is None or not scope.visible_job(principal, job):
            raise ApiError("not_found", f"no job {job_id}")
        body = {
            "effects": [render.effect(effect) for effect in effects[:limit]],
            "total": len(effects),
        }
    return json_response(body, headers=headers)
