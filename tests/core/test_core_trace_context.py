"""A submission's W3C trace context (cluster version 8, jobs.trace_book):
a job's, kept beside it; a workflow's, kept with it and given to every job
it creates."""

from __future__ import annotations

from dataclasses import replace

import msgpack
import pytest
from core_support import T0, Cluster, assert_rejected_unchanged
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.core import (
    REGISTRY,
    check_invariants,
    command_version,
    decode_entry,
    decode_state,
    encode_entry,
    encode_state,
    job_trace,
    needs_upgrade,
    newest_kind,
    newest_spec_field,
    state_digest,
)
from raftsched.core.jobs import trace_book
from raftsched.core.jobs.commands import (
    CompleteJob,
    Configure,
    ConfigureWheel,
    FailJob,
    StartJob,
    SubmitJobs,
)
from raftsched.core.jobs.submit import spec_fingerprint
from raftsched.core.kernel import wheel
from raftsched.core.kernel.codec import _command_row, decode_spec, spec_row
from raftsched.core.kernel.commands import Entry, JobSpec, RaiseClusterVersion, Tick
from raftsched.core.kernel.results import Rejected, SubmitItem, Submitted, WorkflowSubmitted
from raftsched.core.kernel.validate import check_trace_context
from raftsched.core.schedules.commands import CreateSchedule, ScheduleSpec
from raftsched.core.workflows.commands import StepSpec, SubmitWorkflow
from raftsched.core.workflows.model import _workflow_row, table

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OTHER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
STATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
MIN = 60_000


def traced(**fields: object) -> JobSpec:
    return JobSpec(**{"queue": "q", "traceparent": PARENT, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "length"),
    [
        (JobSpec("q"), 14),
        (JobSpec("q", on_unknown="reconcile"), 16),
        (traced(), 19),
        (traced(tracestate=STATE), 19),
        (traced(on_unknown="retry", reconcile_queue="audit", tracestate=STATE), 19),
        (traced(kind="charge"), 19),
        (JobSpec("q", kind="charge"), 17),
    ],
)
def test_a_spec_encodes_its_trace_context_only_when_it_has_one(spec: JobSpec, length: int) -> None:
    row = spec_row(spec)
    assert len(row) == length
    decoded = decode_spec(msgpack.unpackb(msgpack.packb(row), use_list=False))
    assert decoded == spec


