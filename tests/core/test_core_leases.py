"""The worker protocol: claim, start, heartbeat, complete, fail, fencing, epochs."""

from __future__ import annotations

import pytest
from core_support import T0, Cluster, assert_rejected_unchanged

from raftsched.core.jobs.commands import (
    ClaimJobs,
    CompleteJob,
    FailJob,
    HeartbeatJob,
    RecordEffect,
    StartJob,
)
from raftsched.core.kernel.commands import Backoff, TakeOver, Tick
from raftsched.core.kernel.results import (
    Claimed,
    Completed,
    Failed,
    HeartbeatAccepted,
    Lease,
    Rejected,
    Started,
)


def test_claim_grants_highest_priority_then_oldest() -> None:
    cluster = Cluster()
    low = cluster.submit(priority=-5)
    old = cluster.submit(priority=3)
    new = cluster.submit(priority=3)
    other_queue = cluster.submit(queue="r", priority=9)
    leases = cluster.claim(n=10, queues=("q", "r"))
    assert [lease.job_id for lease in leases] == [other_queue, old, new, low]
    assert [lease.fencing_token for lease in leases] == [1, 2, 3, 4]
    assert cluster.state.last_fencing_token == 4


def test_claim_records_worker_epoch_token_and_expiry() -> None:
    cluster = Cluster(epoch=3)
    job_id = cluster.submit(lease_ms=5_000, idempotency_key="k", correlation_id="c")
    lease = cluster.claim_one(worker="w7")
    assert lease == Lease(
        job_id, 1, 3, 1, T0 + 5_000, 5_000, "q", b"\xc0", "k", None, "c", None, None, None, T0
    )
    job = cluster.job(job_id)
    assert job.status == "claimed"
    assert (job.lease.worker_id, job.lease.epoch, job.lease.fencing_token) == ("w7", 3, 1)
    (attempt,) = job.attempts
    assert (attempt.number, attempt.worker_id, attempt.claimed_at_ms) == (1, "w7", T0)
    assert attempt.outcome is None


def test_claim_lease_override_and_empty_queues() -> None:
    cluster = Cluster()
    cluster.submit()
    assert cluster.claim(queues=("nothing",)) == []
    lease = cluster.claim_one(lease_ms=200)
    assert lease.expires_at_ms == T0 + 200


@pytest.mark.parametrize(
    "command",
    [
        ClaimJobs("", ("q",), 1),
        ClaimJobs("w", (), 1),
        ClaimJobs("w", tuple(f"q{i}" for i in range(101)), 1),
        ClaimJobs("w", ("q",), 0),
        ClaimJobs("w", ("q",), 1001),
        ClaimJobs("w", ("q",), 1, lease_ms=50),
    ],
)
def test_invalid_claims(command: ClaimJobs) -> None:
    cluster = Cluster()
    cluster.submit()
    assert_rejected_unchanged(cluster, command, "invalid_request")


def test_claim_and_tick_from_a_stale_epoch_are_rejected() -> None:
    cluster = Cluster(epoch=5)
    cluster.submit()
    before = cluster.digest()
    claim, tick = cluster.run(ClaimJobs("w", ("q",), 1), Tick(), epoch=4)
    assert isinstance(claim, Rejected) and claim.code == "stale_epoch"
    assert isinstance(tick, Rejected) and tick.code == "stale_epoch"
    assert cluster.digest() == before


def test_epoch_takeover_extends_every_active_lease() -> None:
    cluster = Cluster(epoch=1)
    cluster.submit(lease_ms=10_000)
    cluster.submit(lease_ms=1_000)
    long, short = cluster.claim(n=2)
    cluster.run(HeartbeatJob(long.job_id, long.fencing_token, extend_ms=50_000))
    cluster.run(TakeOver(), at=T0 + 900, epoch=2)
    assert cluster.state.epoch == 2
    assert cluster.job(long.job_id).lease.expires_at_ms == T0 + 50_000  # already later
    assert cluster.job(short.job_id).lease.expires_at_ms == T0 + 900 + 1_000
    cluster.run(Tick(), at=T0 + 1_800)
    assert cluster.job(short.job_id).status == "claimed"


def test_time_never_runs_backwards() -> None:
    cluster = Cluster()
    cluster.run(TakeOver(), at=T0 - 500)
    assert cluster.state.now_ms == T0


