"""node.change: what long-polls and the leader's loops wait on."""

from __future__ import annotations

import asyncio

from raftsched.node.change import Change


def test_every_waiter_wakes_when_it_is_set_and_a_set_one_does_not_wait() -> None:
    async def scenario() -> list[bool]:
        change = Change()
        waiters = [asyncio.create_task(change.wait_s(5.0)) for _ in range(3)]
        waiters.append(asyncio.create_task(change.wait()))
        await asyncio.sleep(0)
        assert not any(waiter.done() for waiter in waiters)
        change.set()
        woken = list(await asyncio.gather(*waiters))
        woken.append(await change.wait_s(0.0))  # already set: at once
        return woken

    assert asyncio.run(scenario()) == [True] * 5


def test_a_wait_that_times_out_says_so_and_is_forgotten() -> None:
    async def scenario() -> None:
        change = Change()
        for _ in range(100):
            assert await change.wait_s(0.0) is False
        assert change._waiters == []
        late = asyncio.create_task(change.wait_s(5.0))
        await asyncio.sleep(0)
        change.set()
        assert await late is True and change.is_set()

    asyncio.run(scenario())


def test_cancelling_one_waiter_leaves_the_others_waiting() -> None:
    async def scenario() -> None:
        change = Change()
        cancelled = asyncio.create_task(change.wait_s(None))
        other = asyncio.create_task(change.wait_s(None))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.sleep(0)
        assert cancelled.cancelled() and not other.done()
        assert len(change._waiters) == 1
        change.set()
        assert await other is True

    asyncio.run(scenario())


def test_it_serves_asyncio_wait_for_as_an_event_does() -> None:
    async def scenario() -> bool:
        change = Change()
        asyncio.get_running_loop().call_later(0.01, change.set)
        return await asyncio.wait_for(change.wait(), 5.0)

    assert asyncio.run(scenario()) is True
