"""Helpers for the core tests: build a state, apply commands, read results."""

from __future__ import annotations

from typing import Any

from raftsched.core import State, apply_entry, check_invariants, new_state, state_digest
from raftsched.core.jobs.commands import ClaimJobs, StartJob, SubmitJobs
from raftsched.core.kernel.commands import Command, Entry, JobSpec, TakeOver
from raftsched.core.kernel.results import Claimed, Lease, Rejected, Result, Submitted

T0 = 1_000_000


class Cluster:
    """One state plus the clock and epoch its leader stamps on entries."""

    def __init__(self, now_ms: int = T0, epoch: int = 1) -> None:
        self.state: State = new_state()
        self.now_ms = now_ms
        self.epoch = epoch
        self.next_id = 1
        # The leader's first entry: time and epoch start here, so that later
        # rejected commands leave the digest exactly as it was.
        self.run(TakeOver())

    def run(
        self, *commands: Command, at: int | None = None, epoch: int | None = None
    ) -> list[Result]:
        if at is not None:
            self.now_ms = at
        entry = Entry(self.epoch if epoch is None else epoch, self.now_ms, tuple(commands))
        results = apply_entry(self.state, entry)
        assert check_invariants(self.state) == []
        return results

    def one(self, command: Command, **kwargs: Any) -> Any:
        (result,) = self.run(command, **kwargs)
        return result

    def submit(self, spec: JobSpec | None = None, job_id: str | None = None, **fields: Any) -> str:
        if spec is None:
            spec = JobSpec(**{"queue": "q", **fields})
        if job_id is None:
            job_id = f"job_{self.next_id}"
            self.next_id += 1
        result = self.one(SubmitJobs((spec,), (job_id,)))
        assert isinstance(result, Submitted), result
        (item,) = result.items
        assert not isinstance(item, Rejected), item
        return item.job_id

    def claim(
        self,
        worker: str = "w1",
        queues: tuple[str, ...] = ("q",),
        n: int = 1,
        lease_ms: int | None = None,
    ) -> list[Lease]:
        result = self.one(ClaimJobs(worker, queues, n, lease_ms))
        assert isinstance(result, Claimed), result
        return list(result.leases)

    def claim_one(self, **kwargs: Any) -> Lease:
        (lease,) = self.claim(**kwargs)
        return lease

    def start(self, **fields: Any) -> Lease:
        """Submit, claim and start one job."""
        self.submit(**fields)
        lease = self.claim_one()
        self.one(StartJob(lease.job_id, lease.fencing_token))
        return lease

    def digest(self) -> str:
        return state_digest(self.state)

    def job(self, job_id: str) -> Any:
        return self.state.jobs[job_id]


def assert_rejected_unchanged(cluster: Cluster, command: Command, code: str) -> Rejected:
    """The command is rejected with `code` and the state is byte-for-byte unchanged."""
    before = cluster.digest()
    result = cluster.one(command)
    assert isinstance(result, Rejected), result
    assert result.code == code, result
    assert cluster.digest() == before
    return result
