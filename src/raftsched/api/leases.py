"""The worker protocol (`/v1/leases`) and the effects ledger (`/v1/effects`).

Scope (api.scope): a claim that names a queue outside the caller's queues is
`403 forbidden`; a lease operation or effect record on a job outside the
caller's queues or tenants, and an effect of such a job, is `404 not_found`,
exactly as for a job or effect that does not exist.

Every operation here is fenced: the core accepts it only with the job's
current lease token, so a retry after an unknown outcome is safe, and a
worker whose lease moved on gets `409 lease_lost` and changes nothing.

`complete`, `fail` and the lease batch may carry the next claim (`next`,
docs/api.md "The next claim"): validated and scoped as a claim is, before
anything is proposed, and proposed after the operations by
`node.lease_ops.propose_lease_ops`. A single operation that is rejected is
answered with its error and claims nothing; a claim that fails after the
operation committed is answered inside `next`, the operation's outcome
standing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from raftsched import core
from raftsched.api import render, scope, unsafe
from raftsched.api.errors import ApiError, from_proposal_error, from_rejection, invalid
from raftsched.api.jsonbody import json_response
from raftsched.api.principal import principal_of
from raftsched.api.requests import body_bytes, node_of, prepare_read, read_json
from raftsched.api.validation import (
    CLAIM_JOBS_MAX,
    CLAIM_KINDS_MAX,
    CLAIM_QUEUES_MAX,
    KEY_LENGTH_MAX,
    LEASE_S_MAX,
    LEASE_S_MIN,
    NAME_LENGTH_MAX,
    choice,
    failure,
    fencing_token,
    integer,
    is_kind,
    pack_json,
    path_id,
    reconcile_decision,
    reject_unknown,
    require_object,
    seconds_ms,
    string,
    unpack_json,
)
from raftsched.core.jobs.commands import (
    CompleteJob,
    FailJob,
    HeartbeatJob,
    ReconcileJob,
    RecordEffect,
    StartJob,
)
from raftsched.core.kernel.commands import Command
from raftsched.core.kernel.results import (
    Completed,
    EffectRecorded,
    Failed,
    HeartbeatAccepted,
    Lease,
    Reconciled,
    Rejected,
    Result,
    Started,
)
from raftsched.core.kernel.validate import OTHER_KINDS
from raftsched.limits import LEASE_BATCH_OPS_MAX, WAIT_S_MAX
from raftsched.node.lease_ops import (
    ClaimKinds,
    ClaimOutcome,
    ClaimRequest,
    OpOutcome,
    propose_lease_ops,
)
from raftsched.node.proposer import NotLeader
from raftsched.node.view import NodeView
from raftsched.timefmt import format_ms

routes = web.RouteTableDef()

OP_FIELDS: dict[str, frozenset[str]] = {
    "start": frozenset({"fencing_token"}),
    "heartbeat": frozenset({"fencing_token", "extend_s", "progress"}),
    "complete": frozenset({"fencing_token", "result"}),
    "fail": frozenset({"fencing_token", "error"}),
    # A reconcile handler's decision on a reconciling job (core.jobs.reconcile).
    "reconcile": frozenset({"fencing_token", "decision", "result", "effects", "reason"}),
}


CLAIM_FIELDS = frozenset(
    {"worker_id", "queues", "max_jobs", "wait_s", "lease_s", "kinds", "kind_max_jobs"}
)


@routes.post("/v1/leases")
async def claim(request: web.Request) -> web.Response:
    body = require_object(await read_json(request))
    wanted = claim_request(body, prefix="", worker_required=True)
    assert wanted.worker_id is not None
    scope.require_queues(request, wanted.queues)
    node = node_of(request)
    outcome = await node.claim(
        wanted.worker_id,
        wanted.queues,
        wanted.max_jobs,
        wanted.wait_s,
        wanted.lease_ms,
        wanted.kinds,
        gone=lambda: _disconnected(request),
    )
    if isinstance(outcome, Rejected):
        raise from_rejection(outcome)
    return json_response({"leases": _granted(node, outcome)})


def _disconnected(request: web.Request) -> bool:
    """The client closed the connection (a worker that stopped while its
    claim long-polled): aiohttp lets the handler run on, so the claim asks."""
    transport = request.transport
    return transport is None or transport.is_closing()


def claim_request(
    body: Mapping[str, Any],
    *,
    prefix: str,
    worker_required: bool,
    after_success_only: bool = False,
) -> ClaimRequest:
    """A claim's fields, at the top of `POST /v1/leases` or as `next` (with
    `prefix` "next."), or 400 naming the field."""
    reject_unknown(body, CLAIM_FIELDS, prefix)
    worker_id = string(body, "worker_id", required=worker_required, prefix=prefix)
    queues = body.get("queues")
    if (
        not isinstance(queues, list)
        or not 1 <= len(queues) <= CLAIM_QUEUES_MAX
        or not all(isinstance(q, str) and 0 < len(q) <= NAME_LENGTH_MAX for q in queues)
    ):
        raise invalid(prefix + "queues", f"must be a list of 1 to {CLAIM_QUEUES_MAX} queue names")
    max_jobs = integer(body, "max_jobs", 1, CLAIM_JOBS_MAX, prefix=prefix) or 1
    wait_ms = seconds_ms(body, "wait_s", 0, WAIT_S_MAX, prefix=prefix) or 0
    lease_ms = seconds_ms(body, "lease_s", LEASE_S_MIN, LEASE_S_MAX, prefix=prefix)
    return ClaimRequest(
        tuple(dict.fromkeys(queues)), max_jobs, wait_ms / 1000, lease_ms, worker_id,
        after_success_only, claim_kinds(body, max_jobs, prefix),
    )  # fmt: skip


def claim_kinds(body: Mapping[str, Any], max_jobs: int, prefix: str) -> ClaimKinds | None:
    """`kinds` (the kinds to claim, null for jobs without one, "*" for every
    job no other entry names) and `kind_max_jobs` (at most this many of a
    kind; above `max_jobs` counts as `max_jobs`) as the core's (kind,
    max_jobs) pairs, or None: any job."""
    kinds = body.get("kinds")
    caps = body.get("kind_max_jobs")
    if kinds is None:
        if caps is not None:
            raise invalid(prefix + "kind_max_jobs", "needs kinds")
        return None
    if (
        not isinstance(kinds, list)
        or not 1 <= len(kinds) <= CLAIM_KINDS_MAX
        or not all(item is None or item == OTHER_KINDS or is_kind(item) for item in kinds)
    ):
        raise invalid(
            prefix + "kinds",
            f'must be a list of 1 to {CLAIM_KINDS_MAX} kinds (null: jobs without one, "*": '
            "every job no other entry names)",
        )
    if len(set(kinds)) != len(kinds):
        raise invalid(prefix + "kinds", "names each kind once")
    capped: Mapping[str, Any] = {}
    if caps is not None:
        capped = require_object(caps, prefix + "kind_max_jobs")
        for name in capped:
            if name not in kinds:
                raise invalid(prefix + "kind_max_jobs", f"{name!r} is not one of kinds")
            integer(capped, name, 0, CLAIM_JOBS_MAX, prefix=prefix + "kind_max_jobs.")
    return tuple(
        (name, min(max_jobs if capped.get(name) is None else capped[name], max_jobs))
        for name in kinds
    )


def next_request(
    body: Mapping[str, Any], *, worker_required: bool, after_success_only: bool
) -> ClaimRequest | None:
    """The claim that rides on lease operations (`next`), if asked for, or 400."""
    raw = body.get("next")
    if raw is None:
        return None
    return claim_request(
        require_object(raw, "next"),
        prefix="next.",
        worker_required=worker_required,
        after_success_only=after_success_only,
    )


def _scoped(request: web.Request, wanted: ClaimRequest | None) -> ClaimRequest | None:
    """403 for a next claim of a queue outside the caller's queues."""
    if wanted is not None:
        scope.require_queues(request, wanted.queues)
    return wanted


