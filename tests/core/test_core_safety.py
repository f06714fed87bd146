"""Nothing escapes apply, and a failing handler leaves the state unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from core_support import T0, Cluster

from raftsched.core import REGISTRY, apply_entry, check_invariants
from raftsched.core.jobs import leases as leases_module
from raftsched.core.jobs import tick as tick_module
from raftsched.core.jobs.commands import ClaimJobs, CompleteJob, StartJob, SubmitJobs
from raftsched.core.kernel.commands import Barrier, Entry, JobSpec, Tick
from raftsched.core.kernel.results import Rejected, Submitted
from raftsched.core.workflows.commands import StepSpec, SubmitWorkflow


def test_a_raising_handler_is_rolled_back_and_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster()
    lease = cluster.start()
    real = REGISTRY.handlers[CompleteJob]

    def broken(state: Any, command: Any, context: Any) -> Any:
        real(state, command, context)  # mutates completely, then fails
        raise RuntimeError("bug")

    monkeypatch.setitem(REGISTRY.handlers, CompleteJob, broken)
    before = cluster.digest()
    result = cluster.one(CompleteJob(lease.job_id, lease.fencing_token))
    assert isinstance(result, Rejected) and result.code == "internal_error"
    assert "RuntimeError: bug" in result.message
    assert cluster.digest() == before
    assert check_invariants(cluster.state) == []


def test_a_claim_failing_halfway_grants_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster()
    for _ in range(3):
        cluster.submit()
    real = leases_module._grant
    calls = []

    def flaky(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("halfway")
        return real(*args)

    monkeypatch.setattr(leases_module, "_grant", flaky)
    before = cluster.digest()
    result = cluster.one(ClaimJobs("w", ("q",), 3))
    assert isinstance(result, Rejected) and result.code == "internal_error"
    assert cluster.digest() == before
    monkeypatch.setattr(leases_module, "_grant", real)
    assert [lease.fencing_token for lease in cluster.claim(n=3)] == [1, 2, 3]


def test_a_tick_failing_after_purges_restores_them(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster()
    cluster.submit(idempotency_key="k")
    cluster.submit()
    cluster.submit(delay_ms=10)
    for lease in cluster.claim(n=2):
        cluster.run(CompleteJob(lease.job_id, lease.fencing_token))
    cluster.state.retention_ms = 0

    def broken(*args: Any) -> int:
        raise RuntimeError("after the purge")

    monkeypatch.setattr(tick_module, "_make_due_runnable", broken)
    monkeypatch.setattr(tick_module, "_purge_finished", _purge_then(tick_module._purge_finished))
    cluster.run(Barrier(), at=T0 + 10)  # time moves before the command runs
    before = cluster.digest()
    result = cluster.one(Tick())
    assert isinstance(result, Rejected) and result.code == "internal_error"
    assert cluster.digest() == before
    assert cluster.state.idempotency.get("default", "k") is not None


def _purge_then(real: Any) -> Any:
    def purge_and_fail(*args: Any) -> int:
        real(*args)
        raise RuntimeError("after the purge")

    return purge_and_fail


@pytest.mark.parametrize(
    "entry",
    [
        "not an entry",
        Entry("1", 0, ()),  # type: ignore[arg-type]
        Entry(1, -5, ()),
        Entry(1, 0, [StartJob("j", 1)]),  # type: ignore[arg-type]
        Entry(1, 0, ("not a command",)),  # type: ignore[arg-type]
        Entry(1, 0, (StartJob(None, None),)),  # type: ignore[arg-type]
        Entry(1, 0, (SubmitJobs([JobSpec("q")], ["j"]),)),  # type: ignore[arg-type]
        Entry(1, 0, (SubmitJobs((JobSpec(None),), ("j",)),)),  # type: ignore[arg-type]
        Entry(1, 0, (SubmitJobs((JobSpec("q", labels=(("a",),)),), ("j",)),)),  # type: ignore[arg-type]
        Entry(1, 0, (SubmitJobs((JobSpec("q", backoff=None),), ("j",)),)),  # type: ignore[arg-type]
        Entry(1, 0, (ClaimJobs("w", ("q", ["unhashable"]), 1),)),  # type: ignore[arg-type]
        Entry(1, 0, (Tick(seed=-1),)),
    ],
)
def test_garbage_never_raises(entry: Any) -> None:
    cluster = Cluster()
    cluster.submit(job_id="j")
    before = cluster.digest()
    results: list[Any] = []
    for result in apply_entry(cluster.state, entry):
        results.extend(result.items if isinstance(result, Submitted) else [result])
    assert results and all(isinstance(result, Rejected) for result in results)
    assert all(result.code == "invalid_request" for result in results)
    assert cluster.digest() == before


def test_a_workflow_submit_failing_after_its_step_jobs_removes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster()
    real = REGISTRY.handlers[SubmitWorkflow]

    def broken(state: Any, command: Any, context: Any) -> Any:
        real(state, command, context)  # creates the first steps' jobs, then fails
        raise RuntimeError("bug")

    monkeypatch.setitem(REGISTRY.handlers, SubmitWorkflow, broken)
    before = cluster.digest()
    steps = (StepSpec("a", JobSpec("q")), StepSpec("b", JobSpec("q")))
    result = cluster.one(SubmitWorkflow("wf_1", steps))
    assert isinstance(result, Rejected) and result.code == "internal_error"
    assert cluster.digest() == before
    assert cluster.state.jobs == {}


def test_a_submit_failing_after_it_created_its_jobs_removes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster()
    real = REGISTRY.handlers[SubmitJobs]

    def broken(state: Any, command: Any, context: Any) -> Any:
        real(state, command, context)
        raise RuntimeError("bug")

    monkeypatch.setitem(REGISTRY.handlers, SubmitJobs, broken)
    before = cluster.digest()
    result = cluster.one(SubmitJobs((JobSpec("q"), JobSpec("q")), ("job_a", "job_b")))
    assert isinstance(result, Rejected) and result.code == "internal_error"
    assert cluster.digest() == before
    assert cluster.state.jobs == {}
