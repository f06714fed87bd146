"""Workflows in the core: DAG validation, atomic advance, saga, cancel, timeout."""

from __future__ import annotations

import msgpack
import pytest
from core_support import Cluster, assert_rejected_unchanged

from raftsched.core import check_invariants, decode_state, encode_state
from raftsched.core.jobs.commands import ClaimJobs, CompleteJob, FailJob, StartJob
from raftsched.core.kernel.commands import JobSpec, Tick
from raftsched.core.kernel.outbox import events_after
from raftsched.core.kernel.results import Claimed, Lease, WorkflowCancelAccepted, WorkflowSubmitted
from raftsched.core.workflows.commands import CancelWorkflow, StepSpec, SubmitWorkflow
from raftsched.core.workflows.model import table


def step(name: str, queue: str = "q", *deps: str, undo: str | None = None) -> StepSpec:
    compensation = None if undo is None else JobSpec(undo, payload=msgpack.packb(name))
    return StepSpec(name, JobSpec(queue, payload=msgpack.packb(name)), deps, compensation)


PAYMENT = (
    step("reserve", "inventory", undo="inventory_undo"),
    step("charge", "payments", "reserve", undo="payments_undo"),
    step("ship", "shipping", "charge"),
)


def submit(cluster: Cluster, steps: tuple[StepSpec, ...] = PAYMENT, **kw: object) -> str:
    result = cluster.one(SubmitWorkflow(kw.pop("workflow_id", "wf_1"), steps, **kw))  # type: ignore[arg-type]
    assert isinstance(result, WorkflowSubmitted), result
    return result.workflow_id


def claim(cluster: Cluster, queue: str) -> Lease:
    result = cluster.one(ClaimJobs("w", (queue,), 1))
    assert isinstance(result, Claimed), result
    (lease,) = result.leases
    cluster.one(StartJob(lease.job_id, lease.fencing_token))
    return lease


def complete(cluster: Cluster, queue: str, result: object) -> Lease:
    lease = claim(cluster, queue)
    cluster.one(CompleteJob(lease.job_id, lease.fencing_token, msgpack.packb(result)))
    return lease


def statuses(cluster: Cluster, workflow_id: str = "wf_1") -> dict[str, str]:
    workflow = table(cluster.state).workflows[workflow_id]
    return {s.name: s.status for s in workflow.steps}


def event_types(cluster: Cluster) -> list[str]:
    return [e.type for e in events_after(cluster.state, 0, ["workflow.*"])]


def test_steps_without_dependencies_start_at_once_and_others_wait() -> None:
    cluster = Cluster()
    submit(cluster)
    assert statuses(cluster) == {"reserve": "active", "charge": "waiting", "ship": "waiting"}
    assert cluster.job("job_1_s0").workflow_id == "wf_1"
    assert cluster.job("job_1_s0").step == "reserve"


def test_a_dependent_step_is_created_in_the_command_that_completes_its_dependency() -> None:
    cluster = Cluster()
    submit(cluster)
    lease = claim(cluster, "inventory")
    assert "job_1_s1" not in cluster.state.jobs
    cluster.one(CompleteJob(lease.job_id, lease.fencing_token, msgpack.packb({"hold": 7})))
    assert cluster.job("job_1_s1").status == "pending"
    charge = claim(cluster, "payments")
    assert charge.workflow_id == "wf_1" and charge.step == "charge"
    assert msgpack.unpackb(charge.inputs) == {"reserve": {"hold": 7}}


def test_workflow_succeeds_when_every_step_does() -> None:
    cluster = Cluster()
    submit(cluster)
    complete(cluster, "inventory", 1)
    complete(cluster, "payments", 2)
    complete(cluster, "shipping", 3)
    workflow = table(cluster.state).workflows["wf_1"]
    assert workflow.status == "succeeded"
    assert [s.result for s in workflow.steps] == [msgpack.packb(n) for n in (1, 2, 3)]
    assert event_types(cluster) == ["workflow.succeeded"]


def test_permanent_failure_compensates_in_reverse_completion_order_with_inputs() -> None:
    cluster = Cluster()
    steps = (
        step("reserve", "inventory", undo="undo"),
        step("hold", "inventory", undo="undo"),
        step("charge", "payments", "reserve", "hold", undo="undo"),
    )
    submit(cluster, steps)
    first = complete(cluster, "inventory", "r")
    second = complete(cluster, "inventory", "h")
    assert first.job_id == "job_1_s0" and second.job_id == "job_1_s1"
    charge = claim(cluster, "payments")
    cluster.one(FailJob(charge.job_id, charge.fencing_token, "permanent", "declined"))
    workflow = table(cluster.state).workflows["wf_1"]
    assert workflow.status == "compensating"
    undo_hold = claim(cluster, "undo")  # only one compensation at a time
    assert undo_hold.job_id == "job_1_c1"
    assert msgpack.unpackb(undo_hold.inputs) == {"hold": "h"}
    assert cluster.one(ClaimJobs("w", ("undo",), 5)) == Claimed(())
    cluster.one(CompleteJob(undo_hold.job_id, undo_hold.fencing_token))
    undo_reserve = claim(cluster, "undo")
    assert msgpack.unpackb(undo_reserve.inputs) == {"reserve": "r"}
    cluster.one(CompleteJob(undo_reserve.job_id, undo_reserve.fencing_token))
    assert workflow.status == "failed"
    assert [workflow.steps[i].comp_status for i in (1, 0)] == ["succeeded", "succeeded"]
    assert workflow.steps[2].comp_status is None
    assert event_types(cluster) == ["workflow.compensated", "workflow.failed"]


