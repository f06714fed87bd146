"""Every row of the workflow, step and compensation tables is reachable, and
a move a table lacks is a bug that rolls its command back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack
import pytest
from core_support import Cluster

from raftsched.core.jobs.commands import CancelJob, ClaimJobs, CompleteJob, FailJob
from raftsched.core.kernel.commands import JobSpec, Tick
from raftsched.core.kernel.model import ImpossibleTransition
from raftsched.core.kernel.results import Claimed, Lease, Rejected
from raftsched.core.workflows import handlers as workflow_handlers
from raftsched.core.workflows import model as workflows_model
from raftsched.core.workflows.commands import CancelWorkflow, StepSpec, SubmitWorkflow
from raftsched.core.workflows.model import (
    COMPENSATION_TRANSITIONS,
    STEP_TRANSITIONS,
    SUCCEED,
    WORKFLOW_TRANSITIONS,
    Step,
    step_job_id,
    table,
    transition_step,
)

Row = tuple[str, str | None, str]  # (which table, status, event)


def _step(name: str, queue: str, *deps: str, undo: str | None = None) -> StepSpec:
    compensation = None if undo is None else JobSpec(undo)
    return StepSpec(name, JobSpec(queue, payload=msgpack.packb(name)), deps, compensation)


def _lease(cluster: Cluster, queue: str) -> Lease:
    result = cluster.one(ClaimJobs("w", (queue,), 1))
    assert isinstance(result, Claimed) and result.leases, result
    return result.leases[0]


def _complete(cluster: Cluster, queue: str) -> None:
    lease = _lease(cluster, queue)
    cluster.one(CompleteJob(lease.job_id, lease.fencing_token))


def _fail(cluster: Cluster, queue: str) -> None:
    lease = _lease(cluster, queue)
    cluster.one(FailJob(lease.job_id, lease.fencing_token, "permanent"))


def _scenarios(cluster: Cluster) -> None:
    saga = (_step("a", "qa", undo="undo_a"), _step("b", "qb", "a"), _step("c", "qc", "b"))
    cluster.one(SubmitWorkflow("wf_ok", (_step("a", "ok"),)))  # start, succeed
    _complete(cluster, "ok")
    cluster.one(SubmitWorkflow("wf_fail", saga))
    _complete(cluster, "qa")
    _fail(cluster, "qb")  # step fail, stop, skip c, plan and start a's undo
    _fail(cluster, "undo_a")  # compensation fail, workflow fail
    cluster.one(SubmitWorkflow("wf_cancel", saga))
    _complete(cluster, "qa")
    cluster.one(CancelWorkflow("wf_cancel"))  # step cancel (b was queued)
    _complete(cluster, "undo_a")  # compensation succeed, workflow cancel
    cluster.one(SubmitWorkflow("wf_undo_cancelled", saga))
    _complete(cluster, "qa")
    _fail(cluster, "qb")
    undo = step_job_id("wf_undo_cancelled", 0, compensation=True)
    cluster.one(CancelJob(undo))  # queued: compensation cancel
    continue_on = (_step("a", "qa"), _step("b", "qb", "a"))
    cluster.one(SubmitWorkflow("wf_continue", continue_on, on_failure="continue"))
    _fail(cluster, "qa")  # under continue, b is skipped by the running workflow
    cluster.one(SubmitWorkflow("wf_late", (_step("a", "late"),), timeout_ms=1_000))
    cluster.one(Tick(), at=cluster.now_ms + 1_000)  # time_out


def _rows(name: str, rows: Mapping[tuple[Any, str], str]) -> set[Row]:
    return {(name, status, event) for status, event in rows}


def test_every_row_of_each_table_is_reached(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: set[Row] = set()
    real = workflows_model.next_status

    def spy(rows: Mapping[tuple[Any, str], str], status: Any, event: str, what: str) -> str:
        seen.add((what, status, event))
        return real(rows, status, event, what)

    monkeypatch.setattr(workflows_model, "next_status", spy)
    cluster = Cluster()
    _scenarios(cluster)
    workflows = table(cluster.state).workflows
    assert {id: wf.status for id, wf in workflows.items()} == {
        "wf_ok": "succeeded",
        "wf_fail": "failed",
        "wf_cancel": "cancelled",
        "wf_undo_cancelled": "failed",
        "wf_continue": "failed",
        "wf_late": "timed_out",
    }
    assert seen == (
        _rows("workflow", WORKFLOW_TRANSITIONS)
        | _rows("step", STEP_TRANSITIONS)
        | _rows("compensation", COMPENSATION_TRANSITIONS)
    )


def test_a_move_the_table_lacks_raises() -> None:
    step = Step("a", JobSpec("q"), (), None)
    with pytest.raises(ImpossibleTransition, match="no step transition 'succeed' from 'waiting'"):
        transition_step(step, SUCCEED)
    assert step.status == "waiting"


def test_an_impossible_move_inside_a_command_is_rolled_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster()
    cluster.one(SubmitWorkflow("wf_1", (_step("a", "q"),)))
    lease = _lease(cluster, "q")
    before = cluster.digest()
    # A bug that records a step's outcome twice: the second move is not in the table.
    real = workflows_model.transition_step

    def twice(step: Step, event: str) -> None:
        real(step, event)
        real(step, event)

    monkeypatch.setattr(workflow_handlers, "transition_step", twice)
    result = cluster.one(CompleteJob(lease.job_id, lease.fencing_token))
    assert isinstance(result, Rejected) and result.code == "internal_error"
    assert "ImpossibleTransition" in result.message
    assert cluster.digest() == before