@pytest.mark.parametrize(
    ("traceparent", "tracestate", "field"),
    [
        (PARENT, None, None),
        (PARENT, STATE, None),
        (OTHER, "a" * 256, None),
        (None, None, None),
        (None, STATE, "tracestate"),
        ("00-" + "0" * 32 + "-b7ad6b7169203331-01", None, "traceparent"),
        ("00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01", None, "traceparent"),
        ("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None, "traceparent"),
        (PARENT.upper(), None, "traceparent"),
        (PARENT + "-extra", None, "traceparent"),
        (PARENT[:-1], None, "traceparent"),
        (b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None, "traceparent"),
        (PARENT, "a" * 257, "tracestate"),
        (PARENT, "", "tracestate"),
        (PARENT, "rojo=\u00e9t\u00e9", "tracestate"),
        (PARENT, "rojo=1\ncongo=2", "tracestate"),
        (PARENT, 7, "tracestate"),
    ],
)
def test_a_trace_context_is_checked(traceparent: object, tracestate: object, field: str) -> None:
    rejected = check_trace_context(traceparent, tracestate)
    if field is None:
        assert rejected is None
    else:
        assert rejected is not None and rejected.details["field"] == field


def test_a_spec_with_a_trace_context_needs_cluster_version_8() -> None:
    plain = SubmitJobs((JobSpec("q"), JobSpec("q", on_unknown="retry")), ("a", "b"))
    assert command_version(plain) == 5
    submit = SubmitJobs((JobSpec("q"), traced()), ("a", "b"))
    assert command_version(submit) == 8
    template = CreateSchedule(ScheduleSpec("s1", traced(), interval_ms=MIN))
    assert command_version(template) == 8
    cluster = Cluster()
    cluster.run(RaiseClusterVersion(7))
    assert needs_upgrade(cluster.state, submit)
    cluster.run(RaiseClusterVersion(8))
    assert not needs_upgrade(cluster.state, submit)


def test_the_gate_names_the_field_that_needs_version_8() -> None:
    assert newest_spec_field(SubmitJobs((traced(),), ("a",))) == "traceparent"
    assert newest_spec_field(SubmitJobs((traced(kind="charge"),), ("a",))) == "kind"
    assert newest_spec_field(SubmitJobs((traced(), JobSpec("q", kind="x")), ("a", "b"))) == "kind"
    assert newest_spec_field(SubmitJobs((JobSpec("q", on_unknown="retry"),), ("a",))) is None


def test_a_submission_keeps_its_trace_context_beside_the_job() -> None:
    cluster = Cluster()
    digest = cluster.digest()
    assert trace_book.SECTION.omitted(cluster.state)
    plain = cluster.submit(JobSpec("q"))
    assert job_trace(cluster.state, plain) is None
    assert trace_book.SECTION.omitted(cluster.state), "no traced job: encoded as before"
    job_id = cluster.submit(traced(tracestate=STATE))
    other = cluster.submit(traced(traceparent=OTHER))
    assert job_trace(cluster.state, job_id) == (PARENT, STATE)
    assert job_trace(cluster.state, other) == (OTHER, None)
    assert not trace_book.SECTION.omitted(cluster.state)
    assert cluster.digest() != digest
    # Leases do not change it: every attempt's lease hands out the same.
    lease = cluster.claim_one()
    assert lease.job_id == plain
    assert job_trace(cluster.state, job_id) == (PARENT, STATE)


def test_a_rejected_spec_stores_no_trace_context() -> None:
    cluster = Cluster()
    bad = traced(traceparent="00-nothex")
    (result,) = cluster.run(SubmitJobs((bad, traced(queue="")), ("a", "b")))
    assert isinstance(result, Submitted)
    assert all(isinstance(item, Rejected) for item in result.items)
    assert [item.details["field"] for item in result.items] == ["traceparent", "queue"]  # type: ignore[union-attr]
    assert trace_book.traces_of(cluster.state) == {}


def test_an_idempotent_repeat_from_another_span_is_the_same_request() -> None:
    cluster = Cluster()
    first = cluster.submit(traced(idempotency_key="k", payload=b"\x01"), "a")
    assert spec_fingerprint(traced(idempotency_key="k")) == spec_fingerprint(
        JobSpec("q", idempotency_key="k")
    )
    repeats = (
        traced(traceparent=OTHER, idempotency_key="k", payload=b"\x01"),
        JobSpec("q", idempotency_key="k", payload=b"\x01"),
        traced(idempotency_key="k", payload=b"\x02"),
    )
    (result,) = cluster.run(SubmitJobs(repeats, ("b", "c", "d")))
    assert isinstance(result, Submitted)
    assert result.items[:2] == (SubmitItem(first, created=False), SubmitItem(first, created=False))
    assert isinstance(result.items[2], Rejected) and result.items[2].code == "idempotency_conflict"
    assert job_trace(cluster.state, first) == (PARENT, None), "the first submission's context"
    assert set(trace_book.traces_of(cluster.state)) == {first}


def test_the_trace_context_survives_a_snapshot_and_goes_with_the_purged_job() -> None:
    cluster = Cluster()
    cluster.run(Configure(retention_ms=10_000))
    done = cluster.submit(traced(tracestate=STATE), "a")
    kept = cluster.submit(traced(traceparent=OTHER), "b")
    lease = cluster.claim_one()
    assert lease.job_id == done
    cluster.one(CompleteJob(done, lease.fencing_token, b"\xc0"))
    decoded = decode_state(encode_state(cluster.state))
    assert state_digest(decoded) == cluster.digest()
    assert trace_book.traces_of(decoded) == {done: (PARENT, STATE), kept: (OTHER, None)}
    assert decoded.sections[trace_book.TRACES][kept] is not None
    cluster.run(Tick(seed=1), at=cluster.now_ms + 10_000)
    assert done not in cluster.state.jobs, "purged"
    assert trace_book.traces_of(cluster.state) == {kept: (OTHER, None)}
    cluster.run(Tick(seed=2), at=cluster.now_ms + 1)  # the rest stay


def test_a_traced_far_future_job_is_packed_and_keeps_its_context_when_hydrated() -> None:
    cluster = Cluster()
    cluster.run(RaiseClusterVersion(8), ConfigureWheel(5 * MIN, MIN))
    job_id = cluster.submit(traced(run_at_ms=T0 + 60 * MIN, tracestate=STATE))
    assert job_id not in cluster.state.jobs and wheel.find_packed(cluster.state, job_id)
    assert job_trace(cluster.state, job_id) == (PARENT, STATE)
    decoded = decode_state(encode_state(cluster.state))
    assert state_digest(decoded) == cluster.digest()
    cluster.run(Tick(seed=1), at=T0 + 57 * MIN)  # its bucket comes within the horizon
    assert job_id in cluster.state.jobs
    assert job_trace(cluster.state, job_id) == (PARENT, STATE)


def test_invariants_name_a_trace_context_without_a_job() -> None:
    cluster = Cluster()
    job_id = cluster.submit(traced())
    traces = trace_book.traces_of(cluster.state)
    traces["job_gone"] = (PARENT, None)
    traces[job_id] = ("not a traceparent", None)
    assert sorted(trace_book.check(cluster.state)) == [
        f"job {job_id} has an invalid trace context",
        "trace context for unknown job job_gone",
    ]


def test_a_schedules_occurrence_and_a_workflow_step_keep_a_templates_context() -> None:
    """The API never puts a context in a template; a command that does is
    still applied alike everywhere, its jobs keeping it."""
    cluster = Cluster()
    cluster.run(RaiseClusterVersion(8))
    template = replace(traced(), queue="nightly")
    cluster.run(CreateSchedule(ScheduleSpec("s1", template, interval_ms=MIN)))
    cluster.run(Tick(seed=1), at=cluster.now_ms + MIN)
    occurrences = [job for job in cluster.state.jobs.values() if job.queue == "nightly"]
    assert occurrences
    assert all(job_trace(cluster.state, job.id) == (PARENT, None) for job in occurrences)


# -- workflows ----------------------------------------------------------------------


def _step(name: str, *deps: str, queue: str = "q", undo: str | None = None) -> StepSpec:
    compensation = None if undo is None else JobSpec(undo)
    return StepSpec(name, JobSpec(queue, payload=msgpack.packb(name)), deps, compensation)


SAGA = (_step("reserve", undo="undo"), _step("charge", "reserve"), _step("ship", "charge"))


def _workflow(**fields: object) -> SubmitWorkflow:
    return SubmitWorkflow(**{"workflow_id": "wf_1", "steps": SAGA, **fields})  # type: ignore[arg-type]


def _finish_step(cluster: Cluster, queue: str = "q", *, fail: bool = False) -> str:
    lease = cluster.claim_one(queues=(queue,))
    cluster.one(StartJob(lease.job_id, lease.fencing_token))
    if fail:
        cluster.one(FailJob(lease.job_id, lease.fencing_token, "permanent", "no"))
    else:
        cluster.one(CompleteJob(lease.job_id, lease.fencing_token, b"\xc0"))
    return lease.job_id


def test_a_workflow_encodes_its_trace_context_only_when_it_has_one() -> None:
    tables = REGISTRY.codec
    plain = _workflow()
    assert len(_command_row(plain, tables)) == 1 + 7, "as release 0.7.0 wrote it"
    traced_workflow = _workflow(traceparent=PARENT, tracestate=STATE)
    assert _command_row(traced_workflow, tables)[-2:] == [PARENT, STATE]
    for command in (plain, traced_workflow, _workflow(traceparent=PARENT)):
        entry = Entry(1, T0, (command,))
        assert decode_entry(encode_entry(entry)) == entry


def test_a_traced_workflow_needs_cluster_version_8_and_the_gate_names_traceparent() -> None:
    assert command_version(_workflow()) == 1
    traced_workflow = _workflow(traceparent=PARENT)
    assert command_version(traced_workflow) == 8
    assert newest_kind(traced_workflow) == "SubmitWorkflow"
    assert newest_spec_field(traced_workflow) == "traceparent"
    assert newest_spec_field(_workflow()) is None
    cluster = Cluster()
    cluster.run(RaiseClusterVersion(7))
    assert needs_upgrade(cluster.state, traced_workflow)
    assert not needs_upgrade(cluster.state, _workflow())
    cluster.run(RaiseClusterVersion(8))
    assert not needs_upgrade(cluster.state, traced_workflow)


def test_every_job_a_traced_workflow_creates_keeps_its_context() -> None:
    cluster = Cluster()
    own = "00-11111111111111111111111111111111-2222222222222222-01"
    steps = (*SAGA[:2], replace(SAGA[2], job=replace(SAGA[2].job, traceparent=own)))
    result = cluster.one(_workflow(steps=steps, traceparent=PARENT, tracestate=STATE))
    assert result == WorkflowSubmitted("wf_1", created=True)
    workflow = table(cluster.state).workflows["wf_1"]
    assert workflow.trace == (PARENT, STATE)
    first = _finish_step(cluster)
    assert first == "job_1_s0" and job_trace(cluster.state, first) == (PARENT, STATE)
    # The step advance creates the next step's job, in the same context.
    assert job_trace(cluster.state, "job_1_s1") == (PARENT, STATE)
    _finish_step(cluster)
    assert job_trace(cluster.state, "job_1_s2") == (own, None), "a step's own context wins"
    _finish_step(cluster, fail=True)
    # The workflow failed: the compensation is one of its jobs too.
    assert workflow.status == "compensating"
    assert job_trace(cluster.state, "job_1_c0") == (PARENT, STATE)
    assert _finish_step(cluster, "undo") == "job_1_c0"
    assert workflow.status == "failed"


def test_an_untraced_workflow_stores_none_and_encodes_as_before() -> None:
    cluster = Cluster()
    cluster.one(_workflow())
    workflow = table(cluster.state).workflows["wf_1"]
    assert workflow.trace is None and len(_workflow_row(workflow)) == 17
    assert trace_book.traces_of(cluster.state) == {}
    traced_copy = Cluster()
    traced_copy.one(_workflow(traceparent=PARENT))
    assert len(_workflow_row(table(traced_copy.state).workflows["wf_1"])) == 19


def test_a_workflows_trace_context_survives_a_snapshot_and_goes_when_it_is_purged() -> None:
    cluster = Cluster()
    cluster.run(Configure(retention_ms=10_000))
    cluster.one(_workflow(steps=(_step("a"), _step("b", "a")), traceparent=OTHER))
    _finish_step(cluster)
    decoded = decode_state(encode_state(cluster.state))
    assert encode_state(decoded) == encode_state(cluster.state)
    assert state_digest(decoded) == cluster.digest()
    assert table(decoded).workflows["wf_1"].trace == (OTHER, None)
    # The restored replica creates the last step in the same context.
    replica = Cluster()
    replica.state, replica.now_ms = decoded, cluster.now_ms
    for each in (cluster, replica):
        _finish_step(each)
        assert job_trace(each.state, "job_1_s1") == (OTHER, None)
        assert table(each.state).workflows["wf_1"].status == "succeeded"
    assert replica.digest() == cluster.digest()
    cluster.run(Tick(seed=1), at=cluster.now_ms + 10_000)
    assert table(cluster.state).workflows == {}, "purged with its context"
    assert trace_book.traces_of(cluster.state) == {}, "and its jobs with theirs"


def test_a_repeat_from_another_span_is_the_same_workflow_and_keeps_the_first_context() -> None:
    cluster = Cluster()
    cluster.one(_workflow(idempotency_key="k", traceparent=PARENT))
    again = cluster.one(_workflow(workflow_id="wf_2", idempotency_key="k", traceparent=OTHER))
    assert again == WorkflowSubmitted("wf_1", created=False)
    untraced = cluster.one(_workflow(workflow_id="wf_3", idempotency_key="k"))
    assert untraced == WorkflowSubmitted("wf_1", created=False)
    retried = cluster.one(_workflow(idempotency_key="k", traceparent=OTHER))  # same proposal
    assert retried == WorkflowSubmitted("wf_1", created=False)
    assert table(cluster.state).workflows["wf_1"].trace == (PARENT, None)
    other = cluster.one(_workflow(workflow_id="wf_4", idempotency_key="k", timeout_ms=5))
    assert isinstance(other, Rejected) and other.code == "idempotency_conflict"


@pytest.mark.parametrize(
    ("traceparent", "tracestate", "field"),
    [
        ("00-nothex", None, "traceparent"),
        (None, STATE, "tracestate"),
        (PARENT, "x" * 257, "tracestate"),
        (PARENT.encode(), None, "traceparent"),
    ],
)
def test_a_workflow_with_a_malformed_context_is_refused_unchanged(
    traceparent: object, tracestate: object, field: str
) -> None:
    cluster = Cluster()
    command = _workflow(traceparent=traceparent, tracestate=tracestate)
    rejected = assert_rejected_unchanged(cluster, command, "invalid_request")
    assert rejected.details["field"] == field
    assert table(cluster.state).workflows == {}


def test_invariants_name_a_workflows_invalid_trace_context() -> None:
    cluster = Cluster()
    cluster.one(_workflow(traceparent=PARENT))
    table(cluster.state).workflows["wf_1"].trace = ("not a traceparent", None)
    assert check_invariants(cluster.state) == ["workflow wf_1: an invalid trace context"]


@st.composite
def _traced_workflows(draw: st.DrawFn) -> tuple[SubmitWorkflow, list[bool]]:
    """A random DAG of 1-5 steps, some with a compensation and a few with a
    context of their own, under a random context (or none), and the
    outcomes its jobs will have in turn (True: succeeds)."""
    count = draw(st.integers(1, 5))
    steps = []
    for index in range(count):
        deps = draw(st.sets(st.integers(0, index - 1), max_size=2)) if index else set()
        own = draw(st.sampled_from([None, None, None, OTHER]))
        job = JobSpec("q", payload=msgpack.packb(index), traceparent=own)
        undo = JobSpec("undo") if draw(st.booleans()) else None
        steps.append(StepSpec(f"s{index}", job, tuple(f"s{d}" for d in sorted(deps)), undo))
    context = draw(st.sampled_from([None, (PARENT, None), (PARENT, STATE)]))
    command = SubmitWorkflow(
        "wf_1",
        tuple(steps),
        on_failure=draw(st.sampled_from(["fail_fast", "continue"])),
        traceparent=None if context is None else context[0],
        tracestate=None if context is None else context[1],
    )
    return command, draw(st.lists(st.booleans(), min_size=12, max_size=12))


@settings(max_examples=60, deadline=None)
@given(_traced_workflows())
def test_every_job_of_a_random_workflow_has_its_context_whatever_happens(
    drawn: tuple[SubmitWorkflow, list[bool]],
) -> None:
    command, outcomes = drawn
    cluster = Cluster()
    assert cluster.one(command) == WorkflowSubmitted("wf_1", created=True)
    workflow = table(cluster.state).workflows["wf_1"]
    context = None if command.traceparent is None else (command.traceparent, command.tracestate)
    assert workflow.trace == context
    specs = {step.name: step for step in command.steps}

    def expected(job_id: str) -> tuple[str, str | None] | None:
        """A step's own context, else (its compensation too) the workflow's."""
        name = cluster.state.jobs[job_id].step
        step = workflow.step_named(name)
        assert name is not None and step is not None
        own = specs[name].job.traceparent if job_id == step.job_id else None
        return (own, None) if own is not None else context

    seen: set[str] = set()
    for succeeds in outcomes:  # at most 5 steps and 5 compensations run
        for job in cluster.state.jobs.values():
            if job.workflow_id == "wf_1":
                seen.add(job.id)
                assert job_trace(cluster.state, job.id) == expected(job.id), job.id
        leases = cluster.claim(queues=("q", "undo"))
        if not leases:
            break
        (lease,) = leases
        cluster.one(StartJob(lease.job_id, lease.fencing_token))
        if succeeds:
            cluster.one(CompleteJob(lease.job_id, lease.fencing_token, b"\xc0"))
        else:
            cluster.one(FailJob(lease.job_id, lease.fencing_token, "permanent", "no"))
    assert workflow.is_final, workflow.status
    assert seen, "at least the first step ran"
    decoded = decode_state(encode_state(cluster.state))
    assert table(decoded).workflows["wf_1"].trace == context
    assert state_digest(decoded) == cluster.digest()
