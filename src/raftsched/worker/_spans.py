"""The worker's spans: one per attempt, one per `ctx.effect`, one per
reconciliation.

A lease carries the W3C trace context its job was submitted with
(`traceparent`, `tracestate`; cluster version 8), a workflow's step job
the workflow's. The attempt's span is a child of it, so the job's run
shows in the submitter's trace; a lease without one starts a trace of its
own (a schedule's run: its span names the schedule). The handler runs with
the attempt span current (an async handler in a task made inside it, a
sync one in a thread that runs in a copy of its context), so spans the
handler makes, `ctx.effect`'s among them, and the requests its client
sends are children. A reconciliation lease asks a reconcile handler about
an attempt whose outcome is unknown: its `job reconcile` span is a child
of the same context, and its handler runs inside it the same way.

The spans go to the global tracer provider: a no-op until something
configures OpenTelemetry (`raftsched worker --otlp-endpoint`, the `OTEL_*`
environment, or the application that runs the worker). Attributes name
the job, queue, attempt, epoch and fencing token; never a payload, a
result, an error message or a token.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    INVALID_SPAN,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from raftsched import tracing

if TYPE_CHECKING:
    from raftsched.worker._context import Lease

ATTEMPT_SPAN: Final = "job attempt"
EFFECT_SPAN: Final = "job effect"
RECONCILE_SPAN: Final = "job reconcile"
_TRACEPARENT: Final = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
"""What a lease carries: the node stores only this form (api.trace_headers)."""


def submitted_span(lease: Lease) -> SpanContext | None:
    """The span the job was submitted in, from the W3C trace context its
    lease carries (whatever propagator the process uses); None without one,
    or with one that is not a version-00 traceparent with valid ids."""
    found = _TRACEPARENT.fullmatch(lease.traceparent) if lease.traceparent else None
    if found is None:
        return None
    state = None
    if lease.tracestate:
        state = TraceState.from_header([lease.tracestate])
    span = SpanContext(
        int(found[1], 16),
        int(found[2], 16),
        is_remote=True,
        trace_flags=TraceFlags(int(found[3], 16)),
        trace_state=state,
    )
    return span if span.is_valid else None


def start_attempt(lease: Lease, worker_id: str) -> Span:
    """The attempt's span, started (the caller makes it current and ends
    it). Until a tracer provider is set (`tracing.recording`), the job's
    submitted span itself, not recording: made current, it passes the
    trace context on to what the handler calls, for nearly nothing."""
    return _start(ATTEMPT_SPAN, lease, worker_id)


def start_reconcile(lease: Lease, worker_id: str, reconcile_queue: str) -> Span:
    """A reconciliation's span, as `start_attempt`'s: a child of the job's
    trace context, with the lease's attributes (its `attempt` the unknown
    attempt asked about, its `fencing_token` the reconciliation's) and the
    reconcile queue it came from."""
    return _start(RECONCILE_SPAN, lease, worker_id, {tracing.RECONCILE_QUEUE: reconcile_queue})


def _start(name: str, lease: Lease, worker_id: str, extra: dict[str, str] | None = None) -> Span:
    parent = submitted_span(lease)
    if not tracing.recording():
        return INVALID_SPAN if parent is None else NonRecordingSpan(parent)
    context = Context()
    if parent is not None:
        context = trace.set_span_in_context(NonRecordingSpan(parent), context)
    attributes: dict[str, str | int] = {
        tracing.JOB_ID: lease.job_id,
        tracing.QUEUE: lease.queue,
        tracing.ATTEMPT: lease.attempt,
        tracing.EPOCH: lease.epoch,
        tracing.FENCING_TOKEN: lease.fencing_token,
        tracing.WORKER_ID: worker_id,
    }
    # Where the job came from, when it says: ids, never user data.
    if lease.workflow_id is not None:
        attributes[tracing.WORKFLOW_ID] = lease.workflow_id
        if lease.step is not None:
            attributes[tracing.STEP] = lease.step
    if lease.schedule_id is not None:
        attributes[tracing.SCHEDULE_ID] = lease.schedule_id
    if extra:
        attributes.update(extra)
    return tracing.tracer().start_span(
        name, context=context, kind=SpanKind.CONSUMER, attributes=attributes
    )


def attempt_ended(span: Span, outcome: str, error_type: str | None = None) -> None:
    """How the attempt ended: `succeeded`, `failed: <kind>`, `not started`,
    `lease lost`, `report failed`; an error for all but success."""
    ended(span, outcome, outcome == "succeeded", error_type)


RECONCILE_DECISIONS: Final = frozenset({"happened", "did_not_happen", "cannot_tell"})


def reconcile_ended(span: Span, outcome: str, error_type: str | None = None) -> None:
    """How a reconciliation ended: the decision the cluster took
    (`happened`, `did_not_happen`, `cannot_tell`), or `handler failed`,
    `lease lost`, `answer not taken`, `abandoned`: an error, as no answer
    was given and the question will be asked again."""
    ended(span, outcome, outcome in RECONCILE_DECISIONS, error_type)


def ended(span: Span, outcome: str, ok: bool, error_type: str | None = None) -> None:
    span.set_attribute(tracing.OUTCOME, outcome)
    if error_type is not None:
        span.set_attribute("error.type", error_type)
    if not ok:
        span.set_status(Status(StatusCode.ERROR, outcome))


@contextmanager
def effect_span(lease: Lease, key: str) -> Iterator[Span]:
    """A child of the current span (the attempt's) around one effect: its
    lookup, the side effect if it runs, and its record. The key is the
    handler's name for the effect, not user data. None is made while the
    attempt's span is not recording (no tracer provider, or sampled out)."""
    current = trace.get_current_span()
    if not current.is_recording():
        yield current
        return
    with tracing.tracer().start_as_current_span(
        EFFECT_SPAN,
        attributes={
            tracing.EFFECT_KEY: key,
            tracing.JOB_ID: lease.job_id,
            tracing.FENCING_TOKEN: lease.fencing_token,
        },
        # An exception's message may quote a payload: the span names its type only.
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as error:
            span.set_attribute("error.type", type(error).__name__)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            raise
