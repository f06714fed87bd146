"""Bad input from outside, against a real 3-node cluster.

Every field of every request body that `openapi.json` documents is sent with
values of each wrong JSON type and, for numbers, just past its documented
range and at +-1e308. Each must be answered `400 invalid_request` naming the
field (never a 5xx), and the whole sweep must commit nothing. The sweep is
generated from the documented schemas, so a field added to a schema is
swept without touching this file; an operation with a body that this file
has no valid base body for fails the test.

The five cases found by testing from outside are also written out plainly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from e2e_support import REPO_ROOT, cluster_env

from raftsched.testing import LocalCluster, http_json

SPEC: dict[str, Any] = json.loads((REPO_ROOT / "docs" / "openapi.json").read_text("utf-8"))
SCHEMAS: dict[str, Any] = SPEC["components"]["schemas"]

Path = tuple[str | int, ...]

# One value of each JSON type; a property is sent every one its schema does not allow.
SAMPLES: dict[str, Any] = {
    "object": {"x": 1},
    "array": [1],
    "string": "text",
    "boolean": True,
    "integer": 7,
    "number": 1.5,
    "null": None,
}
# The JSON types each schema type admits (an integer is also a number).
ADMITS: dict[str, set[str]] = {
    "object": {"object"},
    "array": {"array"},
    "string": {"string"},
    "boolean": {"boolean"},
    "integer": {"integer"},
    "number": {"integer", "number"},
    "null": {"null"},
}
HUGE = 1e308
# Sent at its maximum, a claim on an empty queue would wait that long.
UNBOUNDED_WAITS = frozenset({"wait_s"})
# A schedule's job template documents these JobRequest fields as not allowed.
TEMPLATE_EXCLUDES = frozenset({"idempotency_key", "run_at", "delay_s"})


# -- the cluster ----------------------------------------------------------------------


@dataclass
class Live:
    cluster: LocalCluster
    ids: dict[str, Any] = field(default_factory=dict)

    def leader_url(self) -> str:
        return self.cluster.nodes[self.cluster.wait_for_leader(timeout_s=30)].http_url

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request to the leader, following a redirect or waiting out an election."""
        deadline = time.monotonic() + 30
        while True:
            status, answer, headers = http_json(method, self.leader_url() + path, body, 10)
            if status == 307:
                status, answer, headers = http_json(method, headers["Location"], body, 10)
            if status != 503 or time.monotonic() > deadline:
                return status, answer
            time.sleep(0.1)

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self.call(method, path, body)
        assert 200 <= status < 300, (method, path, body, status, answer)
        return answer


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    local = LocalCluster(tmp_path_factory.mktemp("bad-input") / "cluster", env=cluster_env())
    local.start()
    try:
        local.wait_for_leader(timeout_s=30)
        # The leader bootstraps the admin token once the cluster version
        # allows it: a commit the sweep's before-and-after must not see.
        local.wait_for_auth(timeout_s=30)
        yield Live(local)
        errors = [line for line in local.logs().splitlines() if _is_error_line(line)]
        assert not errors, "error-level log lines:\n" + "\n".join(errors[:20])
    finally:
        local.stop()


def _is_error_line(line: str) -> bool:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError:
        return " ERROR " in line or " CRITICAL " in line
    return isinstance(entry, dict) and entry.get("level") in ("error", "critical")


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _leased_job(live: Live, queue: str) -> tuple[str, int]:
    job = live.ok("POST", "/v1/jobs", {"queue": queue, "payload": {"n": 1}})["job"]
    claim = {"worker_id": "w-bad-input", "queues": [queue], "wait_s": 5, "lease_s": 600}
    leases = live.ok("POST", "/v1/leases", claim)["leases"]
    assert [lease["job_id"] for lease in leases] == [job["id"]]
    return job["id"], leases[0]["fencing_token"]


def _schedule(schedule_id: str, **fields: Any) -> dict[str, Any]:
    """A schedule that never fires by itself (paused, once a year)."""
    return {
        "id": schedule_id,
        "cron": "0 0 1 1 *",
        "paused": True,
        "job": {"queue": "bad-input-scheduled"},
        **fields,
    }


