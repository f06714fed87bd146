"""The proposer's queue is bounded in commands and request bytes: a request
that does not fit is refused whole (QueueFull), nothing of it is queued or
committed, and everything that was queued commits. Entries are applied by
the real core; only replication is left out (tests/e2e/test_proposer_queue_e2e.py
does it with real nodes)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from raftsched.core import State, apply_entry, decode_entry, new_state
from raftsched.core.jobs.commands import SubmitJobs
from raftsched.core.kernel.commands import Command, JobSpec, TakeOver, Tick
from raftsched.core.kernel.results import Result, Submitted
from raftsched.node.proposer import NotCommitted, NotLeader, Proposer, QueueFull

Callback = Callable[[object | None, str | None], None]


class HeldRaft:
    """One replica that holds each entry until `commit_next`, then applies it
    to its state with the core and answers with the core's results."""

    def __init__(self) -> None:
        self.state: State = new_state()
        self.held: list[tuple[bytes, Callback]] = []

    def propose(self, data: bytes, callback: Callback) -> None:
        self.held.append((data, callback))

    def commit_next(self) -> None:
        data, callback = self.held.pop(0)
        callback(apply_entry(self.state, decode_entry(data)), None)


def submit_job(job_id: str) -> SubmitJobs:
    return SubmitJobs((JobSpec(queue="q"),), (job_id,))


async def drain(raft: HeldRaft, futures: list[asyncio.Future[Result]]) -> list[Result]:
    while not all(future.done() for future in futures):
        await asyncio.sleep(0)
        if raft.held:
            raft.commit_next()
    return [future.result() for future in futures]


def test_a_request_that_does_not_fit_is_refused_whole_and_the_rest_commits() -> None:
    async def run() -> None:
        raft = HeldRaft()
        proposer = Proposer(
            asyncio.get_running_loop(), raft, lambda: 1_000,
            queue_commands_max=3, queue_bytes_max=1_000_000,
        )  # fmt: skip
        proposer.become_leader(3)
        accepted = [proposer.submit(TakeOver())]  # in flight: the queue stays empty
        assert proposer.queued == 0
        accepted += [proposer.submit(submit_job(f"job_{i}")) for i in range(3)]
        assert proposer.queued == 3
        with pytest.raises(QueueFull) as refused:
            proposer.submit(submit_job("job_refused"))
        assert isinstance(refused.value, NotCommitted)  # answered 503 unavailable
        assert "at most 3 commands" in str(refused.value)
        with pytest.raises(QueueFull):
            proposer.submit_all([submit_job("job_a"), submit_job("job_b")])
        assert proposer.queued == 3 and proposer.refused_commands == 3
        # The leader's own duties are not refused: one at a time, they cannot flood it.
        accepted.append(proposer.submit(Tick(seed=1, max_items=10), bounded=False))
        results = await drain(raft, accepted)
        assert all(isinstance(result, Submitted) for result in results[1:4])
        assert sorted(raft.state.jobs) == ["job_0", "job_1", "job_2"]
        assert proposer.queued == 0
        # An empty queue takes any request, even one over the bound.
        many: list[Command] = [submit_job(f"job_late_{i}") for i in range(5)]
        await drain(raft, proposer.submit_all(many))
        assert len(raft.state.jobs) == 8 and proposer.refused_commands == 3

    asyncio.run(run())


def test_request_bytes_are_bounded_and_given_back_when_proposed() -> None:
    async def run() -> None:
        raft = HeldRaft()
        proposer = Proposer(
            asyncio.get_running_loop(), raft, lambda: 1_000,
            queue_commands_max=100, queue_bytes_max=100,
        )  # fmt: skip
        proposer.become_leader(3)
        in_flight = proposer.submit(TakeOver())
        queued = [proposer.submit(submit_job("job_1"), 60)]
        assert proposer.queued_bytes == 60
        with pytest.raises(QueueFull):
            proposer.submit(submit_job("job_2"), 60)
        queued += proposer.submit_all([submit_job("job_3"), submit_job("job_4")], 40)
        assert proposer.queued_bytes == 100 and proposer.queued == 3
        await drain(raft, [in_flight, *queued])
        assert proposer.queued_bytes == 0
        assert sorted(raft.state.jobs) == ["job_1", "job_3", "job_4"]
        # Stepping down fails what is queued and empties the queue's byte count.
        proposer.submit(TakeOver())
        dropped = proposer.submit(submit_job("job_5"), 50)
        proposer.step_down()
        assert proposer.queued == 0 and proposer.queued_bytes == 0
        assert isinstance(dropped.exception(), NotLeader)

    asyncio.run(run())
