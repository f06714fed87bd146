"""The leader's commit index, as a follower asks for it (Raft's read index).

A follower's replica trails the leader's by the entries in flight: a write
the leader has acknowledged may not be applied here yet. Reads accept that
(`consistency=stale`) or go to the leader. But every request's token is
looked up in the replica that receives it (api.auth), and a client that
has just created a token and presents it to a follower must not be told
that it does not exist. The follower's own idea of the leader's commit
index does not settle it: the entry that tells it may still be on its way
when the client's request arrives. So a follower that meets a secret it
does not know asks the leader for its commit index (`GET /v1/time` on the
leader answers it) and waits until it has applied that far
(`Node.catch_up`) before it answers 401.

Asks are shared. One is in flight at a time; callers that arrive while it
is in flight share the next one, which starts when it ends. (They may not
share the one in flight: it may have left before the write that the caller
has seen acknowledged.) A flood of unknown secrets therefore costs the
leader one small request at a time, however many callers wait on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("raftsched.node")

# Asks the leader for its commit index; None when no leader answered as one.
Ask = Callable[[], Awaitable[int | None]]


class ReadIndex:
    """Shared asks for the leader's commit index."""

    __slots__ = ("_ask", "_next", "_running")

    def __init__(self, ask: Ask) -> None:
        self._ask = ask
        self._running: asyncio.Task[None] | None = None
        self._next: asyncio.Future[int | None] | None = None

    def leader_commit_index(self) -> asyncio.Future[int | None]:
        """The answer to an ask that leaves after this call: the leader's
        commit index, or None when no leader answered. Await it through
        `asyncio.shield`: other callers share it."""
        loop = asyncio.get_running_loop()
        if self._running is None:
            future: asyncio.Future[int | None] = loop.create_future()
            self._start(future)
            return future
        if self._next is None:
            self._next = loop.create_future()
        return self._next

    def _start(self, future: asyncio.Future[int | None]) -> None:
        self._running = asyncio.get_running_loop().create_task(self._answer(future))

    async def _answer(self, future: asyncio.Future[int | None]) -> None:
        commit_index: int | None = None
        try:
            commit_index = await self._ask()
        except Exception as error:  # the leader is gone, slow or answers nonsense
            log.debug("asking the leader for its commit index failed: %r", error)
        finally:  # cancelled (close) too
            if not future.done():
                future.set_result(commit_index)
        waiting, self._next = self._next, None
        if waiting is None:
            self._running = None
        else:
            self._start(waiting)

    def close(self) -> None:
        """Stop asking; whoever waits is answered None."""
        if self._running is not None:
            self._running.cancel()
            self._running = None
        waiting, self._next = self._next, None
        if waiting is not None and not waiting.done():
            waiting.set_result(None)
