"""Two tenants on one real 3-node cluster: neither sees the other (issue 15).

Tenants `acme` and `globex` each get a submitter, a viewer and an operator
scoped to the tenant, and a worker scoped to the tenant and its queue. Each
tenant then has real objects: a job with the idempotency key both tenants use
(`order:1`), completed by the tenant's worker, which records an effect (so a
`job.succeeded` event), a dead-lettered job, a pending job, a paused schedule
and a workflow. Then, for every scoped token:

- every list (jobs, the job found by idempotency key, schedules, workflows,
  tenants with their figures, the dead-letter queue, events) holds its own
  tenant's objects and none of the other's;
- the other tenant's ids answer get, history, cancel and replay (and an
  effect's key) exactly as an id that does not exist does: `404 not_found`,
  the same message;
- cluster-wide views (`/metrics`, `/v1/overview`) are 403 to a scoped viewer
  and 200 to a viewer with tenants `*`, who also sees both tenants in lists.

(Revocation seen on every node, followers' stale reads included, is covered by
tests/e2e/test_auth.py::test_tokens_create_list_get_and_revoke_on_every_node.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from e2e_support import cluster_env

from raftsched.testing import LocalCluster, http_json, metrics_text

TENANTS = ("acme", "globex")
pytestmark = pytest.mark.timeout(300)


class World:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.url = cluster.nodes[cluster.wait_for_leader(timeout_s=30)].http_url
        self.tokens: dict[tuple[str, str], str] = {}
        self.ids: dict[str, dict[str, str]] = {tenant: {} for tenant in TENANTS}

    def call(
        self, method: str, path: str, body: Any = None, *, token: str
    ) -> tuple[int, dict[str, Any]]:
        status, answer, _ = http_json(method, self.url + path, body, timeout_s=20, token=token)
        return status, answer

    def ok(self, method: str, path: str, body: Any = None, *, token: str) -> dict[str, Any]:
        status, answer = self.call(method, path, body, token=token)
        assert status in (200, 201), (method, path, status, answer)
        return answer

    def token(self, role: str, tenant: str) -> str:
        if (role, tenant) not in self.tokens:
            tenants = ["*"] if tenant == "*" else [tenant]
            queues = [f"{tenant}-q"] if role == "worker" else ["*"]
            body = {"name": f"{tenant}-{role}", "role": role, "tenants": tenants, "queues": queues}
            answer = self.ok("POST", "/v1/tokens", body, token=self.cluster.admin_token)
            self.tokens[(role, tenant)] = answer["secret"]
        return self.tokens[(role, tenant)]

    def populate(self, tenant: str) -> None:
        submitter, worker = self.token("submitter", tenant), self.token("worker", tenant)
        ids = self.ids[tenant]
        queue = f"{tenant}-q"
        job = {"queue": queue, "tenant": tenant, "idempotency_key": "order:1", "priority": 10}
        ids["done"] = self.ok("POST", "/v1/jobs", job, token=submitter)["job"]["id"]
        dead = {"queue": queue, "tenant": tenant, "max_attempts": 1}
        ids["dead"] = self.ok("POST", "/v1/jobs", dead, token=submitter)["job"]["id"]
        idle = {"queue": f"{tenant}-idle", "tenant": tenant}
        ids["pending"] = self.ok("POST", "/v1/jobs", idle, token=submitter)["job"]["id"]
        claim = {"worker_id": f"{tenant}-w", "queues": [queue], "max_jobs": 2, "wait_s": 5}
        leases = {
            lease["job_id"]: lease
            for lease in self.ok("POST", "/v1/leases", claim, token=worker)["leases"]
        }
        assert set(leases) == {ids["done"], ids["dead"]}, leases
        done, dead_lease = leases[ids["done"]], leases[ids["dead"]]
        effect = {"key": f"{tenant}:charge", "job_id": ids["done"],
                  "fencing_token": done["fencing_token"], "result": {"ok": True}}  # fmt: skip
        self.ok("POST", "/v1/effects", effect, token=worker)
        ids["effect"] = effect["key"]
        op = {"fencing_token": done["fencing_token"], "result": {"tenant": tenant}}
        self.ok("POST", f"/v1/leases/{ids['done']}/complete", op, token=worker)
        error = {"kind": "permanent", "message": "declined"}
        op = {"fencing_token": dead_lease["fencing_token"], "error": error}
        self.ok("POST", f"/v1/leases/{ids['dead']}/fail", op, token=worker)
        schedule = {"id": f"{tenant}-nightly", "cron": "0 2 * * *", "timezone": "UTC",
                    "paused": True, "job": {"queue": queue, "tenant": tenant}}  # fmt: skip
        self.ok("POST", "/v1/schedules", schedule, token=submitter)
        ids["schedule"] = schedule["id"]
        workflow = {"tenant": tenant, "steps": [{"name": "a", "queue": f"{tenant}-idle"}]}
        ids["workflow"] = self.ok("POST", "/v1/workflows", workflow, token=submitter)["workflow"][
            "id"
        ]
        self.ok("PUT", f"/v1/tenants/{tenant}", {"weight": 2}, token=self.token("operator", tenant))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    local = LocalCluster(tmp_path_factory.mktemp("tenants") / "cluster", env=cluster_env())
    local.start()
    try:
        local.wait_for_leader(timeout_s=30)
        local.wait_for_auth(timeout_s=30)
        built = World(local)
        for tenant in TENANTS:
            built.populate(tenant)
        job = built.ok("GET", f"/v1/jobs/{built.ids['acme']['dead']}", token=local.admin_token)
        assert job["job"]["status"] == "dead_letter", job
        yield built
    finally:
        local.stop()


def other(tenant: str) -> str:
    return TENANTS[1 - TENANTS.index(tenant)]


def listed_tenants(world: World, path: str, key: str, token: str) -> set[str]:
    """The tenants of the items a list answers (items name theirs)."""
    answer = world.ok("GET", path, token=token)
    tenants = set()
    for item in answer[key]:
        if "tenant" in item:
            tenants.add(item["tenant"])
        elif "job" in item:  # a schedule names its job's tenant
            tenants.add(item["job"]["tenant"])
        else:
            tenants.add(item["name"])
    return tenants


LISTS = (
    ("/v1/jobs", "jobs"),
    ("/v1/jobs?status=dead_letter", "jobs"),
    ("/v1/jobs?idempotency_key=order:1&tenant=acme", "jobs"),
    ("/v1/jobs?idempotency_key=order:1&tenant=globex", "jobs"),
    ("/v1/schedules", "schedules"),
    ("/v1/workflows", "workflows"),
    ("/v1/tenants", "tenants"),
)


@pytest.mark.parametrize("tenant", TENANTS)
@pytest.mark.parametrize("role", ["submitter", "viewer", "operator"])
def test_a_scoped_token_lists_only_its_tenant(world: World, tenant: str, role: str) -> None:
    token = world.token(role, tenant)
    for path, key in LISTS:
        seen = listed_tenants(world, path, key, token)
        looked_up = "idempotency_key" in path
        mine = not looked_up or path.endswith(tenant)
        assert seen == ({tenant} if mine else set()), (path, seen)
    jobs = world.ok("GET", "/v1/jobs", token=token)["jobs"]
    assert {job["id"] for job in jobs} == {
        world.ids[tenant][k] for k in ("done", "dead", "pending")
    } | {job["id"] for job in jobs if job["workflow_id"] is not None}
    dead = world.ok("GET", "/v1/jobs?status=dead_letter", token=token)["jobs"]
    assert [job["id"] for job in dead] == [world.ids[tenant]["dead"]]
    # Tenants' figures: only its own tenant, whose counts are its own jobs.
    (own,) = world.ok("GET", "/v1/tenants", token=token)["tenants"]
    everyone = world.ok("GET", "/v1/tenants", token=world.cluster.admin_token)["tenants"]
    assert own == next(t for t in everyone if t["name"] == tenant)
    assert own["weight"] == 2 and own["queued"] >= 1


def test_a_worker_lists_nothing_but_reads_effects_of_its_tenant_only(world: World) -> None:
    for tenant in TENANTS:
        worker = world.token("worker", tenant)
        status, body = world.call("GET", f"/v1/effects/{world.ids[tenant]['effect']}", token=worker)
        assert status == 200, body
        foreign = world.ids[other(tenant)]["effect"]
        status, body = world.call("GET", f"/v1/effects/{foreign}", token=worker)
        assert status == 404
        status, body = world.call(
            "POST", "/v1/leases", {"worker_id": "x", "queues": [f"{other(tenant)}-q"]}, token=worker
        )
        assert status == 403


def refusal(world: World, method: str, path: str, token: str, body: Any = None) -> dict[str, Any]:
    status, answer = world.call(method, path, body, token=token)
    assert status == 404, (method, path, status, answer)
    assert answer["error"]["code"] == "not_found"
    return answer


@pytest.mark.parametrize("tenant", TENANTS)
def test_the_other_tenants_ids_are_404_exactly_like_missing_ones(world: World, tenant: str) -> None:
    theirs = world.ids[other(tenant)]
    missing = {
        "pending": "job_01JZZZZZZZZZZZZZZZZZZZZZZZ",
        "dead": "job_01JZZZZZZZZZZZZZZZZZZZZZZY",
        "done": "job_01JZZZZZZZZZZZZZZZZZZZZZZX",
        "schedule": "no-such-schedule",
        "workflow": "wf_01JZZZZZZZZZZZZZZZZZZZZZZZ",
        "effect": "no:such-effect",
    }
    reason = {"reason": "isolation test"}
    probes = [
        ("submitter", "GET", "/v1/jobs/{done}", None),
        ("viewer", "GET", "/v1/jobs/{done}/history", None),
        ("submitter", "POST", "/v1/jobs/{pending}/cancel", reason),
        ("operator", "POST", "/v1/jobs/{dead}/replay", reason),
        ("viewer", "GET", "/v1/schedules/{schedule}", None),
        ("viewer", "GET", "/v1/schedules/{schedule}/occurrences", None),
        ("operator", "POST", "/v1/schedules/{schedule}/trigger", {}),
        ("submitter", "DELETE", "/v1/schedules/{schedule}", None),
        ("viewer", "GET", "/v1/workflows/{workflow}", None),
        ("viewer", "GET", "/v1/workflows/{workflow}/history", None),
        ("submitter", "POST", "/v1/workflows/{workflow}/cancel", reason),
        ("viewer", "GET", "/v1/effects/{effect}", None),
        ("viewer", "GET", f"/v1/tenants/{other(tenant)}", None),
    ]
    for role, method, template, body in probes:
        token = world.token(role, tenant)
        foreign = refusal(world, method, template.format(**theirs), token, body)
        absent = refusal(world, method, template.format(**missing), token, body)
        # The same answer, but for the id itself.
        for key, value in missing.items():
            absent = _replace(absent, value, theirs[key])
        assert foreign == absent, (template, foreign, absent)
    # Nothing happened to the other tenant's objects.
    admin = world.cluster.admin_token
    assert world.ok("GET", f"/v1/jobs/{theirs['pending']}", token=admin)["job"]["status"] == (
        "pending"
    )
    assert world.ok("GET", f"/v1/jobs/{theirs['dead']}", token=admin)["job"]["status"] == (
        "dead_letter"
    )
    assert world.call("GET", f"/v1/schedules/{theirs['schedule']}", token=admin)[0] == 200


def _replace(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, dict):
        return {k: _replace(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, old, new) for v in value]
    return value


@pytest.mark.parametrize("tenant", TENANTS)
def test_the_event_stream_carries_only_the_tenants_events(world: World, tenant: str) -> None:
    token = world.token("operator", tenant)
    events = world.ok("GET", "/v1/events?after=0&limit=1000&wait_s=0", token=token)["events"]
    assert events
    assert {event["data"].get("tenant") for event in events} == {tenant}
    succeeded = world.ok("GET", "/v1/events?after=0&types=job.succeeded&wait_s=0", token=token)[
        "events"
    ]
    assert [event["data"]["job_id"] for event in succeeded] == [world.ids[tenant]["done"]]
    # An operator with every tenant gets both tenants' job.succeeded.
    both = world.ok(
        "GET", "/v1/events?after=0&types=job.succeeded&wait_s=0", token=world.cluster.admin_token
    )["events"]
    assert {event["data"]["job_id"] for event in both} >= {world.ids[t]["done"] for t in TENANTS}


def test_a_star_viewer_sees_both_tenants_and_cluster_views(world: World) -> None:
    viewer = world.token("viewer", "*")
    for path, key in LISTS:
        seen = listed_tenants(world, path, key, viewer)
        if "idempotency_key" in path:
            assert len(seen) == 1, (path, seen)
        else:
            assert seen >= set(TENANTS), (path, seen)
    for tenant in TENANTS:
        assert world.call("GET", f"/v1/jobs/{world.ids[tenant]['done']}", token=viewer)[0] == 200
        assert (
            world.call("GET", f"/v1/effects/{world.ids[tenant]['effect']}", token=viewer)[0] == 200
        )
    assert "raftsched_jobs" in metrics_text(world.url, token=viewer)
    assert world.call("GET", "/v1/overview", token=viewer)[0] == 200
    for path in ("/metrics", "/v1/overview"):
        for tenant in TENANTS:
            scoped = world.token("viewer", tenant)
            status, body = world.call("GET", path, token=scoped)  # a JSON error, even for /metrics
            assert status == 403, (path, tenant, status)
            assert body["error"]["code"] == "forbidden"