def test_fail_fast_cancels_queued_and_asks_running_steps_to_stop() -> None:
    cluster = Cluster()
    submit(cluster, (step("a"), step("b"), step("c"), step("d", "q", "a")))
    lease_a = claim(cluster, "q")
    lease_b = claim(cluster, "q")
    cluster.one(FailJob(lease_a.job_id, lease_a.fencing_token, "permanent"))
    assert statuses(cluster) == {
        "a": "failed", "b": "active", "c": "cancelled", "d": "skipped",
    }  # fmt: skip
    assert cluster.job(lease_b.job_id).cancel_requested
    cluster.one(FailJob(lease_b.job_id, lease_b.fencing_token, "cancelled"))
    assert table(cluster.state).workflows["wf_1"].status == "failed"


def test_continue_runs_independent_steps_and_skips_dependents() -> None:
    cluster = Cluster()
    submit(cluster, (step("a", "qa"), step("b", "qb"), step("c", "qa", "a")), on_failure="continue")
    lease_a = claim(cluster, "qa")
    cluster.one(FailJob(lease_a.job_id, lease_a.fencing_token, "permanent"))
    assert statuses(cluster) == {"a": "failed", "b": "active", "c": "skipped"}
    complete(cluster, "qb", None)
    assert table(cluster.state).workflows["wf_1"].status == "failed"


def test_cancel_compensates_succeeded_steps_when_configured() -> None:
    cluster = Cluster()
    submit(cluster)
    complete(cluster, "inventory", "r")
    result = cluster.one(CancelWorkflow("wf_1", "customer asked"))
    assert result == WorkflowCancelAccepted("wf_1", "compensating")
    assert cluster.job("job_1_s1").status == "cancelled"
    complete(cluster, "inventory_undo", None)
    workflow = table(cluster.state).workflows["wf_1"]
    assert workflow.status == "cancelled"
    assert cluster.one(CancelWorkflow("wf_1")) == WorkflowCancelAccepted("wf_1", "cancelled")


def test_cancel_without_compensation() -> None:
    cluster = Cluster()
    submit(cluster, compensate_on_cancel=False)
    complete(cluster, "inventory", "r")
    cluster.one(CancelWorkflow("wf_1"))
    assert table(cluster.state).workflows["wf_1"].status == "cancelled"


def test_timeout_is_a_failure_with_reason_timed_out() -> None:
    cluster = Cluster()
    submit(cluster, timeout_ms=5_000)
    cluster.one(Tick(), at=cluster.now_ms + 4_999)
    assert table(cluster.state).workflows["wf_1"].status == "running"
    cluster.one(Tick(), at=cluster.now_ms + 1)
    workflow = table(cluster.state).workflows["wf_1"]
    assert (workflow.status, workflow.reason) == ("timed_out", "timed_out")
    assert event_types(cluster) == ["workflow.timed_out"]


def test_idempotency_key_per_tenant() -> None:
    cluster = Cluster()
    submit(cluster, idempotency_key="order:1", tenant="acme")
    again = SubmitWorkflow("wf_2", PAYMENT, "acme", "order:1")
    assert cluster.one(again) == WorkflowSubmitted("wf_1", created=False)
    assert cluster.one(SubmitWorkflow("wf_3", PAYMENT, "other", "order:1")).created
    different = SubmitWorkflow("wf_4", PAYMENT[:1], "acme", "order:1")
    assert_rejected_unchanged(cluster, different, "idempotency_conflict")
    # A retried proposal (same id, same request) creates nothing twice.
    assert cluster.one(SubmitWorkflow("wf_3", PAYMENT, "other", "order:1")).created is False


@pytest.mark.parametrize(
    ("steps", "field"),
    [
        ((step("a"), step("a")), "steps[1].name"),
        ((step("a", "q", "zz"),), "steps[0].depends_on"),
        ((step("a", "q", "b"), step("b", "q", "a")), "steps[0].depends_on"),
        ((step("a", "q", "a"),), "steps[0].depends_on"),
        ((StepSpec("a", JobSpec("")),), "steps[0].queue"),
        (
            (StepSpec("a", JobSpec("q"), (), JobSpec("q", priority=999)),),
            "steps[0].compensation.priority",
        ),
        ((), "steps"),
    ],
)
def test_invalid_graphs_are_rejected_naming_the_field(
    steps: tuple[StepSpec, ...], field: str
) -> None:
    cluster = Cluster()
    rejected = assert_rejected_unchanged(cluster, SubmitWorkflow("wf_1", steps), "invalid_request")
    assert rejected.details["field"] == field


def test_bad_policy_is_rejected() -> None:
    cluster = Cluster()
    bad = SubmitWorkflow("wf_1", PAYMENT, on_failure="sometimes")
    assert assert_rejected_unchanged(cluster, bad, "invalid_request").details == {
        "field": "on_failure"
    }
    assert_rejected_unchanged(cluster, CancelWorkflow("nope"), "not_found")


def test_workflows_survive_a_snapshot_byte_for_byte() -> None:
    cluster = Cluster()
    submit(cluster, timeout_ms=60_000, idempotency_key="k")
    complete(cluster, "inventory", {"x": 1})
    data = encode_state(cluster.state)
    copy = decode_state(data)
    assert encode_state(copy) == data
    assert check_invariants(copy) == []
    lease = copy.sections["workflows"].workflows["wf_1"].steps[1]
    assert lease.status == "active"


def test_finished_workflows_are_purged_after_retention() -> None:
    cluster = Cluster()
    submit(cluster, (step("a"),), idempotency_key="k")
    complete(cluster, "q", None)
    cluster.one(Tick(), at=cluster.now_ms + cluster.state.retention_ms)
    assert table(cluster.state).workflows == {}
    assert table(cluster.state).keys == {}
