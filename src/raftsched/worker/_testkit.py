"""The handler test kit: one handler, one lease, no cluster.

`run_handler(handler, payload, ...)` runs a job handler the way a worker
does, through the worker's own `JobRun` and `JobContext`: start, the handler
(sync in its own thread, async on the loop), heartbeats, cancellation, and
the report that classifies how it ended. Only the two seams that lead to the
cluster are replaced, by one in-process `_TestLease`:

- the lease operations (`LeaseOps`: start, heartbeat, complete, fail,
  reconcile) are answered in process, and the report is kept; a lease that
  is not renewed in time lapses, and every operation after is `lease_lost`;
- the effects ledger (`EffectsLedger`) is a dict with the cluster's rules:
  first writer wins, a record is fenced by the lease's token (LeaseLost once
  the lease is lost), keys of 1 to 256 characters, results that survive JSON.

`run_reconciler(reconciler, ...)` does the same for a reconcile handler
through the worker's `ReconcileRun`. Everything a handler sends or is given
goes through JSON on the way, as it does on the wire.

The outcome's `status` is what the cluster would make of the report:
`succeeded` (complete), `failed_transient` (retried), `failed_permanent`
(dead-lettered), `failed_unknown` (the worker stopped it: shutdown or its
own deadline; retried, or reconciled with `on_unknown: reconcile`),
`cancelled` (a cancel request honoured), or `lease_lost` (nothing reported:
another worker owns the job now).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from raftsched.client import InvalidRequest, JsonObject, LeaseLost
from raftsched.core.kernel.validate import KEY_CHARS_MAX
from raftsched.worker._context import CancelReason, JobContext, Lease
from raftsched.worker._job import Handler, JobRun, Raised, Returned
from raftsched.worker._reconcile import (
    ReconcileContext,
    Reconciler,
    ReconcileRun,
    UnknownAttempt,
)

Status = Literal[
    "succeeded",
    "failed_transient",
    "failed_permanent",
    "failed_unknown",
    "cancelled",
    "lease_lost",
]
DecisionName = Literal["happened", "did_not_happen", "cannot_tell"]

_STATUS_BY_KIND: Mapping[str, Status] = {
    "transient": "failed_transient",
    "permanent": "failed_permanent",
    "unknown": "failed_unknown",
    "cancelled": "cancelled",
}
_REPORTS = frozenset({"complete", "fail", "reconcile"})


@dataclass(frozen=True, slots=True)
class Seen:
    """What a run has done so far; `cancel_when` is asked about it after
    every progress report and every effect looked up or recorded."""

    progress: list[Any] = field(default_factory=list)
    effects: dict[str, Any] = field(default_factory=dict)
    replayed: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class HandlerOutcome:
    """How one run of a job handler ended."""

    status: Status
    # What the job completes with (as it comes back from JSON).
    result: Any
    # What the handler raised (None when it returned).
    error: BaseException | None
    # The failure the worker reports: its message and retry hint.
    message: str | None
    retry_after_s: float | None
    # Effects this run recorded; keys it found recorded already (their fn
    # was not called); the whole ledger afterwards (to pass to a next attempt).
    effects: Mapping[str, Any]
    replayed: tuple[str, ...]
    ledger: Mapping[str, Any]
    # Every value passed to `ctx.progress`, in order. (A worker sends the
    # latest one with each heartbeat, so the cluster may see fewer.)
    progress: tuple[Any, ...]
    cancel_reason: CancelReason | None
    # The operation the worker sent (`complete` or `fail`), None if none.
    report: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class ReconcileOutcome:
    """What a reconcile handler answered, or why it did not."""

    # None: no answer (it raised or was cancelled); the question is asked again.
    decision: DecisionName | None
    result: Any
    reason: str | None
    error: BaseException | None
    # Effects the answer recorded (first writer wins: keys already in the
    # ledger keep their result), and the whole ledger afterwards.
    effects: Mapping[str, Any]
    ledger: Mapping[str, Any]
    # The `reconcile` operation the worker sent, None if none.
    answer: Mapping[str, Any] | None


class _TestLease:
    """One lease as the cluster would keep it: its lease operations
    (`LeaseOps`) and the effects ledger (`EffectsLedger`), in process."""

    def __init__(self, lease: Lease, effects: Mapping[str, Any]) -> None:
        self.lease = lease
        self.ledger: dict[str, Any] = {key: _through_json(v) for key, v in effects.items()}
        self.seen = Seen()
        self.lost = False
        # The cluster's expiry: from the claim, then from each heartbeat. A
        # lease that lapses is lost (the cluster gives the job to others).
        self.expires_at = time.monotonic() + lease.lease_s
        self.cancel_requested = False
        self.report: JsonObject | None = None
        self.on_change: Callable[[], None] = lambda: None

    # LeaseOps
    async def op(self, op: Mapping[str, Any]) -> JsonObject:
        sent: JsonObject = _through_json(op)  # what the wire carries (TypeError if not JSON)
        self._fenced(sent["job_id"], sent["fencing_token"])
        name = sent["op"]
        if name == "heartbeat":
            self.expires_at = time.monotonic() + float(sent.get("extend_s") or self.lease.lease_s)
            return {"status": "running", "cancel_requested": self.cancel_requested}
        if name in _REPORTS:
            if self.report is None:
                self.report = sent
            return {"status": name}
        return {"status": "running"}  # start

    # EffectsLedger
    async def lookup(self, key: str) -> tuple[bool, Any]:
        if key not in self.ledger:
            return False, None
        self.seen.replayed.append(key)
        self.on_change()
        return True, self.ledger[key]

    async def record(self, key: str, job_id: str, fencing_token: int, result: Any) -> Any:
        if not isinstance(key, str) or not 1 <= len(key) <= KEY_CHARS_MAX:
            raise InvalidRequest(
                400,
                "invalid_request",
                f"key must be a non-empty string of at most {KEY_CHARS_MAX} chars",
                {"field": "key"},
            )
        value = _through_json(result)
        self._fenced(job_id, fencing_token)
        if key not in self.ledger:  # first writer wins
            self.ledger[key] = self.seen.effects[key] = value
            self.on_change()
        return self.ledger[key]

    def progress(self, details: Any) -> None:
        """Seen: a value the worker's `JobContext.progress` took."""
        self.seen.progress.append(_through_json(details))
        self.on_change()

    def _fenced(self, job_id: str, fencing_token: int) -> None:
        if time.monotonic() > self.expires_at:
            self.lost = True
        if self.lost or job_id != self.lease.job_id or fencing_token != self.lease.fencing_token:
            raise LeaseLost(409, "lease_lost", f"{fencing_token} is not the current lease")


