"""The `raft commit` span: a request's command from proposal to its result.

While tracing is on (`raftsched.tracing.enabled`), a command proposed on
behalf of a traced request (its HTTP server span is the current span, see
`api.server_spans`) gets a child span that covers the wait for the Raft
entry that carries it to commit and be applied here, named by the command
and the entry's epoch, the job, its queue, attempt and fencing token where
they apply. The leader's own proposals (Ticks, takeovers, the version
raise) have no current span and get none. Off, this costs one function
call per proposal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, Final, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from raftsched import tracing
from raftsched.core.jobs.commands import ClaimJobs, LeaseBatch, SubmitJobs
from raftsched.core.kernel.commands import Audited, Command
from raftsched.core.kernel.results import BatchApplied, Claimed, Lease, Rejected

SPAN_NAME: Final = "raft commit"
T = TypeVar("T")


def start(commands: Sequence[Command], epoch: int | None) -> Span | None:
    """A started commit span for `commands` (one request's), or None when
    tracing is off or nothing traced is current."""
    if not tracing.enabled() or not trace.get_current_span().is_recording():
        return None
    attributes: dict[str, Any] = {}
    if epoch is not None:
        attributes[tracing.EPOCH] = epoch
    if len(commands) == 1:
        attributes.update(_describe(commands[0]))
    else:
        attributes[tracing.COMMAND] = ",".join(sorted({type(c).__name__ for c in commands}))
    return tracing.tracer().start_span(SPAN_NAME, kind=SpanKind.INTERNAL, attributes=attributes)


async def traced(span: Span, awaitable: Awaitable[T]) -> T:
    """Await `awaitable` (the proposal) inside `span`, which it ends; an
    exception (no leader, an unknown outcome) marks the span an error."""
    with trace.use_span(span, end_on_exit=True):
        result = await awaitable
        _annotate(span, result)
        return result


def end_when_done(span: Span, futures: Sequence[asyncio.Future[Any]]) -> None:
    """End `span` when the last of `futures` (a request's commands queued
    together) is done."""
    remaining = [len(futures)]

    def done(future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is not None:
            span.set_status(Status(StatusCode.ERROR, type(future.exception()).__name__))
        remaining[0] -= 1
        if remaining[0] == 0:
            span.end()

    for future in futures:
        future.add_done_callback(done)


def _describe(command: Command) -> dict[str, Any]:
    """What a span may say of a command: its kind, the job and fencing
    token it names, the queue; never a payload, a result or a secret."""
    if type(command) is Audited:
        return {**_describe(command.command), tracing.COMMAND: type(command.command).__name__}
    attributes: dict[str, Any] = {tracing.COMMAND: type(command).__name__}
    if type(command) is SubmitJobs:
        attributes[tracing.JOB_COUNT] = len(command.job_ids)
        if len(command.job_ids) == 1:
            attributes[tracing.JOB_ID] = command.job_ids[0]
        queues = {spec.queue for spec in command.specs}
        if len(queues) == 1:
            attributes[tracing.QUEUE] = next(iter(queues))
        return attributes
    if type(command) is LeaseBatch:
        attributes[tracing.JOB_COUNT] = len(command.ops)
        if len(command.ops) == 1:
            attributes.update(_job_fields(command.ops[0]))
        return attributes
    if isinstance(command, ClaimJobs):
        attributes[tracing.WORKER_ID] = command.worker_id
        if len(command.queues) == 1:
            attributes[tracing.QUEUE] = command.queues[0]
        return attributes
    attributes.update(_job_fields(command))
    return attributes


def _job_fields(command: Command) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    job_id = getattr(command, "job_id", None)
    if isinstance(job_id, str):
        attributes[tracing.JOB_ID] = job_id
    token = getattr(command, "fencing_token", None)
    if type(token) is int:
        attributes[tracing.FENCING_TOKEN] = token
    return attributes


def _annotate(span: Span, result: object) -> None:
    """The result's outcome, and the lease a claim granted (its job,
    attempt, epoch and fencing token) when it granted one."""
    if isinstance(result, Rejected):
        span.set_attribute(tracing.OUTCOME, f"rejected: {result.code}")
        return
    claimed = result.claimed if isinstance(result, BatchApplied) else result
    if isinstance(claimed, Claimed):
        leases = claimed.leases
        span.set_attribute(tracing.OUTCOME, f"granted {len(leases)}")
        if len(leases) == 1:
            _lease_attributes(span, leases[0])
        return
    span.set_attribute(tracing.OUTCOME, type(result).__name__)


def _lease_attributes(span: Span, lease: Lease) -> None:
    span.set_attributes(
        {
            tracing.JOB_ID: lease.job_id,
            tracing.QUEUE: lease.queue,
            tracing.ATTEMPT: lease.attempt,
            tracing.EPOCH: lease.epoch,
            tracing.FENCING_TOKEN: lease.fencing_token,
        }
    )