def _error(answer: Any) -> dict[str, Any]:
    assert isinstance(answer, dict) and isinstance(answer.get("error"), dict), answer
    return answer["error"]


# -- the five reported cases ---------------------------------------------------------------


def test_fail_with_an_object_as_error_kind_is_400_and_keeps_the_lease(live: Live) -> None:
    job_id, token = _leased_job(live, "bad-input-fail")
    for kind in ({}, [], ["transient"]):
        body = {"fencing_token": token, "error": {"kind": kind}}
        status, answer = live.call("POST", f"/v1/leases/{job_id}/fail", body)
        assert status == 400, (kind, status, answer)
        assert _error(answer)["code"] == "invalid_request"
        assert _error(answer)["details"]["field"] == "error.kind"
    job = live.ok("GET", f"/v1/jobs/{job_id}")["job"]
    assert job["status"] == "claimed" and job["lease"]["fencing_token"] == token


def test_lease_batch_with_an_object_as_kind_or_op_fails_only_that_op(live: Live) -> None:
    job_id, token = _leased_job(live, "bad-input-batch")
    ops = [
        {"op": "fail", "job_id": job_id, "fencing_token": token, "error": {"kind": {}}},
        {"op": {}, "job_id": job_id, "fencing_token": token},
        {"op": ["start"], "job_id": job_id, "fencing_token": token},
    ]
    status, answer = live.call("POST", "/v1/leases/batch", {"ops": ops})
    assert status == 200, (status, answer)
    fields = [_error(result)["details"]["field"] for result in answer["results"]]
    assert fields == ["ops[0].error.kind", "ops[1].op", "ops[2].op"]
    assert {_error(result)["code"] for result in answer["results"]} == {"invalid_request"}
    assert live.ok("GET", f"/v1/jobs/{job_id}")["job"]["status"] == "claimed"


@pytest.mark.parametrize(
    ("change", "expected_field"),
    [
        ({"catchup": {"policy": {}}}, "catchup.policy"),
        ({"catchup": {"policy": ["all"]}}, "catchup.policy"),
        ({"overlap": {}}, "overlap"),
        ({"overlap": ["skip"]}, "overlap"),
    ],
)
def test_schedule_with_an_object_or_list_as_policy_is_400(
    live: Live, change: dict[str, Any], expected_field: str
) -> None:
    schedule_id = "bad-input-policy"
    status, answer = live.call("POST", "/v1/schedules", _schedule(schedule_id, **change))
    assert status == 400, (status, answer)
    assert _error(answer)["code"] == "invalid_request"
    assert _error(answer)["details"]["field"] == expected_field
    assert live.call("GET", f"/v1/schedules/{schedule_id}")[0] == 404


def test_backfill_with_an_object_as_overlap_is_400(live: Live) -> None:
    schedule_id = "bad-input-backfill"
    live.ok("POST", "/v1/schedules", _schedule(schedule_id))
    before = live.ok("GET", f"/v1/schedules/{schedule_id}/occurrences")
    now = datetime.now(UTC)
    body = {"from": _iso(now - timedelta(days=800)), "to": _iso(now), "overlap": {}}
    status, answer = live.call("POST", f"/v1/schedules/{schedule_id}/backfill", body)
    assert status == 400, (status, answer)
    assert _error(answer)["code"] == "invalid_request"
    assert _error(answer)["details"]["field"] == "overlap"
    assert live.ok("GET", f"/v1/schedules/{schedule_id}/occurrences") == before


