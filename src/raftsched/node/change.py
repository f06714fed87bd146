"""What long-polls and the leader's loops wait on: the next applied entry.

The node hands out one `Change` at a time (`Node.changed`); at the next
applied entry or leadership change it sets that one and hands out a new one.
A waiter takes the current `Change` *before* it reads the state, so an entry
applied between the read and the wait is not missed: it finds it set.

Every waiter wakes at every applied entry: the dispatch loop, the webhook
supervisor and its workers, and every long-polling claim. On Python 3.11
`asyncio.wait_for(event.wait(), timeout)` makes a task, a timer and their
callbacks per wait; at small entries (one to a few commands each) that was
13.5 us per waiter per entry, micro-measured on a busy machine. A `Change`
gives each waiter a bare future and a timer: 5.7 us.
"""

from __future__ import annotations

import asyncio


class Change:
    """Set once, at the next applied entry or leadership change."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[bool]] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(True)

    async def wait(self) -> bool:
        """Until it is set (as `asyncio.Event.wait`)."""
        return await self.wait_s(None)

    async def wait_s(self, timeout_s: float | None) -> bool:
        """True once it is set, False when `timeout_s` passed first (None:
        no limit). Cancelling the caller cancels only its own wait."""
        if self._set:
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(waiter)
        timer = None if timeout_s is None else loop.call_later(timeout_s, _time_up, waiter)
        try:
            return await waiter
        finally:
            if timer is not None:
                timer.cancel()
            if not self._set:
                # Timed out or cancelled: an idle cluster keeps one Change for
                # long, so its list must not gather every expired wait.
                self._waiters.remove(waiter)


def _time_up(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)
