"""The OpenAPI description matches the routes the app serves.

Two copies exist: `src/raftsched/static/openapi.json` (served at `/openapi.json`)
and `docs/openapi.json` (for readers of the repository). They must be identical,
and their `paths` must list exactly the (method, path) pairs registered in the
aiohttp route tables.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate as validate_description

ROOT = Path(__file__).resolve().parents[2]
SERVED = ROOT / "src" / "raftsched" / "static" / "openapi.json"
DOCS = ROOT / "docs" / "openapi.json"

HTTP_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})

# Modules being written in parallel with the API. Only an import failure that
# originates in one of them skips the route test; any other failure is a bug.
PENDING_MODULES = ("raftsched.raft", "raftsched.core")


def _load(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as handle:
        document = json.load(handle)
    assert isinstance(document, dict)
    return document


def _pending(name: str | None) -> bool:
    return name is not None and any(
        name == module or name.startswith(module + ".") for module in PENDING_MODULES
    )


def _route_tables() -> list[Any]:
    """Every route table of the API: each module of `raftsched.api` with a
    `routes` table (a new module's routes are checked without a change here)."""
    import raftsched.api

    tables = []
    for info in pkgutil.iter_modules(raftsched.api.__path__):
        name = f"raftsched.api.{info.name}"
        try:
            module = importlib.import_module(name)
        except ImportError as error:
            if _pending(error.name):
                pytest.skip(f"cannot import {name} yet: {error} ({error.name} is being written)")
            raise
        if isinstance(getattr(module, "routes", None), web.RouteTableDef):
            tables.append(module.routes)
    assert len(tables) >= 12, tables
    return tables


def _openapi_path(aiohttp_path: str) -> str:
    """`/v1/jobs/{job_id}` stays as is; `{name:regex}` becomes `{name}`."""
    return re.sub(r"\{([^}:]+):[^}]*\}", r"{\1}", aiohttp_path)


def _documented(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


def test_copies_are_identical_and_parse() -> None:
    assert SERVED.read_bytes() == DOCS.read_bytes(), (
        "src/raftsched/static/openapi.json and docs/openapi.json differ; copy one over the other"
    )
    document = _load(SERVED)
    assert document["openapi"].startswith("3.1.")
    assert document["paths"]


def test_the_description_is_valid_openapi_3_1() -> None:
    validate_description(_load(SERVED))


_SCHEDULE = {
    "id": "nightly-settlement",
    "cron": "0 2 * * *",
    "interval_s": None,
    "timezone": "America/New_York",
    "jitter_s": 0,
    "overlap": "skip",
    "catchup": {"policy": "latest", "window_s": 3600, "max_runs": 10},
    "paused": False,
    "job": {"queue": "settlement", "payload": {}, "priority": 0, "max_attempts": 3},
}

# One body per operation that takes one, each a request the server accepts
# (the shapes of docs/api.md). A request schema that rejects its body here
# promises a request nobody can send.
ACCEPTED_BODIES: dict[str, Any] = {
    "submitJob": {"queue": "payments", "payload": {"amount": 1200}, "idempotency_key": "k:1",
                  "delay_s": 30, "backoff": {"initial_s": 1, "max_s": 300}, "tenant": "acme",
                  "labels": {"team": "billing"}, "kind": "charge"},
    "submitJobs": {"jobs": [{"queue": "payments"}, {"queue": "payments", "priority": 5}]},
    "cancelJob": {"reason": "customer asked"},
    "reconcileJob": {"reason": "the provider answers again"},
    "replayJob": {"reason": "the bug is fixed", "reconciled": False},
    "claimLeases": {"worker_id": "w1", "queues": ["payments"], "max_jobs": 10, "wait_s": 20,
                    "lease_s": 30, "kinds": ["charge", "email.send:v2", None, "*"],
                    "kind_max_jobs": {"charge": 2}},
    "startLease": {"fencing_token": 1042},
    "heartbeatLease": {"fencing_token": 1042, "extend_s": 30, "progress": {"done": 3}},
    "completeLease": {"fencing_token": 1042, "result": {"charge": "ch_1"},
                      "next": {"queues": ["payments"], "max_jobs": 2, "wait_s": 5}},
    "failLease": {"fencing_token": 1042,
                  "error": {"kind": "transient", "message": "timeout", "retry_after_s": 10},
                  "next": {"queues": ["payments"], "worker_id": "w1", "lease_s": 30,
                           "kinds": ["charge"]}},
    "reconcileLease": {"fencing_token": 1043, "decision": "happened", "result": {"charge": "ch_1"},
                       "effects": [{"key": "charge:pay_1", "result": {"charge": "ch_1"}}],
                       "reason": "the provider lists ch_1 for pay_1"},
    "leaseBatch": {"ops": [
        {"op": "start", "job_id": "job_1", "fencing_token": 1},
        {"op": "heartbeat", "job_id": "job_2", "fencing_token": 2, "extend_s": 30},
        {"op": "complete", "job_id": "job_3", "fencing_token": 3, "result": None},
        {"op": "fail", "job_id": "job_4", "fencing_token": 4, "error": {"kind": "permanent"}},
        {"op": "reconcile", "job_id": "job_5", "fencing_token": 5, "decision": "cannot_tell",
         "reason": "the provider is down"},
    ], "next": {"worker_id": "w1", "queues": ["payments"], "max_jobs": 5, "wait_s": 0}},
    "recordEffect": {"key": "charge:pay_1", "job_id": "job_1", "fencing_token": 1042,
                     "result": {"charge": "ch_1"}},
    "submitWorkflow": {
        "idempotency_key": "order:77", "tenant": "acme", "timeout_s": 3600,
        "on_failure": "fail_fast",
        "steps": [
            {"name": "reserve", "queue": "inventory", "payload": {}, "kind": "reserve"},
            {"name": "charge", "queue": "payments", "payload": {}, "depends_on": ["reserve"],
             "compensation": {"queue": "payments", "payload": {"refund": True},
                              "kind": "refund"}},
            {"name": "ship", "queue": "shipping", "depends_on": ["charge"]},
        ],
    },
    "cancelWorkflow": {"reason": "order withdrawn"},
    "createSubscription": {"url": "http://127.0.0.1:9000/hook", "types": ["job.succeeded"],
                           "secret": "s3cret-s3cret-s3cret"},
    "setQueue": {"paused": False, "rate_limit_per_s": 100, "burst": 200, "concurrency_limit": 50},
    "setTenant": {"weight": 1, "concurrency_limit": 100, "max_queued": 100000},
    "setWheel": {"horizon_s": 600, "bucket_s": 3600},
    "createSchedule": _SCHEDULE,
    "createSchedules": {"schedules": [_SCHEDULE, {**_SCHEDULE, "id": "hourly"}]},
    "updateSchedule": _SCHEDULE,
    "createToken": {"name": "payments-api", "role": "submitter", "tenants": ["acme"],
                    "queues": ["*"], "expires_at": None},
    "addClusterNode": {"id": "n4", "raft_address": "10.0.0.4:7000",
                       "http_url": "http://10.0.0.4:8080"},
    "backfillSchedule": {"from": "2026-11-30T00:00:00Z", "to": "2026-12-01T00:00:00Z",
                         "overlap": "allow_all"},
}  # fmt: skip

# Bodies the server rejects with 400 that a loose schema would let through.
REJECTED_BODIES: list[tuple[str, Any]] = [
    ("replayJob", {}),
    ("replayJob", {"reason": ""}),
    ("submitWorkflow", {"steps": [{"name": "a", "queue": "q", "tenant": "acme"}]}),
    ("submitWorkflow", {"steps": [{"queue": "q"}]}),
    ("createSchedule", {**_SCHEDULE, "job": {"queue": "q", "idempotency_key": "k"}}),
    ("createSchedule", {**_SCHEDULE, "job": {"queue": "q", "delay_s": 5}}),
    # A claim rides only on an operation that ends a lease, and names its queues;
    # a batch's claim names its worker too.
    ("startLease", {"fencing_token": 1, "next": {"queues": ["q"]}}),
    ("heartbeatLease", {"fencing_token": 1, "next": {"queues": ["q"]}}),
    ("reconcileLease", {"fencing_token": 1, "decision": "cannot_tell", "next": {"queues": ["q"]}}),
    ("completeLease", {"fencing_token": 1, "next": {"max_jobs": 1}}),
    ("failLease", {"fencing_token": 1, "error": {"kind": "transient"},
                   "next": {"queues": ["q"], "wait_s": 61}}),
    ("leaseBatch", {"ops": [{"op": "start", "job_id": "j", "fencing_token": 1}],
                    "next": {"queues": ["q"]}}),
    ("leaseBatch", {"ops": [{"op": "complete", "job_id": "j", "fencing_token": 1,
                             "next": {"queues": ["q"]}}]}),
    # Kinds: 1 to 128 of A-Z a-z 0-9 _ . : -, a claim's each named once.
    ("submitJob", {"queue": "q", "kind": "two words"}),
    ("submitJob", {"queue": "q", "kind": ""}),
    ("submitJob", {"queue": "q", "kind": "k" * 129}),
    ("submitJobs", {"jobs": [{"queue": "q", "kind": "a/b"}]}),
    ("claimLeases", {"worker_id": "w", "queues": ["q"], "kinds": []}),
    ("claimLeases", {"worker_id": "w", "queues": ["q"], "kinds": ["a", "a"]}),
    ("claimLeases", {"worker_id": "w", "queues": ["q"], "kinds": ["a"],
                     "kind_max_jobs": {"a": -1}}),
]  # fmt: skip


def _request_schemas(document: dict[str, Any]) -> dict[str, Any]:
    """operationId -> the JSON request body's schema, for operations that take one."""
    return {
        operation["operationId"]: operation["requestBody"]["content"]["application/json"]["schema"]
        for item in document["paths"].values()
        for method, operation in item.items()
        if method in HTTP_METHODS and "requestBody" in operation
    }


def _validator(document: dict[str, Any], schema: dict[str, Any]) -> OAS31Validator:
    # The components travel with the schema so that its "#/components/..." references resolve.
    return OAS31Validator({**schema, "components": document["components"]})


def test_every_request_schema_admits_a_request_the_server_accepts() -> None:
    document = _load(SERVED)
    schemas = _request_schemas(document)
    assert sorted(schemas) == sorted(ACCEPTED_BODIES), "give every request body a case here"
    for operation_id, body in ACCEPTED_BODIES.items():
        errors = [
            f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
            for error in _validator(document, schemas[operation_id]).iter_errors(body)
        ]
        assert errors == [], f"{operation_id} rejects a valid request: {errors}"


@pytest.mark.parametrize(("operation_id", "body"), REJECTED_BODIES)
def test_request_schemas_reject_what_the_server_rejects(operation_id: str, body: Any) -> None:
    document = _load(SERVED)
    assert not _validator(document, _request_schemas(document)[operation_id]).is_valid(body)


def test_every_route_is_documented_and_every_documented_route_exists() -> None:
    registered = {
        (route.method.upper(), _openapi_path(route.path))
        for table in _route_tables()
        for route in table
    }
    assert registered, "no routes registered"
    documented = _documented(_load(SERVED))
    assert sorted(registered - documented) == [], "routes missing from openapi.json"
    assert sorted(documented - registered) == [], "openapi.json documents routes the app lacks"


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def test_every_reference_resolves_and_operations_are_complete() -> None:
    document = _load(SERVED)
    for ref in _refs(document):
        assert ref.startswith("#/"), ref
        target: Any = document
        for part in ref[2:].split("/"):
            assert isinstance(target, dict) and part in target, f"dangling $ref {ref}"
            target = target[part]
    operation_ids = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            assert operation.get("responses"), f"{method.upper()} {path} has no responses"
            operation_ids.append(operation["operationId"])
    assert len(operation_ids) == len(set(operation_ids)), "operationIds must be unique"


def test_every_operation_but_the_public_ones_needs_a_bearer_token() -> None:
    from raftsched.api.permissions import Permission, permission_for

    document = _load(SERVED)
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert document["security"] == [{"bearer": []}]
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            public = permission_for(method.upper(), path) is Permission.PUBLIC
            where = f"{method.upper()} {path}"
            if public:
                assert operation.get("security") == [], f"{where} is public"
                continue
            assert "security" not in operation, f"{where} needs the document's bearer"
            assert "401" in operation["responses"], f"{where} lacks 401"
            # The failure limiter answers any authenticated route 429.
            assert "429" in operation["responses"], f"{where} lacks 429"
            if permission_for(method.upper(), path) is not Permission.AUTHENTICATED:
                assert "403" in operation["responses"], f"{where} lacks 403"


def test_request_limits_mirror_validation() -> None:
    from raftsched import limits

    try:
        from raftsched.api import validation
        from raftsched.api.leases import CLAIM_FIELDS
    except ImportError as error:
        if _pending(error.name):
            pytest.skip(f"cannot import raftsched.api.validation yet: {error}")
        raise
    schemas = _load(SERVED)["components"]["schemas"]
    job = schemas["JobRequest"]["properties"]
    assert set(job) == set(validation.JOB_FIELDS)
    jobs = schemas["BatchSubmitRequest"]["properties"]["jobs"]
    assert jobs["maxItems"] == validation.BATCH_JOBS_MAX
    ops = schemas["LeaseBatchRequest"]["properties"]["ops"]
    assert ops["maxItems"] == limits.LEASE_BATCH_OPS_MAX
    claim = schemas["ClaimRequest"]["properties"]
    assert claim["max_jobs"]["maximum"] == validation.CLAIM_JOBS_MAX
    assert claim["queues"]["maxItems"] == validation.CLAIM_QUEUES_MAX
    assert claim["wait_s"]["maximum"] == limits.WAIT_S_MAX
    # A next claim has a claim's fields and limits (`worker_id` optional on a single op).
    for name in ("NextClaim", "LeaseBatchNextClaim"):
        next_claim = schemas[name]["properties"]
        assert set(next_claim) == set(claim) == set(CLAIM_FIELDS)
        for field in ("max_jobs", "wait_s", "lease_s", "queues", "worker_id"):
            limits_of = {k: v for k, v in next_claim[field].items() if k != "description"}
            if field == "worker_id" and name == "NextClaim":  # optional there: null is absent
                assert limits_of.pop("type") == ["string", "null"]
                limits_of["type"] = "string"
            assert limits_of == {k: v for k, v in claim[field].items() if k != "description"}
    assert schemas["NextClaim"]["required"] == ["queues"]
    assert schemas["LeaseBatchNextClaim"]["required"] == ["worker_id", "queues"]
    for lease_s in (job["lease_s"], claim["lease_s"]):
        assert (lease_s["minimum"], lease_s["maximum"]) == (
            validation.LEASE_S_MIN,
            validation.LEASE_S_MAX,
        )
    assert job["queue"]["maxLength"] == validation.NAME_LENGTH_MAX
    assert job["idempotency_key"]["maxLength"] == validation.KEY_LENGTH_MAX
    assert job["labels"]["maxProperties"] == validation.LABELS_MAX
    # A kind's rule is the core's pattern, in the request schemas and the claim's.
    rule = validation.core_limits.KIND_PATTERN.pattern
    assert job["kind"]["pattern"] == f"^{rule}$"
    assert claim["kinds"]["items"]["pattern"] == f"^(\\*|{rule})$"  # "*": every other kind
    assert claim["kinds"]["maxItems"] == validation.CLAIM_KINDS_MAX
    reason = schemas["ReasonRequest"]["properties"]["reason"]
    assert reason["maxLength"] == limits.REASON_LENGTH_MAX