@pytest.mark.parametrize("rate", [1e308, -1e308, 1_000_000.001, 0.0009, True, "10", {}])
def test_queue_rate_limit_out_of_range_or_of_wrong_type_is_400(live: Live, rate: Any) -> None:
    name = "bad-input-rate"
    live.ok("PUT", f"/v1/queues/{name}", {"rate_limit_per_s": 5, "burst": 5})
    status, answer = live.call("PUT", f"/v1/queues/{name}", {"rate_limit_per_s": rate})
    assert status == 400, (rate, status, answer)
    assert _error(answer)["code"] == "invalid_request"
    assert _error(answer)["details"]["field"] == "rate_limit_per_s"
    queue = live.ok("GET", f"/v1/queues/{name}")["queue"]
    assert (queue["rate_limit_per_s"], queue["burst"]) == (5, 5)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/jobs?limit=%C2%B2",  # "²" is a digit to str.isdigit, not to int
        "/v1/jobs?limit=" + "9" * 5000,
        "/v1/schedules?limit=%C2%B2",
        "/v1/workflows?limit=%C2%B2",
        "/v1/events?limit=%C2%B2",
        "/v1/events?after=1.5",
        "/v1/overview?errors=%C2%B2",
    ],
)
def test_query_integers_that_are_not_ascii_digits_are_400(live: Live, path: str) -> None:
    status, answer = live.call("GET", path)
    assert status == 400, (path, status, answer)
    assert _error(answer)["code"] == "invalid_request"


# -- the schema-driven sweep ------------------------------------------------------------


