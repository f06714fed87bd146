"""SubmitJobs: creation, every field, validation, idempotency."""

from __future__ import annotations

import pytest
from core_support import T0, Cluster, assert_rejected_unchanged

from raftsched.core import find_by_idempotency_key, get_job
from raftsched.core.jobs.commands import SubmitJobs
from raftsched.core.kernel.commands import Backoff, JobSpec
from raftsched.core.kernel.results import Rejected, SubmitItem, Submitted
from raftsched.core.workflows.commands import StepSpec, SubmitWorkflow


def test_submit_creates_a_pending_job_with_every_field() -> None:
    cluster = Cluster()
    spec = JobSpec(
        queue="payments",
        tenant="acme",
        payload=b"\x81\xa1a\x01",
        priority=7,
        max_attempts=3,
        backoff=Backoff(10, 100, 5),
        lease_ms=5_000,
        deadline_ms=60_000,
        idempotency_key="charge:1",
        ordering_key="acct_42",
        correlation_id="req-abc",
        labels=(("team", "billing"),),
    )
    job_id = cluster.submit(spec, "job_a")
    job = get_job(cluster.state, job_id)
    assert job is not None
    assert (job.queue, job.tenant, job.status, job.priority) == ("payments", "acme", "pending", 7)
    assert job.payload == b"\x81\xa1a\x01"
    assert (job.idempotency_key, job.ordering_key, job.correlation_id) == (
        "charge:1",
        "acct_42",
        "req-abc",
    )
    assert job.labels == (("team", "billing"),)
    assert (job.created_at_ms, job.updated_at_ms, job.run_at_ms) == (T0, T0, T0)
    assert job.next_run_at_ms == T0
    assert (job.max_attempts, job.attempts_made, job.cancel_requested) == (3, 0, False)
    assert job.lease is None and job.result is None and job.last_error is None
    assert job.attempts == ()
    assert job.deadline_at_ms == T0 + 60_000
    assert job.backoff == (10, 100, 5)
    assert (job.schedule_id, job.workflow_id, job.step) == (None, None, None)


def test_delay_and_run_at_make_a_scheduled_job() -> None:
    cluster = Cluster()
    delayed = cluster.submit(delay_ms=500)
    at = cluster.submit(run_at_ms=T0 + 900)
    past = cluster.submit(run_at_ms=T0 - 1)
    assert cluster.job(delayed).status == "scheduled"
    assert cluster.job(delayed).next_run_at_ms == T0 + 500
    assert cluster.job(at).run_at_ms == T0 + 900
    assert cluster.job(past).status == "pending"


def test_batch_items_succeed_or_fail_on_their_own() -> None:
    cluster = Cluster()
    result = cluster.one(
        SubmitJobs((JobSpec("q"), JobSpec("q", priority=101), JobSpec("q")), ("a", "b", "c"))
    )
    assert isinstance(result, Submitted)
    assert result.items[0] == SubmitItem("a", created=True)
    assert isinstance(result.items[1], Rejected)
    assert result.items[1].details == {"field": "priority"}
    assert result.items[2] == SubmitItem("c", created=True)
    assert set(cluster.state.jobs) == {"a", "c"}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (JobSpec(""), "queue"),
        (JobSpec("q" * 201), "queue"),
        (JobSpec("q", tenant=""), "tenant"),
        (JobSpec("q", priority=-101), "priority"),
        (JobSpec("q", priority=True), "priority"),
        (JobSpec("q", max_attempts=0), "max_attempts"),
        (JobSpec("q", max_attempts=1001), "max_attempts"),
        (JobSpec("q", lease_ms=99), "lease"),
        (JobSpec("q", lease_ms=86_400_001), "lease"),
        (JobSpec("q", backoff=Backoff(10, 5, 0)), "backoff.max_ms"),
        (JobSpec("q", backoff=Backoff(-1, 5, 0)), "backoff.initial_ms"),
        (JobSpec("q", backoff=Backoff(1, 5, -1)), "backoff.jitter_ms"),
        (JobSpec("q", run_at_ms=5, delay_ms=5), "run_at"),
        (JobSpec("q", delay_ms=-1), "delay"),
        (JobSpec("q", deadline_ms=0), "deadline"),
        (JobSpec("q", payload=b"x" * (1024 * 1024 + 1)), "payload"),
        (JobSpec("q", labels=tuple((f"k{i}", "v") for i in range(65))), "labels"),
        (JobSpec("q", labels=(("a", "1"), ("a", "2"))), "labels"),
        (JobSpec("q", idempotency_key=""), "idempotency_key"),
    ],
)
def test_invalid_specs_are_rejected_with_the_field(spec: JobSpec, field: str) -> None:
    cluster = Cluster()
    before = cluster.digest()
    result = cluster.one(SubmitJobs((spec,), ("a",)))
    assert isinstance(result, Submitted)
    (item,) = result.items
    assert isinstance(item, Rejected)
    assert (item.code, item.details) == ("invalid_request", {"field": field})
    assert cluster.digest() == before


def test_batch_shape_is_checked() -> None:
    cluster = Cluster()
    assert_rejected_unchanged(cluster, SubmitJobs((), ()), "invalid_request")
    assert_rejected_unchanged(cluster, SubmitJobs((JobSpec("q"),), ()), "invalid_request")
    many = tuple(JobSpec("q") for _ in range(1001))
    ids = tuple(str(i) for i in range(1001))
    assert_rejected_unchanged(cluster, SubmitJobs(many, ids), "invalid_request")


