"""The trace context a submission carries in its W3C headers, for its jobs.

`POST /v1/jobs` and `POST /v1/jobs/batch` keep the request's `traceparent`
(and `tracestate`) with every job they create, and `POST /v1/workflows`
with the workflow, which gives it to every job it creates, so that each
lease hands it to the worker (docs/api.md, "Trace context"). A header is
not a field the caller set: a malformed one is ignored, as W3C Trace
Context asks, and below cluster version 8 (`SPEC_TRACE_VERSION`), while a
member may not decode a command that holds one, the jobs or the workflow
are created without it rather than the submission refused. Nothing in the
body sets it. `POST /v1/schedules` does not keep it: a schedule's runs are
not the work of the request that created it (docs/observability.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from aiohttp import web

from raftsched.api.requests import node_of
from raftsched.core.kernel.cluster_version import SPEC_TRACE_VERSION
from raftsched.core.kernel.commands import JobSpec
from raftsched.tracing import (
    TRACEPARENT_HEADER,
    TRACESTATE_HEADER,
    parse_traceparent,
    parse_tracestate,
)


def request_trace_context(request: web.Request) -> tuple[str, str | None] | None:
    """The request's (traceparent, tracestate), normalized (`tracing`), or
    None: no traceparent, one that does not parse, or more than one (W3C:
    invalid)."""
    parents = request.headers.getall(TRACEPARENT_HEADER, ())
    if len(parents) != 1:
        return None
    traceparent = parse_traceparent(parents[0])
    if traceparent is None:
        return None
    states = request.headers.getall(TRACESTATE_HEADER, ())
    return traceparent, parse_tracestate(",".join(states)) if states else None


def storable_trace_context(request: web.Request) -> tuple[str, str | None] | None:
    """The request's trace context (`request_trace_context`) when the
    cluster version in force lets a command hold it; else None."""
    context = request_trace_context(request)
    if context is None or node_of(request).cluster_version() < SPEC_TRACE_VERSION:
        return None
    return context


def with_trace_context(request: web.Request, specs: Sequence[JobSpec]) -> list[JobSpec]:
    """`specs` with the request's trace context, when it has one and the
    cluster version in force lets a spec hold it; else as they are."""
    context = storable_trace_context(request)
    if context is None:
        return list(specs)
    traceparent, tracestate = context
    return [replace(spec, traceparent=traceparent, tracestate=tracestate) for spec in specs]
