"""`/v1/schedules`: recurring schedules (api.md, Schedules) and their metrics.

Requests are validated completely here, naming the field in a 400, before
anything is proposed; the core checks the same rules again. Per-schedule
metrics are collected from the replicated state at scrape time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, Final

from aiohttp import web

from raftsched.api import scope
from raftsched.api.errors import ApiError, from_rejection, invalid
from raftsched.api.jsonbody import json_response
from raftsched.api.principal import principal_of
from raftsched.api.render import time_or_none
from raftsched.api.requests import (
    audited,
    body_bytes,
    cursors_wanted,
    node_of,
    optional_body,
    prepare_read,
    propose_audited,
    read_json,
)
from raftsched.api.validation import (
    boolean,
    choice,
    instant_ms,
    integer,
    parse_job,
    path_id,
    query_integer,
    reject_unknown,
    require_object,
    seconds_ms,
    string,
    unpack_json,
)
from raftsched.core.kernel.commands import JobSpec
from raftsched.core.kernel.results import (
    OccurrenceDecided,
    Rejected,
    ScheduleBackfilled,
    ScheduleSaved,
)
from raftsched.core.schedules import calendar
from raftsched.core.schedules.commands import (
    BackfillSchedule,
    CreateSchedule,
    DeleteSchedule,
    PauseSchedule,
    ResumeSchedule,
    ScheduleSpec,
    TriggerSchedule,
    UpdateSchedule,
)
from raftsched.core.schedules.handlers import (
    CATCHUP_MAX_RUNS_MAX,
    CATCHUP_POLICIES,
    INTERVAL_MS_MIN,
    OVERLAP_POLICIES,
)
from raftsched.core.schedules.model import Schedule
from raftsched.core.schedules.queries import (
    count_schedules,
    first_schedules,
    get_schedule,
    is_running,
    list_schedules,
    occurrence_totals,
    occurrences,
)
from raftsched.limits import (
    DURATION_S_MAX,
    LIST_LIMIT_MAX,
    METRIC_SCHEDULES_MAX,
    SCHEDULE_BATCH_MAX,
)
from raftsched.node import metrics as families
from raftsched.node.view import NodeView
from raftsched.timefmt import format_ms

routes = web.RouteTableDef()

SCHEDULE_FIELDS: Final = frozenset(
    {
        "id",
        "cron",
        "interval_s",
        "timezone",
        "start_at",
        "end_at",
        "jitter_s",
        "overlap",
        "catchup",
        "paused",
        "job",
    }
)
CATCHUP_FIELDS: Final = frozenset({"policy", "window_s", "max_runs", "grace_s"})


# -- parsing --------------------------------------------------------------------------


def parse_schedule(
    value: object, path_id_value: str | None = None, prefix: str = ""
) -> ScheduleSpec:
    body = require_object(value, prefix.rstrip(".") or "body")
    reject_unknown(body, SCHEDULE_FIELDS, prefix)
    schedule_id = string(body, "id", prefix=prefix)
    if path_id_value is not None:
        if schedule_id is not None and schedule_id != path_id_value:
            raise invalid(prefix + "id", "must match the id in the path")
        schedule_id = path_id_value
    if schedule_id is None:
        raise invalid(prefix + "id", "is required")
    fields: dict[str, Any] = {"id": schedule_id, "job": _parse_template(body, prefix)}
    fields.update(_parse_calendar(body, prefix))
    fields.update(_parse_policies(body, prefix))
    return ScheduleSpec(**fields)


def _parse_template(body: Mapping[str, Any], prefix: str) -> JobSpec:
    job = body.get("job")
    if job is None:
        raise invalid(prefix + "job", "is required")
    for name in ("idempotency_key", "run_at", "delay_s"):
        if isinstance(job, dict) and job.get(name) is not None:
            raise invalid(f"{prefix}job.{name}", "is set per occurrence by the schedule")
    return parse_job(job, prefix=prefix + "job.")


def _parse_calendar(body: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    cron = body.get("cron")
    has_interval = body.get("interval_s") is not None
    if (cron is None) == (not has_interval):
        raise invalid(prefix + "cron", "give exactly one of cron and interval_s")
    fields: dict[str, Any] = {}
    if cron is not None:
        if not isinstance(cron, str):
            raise invalid(prefix + "cron", "must be a string")
        try:
            calendar.check_cron(cron)
        except calendar.CalendarError as error:
            raise invalid(prefix + "cron", str(error)) from None
        fields["cron"] = cron
    else:
        fields["interval_ms"] = seconds_ms(
            body, "interval_s", INTERVAL_MS_MIN / 1000, DURATION_S_MAX, prefix=prefix
        )
    timezone = string(body, "timezone", prefix=prefix)
    if timezone is not None:
        try:
            calendar.zone(timezone)
        except calendar.CalendarError as error:
            raise invalid(prefix + "timezone", str(error)) from None
        fields["timezone"] = timezone
    start = instant_ms(body, "start_at", prefix=prefix)
    end = instant_ms(body, "end_at", prefix=prefix)
    if start is not None and end is not None and end < start:
        raise invalid(prefix + "end_at", "must not be before start_at")
    fields.update(start_at_ms=start, end_at_ms=end)
    jitter = seconds_ms(body, "jitter_s", 0, DURATION_S_MAX, prefix=prefix)
    if jitter is not None:
        fields["jitter_ms"] = jitter
    return fields


def _parse_policies(body: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    overlap = choice(body, "overlap", OVERLAP_POLICIES, prefix=prefix)
    if overlap is not None:
        fields["overlap"] = overlap
    if body.get("paused") is not None:
        fields["paused"] = boolean(body, "paused", False, prefix=prefix)
    catchup = body.get("catchup")
    if catchup is not None:
        where = prefix + "catchup."
        catchup_body = require_object(catchup, where.rstrip("."))
        reject_unknown(catchup_body, CATCHUP_FIELDS, where)
        policy = choice(catchup_body, "policy", CATCHUP_POLICIES, prefix=where)
        if policy is not None:
            fields["catchup_policy"] = policy
        optional = {
            "catchup_window_ms": seconds_ms(
                catchup_body, "window_s", 0, DURATION_S_MAX, prefix=where
            ),
            "catchup_max_runs": integer(
                catchup_body, "max_runs", 1, CATCHUP_MAX_RUNS_MAX, prefix=where
            ),
            "catchup_grace_ms": seconds_ms(
                catchup_body, "grace_s", 0, DURATION_S_MAX, prefix=where
            ),
        }
        fields.update({k: v for k, v in optional.items() if v is not None})
    return fields


# -- rendering --------------------------------------------------------------------------


def render_template(job: JobSpec) -> dict[str, Any]:
    return {
        "queue": job.queue,
        "tenant": job.tenant,
        "payload": unpack_json(job.payload),
        "priority": job.priority,
        "max_attempts": job.max_attempts,
        "backoff": {
            "initial_s": job.backoff.initial_ms / 1000,
            "max_s": job.backoff.max_ms / 1000,
            "jitter_s": job.backoff.jitter_ms / 1000,
        },
        "lease_s": job.lease_ms / 1000,
        "deadline_s": None if job.deadline_ms is None else job.deadline_ms / 1000,
        "ordering_key": job.ordering_key,
        "correlation_id": job.correlation_id,
        "labels": dict(job.labels),
        "kind": job.kind,
    }


def render_schedule(state: Any, schedule: Schedule) -> dict[str, Any]:
    spec = schedule.spec
    return {
        "id": schedule.id,
        "cron": spec.cron,
        "interval_s": None if spec.interval_ms is None else spec.interval_ms / 1000,
        "timezone": spec.timezone,
        "start_at": time_or_none(spec.start_at_ms),
        "end_at": time_or_none(spec.end_at_ms),
        "jitter_s": spec.jitter_ms / 1000,
        "overlap": spec.overlap,
        "catchup": {
            "policy": spec.catchup_policy,
            "window_s": spec.catchup_window_ms / 1000,
            "max_runs": spec.catchup_max_runs,
            "grace_s": spec.catchup_grace_ms / 1000,
        },
        "paused": schedule.paused,
        "job": render_template(spec.job),
        "created_at": format_ms(schedule.created_at_ms),
        "updated_at": format_ms(schedule.updated_at_ms),
        "next_fire_at": None if schedule.paused else time_or_none(schedule.next_fire_ms),
        "next_nominal_time": None if schedule.paused else time_or_none(schedule.next_nominal_ms),
        "last_fired_at": time_or_none(schedule.last_fired_at_ms),
        "running": is_running(state, schedule),
        "running_job_ids": list(schedule.active),
        "buffered": [format_ms(nominal_ms) for nominal_ms, _ in schedule.buffer],
        "counts": dict(sorted(schedule.counts.items())),
        "last_lag_s": None if schedule.last_lag_ms is None else schedule.last_lag_ms / 1000,
    }


def render_occurrence(record: tuple[int, int, str, str | None, str | None]) -> dict[str, Any]:
    nominal_ms, decided_at_ms, decision, job_id, reason = record
    return {
        "nominal_time": format_ms(nominal_ms),
        "decided_at": format_ms(decided_at_ms),
        "decision": decision,
        "job_id": job_id,
        "reason": reason,
    }


def render_decided(decided: OccurrenceDecided, decided_at_ms: int) -> dict[str, Any]:
    return render_occurrence(
        (decided.nominal_ms, decided_at_ms, decided.decision, decided.job_id, decided.reason)
    )


def _schedule_body(request: web.Request, schedule_id: str) -> dict[str, Any]:
    with node_of(request).reading() as state:
        schedule = get_schedule(state, schedule_id)
        if schedule is None:
            raise ApiError("not_found", f"schedule {schedule_id} no longer exists")
        return {"schedule": render_schedule(state, schedule)}


def _schedule_id(request: web.Request) -> str:
    return path_id(request.match_info["schedule_id"], "schedule_id")


def _with_generated_id(request: web.Request, body: Any) -> Any:
    if isinstance(body, dict) and body.get("id") is None:
        return {**body, "id": node_of(request).new_id("sch")}
    return body


# -- routes -------------------------------------------------------------------------------


@routes.post("/v1/schedules")
async def create_schedule(request: web.Request) -> web.Response:
    spec = parse_schedule(_with_generated_id(request, await read_json(request)))
    scope.require_tenant(request, (spec.job.tenant,))
    scope.require_schedule(request, spec.id)
    command = CreateSchedule(spec)
    result = await propose_audited(request, command, ScheduleSaved, body_bytes(request))
    status = 201 if result.created else 200
    return json_response(_schedule_body(request, spec.id), status=status)


@routes.post("/v1/schedules/batch")
async def create_schedules(request: web.Request) -> web.Response:
    body = require_object(await read_json(request))
    reject_unknown(body, frozenset({"schedules"}))
    items = body.get("schedules")
    if not isinstance(items, list) or not 1 <= len(items) <= SCHEDULE_BATCH_MAX:
        raise invalid("schedules", f"must be a list of 1 to {SCHEDULE_BATCH_MAX} schedules")
    specs = [
        parse_schedule(_with_generated_id(request, item), prefix=f"schedules[{i}].")
        for i, item in enumerate(items)
    ]
    scope.require_tenant(request, {spec.job.tenant for spec in specs})
    for spec in specs:
        scope.require_schedule(request, spec.id)
    node = node_of(request)
    # One command per schedule, queued all or none (503 unavailable when the
    # proposer's queue has no room); group commit packs them into a few entries.
    commands = [audited(request, CreateSchedule(spec)) for spec in specs]
    results = await asyncio.gather(*node.submit_all(commands, body_bytes(request)))
    answers: list[dict[str, Any]] = []
    for spec, result in zip(specs, results, strict=True):
        if isinstance(result, Rejected):
            answers.append(from_rejection(result).body())
        else:
            assert isinstance(result, ScheduleSaved)
            answers.append({"id": spec.id, "created": result.created})
    return json_response({"results": answers})


LIST_QUERY = frozenset({"limit", "cursor", "consistency"})


def check_list_query(query: Mapping[str, str]) -> int:
    """Check `GET /v1/schedules`'s query but its cursor; the page size."""
    reject_unknown(query, LIST_QUERY)
    limit = query_integer(query, "limit", 1, LIST_LIMIT_MAX, default=50)
    assert limit is not None
    return limit