def test_same_key_same_request_returns_the_original_job() -> None:
    cluster = Cluster()
    spec = JobSpec("q", payload=b"\x01", idempotency_key="k")
    first = cluster.submit(spec, "job_a")
    before = cluster.digest()
    result = cluster.one(SubmitJobs((spec,), ("job_b",)))
    assert result == Submitted((SubmitItem(first, created=False),))
    assert cluster.digest() == before
    assert find_by_idempotency_key(cluster.state, "default", "k") is cluster.job(first)


def test_same_key_different_request_is_a_conflict() -> None:
    cluster = Cluster()
    cluster.submit(JobSpec("q", payload=b"\x01", idempotency_key="k"), "job_a")
    before = cluster.digest()
    result = cluster.one(SubmitJobs((JobSpec("q", payload=b"\x02", idempotency_key="k"),), ("b",)))
    (item,) = result.items
    assert isinstance(item, Rejected)
    assert item.code == "idempotency_conflict"
    assert item.details["job_id"] == "job_a"
    assert cluster.digest() == before


def test_keys_are_per_tenant_and_labels_are_canonical() -> None:
    cluster = Cluster()
    a = cluster.submit(JobSpec("q", tenant="t1", idempotency_key="k"), "a")
    b = cluster.submit(JobSpec("q", tenant="t2", idempotency_key="k"), "b")
    assert a != b
    spec = JobSpec("q", idempotency_key="l", labels=(("b", "2"), ("a", "1")))
    c = cluster.submit(spec, "c")
    assert cluster.job(c).labels == (("a", "1"), ("b", "2"))
    same = JobSpec("q", idempotency_key="l", labels=(("a", "1"), ("b", "2")))
    result = cluster.one(SubmitJobs((same,), ("d",)))
    assert result.items == (SubmitItem("c", created=False),)


def test_a_reapplied_submission_returns_the_job_it_created() -> None:
    cluster = Cluster()
    command = SubmitJobs((JobSpec("q", payload=b"\x01"),), ("job_a",))
    cluster.run(command)
    before = cluster.digest()
    assert cluster.one(command) == Submitted((SubmitItem("job_a", created=False),))
    assert cluster.digest() == before
    clash = cluster.one(SubmitJobs((JobSpec("other"),), ("job_a",)))
    assert clash.items[0].details == {"field": "job_ids"}


def test_a_workflow_step_job_does_not_take_its_specs_idempotency_key() -> None:
    # The workflow holds the key; a step job carrying it as well would be
    # a second, unregistered owner of the same key.
    cluster = Cluster()
    spec = JobSpec("q", idempotency_key="order-1")
    cluster.one(SubmitWorkflow("wf_1", (StepSpec("only", spec),), idempotency_key="wf-key"))
    (lease,) = cluster.claim()
    assert cluster.job(lease.job_id).idempotency_key is None
    assert lease.idempotency_key is None


def test_an_idempotency_conflict_names_the_key_and_the_job_that_holds_it() -> None:
    cluster = Cluster()
    cluster.submit(JobSpec("q", payload=b"\x01", idempotency_key="k"), "job_a")
    result = cluster.one(SubmitJobs((JobSpec("q", payload=b"\x02", idempotency_key="k"),), ("b",)))
    assert isinstance(result, Submitted)
    assert result.items == (
        Rejected(
            "idempotency_conflict",
            "this idempotency key was used with a different request",
            {"field": "idempotency_key", "job_id": "job_a"},
        ),
    )


def test_a_job_id_that_is_not_a_name_is_refused_as_job_ids() -> None:
    cluster = Cluster()
    result = cluster.one(SubmitJobs((JobSpec("q"),), ("",)))
    assert isinstance(result, Submitted)
    assert result.items == (
        Rejected(
            "invalid_request",
            "job_ids must be a non-empty string of at most 200 chars",
            {"field": "job_ids"},
        ),
    )


def test_a_submission_names_the_field_it_refuses() -> None:
    cluster = Cluster()
    assert cluster.one(SubmitJobs((), ())) == Rejected(
        "invalid_request", "a submission carries 1 to 1000 specs", {"field": "specs"}
    )
    assert cluster.one(SubmitJobs((JobSpec("q"),), ())) == Rejected(
        "invalid_request", "one job id per spec", {"field": "job_ids"}
    )
    cluster.submit(JobSpec("q", payload=b"\x01"), "job_a")
    result = cluster.one(SubmitJobs((JobSpec("q", payload=b"\x02"),), ("job_a",)))
    assert isinstance(result, Submitted)
    assert result.items == (
        Rejected("invalid_request", "job id job_a is already in use", {"field": "job_ids"}),
    )


def test_labels_in_any_order_are_the_same_request() -> None:
    cluster = Cluster()
    first = cluster.submit(
        JobSpec("q", labels=(("b", "a"), ("a", "z")), idempotency_key="k"), "job_a"
    )
    result = cluster.one(
        SubmitJobs((JobSpec("q", labels=(("a", "z"), ("b", "a")), idempotency_key="k"),), ("b",))
    )
    assert result == Submitted((SubmitItem(first, created=False),))
    labels = (("b", "1"), ("a", "2"), ("c", "3"))
    third = cluster.submit(JobSpec("q", labels=labels, idempotency_key="k3"), "job_c")
    result = cluster.one(
        SubmitJobs((JobSpec("q", labels=tuple(sorted(labels)), idempotency_key="k3"),), ("d",))
    )
    assert result == Submitted((SubmitItem(third, created=False),))


def test_a_job_due_in_the_past_is_runnable_since_its_submission() -> None:
    cluster = Cluster()
    cluster.submit(JobSpec("q", run_at_ms=T0 - 500))
    (lease,) = cluster.claim()
    assert lease.runnable_since_ms == T0
