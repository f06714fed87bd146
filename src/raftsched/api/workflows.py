"""`/v1/workflows`: submit, read (with every step), list by status, history, cancel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from raftsched.api import scope
from raftsched.api.errors import ApiError, invalid
from raftsched.api.jsonbody import json_response
from raftsched.api.principal import principal_of
from raftsched.api.render import time_or_none, trace_context
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
from raftsched.api.trace_headers import storable_trace_context
from raftsched.api.validation import (
    JOB_FIELDS,
    KEY_LENGTH_MAX,
    boolean,
    choice,
    parse_job,
    path_id,
    query_integer,
    reason,
    reject_unknown,
    require_object,
    seconds_ms,
    string,
    unpack_json,
)
from raftsched.core.jobs.queries import within
from raftsched.core.kernel.commands import JobSpec
from raftsched.core.kernel.results import WorkflowCancelAccepted, WorkflowSubmitted
from raftsched.core.workflows.commands import CancelWorkflow, StepSpec, SubmitWorkflow
from raftsched.core.workflows.handlers import STEP_NAME_CHARS_MAX, STEPS_MAX
from raftsched.core.workflows.model import (
    FAILURE_POLICIES,
    WORKFLOW_STATUSES,
    Workflow,
    table,
)
from raftsched.limits import DURATION_S_MAX, LIST_LIMIT_MAX
from raftsched.timefmt import format_ms

routes = web.RouteTableDef()

WORKFLOW_FIELDS = frozenset(
    {"idempotency_key", "tenant", "timeout_s", "on_failure", "compensate_on_cancel", "steps"}
)
# A step's job takes the workflow's tenant; the workflow holds the idempotency key.
STEP_JOB_FIELDS = JOB_FIELDS - {"tenant", "idempotency_key"}
STEP_FIELDS = STEP_JOB_FIELDS | {"name", "depends_on", "compensation"}


def parse_workflow(value: object) -> dict[str, Any]:
    """The request as SubmitWorkflow keyword arguments (without the id)."""
    body = require_object(value)
    reject_unknown(body, WORKFLOW_FIELDS)
    steps = body.get("steps")
    if not isinstance(steps, list) or not 1 <= len(steps) <= STEPS_MAX:
        raise invalid("steps", f"must be a list of 1 to {STEPS_MAX} steps")
    fields: dict[str, Any] = {
        "steps": tuple(_parse_step(step, f"steps[{i}].") for i, step in enumerate(steps)),
        "tenant": string(body, "tenant") or "default",
        "idempotency_key": string(body, "idempotency_key", length_max=KEY_LENGTH_MAX),
        "timeout_ms": seconds_ms(body, "timeout_s", 0.001, DURATION_S_MAX),
    }
    fields["on_failure"] = choice(body, "on_failure", FAILURE_POLICIES, default="fail_fast")
    fields["compensate_on_cancel"] = boolean(body, "compensate_on_cancel", True)
    _check_graph(fields["steps"])
    return fields


def _parse_step(value: object, prefix: str) -> StepSpec:
    body = require_object(value, prefix.rstrip("."))
    reject_unknown(body, STEP_FIELDS, prefix)
    name = string(body, "name", required=True, length_max=STEP_NAME_CHARS_MAX, prefix=prefix)
    assert name is not None
    depends_on = body.get("depends_on")
    if depends_on is None:
        depends_on = []
    if not isinstance(depends_on, list) or not all(isinstance(d, str) for d in depends_on):
        raise invalid(prefix + "depends_on", "must be a list of step names")
    if len(set(depends_on)) != len(depends_on):
        raise invalid(prefix + "depends_on", "lists a step twice")
    job = parse_job({k: v for k, v in body.items() if k in STEP_JOB_FIELDS}, prefix)
    compensation: JobSpec | None = None
    if body.get("compensation") is not None:
        where = prefix + "compensation."
        comp = require_object(body["compensation"], where.rstrip("."))
        reject_unknown(comp, STEP_JOB_FIELDS, where)
        compensation = parse_job(comp, where)
    return StepSpec(name, job, tuple(depends_on), compensation)


def _check_graph(steps: tuple[StepSpec, ...]) -> None:
    """Duplicate and unknown names and cycles, named before anything is proposed."""
    names: dict[str, int] = {}
    for index, step in enumerate(steps):
        if step.name in names:
            raise invalid(f"steps[{index}].name", f"duplicate step name {step.name!r}")
        names[step.name] = index
    for index, step in enumerate(steps):
        for dep in step.depends_on:
            if dep not in names:
                raise invalid(f"steps[{index}].depends_on", f"unknown step {dep!r}")
    done: set[int] = set()
    for start in range(len(steps)):
        _visit(steps, names, start, [], done)


def _visit(
    steps: tuple[StepSpec, ...], names: dict[str, int], index: int, path: list[int], done: set[int]
) -> None:
    if index in done:
        return
    if index in path:
        cycle = " -> ".join(steps[i].name for i in [*path[path.index(index) :], index])
        raise invalid(f"steps[{index}].depends_on", f"the steps form a cycle: {cycle}")
    path.append(index)
    for dep in steps[index].depends_on:
        _visit(steps, names, names[dep], path, done)
    path.pop()
    done.add(index)


# -- rendering ------------------------------------------------------------------


def _step_json(workflow: Workflow, index: int, jobs: Mapping[str, Any]) -> dict[str, Any]:
    step = workflow.steps[index]
    job = jobs.get(step.job_id or "")
    compensation = None
    if step.compensation is not None:
        compensation = {
            "queue": step.compensation.queue,
            "kind": step.compensation.kind,
            "status": step.comp_status,
            "job_id": step.comp_job_id,
            "result": unpack_json(step.comp_result),
        }
    return {
        "status": step.status,
        "queue": step.spec.queue,
        "kind": step.spec.kind,
        "depends_on": [workflow.steps[dep].name for dep in step.deps],
        "job_id": step.job_id,
        "job_status": None if job is None else job.status,
        "result": unpack_json(step.result),
        "compensation": compensation,
    }


def workflow_json(workflow: Workflow, jobs: Mapping[str, Any], full: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": workflow.id,
        "tenant": workflow.tenant,
        "status": workflow.status,
        "outcome": workflow.outcome,
        "reason": workflow.reason,
        "idempotency_key": workflow.idempotency_key,
        "on_failure": workflow.on_failure,
        "compensate_on_cancel": workflow.compensate_on_cancel,
        "created_at": format_ms(workflow.created_at_ms),
        "updated_at": format_ms(workflow.updated_at_ms),
        "timeout_at": time_or_none(workflow.timeout_at_ms),
        **trace_context(workflow.trace),
    }
    if full:
        body["steps"] = {
            step.name: _step_json(workflow, index, jobs)
            for index, step in enumerate(workflow.steps)
        }
        body["compensation_order"] = [
            workflow.steps[index].name for index in workflow.compensations or ()
        ]
    return body


def _read_workflow(request: web.Request, workflow_id: str) -> dict[str, Any]:
    principal = principal_of(request)
    with node_of(request).reading() as state:
        workflow = table(state).workflows.get(workflow_id)
        if workflow is None or not scope.visible_workflow(principal, workflow):
            raise ApiError("not_found", f"no workflow {workflow_id}")
        return workflow_json(workflow, state.jobs)


# -- routes ---------------------------------------------------------------------


@routes.post("/v1/workflows")
async def submit_workflow(request: web.Request) -> web.Response:
    fields = parse_workflow(await read_json(request))
    scope.require_tenant(request, (fields["tenant"],))
    workflow_id = node_of(request).new_id("wf")
    # The traceparent header (cluster version 8): the workflow and its jobs keep it.
    context = storable_trace_context(request)
    if context is not None:
        fields["traceparent"], fields["tracestate"] = context
    command = SubmitWorkflow(workflow_id, **fields)
    result = await propose(request, command, WorkflowSubmitted, body_bytes(request))
    body = {"workflow": _read_workflow(request, result.workflow_id)}
    if result.created:
        return json_response(body, status=201)
    return json_response(body, headers={"Idempotent-Replayed": "true"})


@routes.get("/v1/workflows/{workflow_id}")
async def get_workflow(request: web.Request) -> web.Response:
    headers = await prepare_read(request)
    workflow_id = path_id(request.match_info["workflow_id"], "workflow_id")
    return json_response({"workflow": _read_workflow(request, workflow_id)}, headers=headers)


@routes.get("/v1/workflows/{workflow_id}/history")
async def workflow_history(request: web.Request) -> web.Response:
    headers = await prepare_read(request)
    workflow_id = path_id(request.match_info["workflow_id"], "workflow_id")
    principal = principal_of(request)
    with node_of(request).reading() as state:
        workflow = table(state).workflows.get(workflow_id)
        if workflow is None or not scope.visible_workflow(principal, workflow):
            raise ApiError("not_found", f"no workflow {workflow_id}")
        events = [
            {"at": format_ms(at_ms), "event": event, "detail": detail}
            for at_ms, event, detail in workflow.history
        ]
    return json_response({"events": events}, headers=headers)


LIST_QUERY = frozenset({"status", "tenant", "limit", "cursor", "consistency"})


def check_list_query(query: Mapping[str, str]) -> int:
    """Check `GET /v1/workflows`'s query but its cursor; the page size."""
    reject_unknown(query, LIST_QUERY)
    status = query.get("status")
    if status is not None and status not in WORKFLOW_STATUSES:
        raise invalid("status", f"must be one of {', '.join(WORKFLOW_STATUSES)}")
    limit = query_integer(query, "limit", 1, LIST_LIMIT_MAX, default=50)
    assert limit is not None
    return limit


