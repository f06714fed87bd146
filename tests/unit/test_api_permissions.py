"""The permission table: every route of the app names what it needs, and the
role matrix of docs/api.md ("Authentication, roles and tenants")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from raftsched.api.auth import FailureLimiter
from raftsched.api.permissions import (
    ROLE_PERMISSIONS,
    ROUTE_PERMISSIONS,
    Permission,
    allows,
    permission_for,
)
from raftsched.api.principal import Principal, Role
from raftsched.config import NodeConfig


def app_routes(tmp_path: Path) -> set[tuple[str, str]]:
    from raftsched.process import assemble

    async def build() -> set[tuple[str, str]]:
        config = NodeConfig("n1", tmp_path, "127.0.0.1", 1, "127.0.0.1:2", "s" * 20)
        _, app = assemble(config, asyncio.get_running_loop())  # Raft not started
        found: set[tuple[str, str]] = set()
        for route in app.router.routes():
            if route.method == "HEAD" or route.resource is None:
                continue  # aiohttp adds HEAD beside each GET; it takes GET's permission
            found.add((route.method, route.resource.canonical))
        return found

    return asyncio.run(build())


def test_every_route_of_the_app_declares_a_permission(tmp_path: Path) -> None:
    routes = app_routes(tmp_path)
    missing = sorted(route for route in routes if permission_for(*route) is None)
    assert not missing, f"routes without a permission in ROUTE_PERMISSIONS: {missing}"
    # And the table names no route the app does not have (a renamed path).
    stale = sorted(set(ROUTE_PERMISSIONS) - routes)
    assert not stale, f"ROUTE_PERMISSIONS entries for no route: {stale}"


def test_the_public_routes_are_exactly_the_documented_ones() -> None:
    public = {route for route, need in ROUTE_PERMISSIONS.items() if need is Permission.PUBLIC}
    assert public == {
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/openapi.json"),
        ("GET", "/"),
        ("GET", "/static/{name}"),
        ("GET", "/static/vendor/{name}"),
        ("GET", "/v1/time"),
    }
    assert permission_for("HEAD", "/healthz") is Permission.PUBLIC


def caller(role: Role, tenants: frozenset[str] | None = None) -> Principal:
    return Principal("tok_1", "t", role, tenants, None)


# route -> the roles that may call it (with tenants "*").
MATRIX = {
    ("POST", "/v1/tokens"): {Role.ADMIN},
    ("DELETE", "/v1/tokens/{token_id}"): {Role.ADMIN},
    ("GET", "/v1/whoami"): set(Role),
    ("POST", "/v1/jobs"): {Role.ADMIN, Role.OPERATOR, Role.SUBMITTER},
    ("GET", "/v1/jobs"): {Role.ADMIN, Role.OPERATOR, Role.SUBMITTER, Role.VIEWER},
    ("GET", "/v1/jobs/{job_id}"): set(Role),
    ("POST", "/v1/jobs/{job_id}/cancel"): {Role.ADMIN, Role.OPERATOR, Role.SUBMITTER},
    ("POST", "/v1/jobs/{job_id}/replay"): {Role.ADMIN, Role.OPERATOR},
    ("POST", "/v1/leases"): {Role.ADMIN, Role.WORKER},
    ("POST", "/v1/leases/{job_id}/complete"): {Role.ADMIN, Role.WORKER},
    ("POST", "/v1/leases/batch"): {Role.ADMIN, Role.WORKER},
    ("POST", "/v1/effects"): {Role.ADMIN, Role.WORKER},
    ("GET", "/v1/effects/{key}"): set(Role),
    ("POST", "/v1/schedules"): {Role.ADMIN, Role.OPERATOR, Role.SUBMITTER},
    ("PUT", "/v1/schedules/{schedule_id}"): {Role.ADMIN, Role.OPERATOR},
    ("POST", "/v1/workflows"): {Role.ADMIN, Role.OPERATOR, Role.SUBMITTER},
    ("PUT", "/v1/queues/{name}"): {Role.ADMIN, Role.OPERATOR},
    ("POST", "/v1/subscriptions"): {Role.ADMIN, Role.OPERATOR},
    ("GET", "/metrics"): {Role.ADMIN, Role.OPERATOR, Role.VIEWER},
    ("GET", "/v1/cluster"): {Role.ADMIN, Role.OPERATOR, Role.VIEWER},
    ("GET", "/healthz"): set(Role),
}


@pytest.mark.parametrize("route", sorted(MATRIX))
def test_the_role_matrix(route: tuple[str, str]) -> None:
    need = permission_for(*route)
    assert need is not None
    allowed = {role for role in Role if allows(caller(role), need)}
    assert allowed == MATRIX[route]


def test_admin_holds_every_permission_and_roles_nest_as_documented() -> None:
    assert ROLE_PERMISSIONS[Role.ADMIN] == frozenset(Permission)
    assert Permission.TOKENS not in ROLE_PERMISSIONS[Role.OPERATOR]
    assert ROLE_PERMISSIONS[Role.SUBMITTER] < ROLE_PERMISSIONS[Role.OPERATOR]
    assert Permission.WORK not in ROLE_PERMISSIONS[Role.VIEWER]


def test_cluster_wide_views_need_every_tenant_for_a_viewer() -> None:
    need = permission_for("GET", "/metrics")
    assert need is Permission.CLUSTER
    assert allows(caller(Role.VIEWER), need)
    assert not allows(caller(Role.VIEWER, frozenset({"acme"})), need)
    # Tenant-scoped reads stay open to a scoped viewer.
    assert allows(caller(Role.VIEWER, frozenset({"acme"})), Permission.READ)


def test_the_failure_limiter_counts_per_address_in_a_sliding_minute() -> None:
    limiter = FailureLimiter(failures_max=3, window_s=60, addresses_max=2)
    for at in (0.0, 1.0, 2.0):
        assert limiter.retry_after_s("a", at) is None
        limiter.failed("a", at)
    assert limiter.retry_after_s("a", 3.0) == 57
    assert limiter.retry_after_s("b", 3.0) is None  # another address is not held
    assert limiter.retry_after_s("a", 60.5) is None  # the first failure left the window
    limiter.failed("a", 60.5)
    assert limiter.retry_after_s("a", 60.6) == 1
    limiter.failed("b", 61.0)
    limiter.failed("c", 61.0)  # at most two addresses are remembered: "a" goes
    assert limiter.retry_after_s("a", 61.5) is None
