"""One lease, from start to report.

Order of operations for a granted lease:

1. `start` (claimed -> running). If it fails, the handler never runs: a
   claimed lease that expires is a safe retry.
2. Run the handler (async: a task on the loop; sync: its own daemon thread)
   while a keeper renews the lease with heartbeats.
3. Stop the keeper, then report `complete` or `fail`, unless the lease was lost.

The worker keeps its own deadline from the monotonic clock: a renewal sent at
local time `t` makes the lease valid on the cluster until at least
`t + lease_s` (the cluster counts from when it applies the heartbeat, which is
later), so `t + lease_s - margin` never outlives the real lease. The first
deadline counts from when the claim was *sent*. Heartbeats go out when a third
of the lease (minus the margin) is left to spare twice over; when the deadline
passes without a renewal the handler is cancelled, since another worker may
get the job from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span

from raftsched.client import ApiError, FailureKind, JsonObject, LeaseLost, RaftschedError
from raftsched.worker import _spans
from raftsched.worker._batcher import LeaseOps
from raftsched.worker._context import (
    CancelReason,
    JobCancelled,
    JobContext,
    Lease,
    PermanentError,
    TransientError,
    api_json,
    log_fields,
)

log = logging.getLogger("raftsched.worker")

Handler = Callable[[JobContext], Any] | Callable[[JobContext], Awaitable[Any]]

ERROR_MESSAGE_MAX_CHARS = 2000
# While cancel is requested, keep the lease this many leases long so that a
# cooperative handler can stop cleanly; then let it lapse (it ends cancelled).
CANCEL_GRACE_LEASES = 1.0


def safety_margin_s(lease_s: float) -> float:
    """How much earlier than the lease the worker's own deadline falls."""
    return max(0.1, min(2.0, lease_s / 10))


@dataclass(frozen=True, slots=True)
class Returned:
    value: Any


@dataclass(frozen=True, slots=True)
class Raised:
    error: BaseException


Outcome = Returned | Raised


