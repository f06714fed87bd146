"""The traces section: the W3C trace context a job was submitted with.

A submission made inside a trace carries its context (the `traceparent`
and `tracestate` headers, docs/observability.md); the job keeps it, and
every lease of the job hands it to the worker, whose attempt span then
joins the submitter's trace. The core never looks inside: it stores the
two strings (bounded by `validate.check_trace_context`) and gives them back.

They are kept here, beside the jobs, rather than in a slot of every `Job`,
as the reconcile policies are (`reconcile_book`): most jobs carry none, the
job encoding stays the one earlier releases wrote and read, and a far-future
job still packs into the time wheel (the section is keyed by job id, which
packing keeps). The section is optional: a state without a traced job keeps
the bytes and the digest of the release before it (since cluster version 8,
`cluster_version.SPEC_TRACE_VERSION`). A job's record is written when the
job is created and dropped when it is purged (`forget`).
"""

from __future__ import annotations

from typing import Any, Final

from raftsched.core.kernel import wheel
from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.commands import JobSpec
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import check_trace_context

TRACES: Final = "traces"

TraceContext = tuple[str, str | None]
"""(traceparent, tracestate or None)."""


def traces_of(state: State) -> dict[str, TraceContext]:
    traces: dict[str, TraceContext] = state.sections[TRACES]
    return traces


def trace_of(state: State, job_id: str) -> TraceContext | None:
    """The trace context job `job_id` was submitted with, if any."""
    traces: dict[str, TraceContext] = state.sections[TRACES]
    return traces.get(job_id) if traces else None


def remember(state: State, job_id: str, spec: JobSpec, savepoint: Savepoint | None) -> None:
    """A new job whose spec carried a trace context (checked by `check_spec`)."""
    if spec.traceparent is None:
        return
    traces = traces_of(state)
    traces[job_id] = (spec.traceparent, spec.tracestate)
    if savepoint is not None:
        savepoint.on_rollback(lambda: _drop(traces, job_id))


def forget(state: State, job_id: str, savepoint: Savepoint) -> None:
    """A purged job's trace context goes with it."""
    traces = traces_of(state)
    if not traces:
        return
    context = traces.pop(job_id, None)
    if context is not None:
        savepoint.on_rollback(lambda: traces.__setitem__(job_id, context))


def _drop(traces: dict[str, TraceContext], job_id: str) -> None:
    traces.pop(job_id, None)


# -- encoding ---------------------------------------------------------------------


def _encode(state: State) -> Any:
    return [[job_id, *context] for job_id, context in sorted(traces_of(state).items())]


def _decode(state: State, data: Any) -> None:
    if type(data) is not tuple:
        raise CodecError("the traces section is an array")
    traces: dict[str, TraceContext] = {}
    jobs = state.jobs
    for row in data:
        if type(row) is not tuple or len(row) != 3 or type(row[0]) is not str:
            raise CodecError("a trace is [job_id, traceparent, tracestate]")
        job_id, traceparent, tracestate = row
        if type(traceparent) is not str or (tracestate is not None and type(tracestate) is not str):
            raise CodecError("a trace context is strings")
        job = jobs.get(job_id)
        # The live job's own id string, rather than a second copy of it.
        traces[job.id if job is not None else job_id] = (traceparent, tracestate)
    state.sections[TRACES] = traces


def _at_default(state: State) -> bool:
    return not traces_of(state)


SECTION: Final = Section(TRACES, dict, _encode, _decode, _at_default)


def check(state: State) -> list[str]:
    """Invariants: a trace context only for a job that exists (live, or
    packed in the time wheel), and only one the core would accept."""
    problems: list[str] = []
    for job_id, (traceparent, tracestate) in traces_of(state).items():
        if job_id not in state.jobs and wheel.find_packed(state, job_id) is None:
            problems.append(f"trace context for unknown job {job_id}")
        if check_trace_context(traceparent, tracestate) is not None:
            problems.append(f"job {job_id} has an invalid trace context")
    return problems