@routes.get("/v1/schedules")
async def list_all(request: web.Request) -> web.Response:
    body, headers = await list_answer(request, request.query, cursors_wanted(request))
    return json_response(body, headers=headers)


async def list_answer(
    request: web.Request, query: Mapping[str, str], with_cursors: bool = False
) -> tuple[dict[str, Any], dict[str, str]]:
    """A page of schedules in id order; with `with_cursors`, the cursor
    after each, its id (api.shard_reads merges the shards' pages)."""
    limit = check_list_query(query)
    headers = await prepare_read(request)
    principal = principal_of(request)
    with node_of(request).reading() as state:
        page, cursor = list_schedules(state, limit, query.get("cursor"), principal.tenants)
        body: dict[str, Any] = {
            "schedules": [render_schedule(state, schedule) for schedule in page],
            "next_cursor": cursor,
        }
    if with_cursors:
        body["cursors"] = [schedule.id for schedule in page]
    return body, headers


@routes.get("/v1/schedules/{schedule_id}")
async def get_one(request: web.Request) -> web.Response:
    reject_unknown(request.query, frozenset({"consistency"}))
    headers = await prepare_read(request)
    schedule_id = _schedule_id(request)
    principal = principal_of(request)
    with node_of(request).reading() as state:
        schedule = get_schedule(state, schedule_id)
        if schedule is None or not scope.visible_schedule(principal, schedule):
            raise ApiError("not_found", f"no schedule {schedule_id}")
        body = {"schedule": render_schedule(state, schedule)}
    return json_response(body, headers=headers)