class _TestContext(JobContext):
    """The worker's JobContext, whose progress reports the test also sees."""

    def __init__(self, lease: Lease, test_lease: _TestLease, worker_id: str) -> None:
        super().__init__(
            lease, worker_id=worker_id, loop=asyncio.get_running_loop(), ledger=test_lease
        )
        self._test_lease = test_lease

    def progress(self, details: Any) -> None:
        super().progress(details)  # TypeError for what the API would refuse
        self._test_lease.progress(details)


def _through_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _lease(
    job_id: str,
    attempt: int,
    payload: Any,
    *,
    queue: str,
    lease_s: float,
    idempotency_key: str | None,
    inputs: Mapping[str, Any] | None,
    reconcile: Mapping[str, Any] | None = None,
    kind: str | None = None,
) -> Lease:
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    return Lease(
        job_id=job_id,
        attempt=attempt,
        epoch=1,
        # Every attempt's token is greater than the last one's, as on a cluster.
        fencing_token=attempt,
        lease_s=lease_s,
        queue=queue,
        payload=_through_json(payload),
        idempotency_key=idempotency_key,
        inputs=_through_json(dict(inputs or {})),
        reconcile=reconcile,
        kind=kind,
    )


def run_handler(
    handler: Handler,
    payload: Any = None,
    *,
    attempt: int = 1,
    effects: Mapping[str, Any] | None = None,
    job_id: str = "job_test",
    queue: str = "default",
    idempotency_key: str | None = None,
    inputs: Mapping[str, Any] | None = None,
    kind: str | None = None,
    lease_s: float = 30.0,
    cancel_after: float | None = None,
    cancel_when: Callable[[Seen], bool] | None = None,
    cancel_reason: CancelReason = "cancel_requested",
    worker_id: str = "testkit",
    timeout_s: float = 30.0,
) -> HandlerOutcome:
    """Run `handler` on one lease of a job with `payload` and return how it
    ended (see the module doc). `effects` is the ledger before the run (key
    -> result, e.g. an earlier attempt's `outcome.ledger`): `ctx.effect` on
    one of its keys returns that result without calling `fn`. The run is
    cancelled (`cancel_reason`: a cancel request by default, or the lease
    lost, the worker's deadline or its shutdown) `cancel_after` seconds
    after the handler starts, or as soon as `cancel_when(seen)` holds. A
    handler still running `timeout_s` after that is abandoned, as a
    stopping worker abandons it, and TimeoutError is raised. For a test
    that runs its own event loop, `await arun_handler(...)`. `kind` is the
    job's (`ctx.kind`); the handler runs whatever it is, as the one a worker
    registered for that kind would."""
    return asyncio.run(
        arun_handler(
            handler,
            payload,
            attempt=attempt,
            effects=effects,
            job_id=job_id,
            queue=queue,
            idempotency_key=idempotency_key,
            inputs=inputs,
            kind=kind,
            lease_s=lease_s,
            cancel_after=cancel_after,
            cancel_when=cancel_when,
            cancel_reason=cancel_reason,
            worker_id=worker_id,
            timeout_s=timeout_s,
        )
    )


