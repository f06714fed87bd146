"""What a fail, a cancel and a replay leave on record: the attempt, the
history event (actor, token, detail) and the fields that name a bad input."""

from __future__ import annotations

import pytest
from core_support import Cluster

from raftsched.core import job_history
from raftsched.core.jobs.commands import (
    CancelJob,
    ClaimJobs,
    CompleteJob,
    FailJob,
    HeartbeatJob,
    ReplayJob,
    StartJob,
)
from raftsched.core.kernel.results import Failed, HeartbeatAccepted, Rejected, Replayed


def last_event(cluster: Cluster, job_id: str) -> tuple[object, ...]:
    history = job_history(cluster.state, job_id)
    assert history is not None
    event = history[-1]
    return (event.to_status, event.actor, event.fencing_token, event.detail)


@pytest.mark.parametrize(
    ("kind", "message", "status", "outcome", "detail"),
    [
        ("cancelled", "stop", "cancelled", "cancelled", "cancelled: stop"),
        ("permanent", "bad input", "dead_letter", "failed", "permanent: bad input"),
        ("transient", "", "retry_wait", "failed", "transient"),
        ("unknown", "lost", "retry_wait", "failed", "unknown: lost"),
    ],
)
def test_a_fail_records_its_attempt_and_its_event(
    kind: str, message: str, status: str, outcome: str, detail: str
) -> None:
    cluster = Cluster()
    lease = cluster.start(max_attempts=3)
    cluster.one(FailJob(lease.job_id, lease.fencing_token, kind, message))
    job = cluster.job(lease.job_id)
    assert job.status == status
    assert (job.attempts_made, job.attempts[-1].outcome) == (1, outcome)
    assert job.attempts[-1].error == (kind, message)
    assert last_event(cluster, lease.job_id) == (status, "w1", lease.fencing_token, detail)


def test_a_fail_after_a_cancel_request_ends_cancelled_with_its_record() -> None:
    cluster = Cluster()
    lease = cluster.start()
    cluster.one(CancelJob(lease.job_id, "enough", "alice"))
    assert last_event(cluster, lease.job_id) == ("running", "alice", lease.fencing_token, "enough")
    heartbeat = cluster.one(HeartbeatJob(lease.job_id, lease.fencing_token))
    assert isinstance(heartbeat, HeartbeatAccepted) and heartbeat.cancel_requested
    cluster.one(FailJob(lease.job_id, lease.fencing_token, "transient", "saw it"))
    job = cluster.job(lease.job_id)
    assert (job.status, job.attempts_made) == ("cancelled", 1)
    assert job.attempts[-1].outcome == "cancelled"
    assert job.attempts[-1].error == ("transient", "saw it")
    assert last_event(cluster, lease.job_id) == (
        "cancelled",
        "w1",
        lease.fencing_token,
        "transient: saw it",
    )


def test_a_cancel_of_a_claimed_job_records_the_lease_token() -> None:
    cluster = Cluster()
    cluster.submit()
    lease = cluster.claim_one()
    cluster.one(CancelJob(lease.job_id, "", "bob"))
    assert last_event(cluster, lease.job_id) == ("claimed", "bob", lease.fencing_token, None)


def test_a_cancel_of_a_finished_job_is_invalid_state() -> None:
    cluster = Cluster()
    job_id = cluster.submit()
    cluster.one(CancelJob(job_id))
    assert cluster.one(CancelJob(job_id)) == Rejected(
        "invalid_state",
        "cannot cancel a job that is cancelled",
        {"status": "cancelled", "event": "cancel"},
    )


def test_a_replay_restarts_the_job_now_without_its_cancel_request() -> None:
    cluster = Cluster()
    dead = cluster.submit(max_attempts=1)
    lease = cluster.claim_one()
    cluster.one(FailJob(dead, lease.fencing_token, "permanent"))
    assert cluster.one(ReplayJob(dead, "fixed", "carol"), at=cluster.now_ms + 5) == Replayed(dead)
    replayed = cluster.job(dead)
    assert (replayed.status, replayed.cancel_requested) == ("pending", False)
    assert replayed.next_run_at_ms == cluster.now_ms
    assert last_event(cluster, dead) == ("pending", "carol", None, "fixed")
    assert cluster.claim_one().job_id == dead
    assert cluster.one(ReplayJob(dead)) == Rejected(
        "invalid_state",
        "cannot replay a job that is claimed",
        {"status": "claimed", "event": "replay"},
    )


def invalid(field: str, message: str) -> Rejected:
    return Rejected("invalid_request", message, {"field": field})