@routes.get("/v1/workflows")
async def list_workflows(request: web.Request) -> web.Response:
    body, headers = await list_answer(request, request.query, cursors_wanted(request))
    return json_response(body, headers=headers)


async def list_answer(
    request: web.Request, query: Mapping[str, str], with_cursors: bool = False
) -> tuple[dict[str, Any], dict[str, str]]:
    """A page of workflows, newest first; with `with_cursors`, the cursor
    after each (api.shard_reads merges the shards' pages with them)."""
    limit = check_list_query(query)
    cursor = query_integer(query, "cursor", 0, 2**63 - 1)
    status = query.get("status")
    tenant = query.get("tenant")
    headers = await prepare_read(request)
    found: list[dict[str, Any]] = []
    seqs: list[int] = []
    next_cursor: str | None = None
    tenant_in = within(tenant, principal_of(request).tenants)
    if tenant_in == frozenset():
        body: dict[str, Any] = {"workflows": [], "next_cursor": None}
        return ({**body, "cursors": []} if with_cursors else body), headers
    with node_of(request).reading() as state:
        workflows = list(table(state).workflows.values())
        for workflow in reversed(workflows):
            if cursor is not None and workflow.seq >= cursor:
                continue
            if (status is not None and workflow.status != status) or (
                tenant_in is not None and workflow.tenant not in tenant_in
            ):
                continue
            if len(found) == limit:
                next_cursor = str(seqs[-1])
                break
            found.append(workflow_json(workflow, state.jobs, full=False))
            seqs.append(workflow.seq)
    body = {"workflows": found, "next_cursor": next_cursor}
    if with_cursors:
        body["cursors"] = [str(seq) for seq in seqs]
    return body, headers


@routes.post("/v1/workflows/{workflow_id}/cancel")
async def cancel_workflow(request: web.Request) -> web.Response:
    workflow_id = path_id(request.match_info["workflow_id"], "workflow_id")
    body = await optional_body(request)
    reject_unknown(body, frozenset({"reason"}))
    scope.require_workflow(request, workflow_id)
    command = CancelWorkflow(workflow_id, reason(body), actor(request, "api"))
    await propose_audited(request, command, WorkflowCancelAccepted)
    return json_response({"workflow": _read_workflow(request, workflow_id)})