def _deref(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = SCHEMAS[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _merge_all_of(schema: dict[str, Any]) -> dict[str, Any]:
    """allOf parts as one object schema (properties and required united)."""
    merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
    for part in (_deref(p) for p in schema["allOf"]):
        part = _merge_all_of(part) if "allOf" in part else part
        merged["properties"].update(part.get("properties", {}))
        merged["required"] += part.get("required", [])
        if "type" in part:
            merged["type"] = part["type"]
    return merged


def _with_job_fields(schema: dict[str, Any]) -> dict[str, Any]:
    """A schema built on JobRequest (a schedule's job template): its job
    fields are checked as JobRequest documents them, ranges included."""
    job = SCHEMAS["JobRequest"]["properties"]
    properties = {
        name: job.get(name, prop) if name != "compensation" else _with_job_fields(prop)
        for name, prop in schema.get("properties", {}).items()
    }
    return {**schema, "properties": properties}


def _effective(schema: dict[str, Any], base: Any) -> tuple[dict[str, Any], bool]:
    """The schema a value is checked against, and whether null is allowed."""
    schema = _deref(schema)
    nullable = False
    branches = [_deref(branch) for branch in schema.get("oneOf") or schema.get("anyOf") or ()]
    if branches and not any("type" in branch or "properties" in branch for branch in branches):
        # Branches that only require or forbid fields (a webhook's `url` and
        # `secret`, or a broker's `sink`): the base's branch, without the
        # fields it forbids.
        schema = _without_forbidden(schema, branches, base)
    elif branches:
        resolved = branches
        nullable = any(branch.get("type") == "null" for branch in resolved)
        resolved = [branch for branch in resolved if branch.get("type") != "null"]
        if len(resolved) > 1:  # a discriminated union: the branch of the base value
            key = schema["discriminator"]["propertyName"]
            resolved = [
                b for b in resolved if b["properties"][key].get("const") == (base or {}).get(key)
            ]
        assert len(resolved) == 1, schema
        schema = resolved[0]
    if "allOf" in schema:
        schema = _with_job_fields(_merge_all_of(schema))
    types = schema.get("type")
    if isinstance(types, list) and "null" in types:
        nullable = True
    return schema, nullable


def _without_forbidden(
    schema: dict[str, Any], branches: list[dict[str, Any]], base: Any
) -> dict[str, Any]:
    """`schema` without the properties that the branch `base` is in forbids
    (`not: {required}` or `not: {anyOf: [{required}]}`)."""
    given = base if isinstance(base, dict) else {}
    (branch,) = [b for b in branches if all(name in given for name in b.get("required", ()))]
    ruled_out = branch.get("not", {})
    forbidden = set(ruled_out.get("required", ()))
    for each in ruled_out.get("anyOf", ()):
        forbidden |= set(each.get("required", ()))
    properties = schema.get("properties", {})
    return {**schema, "properties": {k: v for k, v in properties.items() if k not in forbidden}}


def _types(schema: dict[str, Any]) -> set[str]:
    types = schema.get("type")
    if types is None:
        return set()
    return {t for t in ([types] if isinstance(types, str) else types) if t != "null"}


@dataclass(frozen=True)
class Case:
    path: Path  # where in the body the bad value goes
    value: Any
    field: str  # what details.field must say


def _field_name(path: Path) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "body"


@dataclass
class Sweep:
    cases: list[Case] = field(default_factory=list)
    bounds: list[Case] = field(default_factory=list)  # must be accepted
    undocumented_ranges: list[str] = field(default_factory=list)

    def value(self, schema: dict[str, Any], base: Any, path: Path, report_as: Path) -> None:
        """Bad values for the value at `path` (reported at `report_as`), then
        recursively for what it holds."""
        schema, nullable = _effective(schema, base)
        types = _types(schema)
        if not types:
            return  # any JSON value is allowed (payload, result, progress)
        admitted = set().union(*(ADMITS[t] for t in types)) | ({"null"} if nullable else set())
        name = _field_name(report_as)
        for kind, sample in SAMPLES.items():
            if kind not in admitted:
                self.cases.append(Case(path, sample, name))
        if "enum" in schema or "const" in schema:
            self.cases.append(Case(path, "not-one-of-the-choices", name))
        if types & {"integer", "number"}:
            self.numbers(schema, types, path, name)
        if "object" in types:
            self.object(schema, base if isinstance(base, dict) else {}, path)
        if "array" in types and "items" in schema:
            self.array(schema["items"], base, path)

    def numbers(self, schema: dict[str, Any], types: set[str], path: Path, name: str) -> None:
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is None or high is None:
            self.undocumented_ranges.append(name)
        step = 1 if "number" not in types else 0.001
        for bad in (HUGE, -HUGE):
            self.cases.append(Case(path, bad, name))
        if low is not None and low - step > -HUGE:
            self.cases.append(Case(path, low - step, name))
        if high is not None and high + step < HUGE:
            self.cases.append(Case(path, high + step, name))
        excluded = len(path) > 1 and path[-2] == "job" and path[-1] in TEMPLATE_EXCLUDES
        if path[-1] not in UNBOUNDED_WAITS and not excluded:
            self.bounds += [Case(path, bound, name) for bound in (low, high) if bound is not None]

    def object(self, schema: dict[str, Any], base: dict[str, Any], path: Path) -> None:
        for prop, prop_schema in schema.get("properties", {}).items():
            self.value(prop_schema, base.get(prop), (*path, prop), (*path, prop))
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and _types(extra):  # a map of typed values (labels)
            name = _field_name(path)
            for kind, sample in SAMPLES.items():
                if kind not in set().union(*(ADMITS[t] for t in _types(extra))):
                    self.cases.append(Case((*path, "some-key"), sample, name))

    def array(self, items: dict[str, Any], base: Any, path: Path) -> None:
        first = base[0] if isinstance(base, list) and base else None
        item_schema, _ = _effective(items, first)
        if "object" in _types(item_schema):
            # An item that is not an object is named by its index; its fields by their path.
            self.value(items, first, (*path, 0), (*path, 0))
        else:
            # A bad scalar item is reported as the list it is in.
            self.value(items, first, (*path, 0), path)


def _apply(base: Any, path: Path, value: Any) -> Any:
    """`base` with the value at `path` replaced (objects on the way made if absent)."""
    body = json.loads(json.dumps(base))  # a tree: no part shared with another
    target = body
    for part in path[:-1]:
        target = target[part] if isinstance(part, int) else target.setdefault(part, {})
    if isinstance(target, list) and path[-1] == len(target):
        target.append(value)  # an item of an empty list
    else:
        target[path[-1]] = value
    if path[-1] == "interval_s":  # exactly one of cron and interval_s
        target.pop("cron", None)
    return body


# Documented rules between two fields, for the bounds to be valid requests.
PARTNERS = {  # backoff: max_s must not be less than initial_s
    "initial_s": ("max_s", 2_592_000),
    "max_s": ("initial_s", 0),
}


def _with_partner(body: Any, case: Case) -> Any:
    partner = PARTNERS.get(str(case.path[-1]))
    return body if partner is None else _apply(body, (*case.path[:-1], partner[0]), partner[1])


def _request_schemas() -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for path, operations in SPEC["paths"].items():
        for method, operation in operations.items():
            if isinstance(operation, dict) and "requestBody" in operation:
                schema = operation["requestBody"]["content"]["application/json"]["schema"]
                found.append((method.upper(), path, schema))
    return found


BACKOFF = {"initial_s": 1, "max_s": 60, "jitter_s": 0.5}
JOB_TEMPLATE = {
    "queue": "bad-input-made",
    "payload": {"n": 1},
    "priority": 1,
    "max_attempts": 3,
    "backoff": BACKOFF,
    "lease_s": 30,
    "deadline_s": 3600,
    "tenant": "bad-input-tenant",
    "ordering_key": "key-1",
    "correlation_id": "corr-1",
    "labels": {"team": "sweep"},
    "on_unknown": "reconcile",
    "reconcile_queue": "bad-input-reconcile",
}
JOB = {**JOB_TEMPLATE, "idempotency_key": "bad-input-job"}
STEP_JOB = {k: v for k, v in JOB_TEMPLATE.items() if k != "tenant"}
CATCHUP = {"policy": "latest", "window_s": 3600, "max_runs": 10, "grace_s": 30}
# The claim that may ride on complete, fail and a lease batch (from a queue kept empty).
NEXT_CLAIM = {
    "worker_id": "w-bad-input",
    "queues": ["bad-input-empty"],
    "max_jobs": 2,
    "wait_s": 0,
    "lease_s": 30,
}


def _bases(live: Live) -> dict[tuple[str, str], list[tuple[dict[str, str], Any]]]:
    """A valid base body (and path parameters) for every operation with a body."""
    ids = live.ids
    job, token = ids["job"], ids["token"]
    now = datetime.now(UTC)
    schedule = _schedule(
        "bad-input-new",
        timezone="UTC",
        start_at=_iso(now - timedelta(days=1)),
        end_at=_iso(now + timedelta(days=3650)),
        jitter_s=0,
        overlap="skip",
        catchup=CATCHUP,
        job=JOB_TEMPLATE | {"tenant": "bad-input-tenant"},
    )
    on_job = {"job_id": job}
    op_bases = {
        "start": {"fencing_token": token},
        "heartbeat": {"fencing_token": token, "extend_s": 60, "progress": {"p": 1}},
        "complete": {"fencing_token": token, "result": {"ok": True}},
        "fail": {
            "fencing_token": token,
            "error": {"kind": "transient", "message": "m", "retry_after_s": 1},
        },
        # The job is not reconciling: the valid base answers 409 lease_lost.
        "reconcile": {
            "fencing_token": token,
            "decision": "happened",
            "result": {"charge": "ch_1"},
            "effects": [{"key": "bad-input-reconciled", "result": {"ok": True}}],
            "reason": "provider lists it",
        },
    }
    step = {
        **STEP_JOB,
        "name": "first",
        "depends_on": [],
        "compensation": {"queue": "bad-input-undo", "backoff": BACKOFF, "labels": {"a": "b"}},
    }
    return {
        ("POST", "/v1/jobs"): [({}, JOB)],
        ("POST", "/v1/jobs/batch"): [({}, {"jobs": [JOB]})],
        ("POST", "/v1/jobs/{job_id}/cancel"): [(on_job, {"reason": "sweep"})],
        ("POST", "/v1/jobs/{job_id}/replay"): [(on_job, {"reason": "sweep", "reconciled": True})],
        ("POST", "/v1/jobs/{job_id}/reconcile"): [(on_job, {"reason": "sweep"})],
        ("POST", "/v1/leases"): [
            ({}, {"worker_id": "w", "queues": ["bad-input-empty"], "max_jobs": 2, "wait_s": 0})
        ],
        **{
            ("POST", f"/v1/leases/{{job_id}}/{op}"): [
                (on_job, body | ({"next": NEXT_CLAIM} if op in ("complete", "fail") else {}))
            ]
            for op, body in op_bases.items()
        },
        ("POST", "/v1/leases/batch"): [
            ({}, {"ops": [{"op": op, "job_id": job, **body}], "next": NEXT_CLAIM})
            for op, body in op_bases.items()
        ],
        ("POST", "/v1/effects"): [
            ({}, {"key": "bad-input-effect", "job_id": job, "fencing_token": token, "result": 1})
        ],
        ("POST", "/v1/workflows"): [
            (
                {},
                {
                    "idempotency_key": "bad-input-wf",
                    "tenant": "bad-input-tenant",
                    "timeout_s": 3600,
                    "on_failure": "continue",
                    "compensate_on_cancel": True,
                    "steps": [step],
                },
            )
        ],
        ("POST", "/v1/workflows/{workflow_id}/cancel"): [
            ({"workflow_id": ids["workflow"]}, {"reason": "sweep"})
        ],
        ("POST", "/v1/subscriptions"): [
            (
                {},
                {
                    "id": "bad-input-sub",
                    "url": "http://127.0.0.1:9/hook",
                    "types": ["schedule.missed"],
                    "secret": "not-a-real-secret",
                },
            ),
            # A broker relay's subscription (docs/relays.md): its sink's fields.
            (
                {},
                {
                    "id": "bad-input-relay",
                    "sink": {"kind": "redis", "url": "redis://127.0.0.1:9/0", "stream": "bad"},
                    "tenants": ["bad-input-tenant"],
                    "key_field": "payment_id",
                },
            ),
        ],
        ("PUT", "/v1/queues/{name}"): [
            (
                {"name": "bad-input-queue"},
                {
                    "paused": False,
                    "rate_limit_per_s": 10,
                    "burst": 20,
                    "concurrency_limit": 5,
                    "circuit_window": 8,
                    "circuit_probe_interval_s": 5,
                    "on_unknown": "retry",
                },
            )
        ],
        ("PUT", "/v1/tenants/{name}"): [
            (
                {"name": "bad-input-tenant"},
                {"weight": 2, "concurrency_limit": 10, "max_queued": 99, "on_unknown": "retry"},
            )
        ],
        ("PUT", "/v1/wheel"): [({}, {"horizon_s": 600, "bucket_s": 3600})],
        ("POST", "/v1/tokens"): [
            (
                {},
                {
                    "name": "bad-input-token",
                    "role": "viewer",
                    "tenants": ["bad-input-tenant"],
                    "queues": ["*"],
                    "expires_at": _iso(now + timedelta(hours=1)),
                },
            )
        ],
        # An existing member's id: every bad value is still refused 400 for
        # its field, and the valid base (the positive control) is refused
        # 409 duplicate_id instead of adding a member that never starts.
        ("POST", "/v1/cluster/nodes"): [
            ({}, {"id": "n1", "raft_address": "127.0.0.1:9", "http_url": "http://127.0.0.1:9"})
        ],
        ("POST", "/v1/schedules"): [({}, schedule)],
        ("POST", "/v1/schedules/batch"): [({}, {"schedules": [schedule | {"id": "bad-input-b"}]})],
        ("PUT", "/v1/schedules/{schedule_id}"): [
            ({"schedule_id": ids["schedule"]}, schedule | {"id": ids["schedule"]})
        ],
        ("POST", "/v1/schedules/{schedule_id}/backfill"): [
            (
                {"schedule_id": ids["schedule"]},
                {
                    "from": _iso(now - timedelta(hours=2)),
                    "to": _iso(now - timedelta(hours=1)),
                    "overlap": "skip",
                },
            )
        ],
    }


def _committed(live: Live) -> dict[str, Any]:
    """What the sweep must not change (only committed state; no live figures)."""
    queues = live.ok("GET", "/v1/queues")["queues"]
    settings = ("name", "depth", "running", "paused", "rate_limit_per_s", "burst")
    return {
        "jobs": live.ok("GET", "/v1/jobs?limit=1000")["jobs"],
        "schedules": live.ok("GET", "/v1/schedules?limit=1000")["schedules"],
        "workflows": live.ok("GET", "/v1/workflows?limit=1000")["workflows"],
        "subscriptions": live.ok("GET", "/v1/subscriptions")["subscriptions"],
        "queues": [
            {**{k: q[k] for k in settings}, "concurrency_limit": q["concurrency_limit"]}
            | {"circuit": None if q["circuit"] is None else q["circuit"]["window"]}
            for q in queues
        ],
        "tenants": live.ok("GET", "/v1/tenants")["tenants"],
        # (ids only: a token's last_used_at moves with every request)
        "tokens": [token["id"] for token in live.ok("GET", "/v1/tokens")["tokens"]],
        "last_event_seq": live.ok("GET", "/v1/events?limit=1")["last_seq"],
        "effect": live.call("GET", "/v1/effects/bad-input-effect")[0],
    }


def _target(template: str, params: dict[str, str]) -> str:
    for name, value in params.items():
        template = template.replace("{" + name + "}", value)
    return template


@pytest.mark.slow
def test_every_field_of_every_request_body_rejects_wrong_types_and_ranges(live: Live) -> None:
    job, token = _leased_job(live, "bad-input-target")
    live.ids.update(job=job, token=token)
    live.ids["schedule"] = "bad-input-target"
    live.ok("POST", "/v1/schedules", _schedule("bad-input-target"))
    live.ids["workflow"] = live.ok(
        "POST", "/v1/workflows", {"steps": [{"name": "only", "queue": "bad-input-wf-target"}]}
    )["workflow"]["id"]
    live.ok("PUT", "/v1/queues/bad-input-queue", {"concurrency_limit": 3})
    live.ok("PUT", "/v1/tenants/bad-input-tenant", {"weight": 3})
    bases = _bases(live)
    operations = _request_schemas()
    assert {(m, p) for m, p, _ in operations} == set(bases), "a base body per operation"

    before = _committed(live)
    started = time.monotonic()
    failures: list[str] = []
    undocumented: set[str] = set()
    bounds: list[tuple[str, str, dict[str, str], Any]] = []
    sent = 0
    for method, template, schema in operations:
        for params, base in bases[(method, template)]:
            sweep = Sweep()
            sweep.value(schema, base, (), ())
            undocumented.update(
                f"{method} {template}: {name}" for name in sweep.undocumented_ranges
            )
            bounds += [
                (method, template, params, _with_partner(_apply(base, case.path, case.value), case))
                for case in sweep.bounds
            ]
            in_slot = template == "/v1/leases/batch"  # a bad op fails in its slot
            for case in sweep.cases:
                if not case.path and case.value is None:
                    continue  # a JSON null body cannot be told from no body here
                body = _apply(base, case.path, case.value) if case.path else case.value
                status, answer = live.call(method, _target(template, params), body)
                sent += 1
                if in_slot and case.path[:2] == ("ops", 0) and status == 200:
                    answer = answer["results"][0]
                    status = 400 if "error" in answer else 200
                error = answer.get("error") if isinstance(answer, dict) else None
                if (
                    status != 400
                    or not isinstance(error, dict)
                    or error.get("code") != "invalid_request"
                    or error.get("details", {}).get("field") != case.field
                ):
                    failures.append(
                        f"{method} {template} {_field_name(case.path)}={case.value!r}: "
                        f"{status} {json.dumps(answer)[:300]} (want field {case.field})"
                    )
    elapsed = time.monotonic() - started
    assert not failures, f"{len(failures)} of {sent} bad requests:\n" + "\n".join(failures[:40])
    assert not undocumented, "numbers without a documented range: " + ", ".join(undocumented)
    assert _committed(live) == before, "the bad requests changed committed state"
    assert sent > 1000, sent  # the sweep did sweep
    print(f"{sent} bad requests in {elapsed:.1f} s")

    # Positive control: each base body passes validation (so every bad case
    # above was rejected for its one bad value, not for something in the base),
    # and so does each number at its documented minimum and maximum (so the
    # documented range is the enforced one, not a narrower one).
    controls = [(m, t, params, base) for m, t, _ in operations for params, base in bases[(m, t)]]
    for method, template, params, body in controls + bounds:
        status, answer = live.call(method, _target(template, params), body)
        if template == "/v1/leases/batch" and status == 200:
            answer = answer["results"][0]
        code = answer.get("error", {}).get("code") if isinstance(answer, dict) else None
        assert status < 500 and code != "invalid_request", (method, template, body, answer)
    live.call("DELETE", "/v1/subscriptions/bad-input-sub")
    print(f"{len(controls)} base bodies and {len(bounds)} documented bounds accepted")