def test_start_moves_claimed_to_running_and_repeats_idempotently() -> None:
    cluster = Cluster()
    cluster.submit()
    lease = cluster.claim_one()
    assert cluster.one(StartJob(lease.job_id, lease.fencing_token)) == Started(
        lease.job_id, lease.expires_at_ms
    )
    assert cluster.job(lease.job_id).status == "running"
    before = cluster.digest()
    assert cluster.one(StartJob(lease.job_id, lease.fencing_token)) == Started(
        lease.job_id, lease.expires_at_ms
    )
    assert cluster.digest() == before


def test_heartbeat_extends_and_reports_cancel() -> None:
    cluster = Cluster()
    lease = cluster.start(lease_ms=1_000)
    result = cluster.one(HeartbeatJob(lease.job_id, lease.fencing_token), at=T0 + 500)
    assert result == HeartbeatAccepted(lease.job_id, T0 + 1_500, False)
    result = cluster.one(HeartbeatJob(lease.job_id, lease.fencing_token, extend_ms=5_000))
    assert result.expires_at_ms == T0 + 5_500
    # A shorter extension never shortens the lease.
    result = cluster.one(HeartbeatJob(lease.job_id, lease.fencing_token, extend_ms=100))
    assert result.expires_at_ms == T0 + 5_500


def test_complete_succeeds_and_a_repeat_returns_the_original_result() -> None:
    cluster = Cluster()
    lease = cluster.start()
    done = cluster.one(CompleteJob(lease.job_id, lease.fencing_token, b"\x01"), at=T0 + 10)
    assert done == Completed(lease.job_id, b"\x01", replayed=False)
    job = cluster.job(lease.job_id)
    assert (job.status, job.result, job.lease, job.attempts_made) == ("succeeded", b"\x01", None, 1)
    assert (job.attempts[0].outcome, job.attempts[0].ended_at_ms) == ("succeeded", T0 + 10)
    before = cluster.digest()
    again = cluster.one(CompleteJob(lease.job_id, lease.fencing_token, b"\x02"))
    assert again == Completed(lease.job_id, b"\x01", replayed=True)
    assert cluster.digest() == before


def test_complete_straight_from_claimed() -> None:
    cluster = Cluster()
    cluster.submit()
    lease = cluster.claim_one()
    result = cluster.one(CompleteJob(lease.job_id, lease.fencing_token))
    assert isinstance(result, Completed)


@pytest.mark.parametrize(
    "make",
    [
        lambda job, token: StartJob(job, token),
        lambda job, token: HeartbeatJob(job, token),
        lambda job, token: CompleteJob(job, token),
        lambda job, token: FailJob(job, token, "transient"),
        lambda job, token: RecordEffect("effect", job, token),
    ],
    ids=["start", "heartbeat", "complete", "fail", "effect"],
)
def test_stale_token_is_lease_lost_and_changes_nothing(make) -> None:  # type: ignore[no-untyped-def]
    cluster = Cluster()
    cluster.submit(lease_ms=1_000)
    first = cluster.claim_one()
    cluster.run(Tick(), at=T0 + 1_000)  # expires, back to pending
    second = cluster.claim_one()
    assert second.job_id == first.job_id and second.fencing_token > first.fencing_token
    assert_rejected_unchanged(cluster, make(first.job_id, first.fencing_token), "lease_lost")
    assert_rejected_unchanged(cluster, make(first.job_id, 999), "lease_lost")
    assert_rejected_unchanged(cluster, make("nope", 1), "not_found")


def test_fail_transient_waits_out_the_backoff() -> None:
    cluster = Cluster()
    lease = cluster.start(backoff=Backoff(1_000, 60_000, 100), max_attempts=3)
    result = cluster.one(
        FailJob(lease.job_id, lease.fencing_token, "transient", "boom", random_u32=2**31)
    )
    assert result == Failed(lease.job_id, "retry_wait", T0 + 1_000 + 50)
    job = cluster.job(lease.job_id)
    assert job.last_error == ("transient", "boom")
    assert (job.attempts_made, job.attempts[0].outcome) == (1, "failed")
    assert job.attempts[0].error == ("transient", "boom")
    cluster.run(Tick(), at=T0 + 1_050)
    assert job.status == "pending"
    second = cluster.claim_one()
    cluster.one(StartJob(second.job_id, second.fencing_token))
    result = cluster.one(FailJob(second.job_id, second.fencing_token, "unknown"))
    assert result == Failed(lease.job_id, "retry_wait", T0 + 1_050 + 2_000)


