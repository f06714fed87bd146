"""What each route needs: the permission table and the role matrix.

Every route of the application is listed in `ROUTE_PERMISSIONS` under its
method and canonical path; `tests/unit/test_api_permissions.py` fails when a
route has no entry, so a new route cannot be added without saying who may
call it. The roles are those of `docs/api.md` ("Authentication, roles and
tenants"):

| role | permissions |
|---|---|
| admin | all of them (only admin: tokens, backup) |
| operator | read, cluster, submit, cancel, operate, effects.read |
| submitter | read, submit, cancel, effects.read |
| worker | work (the lease protocol, recording effects) on its queues, |
|        | effects.read, read.job (a job on its queues that holds a lease) |
| viewer | read, effects.read; cluster only with tenants `*` |

`public` routes need no token at all: health, readiness, the OpenAPI
document, the dashboard's page and files (the page asks for a token), and
`GET /v1/time`, which the nodes poll for each other's clock, version and
identity (cluster id, incarnations: random ids, no secret) and which reveals
only those. `authenticated` needs any valid token (whoami).
"""

from __future__ import annotations

import enum
from typing import Final

from raftsched.api.principal import Principal, Role


class Permission(enum.StrEnum):
    PUBLIC = "public"
    AUTHENTICATED = "authenticated"
    # Tenant-scoped reads: jobs, schedules, workflows, histories, tenants,
    # the reconciliation report.
    READ = "read"
    # GET /v1/jobs/{id}: READ, or a worker's job on its queues that holds a lease.
    READ_JOB = "read.job"
    READ_EFFECTS = "effects.read"
    # Cluster-wide views: /v1/cluster, /metrics, queues, overview, series, events, digest.
    CLUSTER = "cluster"
    SUBMIT = "submit"
    CANCEL = "cancel"
    # Replay, schedule edits, queue and tenant settings, subscriptions.
    OPERATE = "operate"
    # The worker protocol and recording effects.
    WORK = "work"
    TOKENS = "tokens"
    # Adding and removing members (admin only).
    MEMBERSHIP = "membership"
    # GET /v1/backup: the whole state, every tenant's secrets' hashes too.
    BACKUP = "backup"


P = Permission

ROLE_PERMISSIONS: Final[dict[Role, frozenset[Permission]]] = {
    Role.ADMIN: frozenset(Permission),
    Role.OPERATOR: frozenset(
        {
            P.AUTHENTICATED,
            P.READ,
            P.READ_JOB,
            P.READ_EFFECTS,
            P.CLUSTER,
            P.SUBMIT,
            P.CANCEL,
            P.OPERATE,
        }
    ),  # fmt: skip
    Role.SUBMITTER: frozenset(
        {P.AUTHENTICATED, P.READ, P.READ_JOB, P.READ_EFFECTS, P.SUBMIT, P.CANCEL}
    ),
    Role.WORKER: frozenset({P.AUTHENTICATED, P.READ_JOB, P.READ_EFFECTS, P.WORK}),
    Role.VIEWER: frozenset({P.AUTHENTICATED, P.READ, P.READ_JOB, P.READ_EFFECTS, P.CLUSTER}),
}

# Roles whose cluster-wide views need every tenant in scope (`tenants: ["*"]`).
CLUSTER_NEEDS_ALL_TENANTS: Final = frozenset({Role.VIEWER})


def allows(principal: Principal, permission: Permission) -> bool:
    """Whether the principal's role (and, for cluster views, scope) allows it."""
    if permission is P.PUBLIC:
        return True
    if permission not in ROLE_PERMISSIONS[principal.role]:
        return False
    if permission is P.CLUSTER and principal.role in CLUSTER_NEEDS_ALL_TENANTS:
        return principal.all_tenants
    return True


