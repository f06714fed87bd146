"""What a handler sees: the lease it runs under, and the tools it may use.

Cancellation is cooperative for plain (sync) handlers: they run in their own
thread, which nobody can stop from outside. When the lease is lost, cancel is
requested, the worker's own deadline passes or shutdown outlasts its grace
period, `ctx.cancelled` (a threading.Event) is set and `ctx.check_cancelled()`
raises `JobCancelled`. A long sync handler should call `check_cancelled()`
between steps. An async handler is cancelled the asyncio way (CancelledError
at its next await) and `ctx.cancelled` is set too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from raftsched.client import AsyncClient, NotFound
from raftsched.limits import BODY_BYTES_MAX, JSON_DEPTH_MAX
from raftsched.tracing import EFFECT_REPLAYED
from raftsched.worker._spans import effect_span

T = TypeVar("T")

# The integers a JSON value may hold (docs/api.md, "Opaque JSON").
_INT_MIN, _INT_END = -(2**63), 2**64
# A surrogate code point without its other half: the client's JSON carries it
# as a \u escape that the node refuses. (A pair written as two code points is
# sent as one character, which is fine.)
_UNPAIRED_SURROGATE = re.compile(
    "[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]"
)

CancelReason = Literal["lease_lost", "cancel_requested", "deadline", "shutdown"]


class PermanentError(Exception):
    """Raise from a handler to fail the job without retries (dead letter now)."""


class TransientError(Exception):
    """Raise to fail this attempt and retry, optionally not before `retry_after_s`.
    (Any other exception is a transient failure too, with the default backoff.)"""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class JobCancelled(BaseException):
    """Raised by `check_cancelled()`. A BaseException, like asyncio's
    CancelledError, so that a handler's `except Exception` does not swallow it."""

    def __init__(self, reason: CancelReason) -> None:
        super().__init__(f"job cancelled: {reason}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Lease:
    """One granted lease, as `POST /v1/leases` returns it."""

    job_id: str
    attempt: int
    epoch: int
    fencing_token: int
    lease_s: float
    queue: str
    payload: Any = None
    expires_at: str | None = None
    idempotency_key: str | None = None
    ordering_key: str | None = None
    correlation_id: str | None = None
    workflow_id: str | None = None
    step: str | None = None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    # Set on a reconciliation lease: the unknown attempt it asks about
    # (`worker._reconcile`); such a lease is answered, never run.
    reconcile: Mapping[str, Any] | None = None
    # The job's kind: which of the worker's handlers runs it (None: the
    # default one). A node of 0.7.0 or earlier does not send it.
    kind: str | None = None
    # The W3C trace context the job was submitted with (cluster version 8),
    # the parent of the attempt's span (`worker._spans`).
    traceparent: str | None = None
    tracestate: str | None = None
    # The schedule whose occurrence created the job (its runs carry no
    # trace context: each attempt's span is a root that names it). A node
    # of 0.7.0 or earlier does not send it.
    schedule_id: str | None = None

    @staticmethod
    def from_json(data: Mapping[str, Any], default_lease_s: float) -> Lease:
        return Lease(
            job_id=str(data["job_id"]),
            attempt=int(data.get("attempt", 1)),
            epoch=int(data.get("epoch", 0)),
            fencing_token=int(data["fencing_token"]),
            lease_s=float(data.get("lease_s") or default_lease_s),
            queue=str(data.get("queue", "")),
            payload=data.get("payload"),
            expires_at=data.get("expires_at"),
            idempotency_key=data.get("idempotency_key"),
            ordering_key=data.get("ordering_key"),
            correlation_id=data.get("correlation_id"),
            workflow_id=data.get("workflow_id"),
            step=data.get("step"),
            inputs=data.get("inputs") or {},
            reconcile=data.get("reconcile"),
            kind=data.get("kind"),
            traceparent=_text_or_none(data.get("traceparent")),
            tracestate=_text_or_none(data.get("tracestate")),
            schedule_id=_text_or_none(data.get("schedule_id")),
        )


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def log_fields(lease: Lease) -> dict[str, Any]:
    """The structured log fields that name a lease: the job, its attempt,
    epoch and token, and the correlation and workflow ids the submitter set,
    so one search finds a request's lines from API to handler."""
    fields: dict[str, Any] = {
        "job_id": lease.job_id,
        "attempt": lease.attempt,
        "epoch": lease.epoch,
        "fencing_token": lease.fencing_token,
        "queue": lease.queue,
    }
    for name in ("kind", "correlation_id", "workflow_id", "step", "schedule_id"):
        value = getattr(lease, name)
        if value is not None:
            fields[name] = value
    return fields


def api_json(value: Any, what: str) -> str:
    """`value` as JSON the API takes (docs/api.md, "Opaque JSON" and "Body
    size"): JSON types only, no NaN or infinities, no unpaired surrogates,
    nested at most 64 levels, integers within 64 bits, and at most the
    default request body limit (1 MiB) once encoded. Raises TypeError naming
    `what` otherwise. The worker sends a job's operations together in one
    lease batch, so one value the cluster cannot read would fail them all."""
    problem = _api_json_problem(value, 0)
    if problem is None:
        try:
            # As the client encodes it (ASCII), so its length is the bytes sent.
            text = json.dumps(value, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as error:
            problem = str(error)
        else:
            if len(text) <= BODY_BYTES_MAX:
                return text
            problem = f"{len(text)} bytes encoded, over the {BODY_BYTES_MAX}-byte request limit"
    raise TypeError(f"{what} must be JSON the API takes: {problem}")


def _api_json_problem(value: Any, depth: int) -> str | None:
    """What the API refuses in a value JSON can encode (the encoder finds the rest)."""
    if depth > JSON_DEPTH_MAX:
        return f"nested deeper than {JSON_DEPTH_MAX} levels"
    if isinstance(value, str):
        return None if _utf8(value) else f"unpaired surrogate in string {value!r}"
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and not _utf8(key):
                return f"unpaired surrogate in key {key!r}"
            problem = _api_json_problem(item, depth + 1)
            if problem is not None:
                return problem
        return None
    if isinstance(value, list | tuple):
        for item in value:
            problem = _api_json_problem(item, depth + 1)
            if problem is not None:
                return problem
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a JSON number"
    if isinstance(value, int) and not isinstance(value, bool) and not _INT_MIN <= value < _INT_END:
        return f"integer {value} does not fit in 64 bits"
    return None


def _utf8(text: str) -> bool:
    """No unpaired surrogate in `text`."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return _UNPAIRED_SURROGATE.search(text) is None
    return True


class EffectsLedger(Protocol):
    """Where `JobContext.effect` looks effects up and records them: the
    cluster's ledger (`ClusterLedger`), or the handler test kit's in-process
    one (`raftsched.testing.run_handler`)."""

    async def lookup(self, key: str) -> tuple[bool, Any]:
        """(True, the recorded result) or (False, None)."""
        ...

    async def record(self, key: str, job_id: str, fencing_token: int, result: Any) -> Any:
        """Record `result` under `key`, fenced by the lease's token (LeaseLost
        if it is not the job's current one); first writer wins: returns what
        the ledger holds for `key` afterwards."""
        ...


class ClusterLedger:
    """The effects ledger of the cluster (`POST`/`GET /v1/effects`)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def lookup(self, key: str) -> tuple[bool, Any]:
        try:
            effect = await self._client.get_effect(key)
        except NotFound:
            return False, None
        return True, effect.get("result")

    async def record(self, key: str, job_id: str, fencing_token: int, result: Any) -> Any:
        answer = await self._client.record_effect(key, job_id, fencing_token, result)
        effect = answer.get("effect")
        return effect.get("result") if isinstance(effect, dict) else result


class JobContext:
    """Passed to the handler. Read the lease fields, call `effect` around side
    effects, report `progress`, and honour cancellation (see module doc)."""

    def __init__(
        self,
        lease: Lease,
        *,
        worker_id: str,
        loop: asyncio.AbstractEventLoop,
        client: AsyncClient | None = None,
        ledger: EffectsLedger | None = None,
    ) -> None:
        """`ledger`: where effects go; by default the cluster's, through `client`."""
        if ledger is None:
            if client is None:
                raise TypeError("JobContext needs a client or a ledger")
            ledger = ClusterLedger(client)
        self.lease = lease
        self.worker_id = worker_id
        self.cancelled = threading.Event()
        self.cancel_reason: CancelReason | None = None
        self.log = logging.LoggerAdapter(logging.getLogger("raftsched.handler"), log_fields(lease))
        self._ledger = ledger
        self._loop = loop
        # Contexts are made on the loop's thread; a sync `effect` called from
        # it would block the loop it waits for.
        self._loop_thread_id = threading.get_ident()
        self._progress: Any = None
        self._progress_lock = threading.Lock()

    # The lease, flattened for handlers.
    @property
    def job_id(self) -> str:
        return self.lease.job_id

    @property
    def attempt(self) -> int:
        return self.lease.attempt

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    @property
    def fencing_token(self) -> int:
        return self.lease.fencing_token

    @property
    def idempotency_key(self) -> str | None:
        return self.lease.idempotency_key

    @property
    def payload(self) -> Any:
        return self.lease.payload

    @property
    def correlation_id(self) -> str | None:
        return self.lease.correlation_id

    @property
    def inputs(self) -> Mapping[str, Any]:
        return self.lease.inputs

    @property
    def queue(self) -> str:
        return self.lease.queue

    @property
    def kind(self) -> str | None:
        """The job's kind (None: none); the handler running it is that kind's."""
        return self.lease.kind

    # Cancellation.
    def check_cancelled(self) -> None:
        """Raise JobCancelled if the job must stop (lease lost, cancel requested...)."""
        if self.cancelled.is_set():
            raise JobCancelled(self.cancel_reason or "shutdown")

    def cancel(self, reason: CancelReason) -> None:
        """Used by the worker; the first reason wins."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self.cancelled.set()

    # Progress travels with the next heartbeat; only the latest is sent.
    def progress(self, details: Any) -> None:
        """Report `details` (a JSON value) with the next heartbeat. A value
        the API would refuse raises TypeError here (see `api_json`): sent,
        it would fail the heartbeat that carries it, and the other jobs'
        operations in the same batch. What is kept is a copy, so changing
        `details` afterwards changes nothing."""
        copy = json.loads(api_json(details, "progress"))
        with self._progress_lock:
            self._progress = copy

    def take_progress(self) -> Any:
        with self._progress_lock:
            details, self._progress = self._progress, None
        return details

    # Effects ledger.
    def effect(self, key: str, fn: Callable[[], T]) -> T | Any:
        """Run the side effect `fn` at most once per `key` across attempts:
        return the recorded result if there is one, else call `fn`, record its
        (JSON) result fenced by this lease, and return what the ledger holds
        (the first writer's result if another attempt got there first). Pass
        `key` to the downstream API as its idempotency key too. For sync handlers."""
        with effect_span(self.lease, key) as span:
            found, recorded = self._on_loop(self._lookup(key))
            span.set_attribute(EFFECT_REPLAYED, found)
            if found:
                return recorded
            self.check_cancelled()
            return self._on_loop(self._record(key, fn()))

    async def aeffect(self, key: str, fn: Callable[[], Awaitable[T]]) -> T | Any:
        """`effect` for async handlers: `await ctx.aeffect(key, lambda: charge(...))`."""
        with effect_span(self.lease, key) as span:
            found, recorded = await self._lookup(key)
            span.set_attribute(EFFECT_REPLAYED, found)
            if found:
                return recorded
            self.check_cancelled()
            return await self._record(key, await fn())

    def _on_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if threading.get_ident() == self._loop_thread_id:
            coroutine.close()
            raise RuntimeError("ctx.effect blocks; use `await ctx.aeffect(...)` in async handlers")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _lookup(self, key: str) -> tuple[bool, Any]:
        return await self._ledger.lookup(key)

    async def _record(self, key: str, result: Any) -> Any:
        return await self._ledger.record(key, self.lease.job_id, self.lease.fencing_token, result)