@routes.put("/v1/schedules/{schedule_id}")
async def edit(request: web.Request) -> web.Response:
    schedule_id = _schedule_id(request)
    spec = parse_schedule(await read_json(request), path_id_value=schedule_id)
    scope.require_schedule(request, schedule_id)
    scope.require_tenant(request, (spec.job.tenant,))
    await propose_audited(request, UpdateSchedule(spec), ScheduleSaved, body_bytes(request))
    return json_response(_schedule_body(request, schedule_id))


@routes.delete("/v1/schedules/{schedule_id}")
async def delete(request: web.Request) -> web.Response:
    schedule_id = _schedule_id(request)
    scope.require_schedule(request, schedule_id)
    command = DeleteSchedule(schedule_id)
    await propose_audited(request, command, ScheduleSaved, body_bytes(request))
    return json_response({"deleted": True, "id": schedule_id})


@routes.post("/v1/schedules/{schedule_id}/pause")
async def pause(request: web.Request) -> web.Response:
    schedule_id = _schedule_id(request)
    scope.require_schedule(request, schedule_id)
    command = PauseSchedule(schedule_id)
    await propose_audited(request, command, ScheduleSaved, body_bytes(request))
    return json_response(_schedule_body(request, schedule_id))


@routes.post("/v1/schedules/{schedule_id}/resume")
async def resume(request: web.Request) -> web.Response:
    schedule_id = _schedule_id(request)
    scope.require_schedule(request, schedule_id)
    command = ResumeSchedule(schedule_id)
    await propose_audited(request, command, ScheduleSaved, body_bytes(request))
    return json_response(_schedule_body(request, schedule_id))


