"""Tenant isolation: what a caller may see of the replicated state, in one place.

Every handler asks the request's principal (`api.principal.principal_of`),
never a header. The rules (docs/security.md, "Tenant isolation and audit"):

1. A job, schedule, workflow or effect of a tenant outside the caller's
   scope is `404 not_found` with exactly the answer an absent one gets, and
   is left out of every list and count. A job (and its effects) on a queue
   outside the caller's queues is treated the same way.
2. Writing for a tenant outside the scope (submitting a job, workflow or
   schedule, or changing a tenant's settings) is `403 forbidden`, as is a
   claim that names a queue outside the caller's queues.
3. Views that mix tenants and cannot be split by tenant (queues and their
   settings, `/metrics`, the dashboard's overview, subscriptions, which
   deliver every tenant's events) need a caller who sees every tenant:
   otherwise `403 forbidden`.
4. An event or audit entry that names no tenant (recorded before cluster
   version 3, or about something no tenant owns) is shown only to callers
   who see every tenant.

Cost: a caller who sees every tenant and queue (`unrestricted`, which
`ANONYMOUS` is) is recognised once per request, and lists then run exactly
as before; only a scoped caller's lists test each item.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web

from raftsched.api.errors import ApiError, from_rejection
from raftsched.api.principal import Principal, principal_of
from raftsched.api.requests import node_of
from raftsched.core.jobs.leases import not_found as job_not_found
from raftsched.core.jobs.queries import get_job
from raftsched.core.jobs.reconcile_book import open_reconcile_queue as reconcile_queue_of
from raftsched.core.kernel.model import Job
from raftsched.core.kernel.outbox import OutboxEvent, decode_data
from raftsched.core.kernel.results import NOT_FOUND, Rejected
from raftsched.core.kernel.state import State
from raftsched.core.schedules.handlers import not_found as schedule_not_found
from raftsched.core.schedules.model import Schedule
from raftsched.core.schedules.queries import get_schedule
from raftsched.core.workflows.model import Workflow, table


def unrestricted(principal: Principal) -> bool:
    """Sees every tenant and every queue: nothing to filter."""
    return principal.tenants is None and principal.queues is None


def visible_tenant(principal: Principal, tenant: str | None) -> bool:
    """`None` (a record of no tenant) only for callers of every tenant."""
    if principal.tenants is None:
        return True
    return tenant is not None and tenant in principal.tenants


def visible_job(principal: Principal, job: Job) -> bool:
    return principal.sees_tenant(job.tenant) and principal.may_use_queue(job.queue)


def visible_schedule(principal: Principal, schedule: Schedule) -> bool:
    return principal.sees_tenant(schedule.spec.job.tenant)


def visible_workflow(principal: Principal, workflow: Workflow) -> bool:
    return principal.sees_tenant(workflow.tenant)


def visible_effect(principal: Principal, state: State, key: str) -> bool:
    """An effect belongs to the job that recorded it."""
    found = state.effects.get(key)
    return found is not None and visible_job(principal, found[0])


def visible_event(principal: Principal, event: OutboxEvent) -> bool:
    """Decodes the event's data: call only for a scoped caller."""
    tenant = decode_data(event).get("tenant")
    return visible_tenant(principal, tenant if isinstance(tenant, str) else None)


# -- filters for lists ------------------------------------------------------------


def filter_events(principal: Principal, events: Iterable[OutboxEvent]) -> list[OutboxEvent]:
    events = list(events)
    if principal.tenants is None:
        return events
    return [event for event in events if visible_event(principal, event)]


# -- checks that raise --------------------------------------------------------------


def forbidden(message: str, details: dict[str, str] | None = None) -> ApiError:
    return ApiError("forbidden", message, details or {})


def require_all_tenants(request: web.Request, what: str) -> Principal:
    """Cluster-wide views: 403 unless the caller sees every tenant."""
    principal = principal_of(request)
    if not principal.all_tenants:
        raise forbidden(f"{what} mixes every tenant's data: it needs a token for tenants *")
    return principal


def require_tenant(request: web.Request, tenants: Iterable[str]) -> None:
    """Writing for these tenants: 403 for one outside the caller's scope."""
    principal = principal_of(request)
    if principal.tenants is None:
        return
    for tenant in tenants:
        if tenant not in principal.tenants:
            raise forbidden(f"tenant {tenant} is outside this token's tenants", {"tenant": tenant})


def require_queues(request: web.Request, queues: Iterable[str]) -> None:
    """A claim names its queues: 403 for one outside the caller's queues."""
    principal = principal_of(request)
    if principal.queues is None:
        return
    for queue in queues:
        if queue not in principal.queues:
            raise forbidden(f"queue {queue} is outside this token's queues", {"queue": queue})


def require_job(request: web.Request, job_id: str, error: ApiError | None = None) -> None:
    """Before proposing a command on a job: out of scope is the core's own
    404 for a job that does not exist (or `error`, the route's answer)."""
    principal = principal_of(request)
    if unrestricted(principal):
        return
    with node_of(request).reading() as state:
        job = get_job(state, job_id)  # a packed one too (kernel.wheel)
        if job is not None and not visible_job(principal, job):
            raise error or from_rejection(job_not_found(job_id))


def require_lease_job(request: web.Request, job_id: str) -> None:
    """`require_job` for the lease operations: a job whose reconciliation is
    leased from another queue (its reconcile queue) is also in scope for
    the workers of that queue, who answer and heartbeat it."""
    principal = principal_of(request)
    if unrestricted(principal):
        return
    with node_of(request).reading() as state:
        job = get_job(state, job_id)
        if job is None or visible_job(principal, job):
            return
        queue = reconcile_queue_of(state, job)
        if queue is None or not (
            principal.sees_tenant(job.tenant) and principal.may_use_queue(queue)
        ):
            raise from_rejection(job_not_found(job_id))


def require_schedule(request: web.Request, schedule_id: str) -> None:
    principal = principal_of(request)
    if principal.tenants is None:
        return
    with node_of(request).reading() as state:
        schedule = get_schedule(state, schedule_id)
        if schedule is not None and not visible_schedule(principal, schedule):
            raise from_rejection(schedule_not_found(schedule_id))


def require_workflow(request: web.Request, workflow_id: str) -> None:
    principal = principal_of(request)
    if principal.tenants is None:
        return
    with node_of(request).reading() as state:
        workflow = table(state).workflows.get(workflow_id)
        if workflow is not None and not visible_workflow(principal, workflow):
            raise from_rejection(workflow_not_found(workflow_id))


def workflow_not_found(workflow_id: str) -> Rejected:
    """What the core answers for a workflow that does not exist."""
    return Rejected(NOT_FOUND, f"no workflow {workflow_id}", {"workflow_id": workflow_id})
