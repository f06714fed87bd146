"""Reconcile handlers: did an attempt whose outcome is unknown have its effect?

A job with `on_unknown: reconcile` whose attempt ended unknown (the worker
died after calling a provider, or its lease expired mid-call) is not run
again until a reconcile handler looked: the cluster leases the question to
the workers of the job's reconcile queue. Register one per queue:

    worker = Worker(config, charge)

    @worker.reconciler("payments")
    def was_charged(ctx: ReconcileContext) -> Decision:
        charge = provider.find(idempotency_key=ctx.idempotency_key)
        if charge is None:
            return DidNotHappen("no charge for this key")
        return Happened({"charge": charge.id}, effects={f"charge:{ctx.job_id}": charge.id})

The answer is fenced by the reconciliation's own token. `Happened` completes
the job with its result (and records the effects, first writer wins),
`DidNotHappen` retries the job, `CannotTell` dead-letters it for a human. A
handler that raises gives no answer: the reconciliation lease lapses and the
question is asked again after the job's backoff (five times at most, then
the job is dead-lettered as `unreconciled`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span

from raftsched.client import LeaseLost, RaftschedError
from raftsched.worker import _spans
from raftsched.worker._batcher import LeaseOps
from raftsched.worker._context import CancelReason, Lease, api_json, log_fields

log = logging.getLogger("raftsched.worker")


@dataclass(frozen=True, slots=True)
class Happened:
    """The effect happened: complete the job with `result`; record `effects`
    (key -> result) in the ledger as if the attempt had recorded them."""

    result: Any = None
    effects: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""


@dataclass(frozen=True, slots=True)
class DidNotHappen:
    """The effect did not happen: the job is retried as its next attempt."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class CannotTell:
    """Nobody can tell now: the job is dead-lettered `unreconciled`."""

    reason: str


Decision = Happened | DidNotHappen | CannotTell


@dataclass(frozen=True, slots=True)
class UnknownAttempt:
    """The attempt whose outcome is unknown, as the lease names it."""

    number: int
    fencing_token: int
    worker_id: str
    started_at: str | None
    effect_keys: tuple[str, ...]
    queue: str

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> UnknownAttempt:
        return UnknownAttempt(
            number=int(data["attempt"]),
            fencing_token=int(data["fencing_token"]),
            worker_id=str(data["worker_id"]),
            started_at=data.get("started_at"),
            effect_keys=tuple(str(key) for key in data.get("effect_keys") or ()),
            queue=str(data.get("queue", "")),
        )


class ReconcileContext:
    """What a reconcile handler sees: the job, the unknown attempt, the
    effects recorded so far, and whether it should stop (`cancelled`)."""

    def __init__(self, lease: Lease, attempt: UnknownAttempt, worker_id: str) -> None:
        self.lease = lease
        self.attempt = attempt
        self.worker_id = worker_id
        self.cancelled = threading.Event()

    @property
    def job_id(self) -> str:
        return self.lease.job_id

    @property
    def payload(self) -> Any:
        return self.lease.payload

    @property
    def idempotency_key(self) -> str | None:
        return self.lease.idempotency_key

    @property
    def queue(self) -> str:
        """The job's own queue (the reconcile queue is `attempt.queue`)."""
        return self.lease.queue

    @property
    def effect_keys(self) -> tuple[str, ...]:
        return self.attempt.effect_keys

    @property
    def fencing_token(self) -> int:
        """The reconciliation's token (not the unknown attempt's)."""
        return self.lease.fencing_token


Reconciler = (
    Callable[[ReconcileContext], Decision] | Callable[[ReconcileContext], Awaitable[Decision]]
)


