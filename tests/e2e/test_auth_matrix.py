"""Every route × every role × scope, against one real 3-node cluster (issue 15).

The routes are the application's own router (enumerated as
tests/unit/test_api_permissions.py does), so a route added later is covered
without touching this file. For each route a request is sent:

- without a token: `401` (public routes: not 401/403);
- for each role (admin, operator, submitter, worker, viewer) with three
  tokens: tenants and queues `*` ("star"), scoped to the objects the request
  addresses (tenant `acme`, queue `qa`: "in") and scoped to another tenant and
  queue (`globex`, `qg`: "out").

What is expected follows from `ROUTE_PERMISSIONS` and `ROLE_PERMISSIONS`
(`permissions.allows`): a role without the permission gets `403`; a role with
it gets the route's own answer (2xx, 400, 404, 409: never 401 or 403), except
where scope decides: a scoped token on a view that mixes every tenant
(queues, subscriptions, `/metrics`, the overview) gets `403`, and an
out-of-scope token addressing `acme`'s job, schedule, workflow, effect or
tenant, or writing for `acme` / `qa`, is refused (`404` as if absent, or
`403` for a write naming a tenant or queue outside its scope).

Matrix size: for each route of the router, one request per role and scope
variant (`len(Role) × len(VARIANTS)`) and one without a token, so the total
follows the router rather than a count written here; the test prints the
figures it ran and checks that it sent exactly that many requests.
Long-polls are sent with `wait_s` 0.
Routes that delete (a schedule, a subscription, a token) run last and address
objects the matrix does not need any more (a token id that does not exist),
so the tokens the test uses are never revoked.
"""

from __future__ import annotations

import asyncio
import http.client
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from e2e_support import cluster_env

from raftsched.api.permissions import Permission, allows, permission_for
from raftsched.api.principal import Principal, Role
from raftsched.config import NodeConfig
from raftsched.testing import LocalCluster, http_json

pytestmark = pytest.mark.timeout(600)

VARIANTS = ("star", "in", "out")
SCOPES: dict[str, tuple[list[str], list[str]]] = {
    "star": (["*"], ["*"]),
    "in": (["acme"], ["qa"]),
    "out": (["globex"], ["qg"]),
}

# Views that mix every tenant: a scoped token (any role) is refused 403 by
# api.scope.require_all_tenants, after the role check.
NEEDS_ALL_TENANTS = {
    ("GET", "/metrics"),
    ("GET", "/v1/overview"),
    # The dashboard's charts: a queue's figures mix every tenant's jobs.
    ("GET", "/v1/stats/series"),
    ("GET", "/v1/queues"),
    ("GET", "/v1/queues/{name}"),
    ("PUT", "/v1/queues/{name}"),
    ("POST", "/v1/queues/{name}/pause"),
    ("POST", "/v1/queues/{name}/resume"),
    ("POST", "/v1/subscriptions"),
    ("GET", "/v1/subscriptions"),
    ("GET", "/v1/subscriptions/{subscription_id}"),
    ("DELETE", "/v1/subscriptions/{subscription_id}"),
    ("POST", "/v1/subscriptions/{subscription_id}/retry"),
    # The time wheel's settings and counts cover every tenant's jobs.
    ("GET", "/v1/wheel"),
    ("PUT", "/v1/wheel"),
}
# Routes whose request addresses or writes for tenant acme / queue qa: an
# "out" token is refused (404 for an object it may not see, 403 for a write
# naming a tenant or queue outside its scope).
ADDRESSES_ACME = {
    ("POST", "/v1/jobs"),
    ("POST", "/v1/jobs/batch"),
    ("POST", "/v1/leases"),
    ("POST", "/v1/effects"),
    ("GET", "/v1/effects/{key}"),
    ("POST", "/v1/schedules"),
    ("POST", "/v1/schedules/batch"),
    ("POST", "/v1/workflows"),
    ("GET", "/v1/tenants/{name}"),
    ("PUT", "/v1/tenants/{name}"),
}
# Its ops answer one by one inside a 200: an "out" op on acme's job is not_found.
BATCH = ("POST", "/v1/leases/batch")
OBJECT_PARAMETERS = ("{job_id}", "{schedule_id}", "{workflow_id}")


def app_routes(tmp_path: Path) -> list[tuple[str, str]]:
    """The app's (method, canonical path) pairs, as the unit test finds them."""
    from raftsched.process import assemble

    async def build() -> set[tuple[str, str]]:
        config = NodeConfig("n1", tmp_path, "127.0.0.1", 1, "127.0.0.1:2", "s" * 20)
        _, app = assemble(config, asyncio.get_running_loop())  # Raft not started
        return {
            (route.method, route.resource.canonical)
            for route in app.router.routes()
            if route.method != "HEAD" and route.resource is not None
        }

    # Deletions last, so that they cannot take away what other rows address.
    return sorted(asyncio.run(build()), key=lambda r: (r[0] == "DELETE", r[1], r[0]))


