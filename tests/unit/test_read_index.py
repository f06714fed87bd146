"""A follower's asks for the leader's commit index (node.read_index): one in
flight, callers that arrive meanwhile share the next, never the one in flight."""

from __future__ import annotations

import asyncio

from raftsched.node.read_index import ReadIndex


class Leader:
    """Answers each ask when told to, with its commit index at that moment."""

    def __init__(self) -> None:
        self.commit_index = 10
        self.asks: list[asyncio.Future[None]] = []

    async def ask(self) -> int | None:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.asks.append(gate)
        await gate
        return self.commit_index

    def answer(self, index: int) -> None:
        self.asks[index].set_result(None)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def _shared() -> None:
    leader = Leader()
    index = ReadIndex(leader.ask)
    first = index.leader_commit_index()
    await _settle()
    assert len(leader.asks) == 1
    # A write is acknowledged after the first ask left; these callers may
    # have seen it, so they must not be given the first ask's answer.
    leader.commit_index = 11
    later = [index.leader_commit_index() for _ in range(50)]
    assert all(future is later[0] for future in later)  # one ask for all of them
    assert later[0] is not first
    await _settle()
    assert len(leader.asks) == 1  # not before the first one ends
    leader.answer(0)
    await _settle()
    assert first.result() == 11
    assert not later[0].done() and len(leader.asks) == 2
    leader.commit_index = 12
    leader.answer(1)
    await _settle()
    assert later[0].result() == 12
    # Nothing in flight: the next caller starts an ask of its own.
    again = index.leader_commit_index()
    await _settle()
    assert len(leader.asks) == 3 and not again.done()
    index.close()
    await _settle()
    assert again.result() is None


def test_asks_are_shared_but_never_one_that_left_before_the_caller_came() -> None:
    asyncio.run(_shared())


async def _failing() -> None:
    calls = 0

    async def ask() -> int | None:
        nonlocal calls
        calls += 1
        raise ConnectionError("the leader is gone")

    index = ReadIndex(ask)
    assert await index.leader_commit_index() is None
    assert await index.leader_commit_index() is None
    assert calls == 2


def test_a_failed_ask_answers_none() -> None:
    asyncio.run(_failing())


async def _closed_while_waiting() -> None:
    leader = Leader()
    index = ReadIndex(leader.ask)
    first = index.leader_commit_index()
    second = index.leader_commit_index()
    await _settle()
    index.close()
    await _settle()
    assert first.result() is None and second.result() is None


def test_closing_answers_every_waiter_none() -> None:
    asyncio.run(_closed_while_waiting())
