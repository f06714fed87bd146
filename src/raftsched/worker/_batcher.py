"""Coalesce the lease operations of concurrent jobs into `POST /v1/leases/batch`.

A job awaits `batcher.op({...})`; the batcher holds operations for at most
`linger_s` (or until `max_ops` are waiting), sends them in one request and
resolves each job's future with its own result or error. One batch request
failing as a whole (cluster unreachable) fails every op in it the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from raftsched.client import AsyncClient, JsonObject, TransportError, item_error

log = logging.getLogger("raftsched.worker")

_Waiting = tuple[JsonObject, "asyncio.Future[JsonObject]"]


class LeaseBatcher:
    def __init__(self, client: AsyncClient, *, linger_s: float = 0.005, max_ops: int = 100) -> None:
        self._client = client
        self._linger_s = linger_s
        self._max_ops = max_ops
        self._waiting: list[_Waiting] = []
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight: dict[asyncio.Task[None], list[_Waiting]] = {}

    async def op(self, op: Mapping[str, Any]) -> JsonObject:
        """Run one operation (`{"op", "job_id", "fencing_token", ...}`); returns
        its result or raises its ApiError (LeaseLost...) or TransportError."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[JsonObject] = loop.create_future()
        self._waiting.append((dict(op), future))
        if len(self._waiting) >= self._max_ops:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._linger_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._waiting = self._waiting, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._in_flight[task] = batch
            task.add_done_callback(self._landed)

    def _landed(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)

    async def _send(self, batch: list[_Waiting]) -> None:
        try:
            results = await self._client.lease_batch([op for op, _ in batch])
            if len(results) != len(batch):
                raise TransportError(f"lease batch of {len(batch)} got {len(results)} results")
        except Exception as error:  # every op learns the same failure
            log.warning("lease batch failed", extra={"ops": len(batch), "error": str(error)})
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():  # the job stopped waiting (cancelled)
                continue
            problem = item_error(result)
            if problem is None:
                future.set_result(result)
            else:
                future.set_exception(problem)

    async def close(self) -> None:
        """Send what is waiting and wait for the batches someone still awaits;
        cancel those nobody does (e.g. a heartbeat its job gave up on)."""
        self._flush()
        for task, batch in list(self._in_flight.items()):
            if all(future.done() for _, future in batch):
                task.cancel()
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)