ROUTE_PERMISSIONS: Final[dict[tuple[str, str], Permission]] = {
    # Public.
    ("GET", "/healthz"): P.PUBLIC,
    ("GET", "/readyz"): P.PUBLIC,
    ("GET", "/openapi.json"): P.PUBLIC,
    ("GET", "/"): P.PUBLIC,
    ("GET", "/static/{name}"): P.PUBLIC,
    ("GET", "/static/vendor/{name}"): P.PUBLIC,
    ("GET", "/v1/time"): P.PUBLIC,
    # Jobs.
    ("POST", "/v1/jobs"): P.SUBMIT,
    ("POST", "/v1/jobs/batch"): P.SUBMIT,
    ("GET", "/v1/jobs"): P.READ,
    ("GET", "/v1/jobs/{job_id}"): P.READ_JOB,
    ("POST", "/v1/jobs/{job_id}/cancel"): P.CANCEL,
    ("POST", "/v1/jobs/{job_id}/replay"): P.OPERATE,
    ("POST", "/v1/jobs/{job_id}/reconcile"): P.OPERATE,
    ("GET", "/v1/jobs/{job_id}/history"): P.READ,
    # A job's effects: whoever may read effects (a worker on the job's queues too).
    ("GET", "/v1/jobs/{job_id}/effects"): P.READ_EFFECTS,
    # The reconciliation report: tenant-scoped like the job lists.
    ("GET", "/v1/reconciliation"): P.READ,
    # The worker protocol and effects.
    ("POST", "/v1/leases"): P.WORK,
    ("POST", "/v1/leases/{job_id}/start"): P.WORK,
    ("POST", "/v1/leases/{job_id}/heartbeat"): P.WORK,
    ("POST", "/v1/leases/{job_id}/complete"): P.WORK,
    ("POST", "/v1/leases/{job_id}/fail"): P.WORK,
    ("POST", "/v1/leases/{job_id}/reconcile"): P.WORK,
    ("POST", "/v1/leases/batch"): P.WORK,
    ("POST", "/v1/effects"): P.WORK,
    ("GET", "/v1/effects/{key}"): P.READ_EFFECTS,
    # Schedules.
    ("POST", "/v1/schedules"): P.SUBMIT,
    ("POST", "/v1/schedules/batch"): P.SUBMIT,
    ("GET", "/v1/schedules"): P.READ,
    ("GET", "/v1/schedules/{schedule_id}"): P.READ,
    ("PUT", "/v1/schedules/{schedule_id}"): P.OPERATE,
    ("DELETE", "/v1/schedules/{schedule_id}"): P.CANCEL,
    ("POST", "/v1/schedules/{schedule_id}/pause"): P.OPERATE,
    ("POST", "/v1/schedules/{schedule_id}/resume"): P.OPERATE,
    ("POST", "/v1/schedules/{schedule_id}/trigger"): P.OPERATE,
    ("POST", "/v1/schedules/{schedule_id}/backfill"): P.OPERATE,
    ("GET", "/v1/schedules/{schedule_id}/occurrences"): P.READ,
    # Workflows.
    ("POST", "/v1/workflows"): P.SUBMIT,
    ("GET", "/v1/workflows"): P.READ,
    ("GET", "/v1/workflows/{workflow_id}"): P.READ,
    ("GET", "/v1/workflows/{workflow_id}/history"): P.READ,
    ("POST", "/v1/workflows/{workflow_id}/cancel"): P.CANCEL,
    # Events and subscriptions.
    ("GET", "/v1/events"): P.CLUSTER,
    ("POST", "/v1/subscriptions"): P.OPERATE,
    ("GET", "/v1/subscriptions"): P.OPERATE,
    ("GET", "/v1/subscriptions/{subscription_id}"): P.OPERATE,
    ("DELETE", "/v1/subscriptions/{subscription_id}"): P.OPERATE,
    ("POST", "/v1/subscriptions/{subscription_id}/retry"): P.OPERATE,
    # Queues and tenants (flow control).
    ("GET", "/v1/queues"): P.CLUSTER,
    ("GET", "/v1/queues/{name}"): P.CLUSTER,
    ("PUT", "/v1/queues/{name}"): P.OPERATE,
    ("POST", "/v1/queues/{name}/pause"): P.OPERATE,
    ("POST", "/v1/queues/{name}/resume"): P.OPERATE,
    ("GET", "/v1/tenants"): P.READ,
    ("GET", "/v1/tenants/{name}"): P.READ,
    ("PUT", "/v1/tenants/{name}"): P.OPERATE,
    # The time wheel's settings (cluster version 7).
    ("GET", "/v1/wheel"): P.CLUSTER,
    ("PUT", "/v1/wheel"): P.OPERATE,
    # Cluster-wide views.
    ("GET", "/v1/cluster"): P.CLUSTER,
    ("GET", "/v1/overview"): P.CLUSTER,
    # The dashboard's charts: a queue's figures mix every tenant's jobs.
    ("GET", "/v1/stats/series"): P.CLUSTER,
    ("GET", "/metrics"): P.CLUSTER,
    ("GET", "/v1/debug/digest"): P.CLUSTER,
    # Membership.
    ("POST", "/v1/cluster/nodes"): P.MEMBERSHIP,
    ("DELETE", "/v1/cluster/nodes/{node_id}"): P.MEMBERSHIP,
    ("GET", "/v1/backup"): P.BACKUP,
    # Tokens.
    ("GET", "/v1/audit"): P.OPERATE,
    ("POST", "/v1/tokens"): P.TOKENS,
    ("GET", "/v1/tokens"): P.TOKENS,
    ("GET", "/v1/tokens/{token_id}"): P.TOKENS,
    ("DELETE", "/v1/tokens/{token_id}"): P.TOKENS,
    ("GET", "/v1/whoami"): P.AUTHENTICATED,
}


def permission_for(method: str, canonical: str) -> Permission | None:
    """The route's permission; HEAD is GET's. None: the route is not listed
    (a test keeps that from happening; the middleware then refuses it)."""
    if method == "HEAD":
        method = "GET"
    return ROUTE_PERMISSIONS.get((method, canonical))
