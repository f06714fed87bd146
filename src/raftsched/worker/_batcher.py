"""Coalesce the lease operations of concurrent jobs into `POST /v1/leases/batch`.

A job awaits `batcher.op({...})`; the batcher holds operations for at most
`linger_s` (or until `max_ops` are waiting), sends them in one request and
resolves each job's future with its own result or error. One batch request
failing as a whole (cluster unreachable) fails every op in it the same way.

A request body must fit a node's `max_body_bytes` (default 1 MiB): enough
leases, or large progress values and results, would not fit one. So what is
waiting is sent as several requests, each within `body_bytes_max`, sized by
the JSON the client will send (`body_size_bytes`). A node with a lower limit
answers 413 naming it (`PayloadTooLarge.max_body_bytes`); nothing was
applied, so the batcher lowers its own limit to that and sends the same ops
again in requests that fit. An op that does not fit a request by itself is
sent alone; if the node refuses it, that op alone fails with the 413.

With `next_claims` (the worker agent's), a batch may also carry the next claim
(`next`, docs/api.md): `NextClaims.ask` sees the batch's ops and says what to
claim, and `NextClaims.granted` receives the leases, exactly once per claim
asked for (with none when the request failed), before any op's future is
resolved. A node that does not know `next` (release 0.5.0 or earlier) answers
400 naming the field `next` and applies nothing: the batch is sent again
without it, and `NextClaims.refused` is told. A claim of kinds that the
cluster does not take yet (`kinds_refused`: `next` holds the refusal, or a
node of 0.7.0 or earlier refused the whole batch, which is then sent again
without it) is told to `NextClaims.kinds_refused`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from contextvars import Context
from typing import Any, Protocol

from raftsched.client import (
    AsyncClient,
    InvalidRequest,
    JsonObject,
    NextClaim,
    PayloadTooLarge,
    RaftschedError,
    TransportError,
    body_size_bytes,
    item_error,
    kinds_refused,
    next_refused,
)
from raftsched.limits import BODY_BYTES_MAX

log = logging.getLogger("raftsched.worker")

_Waiting = tuple[JsonObject, "asyncio.Future[JsonObject]"]

# Room a request keeps for its next claim (`next`) beside its ops, at most a
# quarter of the body. A claim that needs more is not sent with it (it is
# handed back with no leases; the claim loop finds the work).
NEXT_CLAIM_BYTES_RESERVE = 4096
_EMPTY_BATCH_BYTES = body_size_bytes({"ops": []})
# What `,"next":` adds to a body besides the claim itself.
_NEXT_FIELD_BYTES = body_size_bytes({"ops": [], "next": 0}) - _EMPTY_BATCH_BYTES - 1


class NextClaims(Protocol):
    """Where a batch's next claim comes from and where its leases go."""

    def ask(self, ops: Sequence[JsonObject]) -> NextClaim | None:
        """The claim to send with these ops, or None."""
        ...

    def granted(
        self,
        ops: Sequence[JsonObject],
        claim: NextClaim,
        leases: list[JsonObject],
        sent_at: float,
    ) -> None:
        """The leases `claim`, asked for with `ops`, brought (none if the
        request failed); `sent_at` is the monotonic time the request was sent."""
        ...

    def refused(self, error: InvalidRequest) -> None:
        """The cluster does not take next claims."""
        ...

    def kinds_refused(self, error: RaftschedError) -> None:
        """The cluster does not take a claim's kinds yet (`kinds_refused`)."""
        ...


class LeaseOps(Protocol):
    """Where a job's lease operations go: `LeaseBatcher` (the cluster), or the
    handler test kit's in-process lease (`raftsched.testing.run_handler`)."""

    async def op(self, op: Mapping[str, Any]) -> JsonObject:
        """Run one operation; its result, or its ApiError (LeaseLost...)."""
        ...


