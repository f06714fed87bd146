"""Every row of the transition table is reachable, and recorded as it says;
entering a status does one thing, and a move the table lacks is a bug."""

from __future__ import annotations

from typing import Any

import pytest
from core_support import T0, Cluster

from raftsched.core import FINAL_STATUSES, JOB_STATUSES, TRANSITIONS
from raftsched.core.jobs import leases as leases_module
from raftsched.core.jobs.commands import (
    CancelJob,
    CompleteJob,
    FailJob,
    ReconcileJob,
    ReplayJob,
    RequestReconcile,
    StartJob,
)
from raftsched.core.jobs.lifecycle import ON_ENTER, finish, transition
from raftsched.core.kernel.commands import Backoff, Tick
from raftsched.core.kernel.model import START, ImpossibleTransition
from raftsched.core.kernel.results import Rejected
from raftsched.core.kernel.savepoint import Savepoint

# Repeated starts and heartbeats keep the status and are not history events;
# test_core_leases covers them.
NOT_RECORDED = {("running", "start"), ("claimed", "heartbeat"), ("running", "heartbeat")}


def _leased(cluster: Cluster, started: bool, **fields: object) -> tuple[str, int]:
    job_id = cluster.submit(**fields)
    lease = cluster.claim_one()
    assert lease.job_id == job_id
    if started:
        cluster.run(StartJob(job_id, lease.fencing_token))
    return job_id, lease.fencing_token


def _scenarios(cluster: Cluster) -> None:
    for started in (False, True):
        job, token = _leased(cluster, started)
        cluster.run(CompleteJob(job, token))
        job, token = _leased(cluster, started, backoff=Backoff(50, 50, 0))
        cluster.run(FailJob(job, token, "transient"))  # retry
        cluster.run(CancelJob(job))  # retry_wait -> cancelled
        job, token = _leased(cluster, started, backoff=Backoff(0, 0, 0))
        cluster.run(FailJob(job, token, "transient"))  # requeue
        cluster.run(CancelJob(job))
        job, token = _leased(cluster, started)
        cluster.run(FailJob(job, token, "permanent"))  # dead_letter
        cluster.run(ReplayJob(job))
        cluster.run(CancelJob(job))
        job, token = _leased(cluster, started)
        cluster.run(FailJob(job, token, "permanent"))
        cluster.run(CancelJob(job))  # dead_letter -> cancelled (discarded)
        job, token = _leased(cluster, started)
        cluster.run(CancelJob(job))  # request_cancel
        cluster.run(FailJob(job, token, "cancelled"))  # cancel
    job, _ = _leased(cluster, False, lease_ms=100)
    cluster.run(Tick(), at=cluster.now_ms + 100)  # claimed lease expiry: requeue
    cluster.run(CancelJob(job))
    delayed = cluster.submit(delay_ms=10)
    cluster.run(Tick(), at=cluster.now_ms + 10)  # scheduled -> due
    cluster.run(CancelJob(delayed))
    cluster.run(CancelJob(cluster.submit(delay_ms=10)))  # scheduled -> cancel
    cluster.submit(delay_ms=10_000, deadline_ms=1_000)  # scheduled -> dead_letter
    job, token = _leased(cluster, True, deadline_ms=1_000, backoff=Backoff(5_000, 5_000, 0))
    cluster.run(FailJob(job, token, "transient"))  # retry_wait -> dead_letter
    cluster.submit(deadline_ms=1_000)  # pending -> dead_letter
    cluster.run(Tick(), at=cluster.now_ms + 1_000)
    job, token = _leased(cluster, True, backoff=Backoff(50, 50, 0))
    cluster.run(FailJob(job, token, "transient"))
    cluster.run(Tick(), at=cluster.now_ms + 50)  # retry_wait -> due
    cluster.run(CancelJob(job))
    _reconcile_scenarios(cluster)


def _reconciling(cluster: Cluster, started: bool, **fields: object) -> tuple[str, int]:
    """A reconcile job whose attempt failed `unknown`, and its reconciliation lease."""
    job, token = _leased(cluster, started, on_unknown="reconcile", **fields)
    cluster.run(FailJob(job, token, "unknown"))  # claimed/running -> reconciling
    lease = cluster.claim_one()  # reconciling -> claim
    assert lease.job_id == job and lease.reconcile is not None
    return job, lease.fencing_token


def _reconcile_scenarios(cluster: Cluster) -> None:
    for started in (False, True):
        job, token = _reconciling(cluster, started)
        cluster.run(ReconcileJob(job, token, "happened"))  # -> succeeded
    job, token = _reconciling(cluster, True, backoff=Backoff(50, 50, 0))
    cluster.run(ReconcileJob(job, token, "did_not_happen"))  # -> retry_wait
    cluster.run(CancelJob(job))
    job, token = _reconciling(cluster, True, backoff=Backoff(0, 0, 0))
    cluster.run(ReconcileJob(job, token, "did_not_happen"))  # -> pending (requeue)
    cluster.run(CancelJob(job))
    job, token = _reconciling(cluster, True)
    cluster.run(ReconcileJob(job, token, "cannot_tell", reason="no record"))  # -> dead_letter
    cluster.run(RequestReconcile(job, "the provider is back"))  # dead_letter -> reconciling
    (ask,) = cluster.claim()
    cluster.run(ReconcileJob(job, ask.fencing_token, "cannot_tell", reason="still no record"))
    job, _ = _reconciling(cluster, True, backoff=Backoff(0, 0, 0), lease_ms=100)
    cluster.run(Tick(), at=cluster.now_ms + 100)  # reconciliation lease expires
    cluster.run(CancelJob(job))  # reconciling -> cancelled


def test_every_transition_is_reachable_and_recorded() -> None:
    cluster = Cluster()
    _scenarios(cluster)
    seen = set()
    for job in cluster.state.jobs.values():
        for _at, event, from_status, to_status, *_ in job.history or ():
            assert TRANSITIONS[from_status, event] == to_status
            seen.add((from_status, event))
    assert seen == set(TRANSITIONS) - NOT_RECORDED
    assert cluster.state.now_ms > T0


def test_entering_each_status_has_one_row_and_every_final_status_finishes() -> None:
    assert tuple(ON_ENTER) == JOB_STATUSES
    assert {status for status, enter in ON_ENTER.items() if enter is finish} == FINAL_STATUSES


def test_a_move_the_table_lacks_raises() -> None:
    cluster = Cluster()
    job = cluster.job(cluster.submit())
    with pytest.raises(ImpossibleTransition, match="no job transition 'start' from 'pending'"):
        transition(cluster.state, job, START, "test", Savepoint(cluster.state))


def test_an_impossible_move_inside_a_command_is_rolled_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster()
    lease = cluster.start()
    before = cluster.digest()
    # A bug that completes a running job twice: the second move is not in the table.
    real = leases_module.transition

    def twice(state: Any, job: Any, event: str, *args: Any) -> None:
        real(state, job, event, *args)
        real(state, job, event, *args)

    monkeypatch.setattr(leases_module, "transition", twice)
    result = cluster.one(CompleteJob(lease.job_id, lease.fencing_token))
    assert isinstance(result, Rejected) and result.code == "internal_error"
    assert "ImpossibleTransition" in result.message
    assert cluster.digest() == before
