"""`GET /v1/reconciliation`: the periodic reconciliation report (issue 17).

For operations: the jobs `reconciling` now, unknown outcomes per queue and
hour, how reconciliations ended per queue, and the jobs reconciliation
completed, over the last `hours` (docs/reconciliation.md, "The
reconciliation report"). A read like `GET /v1/jobs`: linearizable unless
`consistency=stale`, and scoped like it, so a token of some tenants (and
queues) sees only their jobs in every part of the report. Derived from
replicated state only (core.jobs.reconcile_report), so every replica at the
same applied index answers the same.
"""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from raftsched.api import scope
from raftsched.api.jsonbody import json_response
from raftsched.api.principal import principal_of
from raftsched.api.requests import node_of, prepare_read
from raftsched.api.validation import query_integer, reject_unknown
from raftsched.core.jobs.reconcile_log import ENDINGS, HOUR_MS, WINDOW_HOURS_MAX
from raftsched.core.jobs.reconcile_report import (
    CompletedJob,
    ReconcilingJob,
    Report,
    reconciliation_report,
)
from raftsched.core.kernel.model import Job
from raftsched.limits import LIST_LIMIT_MAX
from raftsched.timefmt import format_ms

routes = web.RouteTableDef()

HOURS_DEFAULT: Final = 24
LISTED_DEFAULT: Final = 100


@routes.get("/v1/reconciliation")
async def reconciliation(request: web.Request) -> web.Response:
    query = request.query
    reject_unknown(query, frozenset({"hours", "limit", "consistency"}))
    hours = query_integer(query, "hours", 1, WINDOW_HOURS_MAX, default=HOURS_DEFAULT)
    limit = query_integer(query, "limit", 1, LIST_LIMIT_MAX, default=LISTED_DEFAULT)
    assert hours is not None and limit is not None
    headers = await prepare_read(request)
    principal = principal_of(request)

    def visible(job: Job) -> bool:
        return scope.visible_job(principal, job)

    with node_of(request).reading() as state:
        report = reconciliation_report(
            state, hours, limit, None if scope.unrestricted(principal) else visible
        )
    return json_response(report_json(report), headers=headers)


def report_json(report: Report) -> dict[str, Any]:
    buckets = [format_ms(report.since_ms + n * HOUR_MS) for n in range(report.hours)]
    return {
        "now": format_ms(report.now_ms),
        "since": format_ms(report.since_ms),
        "hours": report.hours,
        "reconciling": {
            "jobs": [_reconciling(item) for item in report.reconciling],
            "total": report.reconciling_total,
            "truncated": report.reconciling_total > len(report.reconciling),
        },
        "unknown_outcomes": {
            "buckets": buckets,
            "queues": [
                {"queue": queue, "total": sum(counts), "counts": list(counts)}
                for queue, counts in report.unknown_outcomes.items()
            ],
        },
        "decisions": [
            {"queue": queue, **{kind: counts[kind] for kind in ENDINGS}}
            for queue, counts in report.endings.items()
        ],
        "completed": {
            "jobs": [_completed(item) for item in report.completed],
            "total": report.completed_total,
            "truncated": report.completed_total > len(report.completed),
        },
    }


def _reconciling(item: ReconcilingJob) -> dict[str, Any]:
    lease = item.lease
    return {
        "job_id": item.job_id,
        "queue": item.queue,
        "tenant": item.tenant,
        "attempt": item.attempt,
        "since": format_ms(item.since_ms),
        "tries": item.tries,
        "reconcile_queue": item.reconcile_queue,
        "available_at": format_ms(item.available_at_ms),
        "lease": None
        if lease is None
        else {"worker_id": lease[0], "fencing_token": lease[1], "expires_at": format_ms(lease[2])},
    }


def _completed(item: CompletedJob) -> dict[str, Any]:
    return {
        "job_id": item.job_id,
        "queue": item.queue,
        "tenant": item.tenant,
        "completed_at": format_ms(item.completed_at_ms),
        "worker_id": item.worker_id,
        "fencing_token": item.fencing_token,
        "evidence": item.evidence,
    }