@routes.post("/v1/schedules/{schedule_id}/trigger")
async def trigger(request: web.Request) -> web.Response:
    schedule_id = _schedule_id(request)
    reject_unknown(await optional_body(request), frozenset())
    scope.require_schedule(request, schedule_id)
    command = TriggerSchedule(schedule_id)
    result = await propose_audited(request, command, OccurrenceDecided, body_bytes(request))
    return json_response({"occurrence": render_decided(result, result.nominal_ms)})


@routes.post("/v1/schedules/{schedule_id}/backfill")
async def backfill(request: web.Request) -> web.Response:
    schedule_id = _schedule_id(request)
    body = require_object(await read_json(request))
    reject_unknown(body, frozenset({"from", "to", "overlap"}))
    from_ms, to_ms = instant_ms(body, "from"), instant_ms(body, "to")
    if from_ms is None:
        raise invalid("from", "is required")
    if to_ms is None:
        raise invalid("to", "is required")
    if to_ms < from_ms:
        raise invalid("to", "must not be before from")
    overlap = choice(body, "overlap", OVERLAP_POLICIES)
    scope.require_schedule(request, schedule_id)
    command = BackfillSchedule(schedule_id, from_ms, to_ms, overlap)
    result = await propose_audited(request, command, ScheduleBackfilled, body_bytes(request))
    with node_of(request).reading() as state:
        decided_at_ms = state.now_ms
    rendered = [render_decided(each, decided_at_ms) for each in result.decisions]
    return json_response({"occurrences": rendered})


