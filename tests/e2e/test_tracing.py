"""One trace across three real processes (issue 20): a client process
submits a job inside a span; a 3-node cluster and a worker process, each
exporting over OTLP/HTTP to a receiver in this test (`otlp_receiver`: what
a collector is to them), add their spans to the same trace:

    client "submit order"
      -> node "POST /v1/jobs" (server span)  -> "raft commit"
      -> worker "job attempt" (child of the context the job kept)
           -> "job effect"  -> node "GET/POST /v1/effects..." -> "raft commit"

The nodes are told with `--otlp-endpoint`, the worker with the standard
OTEL_EXPORTER_OTLP_ENDPOINT, and the client configures the OpenTelemetry
SDK itself, as an application would. Also: the lease JSON carries the
normalized `traceparent` and `tracestate` of the submission, an idempotent
repeat from another span is the same job, and no payload reaches a span.

Below cluster version 8 (a member of release 0.7.0's code holds it at 7), a
submission with a `traceparent` is served and its job kept without it; once
the member is upgraded, the context is kept. The same holds for a workflow.

A workflow submitted inside a client span: the worker's attempts of both
its steps are children of that span (the test prints the trace's span
tree); a schedule created inside a span runs in traces of its own, each
attempt a root naming the schedule. A reconciliation runs in a `job
reconcile` span, a child of the job's context.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import cluster_env, lead_on, release_tree
from otlp_receiver import ExportedSpan, OtlpReceiver, otlp_receiver

from raftsched import child_processes
from raftsched.client import Client
from raftsched.node.versions import POLL_PERIOD_S
from raftsched.testing import LocalCluster, http_json, wait_for

QUEUE = "traced"
SECRET = "card-4111-1111-1111-1111"  # in payloads: never in a span
SERVER, CONSUMER, INTERNAL = 2, 5, 1  # OTLP span kinds
# Release 0.7.0 (cluster version 7): written on this commit of main.
VERSION_7 = "v0.7.0"
VERSION_7_COMMIT = "7f273a934790110964b4577eb3fed50f010a65c5"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# Flush spans every 200 ms, not every 5 s, so they arrive while the test waits.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "200"}

CLIENT_SCRIPT = """
import json, sys
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from raftsched.client import Client

urls, collector, secret = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
exporter = OTLPSpanExporter(endpoint=collector + "/v1/traces")
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
with Client(urls, timeout_s=10, retry_budget_s=30) as client:
    with trace.get_tracer("shop").start_as_current_span("submit order") as span:
        job = client.submit("traced", {"card": secret}, idempotency_key="order-1")
    context = span.get_span_context()
    with trace.get_tracer("shop").start_as_current_span("submit order again"):
        again = client.submit("traced", {"card": secret}, idempotency_key="order-1")
provider.shutdown()
print(json.dumps({"job_id": job["id"], "again_id": again["id"],
                  "trace_id": format(context.trace_id, "032x"),
                  "span_id": format(context.span_id, "016x")}))
"""


WORKFLOW_QUEUE = "traced-wf"
WORKFLOW_SCRIPT = """
import json, sys
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from raftsched.client import Client

urls, collector, secret, queue = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4]
provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
exporter = OTLPSpanExporter(endpoint=collector + "/v1/traces")
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("shop")
steps = [{"name": "reserve", "queue": queue, "payload": {"card": secret}},
         {"name": "charge", "queue": queue, "depends_on": ["reserve"]}]
with Client(urls, timeout_s=10, retry_budget_s=30) as client:
    with tracer.start_as_current_span("submit order workflow") as span:
        workflow = client.submit_workflow({"steps": steps, "idempotency_key": "wf-order-1"})
    with tracer.start_as_current_span("create nightly") as created:
        client.create_schedule({"id": "sch_nightly", "interval_s": 3600,
                                "job": {"queue": queue, "payload": {"nightly": True}}})
    occurrence = client.trigger_schedule("sch_nightly")
provider.shutdown()
context, created_context = span.get_span_context(), created.get_span_context()
print(json.dumps({"workflow_id": workflow["id"], "traceparent": workflow["traceparent"],
                  "trace_id": format(context.trace_id, "032x"),
                  "span_id": format(context.span_id, "016x"),
                  "schedule_trace_id": format(created_context.trace_id, "032x"),
                  "occurrence_job_id": occurrence["job_id"]}))