class ReconcileRun:
    """One reconciliation lease: ask the handler, keep the lease while it
    thinks, answer. Has `cancel` and `abandon` like a `JobRun`, so that the
    worker drains it the same way."""

    def __init__(self, ctx: ReconcileContext, handler: Reconciler, batcher: LeaseOps) -> None:
        self.ctx = ctx
        self._handler = handler
        self._batcher = batcher
        self._task: asyncio.Task[Any] | None = None
        # What the handler answered, or why it gave no answer.
        self.decision: Decision | None = None
        self.error: BaseException | None = None
        self._fields = {**log_fields(ctx.lease), "reconcile_attempt": ctx.attempt.number}

    def cancel(self, reason: CancelReason) -> None:
        self.ctx.cancelled.set()
        if self._task is not None and inspect.iscoroutinefunction(self._handler):
            self._task.cancel()

    def abandon(self) -> None:
        self.cancel("shutdown")
        if self._task is not None:
            self._task.cancel()

    async def run(self) -> None:
        """Ask, keep the lease, answer, inside the reconciliation's span (a
        child of the job's trace context, `worker._spans`): the handler's
        task, or thread, runs with that span current."""
        ctx = self.ctx
        span = _spans.start_reconcile(ctx.lease, ctx.worker_id, ctx.attempt.queue)
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
                _spans.reconcile_ended(span, "abandoned", type(error).__name__)
                raise

    async def _run(self, span: Span) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._ask())
        keeper = loop.create_task(self._keep_lease())
        try:
            decision = self.decision = await self._task
        except asyncio.CancelledError as cancelled:
            self.error = cancelled
            log.info("reconciliation abandoned", extra=self._fields)
            _spans.reconcile_ended(span, "abandoned", type(cancelled).__name__)
            return
        except Exception as error:  # noqa: BLE001 - no answer: asked again later
            self.error = error
            log.warning(
                "reconcile handler failed; the question will be asked again",
                extra={**self._fields, "error": f"{type(error).__name__}: {error}"},
            )
            _spans.reconcile_ended(span, "handler failed", type(error).__name__)
            return
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        _spans.reconcile_ended(span, *await self._answer(decision))

    async def _ask(self) -> Decision:
        handler = self._handler
        if inspect.iscoroutinefunction(handler):
            decision = await handler(self.ctx)
        else:
            decision = await _in_thread(handler, self.ctx)
        if not isinstance(decision, Happened | DidNotHappen | CannotTell):
            raise TypeError(
                f"a reconciler returns Happened, DidNotHappen or CannotTell, not {decision!r}"
            )
        if isinstance(decision, Happened):
            # Refused here, not by the batch that would carry it (and others' ops).
            api_json(decision.result, "Happened.result")
            for key, result in decision.effects.items():
                api_json(result, f"Happened.effects[{key!r}]")
        return decision

    async def _keep_lease(self) -> None:
        lease = self.ctx.lease
        while True:
            await asyncio.sleep(lease.lease_s / 3)
            op = {"op": "heartbeat", "job_id": lease.job_id, "fencing_token": lease.fencing_token}
            try:
                await self._batcher.op(op)
            except RaftschedError as error:
                log.warning(
                    "reconciliation lease not renewed", extra={**self._fields, "error": str(error)}
                )
                self.ctx.cancelled.set()
                return

    async def _answer(self, decision: Decision) -> tuple[str, str | None]:
        """Send the decision; how the reconciliation ended, for its span
        (the decision taken, or why not, and the error's type)."""
        lease = self.ctx.lease
        op: dict[str, Any] = {
            "op": "reconcile",
            "job_id": lease.job_id,
            "fencing_token": lease.fencing_token,
            "reason": decision.reason,
        }
        if isinstance(decision, Happened):
            op["decision"] = "happened"
            op["result"] = decision.result
            if decision.effects:
                op["effects"] = [{"key": k, "result": v} for k, v in decision.effects.items()]
        elif isinstance(decision, DidNotHappen):
            op["decision"] = "did_not_happen"
        else:
            op["decision"] = "cannot_tell"
        try:
            answer = await self._batcher.op(op)
        except RaftschedError as error:
            log.warning("reconcile answer not taken", extra={**self._fields, "error": str(error)})
            lost = isinstance(error, LeaseLost)
            return ("lease lost" if lost else "answer not taken"), type(error).__name__
        log.info(
            "job reconciled",
            extra={**self._fields, "decision": op["decision"], "status": answer.get("status")},
        )
        return op["decision"], None


async def _in_thread(handler: Callable[[ReconcileContext], Any], ctx: ReconcileContext) -> Any:
    """A sync handler in its own daemon thread (it may call a slow provider),
    in a copy of this task's context: the reconciliation's span is current
    there, so the handler's own spans and requests are its children."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    def target() -> None:
        try:
            value, error = context.run(handler, ctx), None
        except Exception as raised:  # noqa: BLE001 - handed to the loop
            value, error = None, raised
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker exited
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=target, name=f"reconcile-{ctx.job_id}", daemon=True).start()
    return await future