def _granted(node: NodeView, leases: Sequence[Lease]) -> list[dict[str, Any]]:
    node.metrics.leases_granted.inc(len(leases))
    if not leases:
        return []
    with node.reading() as state:  # a leased job is live, never packed
        jobs = [state.jobs.get(grant.job_id) for grant in leases]
        traces = [core.job_trace(state, grant.job_id) for grant in leases]  # cluster version 8
    return [
        render.lease(
            grant,
            getattr(job, "kind", None),
            trace=trace,
            schedule_id=getattr(job, "schedule_id", None),
        )
        for grant, job, trace in zip(leases, jobs, traces, strict=True)
    ]


def _next_answer(node: NodeView, outcome: ClaimOutcome) -> dict[str, Any]:
    """`next` in an answer: the leases granted (claimed: the worker starts
    each), or why the claim failed. The operations' outcomes stand either way."""
    if isinstance(outcome, Rejected):
        return from_rejection(outcome).body()
    if isinstance(outcome, Exception):
        return from_proposal_error(outcome).body()
    return {"leases": _granted(node, outcome)}


def _command_for(
    node: NodeView,
    op: str,
    job_id: str,
    body: Mapping[str, Any],
    prefix: str = "",
    also_allowed: frozenset[str] = frozenset(),
) -> Command:
    """Validate one lease operation and build its command (raises 400).
    `also_allowed`: fields of the request the caller validates itself."""
    allowed = OP_FIELDS[op] | also_allowed | ({"op", "job_id"} if prefix else set())
    reject_unknown(body, allowed, prefix)
    token = fencing_token(body, prefix)
    if op == "start":
        return StartJob(job_id, token)
    if op == "heartbeat":
        extend_ms = seconds_ms(body, "extend_s", LEASE_S_MIN, LEASE_S_MAX, prefix=prefix)
        progress = body.get("progress")
        packed = None if progress is None else pack_json(progress, prefix + "progress")
        return HeartbeatJob(job_id, token, extend_ms, packed)
    if op == "complete":
        return CompleteJob(job_id, token, pack_json(body.get("result"), prefix + "result"))
    if op == "reconcile":
        decision, result, effects, why = reconcile_decision(body, prefix)
        return ReconcileJob(job_id, token, decision, result, effects, why, node.random_u32())
    kind, message, retry_after_ms = failure(body, prefix)
    return FailJob(job_id, token, kind, message, retry_after_ms, node.random_u32())


