"""Group commit: one entry in flight, batching behind it, bounded by work."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from raftsched.core import decode_entry
from raftsched.core.jobs.commands import ClaimJobs, CompleteJob, HeartbeatJob, LeaseBatch, StartJob
from raftsched.core.kernel.commands import Barrier, Entry, Tick
from raftsched.core.kernel.results import Ack, Result
from raftsched.node.proposer import (
    ENTRY_WORK_MAX,
    EXPRESS_WORK_MAX,
    SMALL_WORK_MAX,
    Proposer,
    work_units,
)


class FakeRaft:
    """Commits on demand; records each entry it was handed."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.callbacks: list[Callable[[object | None, str | None], None]] = []

    def propose(self, data: bytes, callback: Callable[[object | None, str | None], None]) -> None:
        self.entries.append(decode_entry(data))
        self.callbacks.append(callback)

    def commit_next(self) -> None:
        callback = self.callbacks.pop(0)
        entry = self.entries[len(self.entries) - len(self.callbacks) - 1]
        callback([Ack() for _ in entry.commands], None)


async def _run() -> tuple[FakeRaft, list[Result]]:
    loop = asyncio.get_running_loop()
    raft = FakeRaft()
    proposer = Proposer(loop, raft, lambda: 1_000)
    proposer.become_leader(3)
    first = proposer.submit(Barrier())  # goes out alone: nothing is in flight
    heavy = [proposer.submit(ClaimJobs("w", ("q",), 1000)) for _ in range(6)]
    tick = proposer.submit(Tick(max_items=1000))
    light = [proposer.submit(Barrier()) for _ in range(3)]  # shared barrier
    pending = [first, *heavy, tick, *light]
    while not all(f.done() for f in pending):
        await asyncio.sleep(0)
        if raft.callbacks:
            raft.commit_next()
            await asyncio.sleep(0)
    return raft, [f.result() for f in pending]


def test_one_entry_in_flight_and_entries_bounded_by_work() -> None:
    raft, results = asyncio.run(_run())
    assert all(result == Ack() for result in results)
    sizes = [len(entry.commands) for entry in raft.entries]
    assert sizes[0] == 1  # the first command did not wait for company
    assert all(entry.epoch == 3 and entry.now_ms == 1_000 for entry in raft.entries)
    for entry in raft.entries:
        work = sum(
            c.max_jobs if isinstance(c, ClaimJobs) else c.max_items if isinstance(c, Tick) else 1
            for c in entry.commands
        )
        assert work <= ENTRY_WORK_MAX or len(entry.commands) == 1
    # Six 1,000-job claims and a 1,000-item Tick cannot share one entry.
    assert len(raft.entries) >= 3
    # Concurrent reads share one barrier.
    barriers = sum(isinstance(c, Barrier) for e in raft.entries[1:] for c in e.commands)
    assert barriers == 1


async def _run_express() -> tuple[FakeRaft, list[object]]:
    loop = asyncio.get_running_loop()
    raft = FakeRaft()
    proposer = Proposer(loop, raft, lambda: 1_000)
    proposer.become_leader(3)
    first = proposer.submit(Barrier())  # in flight while the rest queue up
    big = [proposer.submit(ClaimJobs("w", ("hot",), 1000)) for _ in range(2)]
    big.append(proposer.submit(Tick(max_items=1000)))
    big += [proposer.submit(ClaimJobs("w", ("hot",), 1000)) for _ in range(2)]
    small = proposer.submit(HeartbeatJob("j1", 7))  # arrives last
    pending = [first, *big, small]
    while not all(f.done() for f in pending):
        await asyncio.sleep(0)
        if raft.callbacks:
            raft.commit_next()
            await asyncio.sleep(0)
    return raft, [*big]


def test_small_commands_overtake_queued_big_work_in_a_short_entry() -> None:
    raft, _ = asyncio.run(_run_express())
    second = raft.entries[1]  # the first entry proposed after the one in flight
    assert isinstance(second.commands[0], HeartbeatJob)
    # Beside a small command an entry carries at most EXPRESS_WORK_MAX of big work.
    assert sum(work_units(c) for c in second.commands[1:]) <= EXPRESS_WORK_MAX
    # Big commands still go out in arrival order, and all of them do.
    order = [
        (type(c).__name__, getattr(c, "queues", None))
        for entry in raft.entries[1:]
        for c in entry.commands
        if work_units(c) > SMALL_WORK_MAX
    ]
    assert order == [("ClaimJobs", ("hot",))] * 2 + [("Tick", None)] + [("ClaimJobs", ("hot",))] * 2
    for entry in raft.entries[2:]:
        assert sum(work_units(c) for c in entry.commands) <= ENTRY_WORK_MAX


def test_a_lease_batch_weighs_its_ops_and_the_jobs_its_claim_may_grant() -> None:
    """So one complete with a one-job claim is small work that takes the
    express lane, and a 1,000-job claim is big whether batched or not."""
    one = LeaseBatch((CompleteJob("j", 1),), ClaimJobs("w", ("q",), 1))
    assert work_units(one) == 2 <= SMALL_WORK_MAX
    many = LeaseBatch((CompleteJob("j", 1),) * 100, ClaimJobs("w", ("q",), 100))
    assert work_units(many) == 200 > SMALL_WORK_MAX
    assert work_units(LeaseBatch((), ClaimJobs("w", ("q",), 1000))) == work_units(
        ClaimJobs("w", ("q",), 1000)
    )
    assert work_units(LeaseBatch((StartJob("j", 1),))) == 1