class LeaseBatcher:
    def __init__(
        self,
        client: AsyncClient,
        *,
        linger_s: float = 0.005,
        max_ops: int = 100,
        next_claims: NextClaims | None = None,
        body_bytes_max: int = BODY_BYTES_MAX,
    ) -> None:
        self._client = client
        self._linger_s = linger_s
        self._max_ops = max_ops
        self._next_claims = next_claims
        self._body_bytes_max = body_bytes_max
        self._waiting: list[_Waiting] = []
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight: dict[asyncio.Task[None], list[_Waiting]] = {}

    @property
    def body_bytes_max(self) -> int:
        """The largest request body it sends: as configured, or lower once
        a node said its limit is lower (a 413)."""
        return self._body_bytes_max

    async def op(self, op: Mapping[str, Any]) -> JsonObject:
        """Run one operation (`{"op", "job_id", "fencing_token", ...}`); returns
        its result or raises its ApiError (LeaseLost...) or TransportError."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[JsonObject] = loop.create_future()
        self._waiting.append((dict(op), future))
        if len(self._waiting) >= self._max_ops:
            self._flush()
        elif self._timer is None:
            # In a context of its own: a batch carries many jobs' operations,
            # and would otherwise run (and send its request) in the trace of
            # whichever attempt's op started it.
            self._timer = loop.call_later(self._linger_s, self._flush, context=Context())
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._waiting = self._waiting, []
        if not batch:
            return
        loop = asyncio.get_running_loop()
        for part in self._split(batch):
            task = loop.create_task(self._send(part), context=Context())
            self._in_flight[task] = part
            task.add_done_callback(self._landed)

    def _split(self, batch: list[_Waiting]) -> list[list[_Waiting]]:
        """`batch` in parts whose requests fit `body_bytes_max` (with room
        for a next claim), in order; an op too large for any goes alone."""
        room = self._body_bytes_max
        if self._next_claims is not None:
            room -= min(NEXT_CLAIM_BYTES_RESERVE, self._body_bytes_max // 4)
        if body_size_bytes({"ops": [op for op, _ in batch]}) <= room:
            return [batch]  # the common case: one encoding, one request
        parts: list[list[_Waiting]] = []
        part: list[_Waiting] = []
        size = _EMPTY_BATCH_BYTES
        for waiting in batch:
            op_bytes = body_size_bytes(waiting[0])
            if part and size + 1 + op_bytes > room:  # 1: the comma before it
                parts.append(part)
                part, size = [], _EMPTY_BATCH_BYTES
            size += op_bytes + (1 if part else 0)
            part.append(waiting)
        parts.append(part)
        return parts

    def _landed(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)

    async def _send(self, batch: list[_Waiting]) -> None:
        ops = [op for op, _ in batch]
        claim = None if self._next_claims is None else self._next_claims.ask(ops)
        sent_at = time.monotonic()
        granted: list[JsonObject] = []
        if claim is not None and not self._claim_fits(claim):
            self._hand_over(ops, claim, [], sent_at)
            claim = None
        try:
            results, granted = await self._request(ops, claim)
            if len(results) != len(batch):
                raise TransportError(f"lease batch of {len(batch)} got {len(results)} results")
        except PayloadTooLarge as error:  # nothing was applied
            self._hand_over(ops, claim, granted, sent_at)
            if len(batch) == 1:
                log.warning("lease op too large for a request", extra={"error": str(error)})
                _, future = batch[0]
                if not future.done():
                    future.set_exception(error)
                return
            self._learn_limit(error, ops, claim)
            parts = self._split(batch)
            if len(parts) == 1:  # the limit it knows still holds them all: halve
                parts = [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
            await asyncio.gather(*(self._send(part) for part in parts))
            return
        except Exception as error:  # every op learns the same failure
            self._hand_over(ops, claim, granted, sent_at)
            log.warning("lease batch failed", extra={"ops": len(batch), "error": str(error)})
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        except BaseException:  # cancelled (close): the claim's slots are free again
            self._hand_over(ops, claim, granted, sent_at)
            raise
        # The leases first: a job whose report is answered frees its slot, and
        # the slots the new leases fill must already be counted.
        self._hand_over(ops, claim, granted, sent_at)
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():  # the job stopped waiting (cancelled)
                continue
            problem = item_error(result)
            if problem is None:
                future.set_result(result)
            else:
                future.set_exception(problem)

    async def _request(
        self, ops: list[JsonObject], claim: NextClaim | None
    ) -> tuple[list[JsonObject], list[JsonObject]]:
        """(per-op results, the next claim's leases)."""
        if claim is None:
            return await self._client.lease_batch(ops), []
        try:
            results, next_leases = await self._client.lease_batch(ops, next_claim=claim)
        except InvalidRequest as error:
            if self._next_claims is None:
                raise
            if next_refused(error):
                self._next_claims.refused(error)  # nothing was applied: send it plain
            elif kinds_refused(error):  # a node of 0.7.0 or earlier: no `next.kinds`
                self._next_claims.kinds_refused(error)
            else:
                raise
            return await self._client.lease_batch(ops), []
        if kinds_refused(next_leases.error) and self._next_claims is not None:
            assert next_leases.error is not None
            self._next_claims.kinds_refused(next_leases.error)  # the ops' outcomes stand
        elif next_leases.error is not None:
            # The ops' outcomes stand; the worker's claim loop finds the work.
            log.info("next claim not made", extra={"error": str(next_leases.error)})
        return results, next_leases.leases

    def _claim_fits(self, claim: NextClaim) -> bool:
        reserve = min(NEXT_CLAIM_BYTES_RESERVE, self._body_bytes_max // 4)
        return _NEXT_FIELD_BYTES + body_size_bytes(claim.body()) <= reserve

    def _learn_limit(
        self, error: PayloadTooLarge, ops: list[JsonObject], claim: NextClaim | None
    ) -> None:
        """After a 413 for `ops` (and `claim`): the node's limit, or (from a
        node that does not name it) half of what it refused. Either is below
        what was sent, so the ops go again in smaller requests."""
        body: JsonObject = {"ops": ops}
        if claim is not None:
            body["next"] = claim.body()
        sent = body_size_bytes(body)
        named = error.max_body_bytes
        limit = named if named is not None and named < sent else sent // 2
        if limit < self._body_bytes_max:
            log.info(
                "lease batches split to fit the node's body limit",
                extra={"max_body_bytes": limit, "refused_bytes": sent},
            )
            self._body_bytes_max = limit

    def _hand_over(
        self,
        ops: list[JsonObject],
        claim: NextClaim | None,
        leases: list[JsonObject],
        sent_at: float,
    ) -> None:
        if claim is not None and self._next_claims is not None:
            self._next_claims.granted(ops, claim, leases, sent_at)

    async def close(self) -> None:
        """Send what is waiting and wait for the batches someone still awaits;
        cancel those nobody does (e.g. a heartbeat its job gave up on)."""
        self._flush()
        for task, batch in list(self._in_flight.items()):
            if all(future.done() for _, future in batch):
                task.cancel()
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)