"""


def _start_worker(
    cluster: LocalCluster, collector: str, sink: Path, log_path: Path, *options: str
) -> subprocess.Popen[bytes]:
    """A worker process of `effect_once` on QUEUE, or on the queues (and
    with the reconcilers) `options` give."""
    env = {
        **os.environ, **cluster_env(), **FAST_EXPORT, "RAFTSCHED_TEST_SINK": str(sink),
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector,
    }  # fmt: skip
    with log_path.open("ab") as log:
        return child_processes.popen(
            [sys.executable, "-m", "raftsched", "worker",
             *(options or ("--queue", QUEUE)),
             "--handler", "tests.e2e.handlers:effect_once", "--worker-id", "w-traced",
             "--poll-wait-s", "1", "--shutdown-grace-s", "5", "--log-format", "json",
             "--url", ",".join(cluster.urls)],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip


def _stop(worker: subprocess.Popen[bytes]) -> int:
    worker.send_signal(signal.SIGTERM)
    try:
        return worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        raise


@pytest.fixture
def traced_cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, OtlpReceiver]]:
    # The receiver outlives the nodes: they export what is left as they stop.
    with otlp_receiver() as receiver:
        cluster = LocalCluster(
            tmp_path / "cluster", size=3, env={**cluster_env(), **FAST_EXPORT},
            extra_args=["--otlp-endpoint", receiver.url],
        )  # fmt: skip
        cluster.start()
        try:
            cluster.wait_for_leader(timeout_s=30)
            cluster.wait_for_auth(timeout_s=30)
            yield cluster, receiver
        finally:
            cluster.stop()


def _tree(spans: list[ExportedSpan], root: ExportedSpan, depth: int = 0) -> list[str]:
    """The span tree under `root`, a line a span (service, name, the
    attributes that tell spans apart), children in a stable order."""
    shown = ("http.response.status_code", "raftsched.command", "raftsched.job_id",
             "raftsched.step", "raftsched.schedule_id", "raftsched.outcome")  # fmt: skip
    described = " ".join(
        f"{name.removeprefix('raftsched.')}={root.attributes[name]}"
        for name in shown
        if name in root.attributes
    )
    lines = [f"{'    ' * depth}{root.service:17} {root.name}  {described}".rstrip()]
    children = sorted(
        _children(spans, root),
        key=lambda span: (span.service, span.name, sorted(map(str, span.attributes.items()))),
    )
    for child in children:
        lines += _tree(spans, child, depth + 1)
    return lines


def _one(spans: list[ExportedSpan], **wanted: Any) -> ExportedSpan:
    found = [span for span in spans if all(getattr(span, k) == v for k, v in wanted.items())]
    assert len(found) == 1, (wanted, [span.describe() for span in spans])
    return found[0]


def _children(spans: list[ExportedSpan], parent: ExportedSpan) -> list[ExportedSpan]:
    return [span for span in spans if span.parent_span_id == parent.span_id]


@pytest.mark.slow
def test_one_trace_from_the_client_through_the_node_to_the_worker_and_its_effect(
    traced_cluster: tuple[LocalCluster, OtlpReceiver], tmp_path: Path
) -> None:
    cluster, receiver = traced_cluster
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        version = wait_for(lambda: client.cluster()["cluster_version"] >= 8, 4 * POLL_PERIOD_S)
        assert version, client.cluster()
    submitted = subprocess.run(
        [sys.executable, "-c", CLIENT_SCRIPT, ",".join(cluster.urls), receiver.url, SECRET],
        capture_output=True, text=True, timeout=120, env={**os.environ, **cluster_env()},
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    ids = json.loads(submitted.stdout.strip().splitlines()[-1])
    job_id, trace_id = ids["job_id"], ids["trace_id"]
    assert ids["again_id"] == job_id, "a repeat from another span is the same request"

    sink = tmp_path / "effects.jsonl"
    worker = _start_worker(cluster, receiver.url, sink, tmp_path / "worker.log")
    try:
        with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
            done = wait_for(lambda: client.get_job(job_id)["status"] == "succeeded", 60)
            assert done, client.get_job(job_id)
            job = client.get_job(job_id)
    finally:
        assert _stop(worker) == 0  # its last spans are exported as it stops
    (attempt_record,) = job["attempts"]

    def whole(spans: list[ExportedSpan]) -> bool:
        names = {(span.service, span.name) for span in spans if span.trace_id == trace_id}
        return {
            ("shop", "submit order"), ("raftsched-node", "POST /v1/jobs"),
            ("raftsched-node", "raft commit"), ("raftsched-worker", "job attempt"),
            ("raftsched-worker", "job effect"), ("raftsched-node", "POST /v1/effects"),
        } <= names  # fmt: skip

    assert receiver.wait_for(whole, 30), [s.describe() for s in receiver.received()]
    spans = [span for span in receiver.received() if span.trace_id == trace_id]

    # client submit span -> node HTTP span -> raft commit span
    submit = _one(spans, service="shop", name="submit order")
    assert (submit.span_id, submit.parent_span_id) == (ids["span_id"], "")
    servers = [s for s in _children(spans, submit) if s.name == "POST /v1/jobs"]
    # A follower's 307 is a span too; the leader's answer created the job.
    (created,) = [s for s in servers if s.attributes["http.response.status_code"] == 201]
    assert created.service == "raftsched-node" and created.kind == SERVER
    assert created.attributes["http.route"] == "/v1/jobs"
    (commit,) = _children(spans, created)
    assert commit.name == "raft commit" and commit.kind == INTERNAL
    assert commit.attributes["raftsched.command"] == "SubmitJobs"
    assert commit.attributes["raftsched.job_id"] == job_id
    assert commit.attributes["raftsched.queue"] == QUEUE
    assert commit.attributes["raftsched.epoch"] == attempt_record["epoch"]

    # worker attempt span (child of the submit's context) -> effect span
    attempt = _one(spans, service="raftsched-worker", name="job attempt")
    assert attempt.parent_span_id == submit.span_id and attempt.kind == CONSUMER
    assert attempt.attributes == {
        "raftsched.job_id": job_id,
        "raftsched.queue": QUEUE,
        "raftsched.attempt": 1,
        "raftsched.epoch": attempt_record["epoch"],
        "raftsched.fencing_token": attempt_record["fencing_token"],
        "raftsched.worker_id": "w-traced",
        "raftsched.outcome": "succeeded",
    }
    effect = _one(spans, service="raftsched-worker", name="job effect")
    assert effect.parent_span_id == attempt.span_id
    assert effect.attributes["raftsched.effect.key"] == f"effect:{job_id}"
    # The effect's requests carry its context: the node's spans join in.
    ledger = [s for s in _children(spans, effect) if s.service == "raftsched-node"]
    assert {s.name for s in ledger} >= {"GET /v1/effects/{key}", "POST /v1/effects"}
    (recorded,) = [s for s in ledger if s.name == "POST /v1/effects"]
    (record_commit,) = _children(spans, recorded)
    assert record_commit.attributes["raftsched.command"] == "RecordEffect"
    assert record_commit.attributes["raftsched.fencing_token"] == attempt_record["fencing_token"]

    # Nothing of the payload anywhere, in any process's spans.
    assert not [s.describe() for s in receiver.received() if SECRET in s.describe()]
    assert not receiver.refused


@pytest.mark.slow
def test_a_workflows_steps_run_in_the_trace_its_submission_was_made_in(
    traced_cluster: tuple[LocalCluster, OtlpReceiver], tmp_path: Path
) -> None:
    """A 2-step workflow submitted inside a client span: the worker's
    attempts of both steps (the first made at submit, the second when the
    first succeeded) are children of that span. A schedule created inside a
    span and then triggered runs in a trace of its own, named by its id."""
    cluster, receiver = traced_cluster
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        assert wait_for(lambda: client.cluster()["cluster_version"] >= 8, 4 * POLL_PERIOD_S)
    submitted = subprocess.run(
        [sys.executable, "-c", WORKFLOW_SCRIPT, ",".join(cluster.urls), receiver.url, SECRET,
         WORKFLOW_QUEUE],
        capture_output=True, text=True, timeout=120, env={**os.environ, **cluster_env()},
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    ids = json.loads(submitted.stdout.strip().splitlines()[-1])
    workflow_id, trace_id = ids["workflow_id"], ids["trace_id"]
    # The Workflow object shows the context it keeps: the client's span.
    assert ids["traceparent"].split("-")[1:3] == [trace_id, ids["span_id"]]

    worker = _start_worker(
        cluster, receiver.url, tmp_path / "effects.jsonl", tmp_path / "worker.log",
        "--queue", WORKFLOW_QUEUE,
    )  # fmt: skip
    try:
        with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:

            def finished() -> bool:
                occurrence = client.get_job(ids["occurrence_job_id"])
                return (
                    client.get_workflow(workflow_id)["status"] == "succeeded"
                    and occurrence["status"] == "succeeded"
                )

            assert wait_for(finished, 60), client.get_workflow(workflow_id)
            workflow = client.get_workflow(workflow_id)
            step_jobs = {name: client.get_job(step["job_id"]) for name, step in
                         workflow["steps"].items()}  # fmt: skip
            nightly = client.get_job(ids["occurrence_job_id"])
    finally:
        assert _stop(worker) == 0  # its last spans are exported as it stops
    # Every step's job keeps the workflow's context; the schedule's run none.
    assert {job["traceparent"] for job in step_jobs.values()} == {workflow["traceparent"]}
    assert (nightly["schedule_id"], nightly["traceparent"]) == ("sch_nightly", None)

    def attempts(spans: list[ExportedSpan]) -> list[ExportedSpan]:
        return [s for s in spans if s.name == "job attempt" and s.service == "raftsched-worker"]

    def whole(spans: list[ExportedSpan]) -> bool:
        traced = [span for span in spans if span.trace_id == trace_id]
        scheduled = [s for s in attempts(spans) if "raftsched.schedule_id" in s.attributes]
        return len(attempts(traced)) == 2 and len(scheduled) == 1

    assert receiver.wait_for(whole, 30), [s.describe() for s in receiver.received()]
    spans = [span for span in receiver.received() if span.trace_id == trace_id]
    submit = _one(spans, service="shop", name="submit order workflow")
    tree = _tree(spans, submit)
    print("\nthe workflow's trace:\n" + "\n".join(tree))
    assert submit.parent_span_id == "" and len(tree) == len(spans), "one tree, nothing else"

    # client span -> node "POST /v1/workflows" -> raft commit of SubmitWorkflow
    servers = [s for s in _children(spans, submit) if s.name == "POST /v1/workflows"]
    (created,) = [s for s in servers if s.attributes["http.response.status_code"] == 201]
    (commit,) = _children(spans, created)
    assert commit.attributes["raftsched.command"] == "SubmitWorkflow"
    # Both steps' attempts are children of the submit's span, in order.
    by_step = {span.attributes["raftsched.step"]: span for span in attempts(spans)}
    assert set(by_step) == {"reserve", "charge"}
    for name, attempt in by_step.items():
        job = step_jobs[name]
        (record,) = job["attempts"]
        assert attempt.parent_span_id == submit.span_id and attempt.kind == CONSUMER
        assert attempt.attributes == {
            "raftsched.job_id": job["id"],
            "raftsched.queue": WORKFLOW_QUEUE,
            "raftsched.attempt": 1,
            "raftsched.epoch": record["epoch"],
            "raftsched.fencing_token": record["fencing_token"],
            "raftsched.worker_id": "w-traced",
            "raftsched.workflow_id": workflow_id,
            "raftsched.step": name,
            "raftsched.outcome": "succeeded",
        }
        inside = [span.name for span in _children(spans, attempt)]
        assert inside == ["job effect"], "the handler's effect, in the step's attempt"

    # The schedule's run: a root of its own trace that names the schedule,
    # not a child of the request that created the schedule.
    (scheduled,) = [
        s for s in attempts(receiver.received()) if "raftsched.schedule_id" in s.attributes
    ]
    assert scheduled.attributes["raftsched.schedule_id"] == "sch_nightly"
    assert scheduled.attributes["raftsched.job_id"] == nightly["id"]
    assert scheduled.parent_span_id == "" and scheduled.trace_id not in (
        trace_id, ids["schedule_trace_id"],
    )  # fmt: skip
    creation = [s for s in receiver.received() if s.trace_id == ids["schedule_trace_id"]]
    assert {s.name for s in creation} >= {"create nightly", "POST /v1/schedules"}
    assert not [s.describe() for s in receiver.received() if SECRET in s.describe()]
    assert not receiver.refused


RECONCILE_QUEUE = "traced-rec"


@pytest.mark.slow
def test_a_reconciliation_runs_in_a_span_of_the_jobs_trace(
    traced_cluster: tuple[LocalCluster, OtlpReceiver], tmp_path: Path
) -> None:
    """A traced job whose attempt ended unknown: the reconcile handler runs
    in a `job reconcile` span, a child of the submission's context, naming
    the job, the unknown attempt, the reconciliation's token and the
    decision the cluster took."""
    cluster, receiver = traced_cluster
    leader = cluster.wait_for_leader()
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        assert wait_for(lambda: client.cluster()["cluster_version"] >= 8, 4 * POLL_PERIOD_S)
        status, body, _ = http_json(
            "POST", cluster.nodes[leader].http_url + "/v1/jobs",
            {"queue": RECONCILE_QUEUE, "payload": {"card": SECRET}, "on_unknown": "reconcile"},
            headers={"traceparent": TRACEPARENT},
        )  # fmt: skip
        assert status == 201, body
        job_id = body["job"]["id"]
        # A worker that ran it and lost track: the outcome is unknown.
        (lease,) = client.claim("w-lost", [RECONCILE_QUEUE], max_jobs=1, wait_s=0)
        client.start(job_id, lease["fencing_token"])
        client.fail(
            job_id, lease["fencing_token"], kind="unknown", message="the provider did not answer"
        )
        assert client.get_job(job_id)["status"] == "reconciling"
        worker = _start_worker(
            cluster, receiver.url, tmp_path / "effects.jsonl", tmp_path / "worker.log",
            "--queue", "unused", "--reconciler", f"{RECONCILE_QUEUE}=tests.e2e.handlers:found_it",
        )  # fmt: skip
        try:
            done = wait_for(lambda: client.get_job(job_id)["status"] == "succeeded", 60)
            assert done, client.get_job(job_id)
            history = client.job_history(job_id)
        finally:
            assert _stop(worker) == 0
    trace_id, parent_id = TRACEPARENT.split("-")[1:3]

    def reconciled(spans: list[ExportedSpan]) -> bool:
        return any(s.name == "job reconcile" and s.trace_id == trace_id for s in spans)

    assert receiver.wait_for(reconciled, 30), [s.describe() for s in receiver.received()]
    spans = [span for span in receiver.received() if span.trace_id == trace_id]
    reconcile = _one(spans, service="raftsched-worker", name="job reconcile")
    print("\nthe reconciliation's span:\n" + "\n".join(_tree(spans, reconcile)))
    assert reconcile.parent_span_id == parent_id and reconcile.kind == CONSUMER
    (claimed,) = [e for e in history if (e.get("detail") or "").startswith("reconcile attempt")]
    assert reconcile.attributes == {
        "raftsched.job_id": job_id,
        "raftsched.queue": RECONCILE_QUEUE,
        "raftsched.attempt": 1,  # the unknown attempt it asked about
        "raftsched.epoch": claimed["epoch"],
        "raftsched.fencing_token": claimed["fencing_token"],  # the reconciliation's
        "raftsched.worker_id": "w-traced",
        "raftsched.reconcile.queue": RECONCILE_QUEUE,
        "raftsched.outcome": "happened",
    }
    assert claimed["fencing_token"] > lease["fencing_token"], "the reconciliation's own token"
    assert not [s for s in spans if s.name == "job attempt"], "nothing ran the job again"
    assert not [s.describe() for s in receiver.received() if SECRET in s.describe()]


@pytest.mark.slow
def test_the_lease_carries_the_normalized_trace_context_of_the_submission(
    traced_cluster: tuple[LocalCluster, OtlpReceiver],
) -> None:
    cluster, _ = traced_cluster
    leader = cluster.wait_for_leader()
    url = cluster.nodes[leader].http_url
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        assert wait_for(lambda: client.cluster()["cluster_version"] >= 8, 4 * POLL_PERIOD_S)
        # A later version's header, read for its four fields; two tracestate
        # headers, joined; a batch's jobs all keep the request's context.
        later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future"
        status, body, _ = http_json(
            "POST", url + "/v1/jobs/batch",
            {"jobs": [{"queue": "leased", "payload": 1}, {"queue": "leased", "payload": 2}]},
            headers={"traceparent": later, "tracestate": "rojo=1,congo=2"},
        )  # fmt: skip
        assert status == 200, body
        for bad in ("junk", TRACEPARENT.upper()):
            status, body, _ = http_json(
                "POST", url + "/v1/jobs", {"queue": "leased", "payload": 3},
                headers={"traceparent": bad},
            )  # fmt: skip
            assert status == 201, body  # served; the context is not kept
        leases = client.claim("w-probe", ["leased"], max_jobs=10, wait_s=0)
        jobs = [client.get_job(lease["job_id"]) for lease in leases]
    # The Job object shows what its leases carry.
    assert [(job["traceparent"], job["tracestate"]) for job in jobs] == [
        (lease["traceparent"], lease["tracestate"]) for lease in leases
    ]
    assert [(lease["payload"], lease["traceparent"], lease["tracestate"]) for lease in leases] == [
        (1, TRACEPARENT, "rojo=1,congo=2"),
        (2, TRACEPARENT, "rojo=1,congo=2"),
        (3, None, None),
        (3, None, None),
    ]


def _submit_traced(url: str, queue: str) -> str:
    status, body, _ = http_json(
        "POST", url + "/v1/jobs", {"queue": queue}, headers={"traceparent": TRACEPARENT}
    )
    assert status == 201, body
    job_id: str = body["job"]["id"]
    return job_id


def _submit_traced_workflow(url: str, queue: str) -> dict[str, Any]:
    status, body, _ = http_json(
        "POST", url + "/v1/workflows", {"steps": [{"name": "only", "queue": queue}]},
        headers={"traceparent": TRACEPARENT},
    )  # fmt: skip
    assert status == 201, body
    workflow: dict[str, Any] = body["workflow"]
    return workflow


@pytest.mark.slow
def test_below_cluster_version_8_a_traced_submission_is_kept_without_its_context(
    tmp_path: Path,
) -> None:
    source = release_tree(VERSION_7, VERSION_7_COMMIT, tmp_path / "v7") / "src"
    cluster = LocalCluster(tmp_path / "cluster", size=3, env=cluster_env())
    old = sorted(cluster.nodes)[-1]
    cluster.nodes[old].source_dir = source  # release 0.7.0's code, today's venv
    cluster.start()
    try:
        cluster.wait_for_leader(timeout_s=60)
        cluster.wait_for_auth(timeout_s=60)
        lead_on(cluster, set(cluster.nodes) - {old})  # requests meet today's code
        with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
            assert wait_for(lambda: client.cluster()["cluster_version"] == 7, 4 * POLL_PERIOD_S)
            time.sleep(POLL_PERIOD_S + 1)
            assert client.cluster()["cluster_version"] == 7  # held by the old member
            leader = cluster.wait_for_leader()
            job_id = _submit_traced(cluster.nodes[leader].http_url, "v7")
            (lease,) = client.claim("w-probe", ["v7"], max_jobs=5, wait_s=0)
            assert lease["job_id"] == job_id and lease["traceparent"] is None
            assert client.get_job(job_id)["traceparent"] is None
            # A traced workflow too: served, and kept (with its steps) without it.
            workflow = _submit_traced_workflow(cluster.nodes[leader].http_url, "wf-v7")
            assert workflow["traceparent"] is None
            (lease,) = client.claim("w-probe", ["wf-v7"], max_jobs=5, wait_s=0)
            assert lease["workflow_id"] == workflow["id"] and lease["traceparent"] is None

            # The last member runs today's code: from version 8 on it is kept.
            cluster.kill(old, signal.SIGTERM)
            cluster.nodes[old].source_dir = None
            cluster.start(old)
            cluster.wait_for_leader(timeout_s=60)
            raised = wait_for(lambda: client.cluster()["cluster_version"] >= 8, 6 * POLL_PERIOD_S)
            assert raised, client.cluster()
            leader = cluster.wait_for_leader()
            job_id = _submit_traced(cluster.nodes[leader].http_url, "v8")
            (lease,) = client.claim("w-probe", ["v8"], max_jobs=5, wait_s=0)
            assert (lease["job_id"], lease["traceparent"]) == (job_id, TRACEPARENT)
            assert client.get_job(job_id)["traceparent"] == TRACEPARENT
            workflow = _submit_traced_workflow(cluster.nodes[leader].http_url, "wf-v8")
            assert workflow["traceparent"] == TRACEPARENT
            (lease,) = client.claim("w-probe", ["wf-v8"], max_jobs=5, wait_s=0)
            assert (lease["workflow_id"], lease["traceparent"]) == (workflow["id"], TRACEPARENT)
            cluster.wait_converged(timeout_s=60)
    finally:
        cluster.stop()