class JobRun:
    def __init__(
        self,
        ctx: JobContext,
        handler: Handler,
        batcher: LeaseOps,
        *,
        claim_sent_at: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        self._handler = handler
        self._is_async = is_async_handler(handler)
        self._batcher = batcher
        self._clock = clock
        self._lease_s = ctx.lease.lease_s
        self.deadline = claim_sent_at + self._lease_s - safety_margin_s(self._lease_s)
        self._handler_task: asyncio.Task[Outcome] | None = None
        # Set when the handler has ended: the keeper stops at its next turn
        # even if the cancel that stops it was swallowed (see `run`).
        self._keeper_done = False
        # The unexpected error of the last renewal, if it failed so (not an
        # answer of the cluster): logged as an error if the lease runs out.
        self._renewal_error: Exception | None = None
        # How the handler ended, once it has (what `_report` reports).
        self.outcome: Outcome | None = None
        self._abandoned: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Structured log fields (see raftsched.logs): every line names its lease.
        self._fields: dict[str, Any] = log_fields(ctx.lease)

    def cancel(self, reason: CancelReason) -> None:
        """Ask the handler to stop; async handlers are cancelled at once."""
        if not self.ctx.cancelled.is_set():
            log.info("job cancelling", extra={**self._fields, "reason": reason})
        self.ctx.cancel(reason)
        if self._handler_task is not None and self._is_async:
            self._handler_task.cancel()

    def abandon(self) -> None:
        """Shutdown gave up waiting for a handler that ignores cancellation:
        report it as interrupted now and leave its thread behind."""
        self.cancel("shutdown")
        if not self._abandoned.done():
            self._abandoned.set_result(None)

    async def run(self) -> None:
        """Start, run and report the attempt, inside its span (a child of
        the submission's trace context, `worker._spans`): the handler's
        task, or thread, runs with that span current."""
        span = _spans.start_attempt(self.ctx.lease, self.ctx.worker_id)
        if span is INVALID_SPAN:  # no tracer provider, no trace context: nothing to carry
            await self._run(span)
            return
        # Not the exception's message (it may quote a payload): its type.
        with trace.use_span(
            span, end_on_exit=True, record_exception=False, set_status_on_exception=False
        ):
            try:
                await self._run(span)
            except BaseException as error:
                _spans.attempt_ended(span, "interrupted", type(error).__name__)
                raise

    async def _run(self, span: Span) -> None:
        if not await self._start():
            _spans.attempt_ended(span, "not started")
            return
        log.info("job running", extra=self._fields)
        started_at = self._clock()
        self._handler_task = asyncio.get_running_loop().create_task(self._invoke())
        keeper = asyncio.get_running_loop().create_task(self._keep_lease())
        try:
            ending: set[asyncio.Future[Any]] = {self._handler_task, self._abandoned}
            await asyncio.wait(ending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # On Python 3.11 `asyncio.wait_for` swallows a cancel that arrives
            # when the operation it waits for has just finished (gh-86296): a
            # heartbeat answered in the same loop turn would keep the keeper
            # renewing forever, and this run would never report. The flag ends it.
            self._keeper_done = True
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        if self._handler_task.done():
            outcome = self._handler_task.result()
        else:
            outcome = Raised(JobCancelled("shutdown"))
        self.outcome = outcome
        ended = await self._report(outcome, self._clock() - started_at)
        error = outcome.error if isinstance(outcome, Raised) else None
        _spans.attempt_ended(span, ended, None if error is None else type(error).__name__)

    async def _start(self) -> bool:
        op = self._op("start")
        try:
            await asyncio.wait_for(self._batcher.op(op), timeout=self._remaining_s())
        except (RaftschedError, TimeoutError, ValueError) as error:
            # ValueError: the deadline had passed already (negative timeout).
            log.warning("job not started", extra={**self._fields, "error": _describe(error)})
            return False
        return True

    async def _invoke(self) -> Outcome:
        """Run the handler; every ending becomes an Outcome, so the task itself
        never fails (CancelledError from our own cancel included)."""
        try:
            if self._is_async:
                return Returned(await self._handler(self.ctx))
            return await _in_thread(self._handler, self.ctx)
        except BaseException as error:  # noqa: BLE001 - reported as the attempt's failure
            return Raised(error)

    async def _keep_lease(self) -> None:
        interval_s = self._lease_s / 3
        cancel_requested_at: float | None = None
        while not self._keeper_done:
            if (
                cancel_requested_at is not None
                and self._clock() - cancel_requested_at > CANCEL_GRACE_LEASES * self._lease_s
            ):
                # The handler ignores the cancel: stop renewing and let the
                # lease lapse; the cluster then ends the job cancelled.
                await asyncio.sleep(max(0.0, self._remaining_s()))
                self.cancel("deadline")
                return
            await asyncio.sleep(max(0.0, self.deadline - 2 * interval_s - self._clock()))
            remaining_s = self._remaining_s()
            if remaining_s <= 0:
                if self._renewal_error is not None:
                    log.error(
                        "job lease lost: renewals failed unexpectedly until the deadline",
                        exc_info=self._renewal_error,
                        extra={**self._fields, "error": _describe(self._renewal_error)},
                    )
                self.cancel("deadline")
                return
            answer = await self._heartbeat(remaining_s)
            if answer is None:
                return
            if answer.get("cancel_requested") and cancel_requested_at is None:
                cancel_requested_at = self._clock()
                self.cancel("cancel_requested")

    async def _heartbeat(self, remaining_s: float) -> JsonObject | None:
        """One renewal: its answer; {} after a failure worth retrying at once;
        None when the keeper must stop (lease lost, deadline passed)."""
        op = self._op("heartbeat", extend_s=self._lease_s)
        progress = self.ctx.take_progress()
        if progress is not None:
            op["progress"] = progress
        sent_at = self._clock()
        try:
            answer = await asyncio.wait_for(self._batcher.op(op), timeout=remaining_s)
        except TimeoutError:
            self.cancel("deadline")
            return None
        except LeaseLost:
            self.cancel("lease_lost")
            return None
        except RaftschedError as error:
            # The cluster may be electing a leader; try again soon, within the deadline.
            log.warning("heartbeat failed", extra={**self._fields, "error": _describe(error)})
            await asyncio.sleep(min(1.0, remaining_s / 4))
            return {}
        except Exception as error:  # noqa: BLE001 - a bug must not end renewals
            # Not the cluster's answer: something in the worker itself. The
            # lease is not lost yet; renew again, and say so if the deadline
            # passes before a renewal succeeds (`_keep_lease`).
            self._renewal_error = error
            log.warning(
                "heartbeat failed unexpectedly; renewing again",
                exc_info=error,
                extra={**self._fields, "error": _describe(error)},
            )
            await asyncio.sleep(min(1.0, remaining_s / 4))
            return {}
        self._renewal_error = None
        self.deadline = sent_at + self._lease_s - safety_margin_s(self._lease_s)
        return answer

    async def _report(self, outcome: Outcome, elapsed_s: float) -> str:
        """Report the outcome; how the attempt ended, for its span."""
        reason = self.ctx.cancel_reason
        if reason == "lease_lost" or _is_lease_lost(outcome):
            log.warning("job lease lost; outcome not reported", extra=self._fields)
            return "lease lost"
        op = self._outcome_op(outcome, reason)
        try:
            await self._batcher.op(op)
        except LeaseLost:
            log.warning("job report rejected: lease lost", extra={**self._fields, "op": op["op"]})
            return "lease lost"
        except RaftschedError as error:
            log.error("job report failed", extra={**self._fields, "error": _describe(error)})
            return "report failed"
        fields = {**self._fields, "elapsed_s": round(elapsed_s, 3)}
        if op["op"] == "complete":
            log.info("job succeeded", extra=fields)
            return "succeeded"
        kind = op["error"]["kind"]
        log.info("job failed", extra={**fields, "kind": kind})
        return f"failed: {kind}"

    def _outcome_op(self, outcome: Outcome, reason: CancelReason | None) -> JsonObject:
        if isinstance(outcome, Returned):
            try:
                api_json(outcome.value, "result")
            except TypeError as not_json:
                # Sent, the batch carrying it would fail (NaN: refused whole).
                return self._fail_op("permanent", str(not_json))
            return self._op("complete", result=outcome.value)
        error = outcome.error
        if isinstance(error, JobCancelled | asyncio.CancelledError) and reason is not None:
            kind: FailureKind = "cancelled" if reason == "cancel_requested" else "unknown"
            return self._fail_op(kind, f"handler stopped: {reason}")
        if isinstance(error, PermanentError):
            return self._fail_op("permanent", _describe(error))
        retry_after_s = error.retry_after_s if isinstance(error, TransientError) else None
        return self._fail_op("transient", _describe(error), retry_after_s)

    def _fail_op(
        self, kind: FailureKind, message: str, retry_after_s: float | None = None
    ) -> JsonObject:
        return fail_op(self.ctx.lease, kind, message, retry_after_s)

    def _op(self, name: str, **fields: Any) -> JsonObject:
        lease = self.ctx.lease
        return {"op": name, "job_id": lease.job_id, "fencing_token": lease.fencing_token, **fields}

    def _remaining_s(self) -> float:
        return self.deadline - self._clock()


def fail_op(
    lease: Lease,
    kind: FailureKind,
    why: str | BaseException,
    retry_after_s: float | None = None,
) -> JsonObject:
    """The `fail` lease operation of `lease`: `why` a message, or an error
    described as the attempt's failure is (`_describe`)."""
    message = why if isinstance(why, str) else _describe(why)
    error: JsonObject = {"kind": kind, "message": message[:ERROR_MESSAGE_MAX_CHARS]}
    if retry_after_s is not None:
        error["retry_after_s"] = retry_after_s
    return {
        "op": "fail",
        "job_id": lease.job_id,
        "fencing_token": lease.fencing_token,
        "error": error,
    }


def is_async_handler(handler: Handler) -> bool:
    """`async def` functions, and objects whose `__call__` is one."""
    call = getattr(handler, "__call__", None)  # noqa: B004 - looking for an async __call__
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


def _is_lease_lost(outcome: Outcome) -> bool:
    """A handler whose effect record was fenced off lost its lease too."""
    return isinstance(outcome, Raised) and isinstance(outcome.error, LeaseLost)


def _describe(error: BaseException) -> str:
    if isinstance(error, ApiError):
        return f"{error.code}: {error.message}"
    text = str(error)
    code = getattr(type(error), "code", None)
    if isinstance(code, str):  # a stable code of ours (`no_handler_for_kind`)
        return f"{code}: {text}"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


async def _in_thread(handler: Callable[[JobContext], Any], ctx: JobContext) -> Outcome:
    """Run a sync handler in its own daemon thread: a handler that ignores
    cancellation must not keep the process from exiting at shutdown."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Outcome] = loop.create_future()
    # The thread runs in a copy of this task's context: the attempt's span
    # is current there, so the handler's spans (ctx.effect's) are its children.
    context = contextvars.copy_context()

    def settle(outcome: Outcome) -> None:
        if not future.done():
            future.set_result(outcome)

    def target() -> None:
        outcome: Outcome
        try:
            outcome = Returned(context.run(handler, ctx))
        except BaseException as error:  # noqa: BLE001 - handed to the loop
            outcome = Raised(error)
        # RuntimeError: the loop is closed, the worker has exited without us.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=target, name=f"job-{ctx.job_id}", daemon=True).start()
    return await future
