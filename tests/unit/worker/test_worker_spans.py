"""The worker's spans: an attempt span, a child of the trace context its
lease carries, with the lease's attributes (a workflow step's and a
schedule run's origin); a child span per `ctx.effect`, whose request to the
ledger carries it; how an attempt ended; a reconciliation's span, in the
job's trace, with its decision; nothing of a payload or an error message
(worker._spans)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fakeleases import FakeLeases, run, running_worker
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import INVALID_SPAN, SpanKind, StatusCode

from raftsched import tracing
from raftsched.worker import (
    CannotTell,
    Decision,
    DidNotHappen,
    Happened,
    JobContext,
    ReconcileContext,
    _spans,
)
from raftsched.worker._context import Lease
from spans import in_memory_spans, named

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
SECRET = "card-4111111111111111"


def _hex(span: ReadableSpan) -> tuple[str, str]:
    context = span.get_span_context()
    assert context is not None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def _parent(span: ReadableSpan) -> tuple[str, str] | None:
    parent = span.parent
    return None if parent is None else (f"{parent.trace_id:032x}", f"{parent.span_id:016x}")


def test_a_sync_attempt_joins_the_submitters_trace_and_its_effect_is_a_child() -> None:
    exporter = in_memory_spans()

    def handler(ctx: JobContext) -> dict[str, Any]:
        charged = ctx.effect("charge:1", lambda: {"charge": "ch_1"})
        return {"charged": charged}

    async def scenario(fake: FakeLeases) -> None:
        job = fake.add("job_1", {"card": SECRET})
        job.traceparent, job.tracestate = TRACEPARENT, "rojo=00f067aa0ba902b7"
        async with running_worker(fake, handler):
            await fake.wait_for(lambda: job.status == "succeeded")
            await fake.wait_for(lambda: len(named(exporter.get_finished_spans(), "job attempt")))
        (attempt,) = named(exporter.get_finished_spans(), "job attempt")
        (effect,) = named(exporter.get_finished_spans(), "job effect")
        assert _hex(attempt)[0] == TRACE_ID, "the submitter's trace"
        assert _parent(attempt) == (TRACE_ID, PARENT_ID)
        assert attempt.parent is not None and attempt.parent.is_remote
        assert attempt.get_span_context().trace_state.get("rojo") == "00f067aa0ba902b7"  # type: ignore[union-attr]
        assert attempt.kind == SpanKind.CONSUMER
        assert dict(attempt.attributes or {}) == {
            tracing.JOB_ID: "job_1",
            tracing.QUEUE: "q",
            tracing.ATTEMPT: 1,
            tracing.EPOCH: 1,
            tracing.FENCING_TOKEN: job.token,
            tracing.WORKER_ID: "w-test",
            tracing.OUTCOME: "succeeded",
        }
        assert attempt.status.status_code == StatusCode.UNSET
        assert _parent(effect) == _hex(attempt)
        assert dict(effect.attributes or {}) == {
            tracing.EFFECT_KEY: "charge:1",
            tracing.JOB_ID: "job_1",
            tracing.FENCING_TOKEN: job.token,
            tracing.EFFECT_REPLAYED: False,
        }
        # The ledger's request was made inside the effect span; the lease
        # batches, which carry many jobs' ops, in no trace at all.
        assert fake.effect_traceparents == [f"00-{TRACE_ID}-{_hex(effect)[1]}-01"]
        assert fake.batch_traceparents and set(fake.batch_traceparents) == {None}
        for span in (attempt, effect):
            assert SECRET not in repr(span.to_json())

    run(scenario)


def test_an_async_attempt_and_its_replayed_effect() -> None:
    exporter = in_memory_spans()

    async def handler(ctx: JobContext) -> Any:
        async def charge() -> str:
            return "ch_new"

        return await ctx.aeffect("charge:2", charge)

    async def scenario(fake: FakeLeases) -> None:
        fake.effects["charge:2"] = {"key": "charge:2", "result": "ch_old"}
        job = fake.add("job_2")
        job.traceparent = TRACEPARENT
        async with running_worker(fake, handler):
            await fake.wait_for(lambda: job.status == "succeeded")
            await fake.wait_for(lambda: len(named(exporter.get_finished_spans(), "job attempt")))
        assert job.result == "ch_old"
        (attempt,) = named(exporter.get_finished_spans(), "job attempt")
        (effect,) = named(exporter.get_finished_spans(), "job effect")
        assert _parent(attempt) == (TRACE_ID, PARENT_ID)
        assert _parent(effect) == _hex(attempt)
        assert effect.attributes is not None and effect.attributes[tracing.EFFECT_REPLAYED] is True

    run(scenario)


def test_a_lease_without_a_trace_context_starts_a_trace_and_a_failure_is_an_error() -> None:
    exporter = in_memory_spans()

    def handler(ctx: JobContext) -> None:
        time.sleep(0.01)
        raise ValueError(f"declined {SECRET}")

    async def scenario(fake: FakeLeases) -> None:
        job = fake.add("job_3")
        async with running_worker(fake, handler):
            await fake.wait_for(lambda: job.status == "failed")
            await fake.wait_for(lambda: len(named(exporter.get_finished_spans(), "job attempt")))
        (attempt,) = named(exporter.get_finished_spans(), "job attempt")
        assert attempt.parent is None and _hex(attempt)[0] != TRACE_ID
        assert attempt.attributes is not None
        assert attempt.attributes[tracing.OUTCOME] == "failed: transient"
        assert attempt.attributes["error.type"] == "ValueError"
        assert attempt.status.status_code == StatusCode.ERROR
        assert SECRET not in repr(attempt.to_json()), "never the error's message"
        assert not attempt.events

    run(scenario)


def test_a_failing_effect_is_an_error_span_without_its_message() -> None:
    exporter = in_memory_spans()

    def handler(ctx: JobContext) -> None:
        def declined() -> None:
            raise RuntimeError(f"declined {SECRET}")

        ctx.effect("charge:3", declined)

    async def scenario(fake: FakeLeases) -> None:
        job = fake.add("job_4")
        job.traceparent = TRACEPARENT
        async with running_worker(fake, handler):
            await fake.wait_for(lambda: job.status == "failed")
            await fake.wait_for(lambda: len(named(exporter.get_finished_spans(), "job attempt")))
        (effect,) = named(exporter.get_finished_spans(), "job effect")
        assert effect.status.status_code == StatusCode.ERROR
        assert effect.attributes is not None and effect.attributes["error.type"] == "RuntimeError"
        assert SECRET not in repr(effect.to_json()) and not effect.events

    run(scenario)


def test_without_a_tracer_provider_an_attempt_only_passes_its_context_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tracing, "recording", lambda: False)
    traced = Lease("job_1", 1, 1, 5, 30.0, "q", traceparent=TRACEPARENT, tracestate="rojo=1")
    span = _spans.start_attempt(traced, "w")
    assert not span.is_recording()
    context = span.get_span_context()
    assert (f"{context.trace_id:032x}", f"{context.span_id:016x}") == (TRACE_ID, PARENT_ID)
    assert context.is_remote and context.trace_flags.sampled
    assert context.trace_state.get("rojo") == "1"
    assert _spans.start_attempt(Lease("job_2", 1, 1, 5, 30.0, "q"), "w") is INVALID_SPAN
    for bad in ("01-" + TRACEPARENT[3:], TRACEPARENT.upper(), "00-" + "0" * 32 + TRACEPARENT[35:]):
        lease = Lease("job_3", 1, 1, 5, 30.0, "q", traceparent=bad)
        assert _spans.start_attempt(lease, "w") is INVALID_SPAN


def test_a_workflow_steps_attempt_names_the_workflow_and_a_schedule_runs_names_the_schedule() -> (
    None
):
    """A step's lease carries its workflow's context: its attempt joins that
    trace and names the workflow and step. A schedule's run carries none:
    its attempt is a root that names the schedule (docs/observability.md)."""
    exporter = in_memory_spans()

    async def scenario(fake: FakeLeases) -> None:
        step = fake.add("job_wf_s1")
        step.traceparent, step.workflow_id, step.step = TRACEPARENT, "wf_1", "charge"
        nightly = fake.add("job_nightly")
        nightly.schedule_id = "sch_nightly"
        async with running_worker(fake, lambda ctx: None):
            await fake.wait_for(lambda: step.status == nightly.status == "succeeded")
            await fake.wait_for(
                lambda: len(named(exporter.get_finished_spans(), "job attempt")) == 2
            )
        attempts = {
            span.attributes[tracing.JOB_ID]: span  # type: ignore[index]
            for span in named(exporter.get_finished_spans(), "job attempt")
        }
        traced, scheduled = attempts["job_wf_s1"], attempts["job_nightly"]
        assert _parent(traced) == (TRACE_ID, PARENT_ID)
        assert traced.attributes is not None
        assert (traced.attributes[tracing.WORKFLOW_ID], traced.attributes[tracing.STEP]) == (
            "wf_1",
            "charge",
        )
        assert tracing.SCHEDULE_ID not in traced.attributes
        assert scheduled.parent is None and _hex(scheduled)[0] != TRACE_ID, "a root"
        assert scheduled.attributes is not None
        assert scheduled.attributes[tracing.SCHEDULE_ID] == "sch_nightly"
        assert tracing.WORKFLOW_ID not in scheduled.attributes

    run(scenario)


def never_run(ctx: JobContext) -> None:
    raise AssertionError("a reconciliation lease reached the job handler")


@pytest.mark.parametrize("is_async", [False, True])
def test_a_reconciliation_is_a_span_in_the_jobs_trace_with_its_decision(is_async: bool) -> None:
    exporter = in_memory_spans()
    inside: list[tuple[str, str]] = []

    def look(ctx: ReconcileContext) -> Decision:
        # The handler's own spans are children of the reconciliation's.
        with tracing.tracer().start_as_current_span("provider lookup") as lookup:
            context = lookup.get_span_context()
            inside.append((f"{context.trace_id:032x}", f"{context.span_id:016x}"))
        return Happened({"charge": "ch_1"}, effects={"charge:1": "ch_1"})

    async def look_async(ctx: ReconcileContext) -> Decision:
        return look(ctx)

    async def scenario(fake: FakeLeases) -> None:
        job = fake.add_reconciling("job_r", {"card": SECRET}, queue="audit")
        job.traceparent, job.tracestate = TRACEPARENT, "rojo=00f067aa0ba902b7"
        async with running_worker(fake, never_run) as worker:
            worker.reconciler("audit")(look_async if is_async else look)
            await fake.wait_for(lambda: job.decision is not None)
            await fake.wait_for(lambda: named(exporter.get_finished_spans(), "job reconcile"))
        (span,) = named(exporter.get_finished_spans(), "job reconcile")
        (lookup,) = named(exporter.get_finished_spans(), "provider lookup")
        assert not named(exporter.get_finished_spans(), "job attempt")
        assert _parent(span) == (TRACE_ID, PARENT_ID), "the job's trace"
        assert span.kind == SpanKind.CONSUMER
        assert dict(span.attributes or {}) == {
            tracing.JOB_ID: "job_r",
            tracing.QUEUE: "q",
            tracing.ATTEMPT: 1,
            tracing.EPOCH: 1,
            tracing.FENCING_TOKEN: job.token,
            tracing.WORKER_ID: "w-test",
            tracing.RECONCILE_QUEUE: "audit",
            tracing.OUTCOME: "happened",
        }
        assert span.status.status_code == StatusCode.UNSET
        assert _parent(lookup) == _hex(span) and inside == [_hex(lookup)]
        assert SECRET not in repr(span.to_json()) and "ch_1" not in repr(span.to_json())

    run(scenario)


@pytest.mark.parametrize(
    ("answer", "outcome", "error_type"),
    [
        (DidNotHappen("no charge"), "did_not_happen", None),
        (CannotTell("provider down"), "cannot_tell", None),
        (RuntimeError(f"provider said {SECRET}"), "handler failed", "RuntimeError"),
        ("not a decision", "handler failed", "TypeError"),
    ],
)
def test_how_a_reconciliation_ended_is_its_outcome(
    answer: object, outcome: str, error_type: str | None
) -> None:
    exporter = in_memory_spans()

    def reconciler(ctx: ReconcileContext) -> Decision:
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    async def scenario(fake: FakeLeases) -> None:
        job = fake.add_reconciling("job_r")  # no trace context: a trace of its own
        async with running_worker(fake, never_run) as worker:
            worker.reconciler(None)(reconciler)
            await fake.wait_for(lambda: named(exporter.get_finished_spans(), "job reconcile"))
        span = named(exporter.get_finished_spans(), "job reconcile")[0]
        assert span.parent is None
        assert span.attributes is not None and span.attributes[tracing.OUTCOME] == outcome
        assert span.attributes.get("error.type") == error_type
        failed = error_type is not None
        assert (span.status.status_code == StatusCode.ERROR) is failed
        assert (job.decision is None) is failed
        assert SECRET not in repr(span.to_json()) and not span.events

    run(scenario)


def test_without_a_tracer_provider_a_reconciliation_makes_no_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tracing, "recording", lambda: False)
    traced = Lease("job_1", 1, 1, 5, 30.0, "q", traceparent=TRACEPARENT)
    span = _spans.start_reconcile(traced, "w", "q")
    assert not span.is_recording() and span.get_span_context().span_id == int(PARENT_ID, 16)
    assert _spans.start_reconcile(Lease("job_2", 1, 1, 5, 30.0, "q"), "w", "q") is INVALID_SPAN
