"""The worker's spans: one per attempt, one per `ctx.effect`.

A lease carries the W3C trace context its job was submitted with
(`traceparent`, `tracestate`; cluster version 8). The attempt's span is a
child of it, so the job's run shows in the submitter's trace; a lease
without one starts a trace of its own. The handler runs with the attempt
span current (an async handler in a task made inside it, a sync one in a
thread that runs in a copy of its context), so spans the handler makes,
`ctx.effect`'s among them, and the requests its client sends are children.

The spans go to the global tracer provider: a no-op until something
configures OpenTelemetry (`raftsched worker --otlp-endpoint`, the `OTEL_*`
environment, or the application that runs the worker). Attributes name
the job, queue, attempt, epoch and fencing token; never a payload, a
result, an error message or a token.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from raftsched import tracing

if TYPE_CHECKING:
    from raftsched.worker._context import Lease

ATTEMPT_SPAN: Final = "job attempt"
EFFECT_SPAN: Final = "job effect"
_W3C: Final = TraceContextTextMapPropagator()


def submitted_context(lease: Lease) -> Context:
    """The context the job was submitted in (empty without one): always the
    W3C headers the lease carries, whatever propagator the process uses."""
    if lease.traceparent is None:
        return Context()
    carrier = {tracing.TRACEPARENT_HEADER: lease.traceparent}
    if lease.tracestate is not None:
        carrier[tracing.TRACESTATE_HEADER] = lease.tracestate
    return _W3C.extract(carrier, context=Context())


def start_attempt(lease: Lease, worker_id: str) -> Span:
    """The attempt's span, started (the caller makes it current and ends it)."""
    return tracing.tracer().start_span(
        ATTEMPT_SPAN,
        context=submitted_context(lease),
        kind=SpanKind.CONSUMER,
        attributes={
            tracing.JOB_ID: lease.job_id,
            tracing.QUEUE: lease.queue,
            tracing.ATTEMPT: lease.attempt,
            tracing.EPOCH: lease.epoch,
            tracing.FENCING_TOKEN: lease.fencing_token,
            tracing.WORKER_ID: worker_id,
        },
    )


def attempt_ended(span: Span, outcome: str, error_type: str | None = None) -> None:
    """How the attempt ended: `succeeded`, `failed: <kind>`, `not started`,
    `lease lost`, `report failed`; an error for all but success."""
    span.set_attribute(tracing.OUTCOME, outcome)
    if error_type is not None:
        span.set_attribute("error.type", error_type)
    if outcome != "succeeded":
        span.set_status(Status(StatusCode.ERROR, outcome))


@contextmanager
def effect_span(lease: Lease, key: str) -> Iterator[Span]:
    """A child of the current span (the attempt's) around one effect: its
    lookup, the side effect if it runs, and its record. The key is the
    handler's name for the effect, not user data."""
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