def _answer(request: web.Request, op: str, result: Result) -> dict[str, Any]:
    """The JSON answer of one fenced operation, a lease op or "effect" (raises
    for rejections, counting the lease_lost ones by op)."""
    node = node_of(request)
    if isinstance(result, Rejected):
        if result.code == "lease_lost":
            node.metrics.series(node.metrics.lease_lost, op).inc()
        raise from_rejection(result)
    if isinstance(result, Started):
        return {
            "job_id": result.job_id,
            "status": "running",
            "expires_at": format_ms(result.expires_at_ms),
        }
    if isinstance(result, HeartbeatAccepted):
        return {
            "expires_at": format_ms(result.expires_at_ms),
            "cancel_requested": result.cancel_requested,
        }
    if isinstance(result, Completed):
        return {
            "job_id": result.job_id,
            "status": "succeeded",
            "replayed": result.replayed,
            "result": unpack_json(result.result),
        }
    if isinstance(result, Failed):
        return {
            "job_id": result.job_id,
            "status": result.status,
            "next_run_at": render.time_or_none(result.next_run_at_ms),
        }
    if isinstance(result, Reconciled):
        return {
            "job_id": result.job_id,
            "decision": result.decision,
            "status": result.status,
            "next_run_at": render.time_or_none(result.next_run_at_ms),
            "replayed": result.replayed,
        }
    if isinstance(result, EffectRecorded):
        return {"effect": render.effect(result.effect), "replayed": result.replayed}
    raise ApiError("internal_error", f"unexpected result {type(result).__name__}")


# The operations that end a job's attempt may carry the next claim (`next`);
# start, heartbeat and reconcile answer it 400 as an unknown field.
NEXT_OPS = frozenset({"complete", "fail"})


def _op_route(op: str) -> None:
    also_allowed = frozenset({"next"}) if op in NEXT_OPS else frozenset()

    async def handler(request: web.Request) -> web.Response:
        body = require_object(await read_json(request))
        job_id = path_id(request.match_info["job_id"])
        node = node_of(request)
        body = unsafe.ignore_fencing(node, job_id, body)  # negative control only
        command = _command_for(node, op, job_id, body, also_allowed=also_allowed)
        wanted = next_request(body, worker_required=False, after_success_only=True)
        scope.require_lease_job(request, job_id)
        _scoped(request, wanted)
        if wanted is None:
            result = await node.propose(command, body_bytes(request))
            return json_response(_answer(request, op, result))
        outcome = await propose_lease_ops(node, [command], wanted, body_bytes(request))
        settled = outcome.results[0]
        if isinstance(settled, Exception):
            raise settled  # as if proposed alone: a redirect, 503 or 504
        answer = _answer(request, op, settled)  # a rejected op: its error, and no claim
        assert outcome.claim is not None
        answer["next"] = _next_answer(node, outcome.claim)
        return json_response(answer)

    handler.__name__ = f"lease_{op}"
    routes.post(f"/v1/leases/{{job_id}}/{op}")(handler)


