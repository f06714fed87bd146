"""The reconciliation report (issue 17, item 6) from a real 3-node cluster.

Four jobs of queue `rr-pay`, all `on_unknown: reconcile` with their
reconciliations claimed from `rr-recon`, each with an unknown outcome:

- A (acme): failed `unknown`, reconciled `happened` by rec-1 with evidence;
- B (acme): failed `unknown`, reconciled `did_not_happen` (an hour's backoff);
- C (globex): failed `unknown`, its reconciliation leased to rec-2, unanswered;
- D (acme): its lease expired while it ran (a worker that died mid-call).

`GET /v1/reconciliation` must answer exactly what the jobs' own records
(attempts and histories, read over the API) say: who waits since when, the
unknown outcomes in the hours they ended, the decisions, and A as completed
by rec-1 with its token and evidence. A token of tenant acme sees only
acme's jobs in every part, a worker token none of it, and bad queries get
400 naming the parameter.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

from openapi_schema_validator import OAS31Validator

from raftsched.client import Client, Forbidden
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.testing import LocalCluster, http_json
from raftsched.timefmt import format_ms, parse_ms

QUEUE = "rr-pay"
RECONCILE_QUEUE = "rr-recon"
HOUR_MS = 3_600_000


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _unknown(client: Client, tenant: str, **fields: Any) -> str:
    """Submit, claim and start a job, and fail it `unknown`: it reconciles."""
    job_id = str(
        client.submit(
            QUEUE, {"tenant": tenant}, tenant=tenant, on_unknown="reconcile",
            reconcile_queue=RECONCILE_QUEUE, **fields,
        )["id"]
    )  # fmt: skip
    (lease,) = client.claim("w1", [QUEUE], max_jobs=1, wait_s=5)
    assert lease["job_id"] == job_id, lease
    client.start(job_id, lease["fencing_token"])
    failed = client.fail(job_id, lease["fencing_token"], kind="unknown", message="timed out")
    assert failed["status"] == "reconciling"
    return job_id


def _ask(client: Client, worker: str, job_id: str, lease_s: float = 30) -> dict[str, Any]:
    (ask,) = client.claim(worker, [RECONCILE_QUEUE], max_jobs=1, wait_s=5, lease_s=lease_s)
    assert ask["job_id"] == job_id and ask["reconcile"] is not None, ask
    return ask


def _entered_reconciling(client: Client, job_id: str) -> str:
    (event,) = [
        e
        for e in client.job_history(job_id)
        if e["to_status"] == "reconciling" and e["from_status"] != "reconciling"
    ]
    assert event["event"] == "outcome_unknown"
    return str(event["at"])


def _expected(
    client: Client, now: str, jobs: dict[str, str], asks: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The report the jobs' records call for, for the jobs in `jobs` (by
    letter): everything read back from the API's job and history views."""
    since_ms = (parse_ms(now) // HOUR_MS - 23) * HOUR_MS
    counts = [0] * 24
    for job_id in jobs.values():
        for attempt in client.get_job(job_id)["attempts"]:
            counts[(parse_ms(attempt["ended_at"]) - since_ms) // HOUR_MS] += 1
    waiting = []
    for letter in ("C", "D"):
        if letter not in jobs:
            continue
        entered = _entered_reconciling(client, jobs[letter])
        ask = asks.get(letter)
        lease = None
        if ask is not None:
            lease = {
                "worker_id": "rec-2",
                "fencing_token": ask["fencing_token"],
                "expires_at": client.get_job(jobs[letter])["reconciliation"]["lease"]["expires_at"],
            }
        waiting.append({
            "job_id": jobs[letter], "queue": QUEUE, "tenant": "globex" if letter == "C" else "acme",
            "attempt": 1, "since": entered, "tries": 0, "reconcile_queue": RECONCILE_QUEUE,
            "available_at": entered, "lease": lease,
        })  # fmt: skip
    waiting.sort(key=lambda item: (item["since"], item["job_id"]))
    decided = {letter: job_id for letter, job_id in jobs.items() if letter in "AB"}
    completed = []
    if "A" in decided:
        (done,) = [e for e in client.job_history(decided["A"]) if e["event"] == "complete"]
        assert (done["from_status"], done["actor"]) == ("reconciling", "rec-1")
        completed.append({
            "job_id": decided["A"], "queue": QUEUE, "tenant": "acme", "completed_at": done["at"],
            "worker_id": "rec-1", "fencing_token": asks["A"]["fencing_token"],
            "evidence": "the provider lists ch_A",
        })  # fmt: skip
    return {
        "now": now,
        "since": format_ms(since_ms),
        "hours": 24,
        "reconciling": {"jobs": waiting, "total": len(waiting), "truncated": False},
        "unknown_outcomes": {
            "buckets": [format_ms(since_ms + n * HOUR_MS) for n in range(24)],
            "queues": [{"queue": QUEUE, "total": sum(counts), "counts": counts}],
        },
        "decisions": [
            {"queue": QUEUE, "happened": 1, "did_not_happen": 1, "cannot_tell": 0, "unanswered": 0},
        ],  # fmt: skip
        "completed": {"jobs": completed, "total": len(completed), "truncated": False},
    }


def test_the_report_says_exactly_what_the_jobs_records_say(
    cluster: LocalCluster, client: Client
) -> None:
    _wait(
        lambda: client.cluster().get("cluster_version") == COMMAND_VERSION_MAX,
        30,
        "the cluster version to reach this release's",
    )
    empty = client.reconciliation()
    assert empty["reconciling"] == {"jobs": [], "total": 0, "truncated": False}
    assert empty["unknown_outcomes"]["queues"] == [] and empty["decisions"] == []

    jobs: dict[str, str] = {}
    asks: dict[str, dict[str, Any]] = {}
    jobs["A"] = _unknown(client, "acme")
    asks["A"] = _ask(client, "rec-1", jobs["A"])
    decided = client.reconcile(
        jobs["A"], asks["A"]["fencing_token"], "happened", result={"charge": "ch_A"},
        reason="the provider lists ch_A",
    )  # fmt: skip
    assert decided["status"] == "succeeded"
    jobs["B"] = _unknown(client, "acme", backoff={"initial_s": 3600, "max_s": 3600})
    asks["B"] = _ask(client, "rec-1", jobs["B"])
    decided = client.reconcile(jobs["B"], asks["B"]["fencing_token"], "did_not_happen")
    assert decided["status"] == "retry_wait"
    jobs["C"] = _unknown(client, "globex")
    asks["C"] = _ask(client, "rec-2", jobs["C"], lease_s=300)
    # D: its worker dies mid-call; the lease expires while it runs.
    jobs["D"] = str(
        client.submit(
            QUEUE, {"tenant": "acme"}, tenant="acme", on_unknown="reconcile",
            reconcile_queue=RECONCILE_QUEUE, lease_s=1,
        )["id"]
    )  # fmt: skip
    (lease,) = client.claim("doomed", [QUEUE], max_jobs=1, wait_s=5, lease_s=1)
    assert lease["job_id"] == jobs["D"]
    client.start(jobs["D"], lease["fencing_token"])
    _wait(lambda: client.get_job(jobs["D"])["status"] == "reconciling", 15, "D to reconcile")
    assert client.get_job(jobs["D"])["attempts"][0]["outcome"] == "lease_expired"

    report = client.reconciliation()
    assert report == _expected(client, report["now"], jobs, asks)
    assert report["unknown_outcomes"]["queues"][0]["total"] == 4
    # And it is what openapi.json promises, every list filled.
    document = json.loads(client.request("GET", "/openapi.json").body)
    schema = {"$ref": "#/components/schemas/ReconciliationReport"}
    errors = OAS31Validator({**schema, "components": document["components"]}).iter_errors(report)
    assert [error.message for error in errors] == []

    # Capped lists say so; the same report from a follower's replica.
    capped = client.reconciliation(limit=1)
    assert capped["reconciling"]["jobs"] == report["reconciling"]["jobs"][:1]
    assert (capped["reconciling"]["total"], capped["reconciling"]["truncated"]) == (2, True)
    leader = cluster.wait_for_leader()
    follower = next(node for node_id, node in cluster.nodes.items() if node_id != leader)
    cluster.wait_converged(timeout_s=30)
    status, stale, headers = http_json(
        "GET", follower.http_url + "/v1/reconciliation?consistency=stale", timeout_s=10
    )
    assert status == 200 and "Raftsched-Applied-Index" in headers
    for part in ("reconciling", "decisions", "completed"):
        assert stale[part] == report[part], part

    # A token of tenant acme sees acme's jobs only, in every part.
    acme = client.create_token("acme-viewer", "viewer", tenants=["acme"])["secret"]
    # Used at once: the client may ask a follower first, which catches up
    # with the leader before it calls a token unknown (api.auth).
    with Client(cluster.urls, token=acme, timeout_s=10, retry_budget_s=30) as scoped:
        seen = scoped.reconciliation()
    mine = {letter: jobs[letter] for letter in "ABD"}
    assert seen == _expected(client, seen["now"], mine, asks)
    assert [job["job_id"] for job in seen["reconciling"]["jobs"]] == [jobs["D"]]
    globex = client.create_token("globex-submitter", "submitter", tenants=["globex"])["secret"]
    with Client(cluster.urls, token=globex, timeout_s=10, retry_budget_s=30) as scoped:
        theirs = scoped.reconciliation()
    assert [job["job_id"] for job in theirs["reconciling"]["jobs"]] == [jobs["C"]]
    assert theirs["unknown_outcomes"]["queues"][0]["total"] == 1
    assert theirs["decisions"] == [] and theirs["completed"]["jobs"] == []
    worker = client.create_token("rr-worker", "worker")["secret"]
    with Client(cluster.urls, token=worker, timeout_s=10, retry_budget_s=30) as denied:
        try:
            denied.reconciliation()
        except Forbidden:
            pass
        else:
            raise AssertionError("a worker token read the reconciliation report")

    # The per-queue metrics behind the alerts.
    exported = {}
    for node_id, node in cluster.nodes.items():
        with Client([node.http_url], timeout_s=10) as one:
            exported[node_id] = one.metrics()
    unknown = sum(
        float(line.rsplit(" ", 1)[1])
        for text in exported.values()
        for line in text.splitlines()
        if line.startswith(f'raftsched_unknown_outcomes_total{{queue="{QUEUE}"}}')
    )
    assert unknown == 4
    for text in exported.values():
        assert f'raftsched_queue_reconciling{{queue="{QUEUE}"}} 2.0' in text


def test_bad_report_queries_get_400_naming_the_parameter(
    cluster: LocalCluster, client: Client
) -> None:
    url = cluster.nodes[cluster.wait_for_leader()].http_url + "/v1/reconciliation"
    for query, field in [
        ("hours=0", "hours"),
        ("hours=169", "hours"),
        ("hours=-1", "hours"),
        ("hours=2.5", "hours"),
        ("hours=" + quote("²"), "hours"),
        ("hours=" + "9" * 400, "hours"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=ten", "limit"),
        ("consistency=eventual", "consistency"),
        ("since=2026-01-01T00:00:00Z", "since"),
    ]:
        status, body, _ = http_json("GET", f"{url}?{query}", timeout_s=10)
        assert status == 400, (query, status, body)
        assert body["error"]["code"] == "invalid_request", query
        assert body["error"]["details"]["field"] == field, query
    status, body, _ = http_json("GET", f"{url}?hours=168&limit=1000", timeout_s=10)
    assert (status, body["hours"], len(body["unknown_outcomes"]["buckets"])) == (200, 168, 168)
    status, body, _ = http_json("GET", url, timeout_s=10, token="")
    assert status == 401 and body["error"]["code"] == "unauthenticated"