REASON = invalid("reason", "reason must be a string of at most 10000 chars")
ACTOR = invalid("actor", "actor must be a non-empty string of at most 200 chars")
JOB_ID = invalid("job_id", "job_id must be a non-empty string of at most 200 chars")


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (CancelJob("job_1", 5), REASON),  # type: ignore[arg-type]
        (CancelJob("job_1", "", ""), ACTOR),
        (CancelJob(""), JOB_ID),
        (CancelJob("missing"), Rejected("not_found", "no job missing", {"job_id": "missing"})),
        (ReplayJob("job_1", 5), REASON),  # type: ignore[arg-type]
        (ReplayJob("job_1", "ok", ""), ACTOR),
        (ReplayJob(""), JOB_ID),
    ],
    ids=[
        "cancel-reason",
        "cancel-actor",
        "cancel-job-id",
        "cancel-missing",
        "replay-reason",
        "replay-actor",
        "replay-job-id",
    ],
)
def test_operator_commands_name_the_field_they_refuse(command: object, expected: Rejected) -> None:
    cluster = Cluster()
    cluster.submit()
    before = cluster.digest()
    assert cluster.one(command) == expected
    assert cluster.digest() == before


def test_claim_start_and_complete_record_the_worker_and_token() -> None:
    cluster = Cluster()
    job_id = cluster.submit()
    lease = cluster.claim_one(worker="w7")
    assert cluster.job(job_id).next_run_at_ms is None
    assert last_event(cluster, job_id) == ("claimed", "w7", lease.fencing_token, None)
    cluster.one(StartJob(job_id, lease.fencing_token), at=cluster.now_ms + 3)
    assert cluster.job(job_id).attempts[-1].started_at_ms == cluster.now_ms
    assert last_event(cluster, job_id) == ("running", "w7", lease.fencing_token, None)
    cluster.one(CompleteJob(job_id, lease.fencing_token))
    assert last_event(cluster, job_id) == ("succeeded", "w7", lease.fencing_token, None)


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            FailJob("job_1", 1, "odd"),
            invalid("kind", "kind is transient, permanent, unknown or cancelled"),
        ),
        (
            FailJob("job_1", 1, "transient", 5),  # type: ignore[arg-type]
            invalid("message", "message must be a string of at most 10000 chars"),
        ),
        (
            FailJob("job_1", 1, "transient", retry_after_ms=-1),
            invalid("retry_after", "retry_after must be an integer from 0 to 9007199254740992"),
        ),
        (
            FailJob("job_1", 1, "transient", random_u32=-1),
            invalid("random_u32", "random_u32 must be an integer from 0 to 4294967295"),
        ),
        (
            CompleteJob("job_1", 1, "done"),  # type: ignore[arg-type]
            invalid("result", "result must be at most 1048576 bytes"),
        ),
    ],
    ids=["kind", "message", "retry-after", "random", "result"],
)
def test_worker_commands_name_the_field_they_refuse(command: object, expected: Rejected) -> None:
    cluster = Cluster()
    lease = cluster.start()
    assert lease.job_id == "job_1" and lease.fencing_token == 1
    before = cluster.digest()
    assert cluster.one(command) == expected
    assert cluster.digest() == before


def test_a_retry_after_of_zero_is_accepted_and_leaves_the_backoff() -> None:
    cluster = Cluster()
    lease = cluster.start(max_attempts=2)  # the default backoff starts at 1 s, no jitter
    failed = cluster.one(FailJob(lease.job_id, lease.fencing_token, "transient", retry_after_ms=0))
    assert failed == Failed(lease.job_id, "retry_wait", cluster.now_ms + 1_000)


QUEUES = invalid("queues", "claim from 1 to 100 queues")


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (ClaimJobs("w", (), 1), QUEUES),
        (ClaimJobs("w", tuple(f"q{i}" for i in range(101)), 1), QUEUES),
        (
            ClaimJobs("w", ("q", ""), 1),
            invalid("queues", "queues must be a non-empty string of at most 200 chars"),
        ),
        (
            ClaimJobs("", ("q",), 1),
            invalid("worker_id", "worker_id must be a non-empty string of at most 200 chars"),
        ),
        (
            ClaimJobs("w", ("q",), 0),
            invalid("max_jobs", "max_jobs must be an integer from 1 to 1000"),
        ),
        (
            ClaimJobs("w", ("q",), 1, 99),
            invalid("lease", "lease must be an integer from 100 to 86400000"),
        ),
    ],
    ids=["no-queue", "101-queues", "empty-queue", "worker", "max-jobs", "lease"],
)
def test_claim_names_the_field_it_refuses(command: ClaimJobs, expected: Rejected) -> None:
    cluster = Cluster()
    cluster.submit()
    before = cluster.digest()
    assert cluster.one(command) == expected
    assert cluster.digest() == before


def test_a_claim_may_name_a_hundred_queues_and_the_lease_carries_the_ordering_key() -> None:
    cluster = Cluster()
    job_id = cluster.submit(queue="q99", ordering_key="account-7")
    queues = tuple(f"q{i}" for i in range(100))
    (lease,) = cluster.claim(queues=queues)
    assert (lease.job_id, lease.queue, lease.ordering_key) == (job_id, "q99", "account-7")