async def arun_handler(
    handler: Handler,
    payload: Any = None,
    *,
    attempt: int = 1,
    effects: Mapping[str, Any] | None = None,
    job_id: str = "job_test",
    queue: str = "default",
    idempotency_key: str | None = None,
    inputs: Mapping[str, Any] | None = None,
    kind: str | None = None,
    lease_s: float = 30.0,
    cancel_after: float | None = None,
    cancel_when: Callable[[Seen], bool] | None = None,
    cancel_reason: CancelReason = "cancel_requested",
    worker_id: str = "testkit",
    timeout_s: float = 30.0,
) -> HandlerOutcome:
    """`run_handler` on the running event loop."""
    lease = _lease(
        job_id,
        attempt,
        payload,
        queue=queue,
        lease_s=lease_s,
        idempotency_key=idempotency_key,
        inputs=inputs,
        kind=kind,
    )
    test_lease = _TestLease(lease, effects or {})
    ctx = _TestContext(lease, test_lease, worker_id)
    run = JobRun(ctx, handler, test_lease, claim_sent_at=time.monotonic())

    def cancel() -> None:
        # As the worker learns it: a heartbeat answered `cancel_requested`
        # (which it keeps answering) or `lease_lost` (and every op after).
        if cancel_reason == "cancel_requested":
            test_lease.cancel_requested = True
        elif cancel_reason == "lease_lost":
            test_lease.lost = True
        run.cancel(cancel_reason)

    if cancel_when is not None:

        def check() -> None:
            if not ctx.cancelled.is_set() and cancel_when(test_lease.seen):
                cancel()

        test_lease.on_change = check
    await _run_bounded(run, run.abandon, cancel_after, cancel, timeout_s, "handler")
    outcome = run.outcome
    assert outcome is not None, "a finished JobRun has an outcome"
    return _handler_outcome(test_lease, outcome, ctx.cancel_reason)


async def _run_bounded(
    run: JobRun | ReconcileRun,
    abandon: Callable[[], None],
    cancel_after: float | None,
    cancel: Callable[[], None],
    timeout_s: float,
    what: str,
) -> None:
    loop = asyncio.get_running_loop()
    timer = None if cancel_after is None else loop.call_later(cancel_after, cancel)
    task = loop.create_task(run.run())
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            abandon()
            await task
            raise TimeoutError(f"the {what} was still running after {timeout_s} s; abandoned")
        task.result()
    finally:
        if timer is not None:
            timer.cancel()