@routes.get("/v1/schedules/{schedule_id}/occurrences")
async def list_occurrences(request: web.Request) -> web.Response:
    query = request.query
    reject_unknown(query, frozenset({"limit", "consistency"}))
    limit = query_integer(query, "limit", 1, LIST_LIMIT_MAX, default=100)
    assert limit is not None
    headers = await prepare_read(request)
    schedule_id = _schedule_id(request)
    principal = principal_of(request)
    with node_of(request).reading() as state:
        schedule = get_schedule(state, schedule_id)
        if schedule is None or not scope.visible_schedule(principal, schedule):
            raise ApiError("not_found", f"no schedule {schedule_id}")
        records = occurrences(schedule, limit)
    body = {"occurrences": [render_occurrence(record) for record in records]}
    return json_response(body, headers=headers)


# -- metrics -------------------------------------------------------------------------------


Sample = tuple[tuple[str, ...], float]


def setup(app: web.Application, node: NodeView) -> None:
    """Routes and the schedule metrics of this node."""
    app.add_routes(routes)
    sample = node.metrics.sample
    sample(families.SCHEDULE_OCCURRENCES, lambda: _totals(node))
    sample(families.SCHEDULE_OCCURRENCES_BY_SCHEDULE, lambda: _per_schedule(node))
    sample(families.SCHEDULE_FIRING_LAG, lambda: _lags(node))
    sample(families.SCHEDULES, lambda: _count(node))


def _first_schedules(state: Any) -> list[Schedule]:
    return first_schedules(state, METRIC_SCHEDULES_MAX)


def _totals(node: NodeView) -> Iterable[Sample]:
    with node.reading() as state:
        totals = occurrence_totals(state)
    return [((key,), float(count)) for key, count in sorted(totals.items())]


def _per_schedule(node: NodeView) -> Iterable[Sample]:
    with node.reading() as state:
        return [
            ((schedule.id, key), float(count))
            for schedule in _first_schedules(state)
            for key, count in sorted(schedule.counts.items())
        ]


def _lags(node: NodeView) -> Iterable[Sample]:
    with node.reading() as state:
        return [
            ((schedule.id,), schedule.last_lag_ms / 1000)
            for schedule in _first_schedules(state)
            if schedule.last_lag_ms is not None
        ]


def _count(node: NodeView) -> Iterable[Sample]:
    with node.reading() as state:
        return [((), float(count_schedules(state)))]
