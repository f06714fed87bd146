"""A submission's W3C trace context (cluster version 8, jobs.trace_book)."""

from __future__ import annotations

from dataclasses import replace

import msgpack
import pytest
from core_support import T0, Cluster

from raftsched.core import (
    command_version,
    decode_state,
    encode_state,
    job_trace,
    needs_upgrade,
    newest_spec_field,
    state_digest,
)
from raftsched.core.jobs import trace_book
from raftsched.core.jobs.commands import CompleteJob, Configure, ConfigureWheel, SubmitJobs
from raftsched.core.jobs.submit import spec_fingerprint
from raftsched.core.kernel import wheel
from raftsched.core.kernel.codec import decode_spec, spec_row
from raftsched.core.kernel.commands import JobSpec, RaiseClusterVersion, Tick
from raftsched.core.kernel.results import Rejected, SubmitItem, Submitted
from raftsched.core.kernel.validate import check_trace_context
from raftsched.core.schedules.commands import CreateSchedule, ScheduleSpec

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