def send(
    url: str,
    method: str,
    path: str,
    body: Any = None,
    *,
    token: str,
    source: str = "127.0.0.1",
) -> tuple[int, Any]:
    """One request from a chosen loopback address: its status and JSON body."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(
        parts.hostname or "127.0.0.1", parts.port, timeout=20, source_address=(source, 0)
    )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        raw = response.read()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, None
    finally:
        connection.close()


class Fixture:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.url = cluster.nodes[cluster.wait_for_leader(timeout_s=30)].http_url
        self.admin = cluster.admin_token
        self.ids: dict[str, str] = {}
        self.tokens: dict[tuple[Role, str], tuple[str, Principal]] = {}
        self.serial = itertools.count()

    def admin_call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        status, answer, _ = http_json(method, self.url + path, body, timeout_s=20, token=self.admin)
        assert status in (200, 201), (method, path, status, answer)
        return answer

    def seed(self) -> None:
        job = self.admin_call("POST", "/v1/jobs", {"queue": "qa", "tenant": "acme"})["job"]
        self.ids["{job_id}"] = job["id"]
        # A leased job and its effect, on another acme queue nobody claims from here.
        self.admin_call("POST", "/v1/jobs", {"queue": "qa-held", "tenant": "acme"})
        claim = {"worker_id": "seed", "queues": ["qa-held"], "wait_s": 5}
        (lease,) = self.admin_call("POST", "/v1/leases", claim)["leases"]
        effect = {
            "key": "acme:1",
            "job_id": lease["job_id"],
            "fencing_token": lease["fencing_token"],
        }
        self.admin_call("POST", "/v1/effects", effect)
        self.ids["{key}"] = "acme:1"
        schedule = {"id": "acme-nightly", "cron": "0 2 * * *", "timezone": "UTC",
                    "paused": True, "job": {"queue": "qa", "tenant": "acme"}}  # fmt: skip
        self.admin_call("POST", "/v1/schedules", schedule)
        self.ids["{schedule_id}"] = "acme-nightly"
        workflow = {"tenant": "acme", "steps": [{"name": "a", "queue": "qa"}]}
        self.ids["{workflow_id}"] = self.admin_call("POST", "/v1/workflows", workflow)["workflow"][
            "id"
        ]
        self.admin_call("PUT", "/v1/tenants/acme", {"weight": 1})
        self.ids["{name}"] = "acme"  # queues: "qa" (see path())
        self.ids["{subscription_id}"] = "sub_nope"
        self.ids["{token_id}"] = "tok_nope"
        self.ids["{node_id}"] = "n-nope"  # membership: an unknown node (404 for admins)
        for role in Role:
            for variant, (tenants, queues) in SCOPES.items():
                body = {"name": f"{role}-{variant}", "role": str(role),
                        "tenants": tenants, "queues": queues}  # fmt: skip
                answer = self.admin_call("POST", "/v1/tokens", body)
                principal = Principal(
                    answer["token"]["id"],
                    body["name"],
                    role,
                    None if tenants == ["*"] else frozenset(tenants),
                    None if queues == ["*"] else frozenset(queues),
                )
                self.tokens[(role, variant)] = (answer["secret"], principal)

    def path(self, method: str, canonical: str) -> str:
        path = canonical
        if canonical.startswith("/v1/queues/"):
            path = path.replace("{name}", "qa")
        if canonical.startswith("/static/vendor/"):
            path = path.replace("{name}", "uPlot.iife.min.js")
        elif canonical.startswith("/static/"):
            path = path.replace("{name}", "app.js")
        for parameter, value in self.ids.items():
            path = path.replace(parameter, value)
        if canonical == "/v1/events":
            path += "?wait_s=0"  # no long-poll
        return path

    def body(self, method: str, canonical: str) -> Any:
        """A valid-looking body, where cheap; otherwise {} (a 400 is the route's own answer)."""
        n = next(self.serial)
        job = {"queue": "qa", "tenant": "acme"}
        schedule = {"id": f"m-{n}", "cron": "0 3 * * *", "timezone": "UTC", "paused": True,
                    "job": job}  # fmt: skip
        bodies: dict[tuple[str, str], Any] = {
            ("POST", "/v1/jobs"): job,
            ("POST", "/v1/jobs/batch"): {"jobs": [job]},
            ("POST", "/v1/jobs/{job_id}/replay"): {"reason": "auth matrix"},
            ("POST", "/v1/jobs/{job_id}/reconcile"): {"reason": "auth matrix"},
            ("POST", "/v1/leases/{job_id}/reconcile"): {
                "fencing_token": 1,
                "decision": "cannot_tell",
                "reason": "matrix",
            },
            ("POST", "/v1/leases"): {"worker_id": "w", "queues": ["qa"], "wait_s": 0},
            ("POST", "/v1/leases/batch"): {
                "ops": [{"op": "start", "job_id": self.ids["{job_id}"], "fencing_token": 1}]
            },
            ("POST", "/v1/effects"): {
                "key": f"m:{n}",
                "job_id": self.ids["{job_id}"],
                "fencing_token": 1,
            },
            ("POST", "/v1/schedules"): schedule,
            ("POST", "/v1/schedules/batch"): {"schedules": [schedule]},
            ("PUT", "/v1/schedules/{schedule_id}"): {**schedule, "id": "acme-nightly"},
            ("POST", "/v1/workflows"): {"tenant": "acme", "steps": [{"name": "a", "queue": "qa"}]},
            ("POST", "/v1/schedules/{schedule_id}/backfill"): {
                "from": "2026-01-01T00:00:00Z",
                "to": "2026-01-02T00:00:00Z",
            },
            ("POST", "/v1/leases/{job_id}/fail"): {
                "fencing_token": 1,
                "error": {"kind": "transient", "message": "matrix"},
            },
            ("PUT", "/v1/queues/{name}"): {"paused": False},
            ("PUT", "/v1/tenants/{name}"): {"weight": 1},
        }
        if (method, canonical) in bodies:
            return bodies[(method, canonical)]
        if canonical.startswith("/v1/leases/"):
            return {"fencing_token": 1}
        return {} if method in ("POST", "PUT") else None


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    local = LocalCluster(tmp_path_factory.mktemp("matrix") / "cluster", env=cluster_env())
    local.start()
    try:
        local.wait_for_leader(timeout_s=30)
        local.wait_for_auth(timeout_s=30)
        fixture = Fixture(local)
        fixture.seed()
        yield fixture
    finally:
        local.stop()


def expected(route: tuple[str, str], principal: Principal, variant: str) -> str:
    """'refused-403', 'refused' (403 or 404: scope), or 'answered' (not 401/403)."""
    need = permission_for(*route)
    assert need is not None, route
    if not allows(principal, need):
        return "refused-403"
    if variant == "star" or need is Permission.PUBLIC:
        return "answered"
    if route in NEEDS_ALL_TENANTS:
        return "refused-403"
    if variant == "out" and (
        route in ADDRESSES_ACME or route == BATCH or any(p in route[1] for p in OBJECT_PARAMETERS)
    ):
        return "refused"
    return "answered"


def test_every_route_answers_every_role_as_the_permission_table_says(
    matrix: Fixture, tmp_path: Path
) -> None:
    routes = app_routes(tmp_path)
    wrong: list[str] = []
    requests = 0
    for index, (method, canonical) in enumerate(routes):
        path = matrix.path(method, canonical)
        # Without a token, each probe from its own loopback address, so that the
        # failure limiter (10 a minute per address) answers 401, not 429.
        source = f"127.0.1.{index + 1}"
        status, _ = send(
            matrix.url, method, path, matrix.body(method, canonical), token="", source=source
        )
        requests += 1
        public = permission_for(method, canonical) is Permission.PUBLIC
        if (public and status in (401, 403)) or (not public and status != 401):
            wrong.append(f"{method} {path} without a token: {status}")
        for role in Role:
            for variant in VARIANTS:
                secret, principal = matrix.tokens[(role, variant)]
                status, answer = send(
                    matrix.url, method, path, matrix.body(method, canonical), token=secret
                )
                requests += 1
                want = expected((method, canonical), principal, variant)
                if (method, canonical) == BATCH and status == 200 and variant == "out":
                    # Each op of a batch answers on its own: the foreign job is absent.
                    status = 404 if answer["results"][0]["error"]["code"] == "not_found" else 200
                ok = {
                    "refused-403": status == 403,
                    "refused": status in (403, 404),
                    "answered": status not in (401, 403) and status < 500,
                }[want]
                if not ok:
                    wrong.append(f"{method} {path} as {role}/{variant}: {status}, expected {want}")
    print(
        f"auth matrix: {len(routes)} routes x {len(Role)} roles x {len(VARIANTS)} scope "
        f"variants + {len(routes)} without a token = {requests} requests"
    )
    assert requests == len(routes) * (1 + len(Role) * len(VARIANTS))
    assert not wrong, "\n".join(wrong)
    # The tokens the matrix used are all still valid (nothing revoked them).
    for secret, _ in matrix.tokens.values():
        assert send(matrix.url, "GET", "/v1/whoami", token=secret)[0] == 200
