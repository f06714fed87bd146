"""Tracing in the shells (raftsched.tracing, api.trace_headers,
api.server_spans, node.commit_spans): what a submission's W3C headers
become, when exporting is on, and the node's spans and their attributes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from multidict import CIMultiDict
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from raftsched import tracing
from raftsched.api.requests import NODE
from raftsched.api.server_spans import server_span_middleware
from raftsched.api.trace_headers import (
    request_trace_context,
    storable_trace_context,
    with_trace_context,
)
from raftsched.core.jobs.commands import (
    ClaimJobs,
    CompleteJob,
    LeaseBatch,
    StartJob,
    SubmitJobs,
)
from raftsched.core.kernel.commands import Audited, JobSpec
from raftsched.core.kernel.results import Claimed, Completed, Lease, Rejected
from raftsched.node import commit_spans
from spans import in_memory_spans

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("header", "stored"),
    [
        (PARENT, PARENT),
        (f"  {PARENT}\t", PARENT),
        (f"00-{TRACE_ID}-b7ad6b7169203331-00", f"00-{TRACE_ID}-b7ad6b7169203331-00"),
        # A later version: its first four fields, stored as version 00.
        (f"cc-{TRACE_ID}-b7ad6b7169203331-01-what-comes-next", PARENT),
        (f"cc-{TRACE_ID}-b7ad6b7169203331-01", PARENT),
        (f"ff-{TRACE_ID}-b7ad6b7169203331-01", None),
        (PARENT + "-extra", None),
        (PARENT.upper(), None),
        (f"00-{'0' * 32}-b7ad6b7169203331-01", None),
        (f"00-{TRACE_ID}-{'0' * 16}-01", None),
        (f"00-{TRACE_ID}-b7ad6b716920333-01", None),
        ("", None),
        (None, None),
    ],
)
def test_a_traceparent_header_is_normalized_or_ignored(
    header: str | None, stored: str | None
) -> None:
    assert tracing.parse_traceparent(header) == stored


@pytest.mark.parametrize(
    ("header", "stored"),
    [
        ("rojo=00f067aa0ba902b7", "rojo=00f067aa0ba902b7"),
        ("rojo=00f067aa0ba902b7 , congo=t61rcWkgMzE,,", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
        ("tenant@vendor=x y", "tenant@vendor=x y"),
        ("rojo=1,rojo=2", None),  # a key twice
        ("Rojo=1", None),  # keys are lower case
        ("rojo=trailing ", "rojo=trailing"),  # OWS around a member is not part of it
        ("rojo", None),
        ("rojo=a=b", None),
        (",".join(f"k{i}=v" for i in range(33)), None),  # more than 32 members
        ("", None),
        (None, None),
    ],
)
def test_a_tracestate_header_is_kept_if_it_parses(header: str | None, stored: str | None) -> None:
    assert tracing.parse_tracestate(header) == stored


def test_a_long_tracestate_loses_long_members_first_then_from_the_end() -> None:
    long_member = "big=" + "x" * 200
    members = ["a=" + "1" * 50, long_member, "b=" + "2" * 50, "c=" + "3" * 50, "d=" + "4" * 100]
    stored = tracing.parse_tracestate(",".join(members))
    assert stored == ",".join([members[0], members[2], members[3]])
    assert stored is not None and len(stored) <= 256
    assert tracing.parse_tracestate("x=" + "y" * 255) is None  # one member, too long: nothing


@pytest.mark.parametrize(
    ("flag", "environ", "wanted"),
    [
        (None, {}, ()),
        ("http://collector:4318", {}, ("otlp",)),
        ("http://collector:4318", {"OTEL_TRACES_EXPORTER": "none"}, ("otlp",)),
        ("http://collector:4318", {"OTEL_SDK_DISABLED": "true"}, ()),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ("otlp",)),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ("otlp",)),
        (None, {"OTEL_TRACES_EXPORTER": "console"}, ("console",)),
        (None, {"OTEL_TRACES_EXPORTER": "otlp, console"}, ("otlp", "console")),
        (None, {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, ()),
    ],
)
def test_exporting_is_off_unless_asked_for(
    flag: str | None, environ: dict[str, str], wanted: tuple[str, ...]
) -> None:
    assert tracing.exporters_wanted(flag, environ) == wanted


def test_an_exporter_raftsched_does_not_have_is_refused() -> None:
    with pytest.raises(tracing.TracingConfigError, match="zipkin"):
        tracing.exporters_wanted(None, {"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(tracing.TracingConfigError, match="http/protobuf"):
        tracing.configure(
            "raftsched-test",
            environ={"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
        )
    with pytest.raises(tracing.TracingConfigError, match="URL"):
        tracing.configure("raftsched-test", otlp_endpoint="collector:4318", environ={})
    assert not tracing.enabled()
    assert tracing.configure("raftsched-test", environ={}) is False


def test_the_otlp_endpoint_is_the_collectors_base_url() -> None:
    assert tracing.traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert tracing.traces_url("https://c:4318/") == "https://c:4318/v1/traces"
    assert tracing.traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"


def _request(*headers: tuple[str, str], version: int = 8) -> web.Request:
    app = web.Application()
    app[NODE] = SimpleNamespace(cluster_version=lambda: version)  # type: ignore[assignment]
    return make_mocked_request("POST", "/v1/jobs", headers=CIMultiDict(headers), app=app)


def test_a_submissions_headers_give_its_jobs_their_trace_context() -> None:
    request = _request(("traceparent", PARENT), ("tracestate", "a=1"), ("tracestate", "b=2"))
    assert request_trace_context(request) == (PARENT, "a=1,b=2")
    specs = with_trace_context(request, [JobSpec("q"), JobSpec("r", on_unknown="retry")])
    assert [(s.queue, s.traceparent, s.tracestate) for s in specs] == [
        ("q", PARENT, "a=1,b=2"),
        ("r", PARENT, "a=1,b=2"),
    ]
    assert specs[1].on_unknown == "retry"


@pytest.mark.parametrize(
    "headers",
    [
        (),
        (("traceparent", "junk"),),
        (("traceparent", PARENT), ("traceparent", PARENT)),  # two: invalid (W3C)
        (("tracestate", "a=1"),),
    ],
)
def test_no_usable_traceparent_means_no_trace_context(headers: tuple[tuple[str, str]]) -> None:
    request = _request(*headers)
    assert request_trace_context(request) is None
    assert with_trace_context(request, [JobSpec("q")]) == [JobSpec("q")]


def test_below_cluster_version_8_the_jobs_are_created_without_it() -> None:
    request = _request(("traceparent", PARENT), version=7)
    assert with_trace_context(request, [JobSpec("q")]) == [JobSpec("q")]
    assert storable_trace_context(request) is None, "nor a workflow with it"
    assert storable_trace_context(_request(("traceparent", PARENT))) == (PARENT, None)
    bad_state = _request(("traceparent", PARENT), ("tracestate", "Bad=1"))
    assert with_trace_context(bad_state, [JobSpec("q")]) == [JobSpec("q", traceparent=PARENT)]


def _serve(app: web.Application, requests: list[tuple[str, str, dict[str, str]]]) -> list[int]:
    async def main() -> list[int]:
        async with TestClient(TestServer(app)) as client:
            statuses = []
            for method, path, headers in requests:
                response = await client.request(method, path, headers=headers)
                statuses.append(response.status)
            return statuses

    return asyncio.run(main())


def test_a_request_gets_a_server_span_named_by_its_route_under_the_callers_trace() -> None:
    exporter = in_memory_spans()

    async def job(request: web.Request) -> web.Response:
        assert trace.get_current_span().is_recording()
        return web.json_response({}, status=201 if request.method == "POST" else 200)

    async def broken(request: web.Request) -> web.Response:
        return web.json_response({}, status=503)

    async def health(request: web.Request) -> web.Response:
        assert not trace.get_current_span().is_recording(), "a quiet route"
        return web.json_response({})

    app = web.Application(middlewares=[server_span_middleware])
    app.router.add_get("/v1/jobs/{job_id}", job)
    app.router.add_post("/v1/jobs", job)
    app.router.add_get("/v1/broken", broken)
    app.router.add_get("/healthz", health)
    statuses = _serve(
        app,
        [
            ("GET", "/v1/jobs/job_42", {"traceparent": PARENT}),
            ("POST", "/v1/jobs", {}),
            ("GET", "/v1/broken", {}),
            ("GET", "/healthz", {"traceparent": PARENT}),
            ("GET", "/nowhere", {}),
        ],
    )
    assert statuses == [200, 201, 503, 200, 404]
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"GET /v1/jobs/{job_id}", "POST /v1/jobs", "GET /v1/broken", "GET"}
    read = spans["GET /v1/jobs/{job_id}"]
    assert read.kind == SpanKind.SERVER
    assert read.parent is not None and f"{read.parent.trace_id:032x}" == TRACE_ID
    assert dict(read.attributes or {}) == {
        "http.request.method": "GET",
        "http.route": "/v1/jobs/{job_id}",
        tracing.JOB_ID: "job_42",
        "http.response.status_code": 200,
    }
    assert spans["POST /v1/jobs"].parent is None, "no traceparent: a trace of its own"
    assert spans["GET /v1/broken"].status.is_ok is False
    assert spans["GET"].attributes is not None
    assert spans["GET"].attributes["http.response.status_code"] == 404


def _lease(job_id: str = "job_1") -> Lease:
    return Lease(job_id, 2, 3, 41, 0, 30_000, "emails", b"\xc0", None, None, None)


@pytest.mark.parametrize(
    ("command", "attributes"),
    [
        (
            SubmitJobs((JobSpec("emails", payload=b"secret"),), ("job_1",)),
            {tracing.COMMAND: "SubmitJobs", tracing.JOB_COUNT: 1, tracing.JOB_ID: "job_1",
             tracing.QUEUE: "emails"},
        ),
        (
            SubmitJobs((JobSpec("a"), JobSpec("b")), ("job_1", "job_2")),
            {tracing.COMMAND: "SubmitJobs", tracing.JOB_COUNT: 2},
        ),
        (
            CompleteJob("job_1", 41, b"result"),
            {tracing.COMMAND: "CompleteJob", tracing.JOB_ID: "job_1", tracing.FENCING_TOKEN: 41},
        ),
        (
            ClaimJobs("w1", ("emails",), 5),
            {tracing.COMMAND: "ClaimJobs", tracing.WORKER_ID: "w1", tracing.QUEUE: "emails"},
        ),
        (
            LeaseBatch((StartJob("job_1", 41),)),
            {tracing.COMMAND: "LeaseBatch", tracing.JOB_COUNT: 1, tracing.JOB_ID: "job_1",
             tracing.FENCING_TOKEN: 41},
        ),
        (
            Audited("ops", StartJob("job_9", 7)),
            {tracing.COMMAND: "StartJob", tracing.JOB_ID: "job_9", tracing.FENCING_TOKEN: 7},
        ),
    ],
)  # fmt: skip
def test_a_commit_span_names_the_command_and_its_job(
    command: Any, attributes: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    exporter = in_memory_spans()
    monkeypatch.setattr(tracing, "enabled", lambda: True)

    async def propose() -> Completed:
        return Completed("job_1", b"\xc0", False)

    async def main() -> None:
        assert commit_spans.start((command,), 3) is None, "nothing traced is current"
        with tracing.tracer().start_as_current_span("POST /v1/jobs"):
            span = commit_spans.start((command,), 3)
            assert span is not None
            await commit_spans.traced(span, propose())

    asyncio.run(main())
    (commit,) = [span for span in exporter.get_finished_spans() if span.name == "raft commit"]
    assert dict(commit.attributes or {}) == {
        tracing.EPOCH: 3,
        **attributes,
        tracing.OUTCOME: "Completed",
    }


def test_a_commit_span_names_the_lease_a_claim_granted_and_a_rejection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exporter = in_memory_spans()
    monkeypatch.setattr(tracing, "enabled", lambda: True)
    results: list[Any] = [Claimed((_lease(),)), Claimed(()), Rejected("lease_lost", "stale")]

    async def main() -> None:
        for result in results:
            with tracing.tracer().start_as_current_span("POST /v1/leases"):
                span = commit_spans.start((ClaimJobs("w1", ("a", "b"), 5),), 3)
                assert span is not None

                async def propose(value: Any = result) -> Any:
                    return value

                await commit_spans.traced(span, propose())

    asyncio.run(main())
    commits = [span for span in exporter.get_finished_spans() if span.name == "raft commit"]
    assert [dict(span.attributes or {}) for span in commits] == [
        {tracing.EPOCH: 3, tracing.COMMAND: "ClaimJobs", tracing.WORKER_ID: "w1",
         tracing.OUTCOME: "granted 1", tracing.JOB_ID: "job_1", tracing.QUEUE: "emails",
         tracing.ATTEMPT: 2, tracing.FENCING_TOKEN: 41},
        {tracing.EPOCH: 3, tracing.COMMAND: "ClaimJobs", tracing.WORKER_ID: "w1",
         tracing.OUTCOME: "granted 0"},
        {tracing.EPOCH: 3, tracing.COMMAND: "ClaimJobs", tracing.WORKER_ID: "w1",
         tracing.OUTCOME: "rejected: lease_lost"},
    ]  # fmt: skip


def test_commit_spans_are_off_with_tracing() -> None:
    in_memory_spans()
    assert not tracing.enabled()
    with tracing.tracer().start_as_current_span("POST /v1/jobs"):
        assert commit_spans.start((StartJob("job_1", 1),), 1) is None