for _op in OP_FIELDS:
    _op_route(_op)


@routes.post("/v1/leases/batch")
async def lease_batch(request: web.Request) -> web.Response:
    body = require_object(await read_json(request))
    reject_unknown(body, frozenset({"ops", "next"}))
    ops = body.get("ops")
    if not isinstance(ops, list) or not 1 <= len(ops) <= LEASE_BATCH_OPS_MAX:
        raise invalid("ops", f"must be a list of 1 to {LEASE_BATCH_OPS_MAX} operations")
    # A batch may hold leases of several workers' ids: its claim names its own.
    wanted = _scoped(request, next_request(body, worker_required=True, after_success_only=False))
    node = node_of(request)
    if not node.is_leader:
        raise NotLeader()
    # Each op succeeds or fails on its own, exactly as its single form would;
    # the valid ones are queued together, so group commit puts them in one entry.
    # They are queued all or none: when the proposer's queue has no room for
    # them the whole request is answered 503 unavailable and nothing commits.
    # The claim (`next`) is made after them, unless every one was refused.
    slots: list[tuple[str, ApiError | None]] = []
    commands: list[Command] = []
    for index, raw in enumerate(ops):
        prefix = f"ops[{index}]."
        try:
            item = require_object(raw, f"ops[{index}]")
            op = choice(item, "op", OP_FIELDS, prefix=prefix)
            if op is None:
                raise invalid(prefix + "op", "is required")
            job_id = string(item, "job_id", required=True, prefix=prefix)
            assert job_id is not None
            command = _command_for(node, op, job_id, item, prefix)
            scope.require_lease_job(request, job_id)
            commands.append(command)
            slots.append((op, None))
        except ApiError as error:
            slots.append(("error", error))
    outcome = await propose_lease_ops(node, commands, wanted, body_bytes(request))
    outcomes = iter(outcome.results)
    results = [
        error.body() if error is not None else _slot_answer(request, op, next(outcomes))
        for op, error in slots
    ]
    answer: dict[str, Any] = {"results": results}
    if outcome.claim is not None:
        answer["next"] = _next_answer(node, outcome.claim)
    return json_response(answer)


def _slot_answer(request: web.Request, op: str, outcome: OpOutcome) -> dict[str, Any]:
    """One op's entry in a batch answer: its single form's answer or error body."""
    if isinstance(outcome, Exception):
        return from_proposal_error(outcome).body()
    try:
        return _answer(request, op, outcome)
    except ApiError as error:
        return error.body()


@routes.post("/v1/effects")
async def record_effect(request: web.Request) -> web.Response:
    body = require_object(await read_json(request))
    reject_unknown(body, frozenset({"key", "job_id", "fencing_token", "result"}))
    key = string(body, "key", required=True, length_max=KEY_LENGTH_MAX)
    job_id = string(body, "job_id", required=True)
    assert key is not None and job_id is not None
    body = unsafe.ignore_fencing(node_of(request), job_id, body)  # negative control only
    scope.require_job(request, job_id)
    command = RecordEffect(
        key, job_id, fencing_token(body), pack_json(body.get("result"), "result")
    )
    result = await node_of(request).propose(command, body_bytes(request))
    answer = _answer(request, "effect", result)
    return json_response(answer, status=200 if answer["replayed"] else 201)


@routes.get("/v1/effects/{key}")
async def get_effect(request: web.Request) -> web.Response:
    headers = await prepare_read(request)
    key = request.match_info["key"]
    principal = principal_of(request)
    with node_of(request).reading() as state:
        effect = core.get_effect(state, key)
        if effect is not None and not scope.unrestricted(principal):
            effect = effect if scope.visible_effect(principal, state, key) else None
    if effect is None:
        raise ApiError("not_found", f"no effect {key}")
    return json_response({"effect": render.effect(effect)}, headers=headers)