def _handler_outcome(
    test_lease: _TestLease, outcome: Returned | Raised, reason: CancelReason | None
) -> HandlerOutcome:
    report = test_lease.report
    status: Status
    result = None
    message = retry_after_s = None
    if report is None:
        status = "lease_lost"
    elif report["op"] == "complete":
        status, result = "succeeded", report.get("result")
    else:
        error = report["error"]
        status = _STATUS_BY_KIND[error["kind"]]
        message, retry_after_s = error["message"], error.get("retry_after_s")
    seen = test_lease.seen
    return HandlerOutcome(
        status=status,
        result=result,
        error=outcome.error if isinstance(outcome, Raised) else None,
        message=message,
        retry_after_s=retry_after_s,
        effects=dict(seen.effects),
        replayed=tuple(seen.replayed),
        ledger=dict(test_lease.ledger),
        progress=tuple(seen.progress),
        cancel_reason=reason,
        report=report,
    )


def run_reconciler(
    reconciler: Reconciler,
    payload: Any = None,
    *,
    effects: Mapping[str, Any] | None = None,
    unknown_attempt: int = 1,
    unknown_worker_id: str = "lost-worker",
    job_id: str = "job_test",
    queue: str = "default",
    reconcile_queue: str | None = None,
    idempotency_key: str | None = None,
    lease_s: float = 30.0,
    cancel_after: float | None = None,
    worker_id: str = "testkit",
    timeout_s: float = 30.0,
) -> ReconcileOutcome:
    """Ask `reconciler` about attempt `unknown_attempt` of a job with
    `payload`, whose outcome is unknown, and return its answer. `effects`
    are the effects the job recorded so far (key -> result; the lease names
    their keys in `ctx.effect_keys`). `cancel_after`: cancel the lease that
    many seconds in (the worker lost it, or is stopping). For a test that
    runs its own event loop, `await arun_reconciler(...)`."""
    return asyncio.run(
        arun_reconciler(
            reconciler,
            payload,
            effects=effects,
            unknown_attempt=unknown_attempt,
            unknown_worker_id=unknown_worker_id,
            job_id=job_id,
            queue=queue,
            reconcile_queue=reconcile_queue,
            idempotency_key=idempotency_key,
            lease_s=lease_s,
            cancel_after=cancel_after,
            worker_id=worker_id,
            timeout_s=timeout_s,
        )
    )


async def arun_reconciler(
    reconciler: Reconciler,
    payload: Any = None,
    *,
    effects: Mapping[str, Any] | None = None,
    unknown_attempt: int = 1,
    unknown_worker_id: str = "lost-worker",
    job_id: str = "job_test",
    queue: str = "default",
    reconcile_queue: str | None = None,
    idempotency_key: str | None = None,
    lease_s: float = 30.0,
    cancel_after: float | None = None,
    worker_id: str = "testkit",
    timeout_s: float = 30.0,
) -> ReconcileOutcome:
    """`run_reconciler` on the running event loop."""
    recorded = dict(effects or {})
    asked_about = {
        "attempt": unknown_attempt,
        "fencing_token": unknown_attempt,
        "worker_id": unknown_worker_id,
        "started_at": None,
        "effect_keys": list(recorded),
        "queue": reconcile_queue or queue,
    }
    # The reconciliation's own lease comes after the unknown attempt's.
    lease = _lease(
        job_id,
        unknown_attempt + 1,
        payload,
        queue=queue,
        lease_s=lease_s,
        idempotency_key=idempotency_key,
        inputs=None,
        reconcile=asked_about,
    )
    test_lease = _TestLease(lease, recorded)
    ctx = ReconcileContext(lease, UnknownAttempt.from_json(asked_about), worker_id)
    run = ReconcileRun(ctx, reconciler, test_lease)

    def cancel() -> None:
        test_lease.lost = True
        run.cancel("lease_lost")

    await _run_bounded(run, run.abandon, cancel_after, cancel, timeout_s, "reconcile handler")
    answer = test_lease.report
    if answer is not None:
        for effect in answer.get("effects", ()):  # first writer wins
            if effect["key"] not in test_lease.ledger:
                test_lease.ledger[effect["key"]] = effect["result"]
                test_lease.seen.effects[effect["key"]] = effect["result"]
    return ReconcileOutcome(
        decision=None if answer is None else answer["decision"],
        result=None if answer is None else answer.get("result"),
        reason=None if answer is None else answer.get("reason"),
        error=run.error,
        effects=dict(test_lease.seen.effects),
        ledger=dict(test_lease.ledger),
        answer=answer,
    )