def test_repeated_fail_with_its_token_returns_where_the_first_left_the_job() -> None:
    cluster = Cluster()
    lease = cluster.start(backoff=Backoff(1_000, 60_000, 0), max_attempts=3)
    first = cluster.one(FailJob(lease.job_id, lease.fencing_token, "transient", "boom"))
    assert first == Failed(lease.job_id, "retry_wait", T0 + 1_000)
    before = cluster.digest()
    again = cluster.one(FailJob(lease.job_id, lease.fencing_token, "transient", "boom"))
    assert again == first
    assert cluster.digest() == before
    # A different kind with that token is not a repeat of it.
    assert_rejected_unchanged(
        cluster, FailJob(lease.job_id, lease.fencing_token, "permanent"), "lease_lost"
    )


def test_retry_after_is_a_lower_bound_and_zero_delay_requeues() -> None:
    cluster = Cluster()
    lease = cluster.start(backoff=Backoff(0, 0, 0))
    hinted = cluster.one(
        FailJob(lease.job_id, lease.fencing_token, "transient", retry_after_ms=7_000)
    )
    assert hinted.next_run_at_ms == T0 + 7_000
    cluster = Cluster()
    lease = cluster.start(backoff=Backoff(0, 0, 0))
    result = cluster.one(FailJob(lease.job_id, lease.fencing_token, "transient"))
    assert result == Failed(lease.job_id, "pending", T0)


def test_backoff_is_capped_by_max() -> None:
    cluster = Cluster()
    job_id = cluster.submit(backoff=Backoff(1_000, 3_000, 0), max_attempts=10)
    delays = []
    for _ in range(4):
        cluster.run(Tick(), at=cluster.job(job_id).next_run_at_ms)
        lease = cluster.claim_one()
        result = cluster.one(FailJob(job_id, lease.fencing_token, "transient"))
        delays.append(result.next_run_at_ms - cluster.now_ms)
    assert delays == [1_000, 2_000, 3_000, 3_000]


def test_fail_after_max_attempts_or_permanent_dead_letters() -> None:
    cluster = Cluster()
    lease = cluster.start(max_attempts=1)
    result = cluster.one(FailJob(lease.job_id, lease.fencing_token, "transient"))
    assert result == Failed(lease.job_id, "dead_letter", None)
    cluster = Cluster()
    lease = cluster.start(max_attempts=5)
    result = cluster.one(FailJob(lease.job_id, lease.fencing_token, "permanent", "bad input"))
    assert result == Failed(lease.job_id, "dead_letter", None)
    assert cluster.job(lease.job_id).last_error == ("permanent", "bad input")


def test_fail_cancelled_ends_cancelled() -> None:
    cluster = Cluster()
    lease = cluster.start()
    result = cluster.one(FailJob(lease.job_id, lease.fencing_token, "cancelled"))
    assert result == Failed(lease.job_id, "cancelled", None)
    assert cluster.job(lease.job_id).attempts[0].outcome == "cancelled"


@pytest.mark.parametrize(
    "command",
    [
        FailJob("j", 1, "weird"),  # type: ignore[arg-type]
        FailJob("j", 1, "transient", retry_after_ms=-1),
        FailJob("j", 1, "transient", random_u32=2**32),
        FailJob("j", 1, "transient", message="x" * 10_001),
        CompleteJob("j", 1, "not bytes"),  # type: ignore[arg-type]
        HeartbeatJob("j", 1, extend_ms=0),
        StartJob("j", -1),
        StartJob("", 1),
    ],
)
def test_invalid_worker_commands(command: object) -> None:
    cluster = Cluster()
    cluster.submit(job_id="j")
    cluster.claim_one()
    assert_rejected_unchanged(cluster, command, "invalid_request")  # type: ignore[arg-type]


def test_start_from_running_after_expiry_is_lease_lost() -> None:
    cluster = Cluster()
    lease = cluster.start(lease_ms=1_000, max_attempts=1)
    cluster.run(Tick(), at=T0 + 1_000)
    job = cluster.job(lease.job_id)
    assert job.status == "dead_letter"
    assert_rejected_unchanged(cluster, StartJob(lease.job_id, lease.fencing_token), "lease_lost")
    assert isinstance(cluster.one(ClaimJobs("w", ("q",), 1)), Claimed)
