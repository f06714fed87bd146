"""Cancel, replay, the effects ledger, Configure."""

from __future__ import annotations

from core_support import T0, Cluster, assert_rejected_unchanged

from raftsched.core import get_effect, job_history
from raftsched.core.jobs.commands import (
    CancelJob,
    CompleteJob,
    Configure,
    FailJob,
    HeartbeatJob,
    RecordEffect,
    ReplayJob,
    StartJob,
)
from raftsched.core.kernel.commands import Tick
from raftsched.core.kernel.results import (
    Ack,
    CancelAccepted,
    Effect,
    EffectRecorded,
    Failed,
    Replayed,
)


def test_cancel_of_a_queued_job_is_immediate() -> None:
    cluster = Cluster()
    pending = cluster.submit()
    scheduled = cluster.submit(delay_ms=1_000)
    assert cluster.one(CancelJob(pending, "no longer needed")) == CancelAccepted(
        pending, "cancelled", False
    )
    assert cluster.one(CancelJob(scheduled)) == CancelAccepted(scheduled, "cancelled", False)
    assert cluster.claim() == []
    event = job_history(cluster.state, pending)[-1]
    assert (event.event, event.from_status, event.to_status, event.actor, event.detail) == (
        "cancel",
        "pending",
        "cancelled",
        "api",
        "no longer needed",
    )


def test_cancel_of_a_leased_job_requests_it() -> None:
    cluster = Cluster()
    lease = cluster.start()
    result = cluster.one(CancelJob(lease.job_id))
    assert result == CancelAccepted(lease.job_id, "running", True)
    beat = cluster.one(HeartbeatJob(lease.job_id, lease.fencing_token))
    assert beat.cancel_requested is True
    before = cluster.digest()
    assert cluster.one(CancelJob(lease.job_id)) == result  # repeat changes nothing
    assert cluster.digest() == before
    # The worker honours it; any failure kind then ends cancelled.
    failed = cluster.one(FailJob(lease.job_id, lease.fencing_token, "transient"))
    assert failed == Failed(lease.job_id, "cancelled", None)


def test_a_lease_expiring_with_cancel_requested_ends_cancelled() -> None:
    cluster = Cluster()
    lease = cluster.start(lease_ms=1_000)
    cluster.run(CancelJob(lease.job_id))
    cluster.run(Tick(), at=T0 + 1_000)
    job = cluster.job(lease.job_id)
    assert job.status == "cancelled"
    assert job.attempts[-1].outcome == "lease_expired"


def test_complete_wins_over_a_cancel_request() -> None:
    cluster = Cluster()
    lease = cluster.start()
    cluster.run(CancelJob(lease.job_id))
    cluster.run(CompleteJob(lease.job_id, lease.fencing_token))
    assert cluster.job(lease.job_id).status == "succeeded"


def test_cancel_of_a_finished_job_is_invalid_state() -> None:
    cluster = Cluster()
    job_id = cluster.submit()
    cluster.run(CancelJob(job_id))
    assert_rejected_unchanged(cluster, CancelJob(job_id), "invalid_state")
    assert_rejected_unchanged(cluster, CancelJob("missing"), "not_found")
    assert_rejected_unchanged(cluster, CancelJob(job_id, actor=""), "invalid_request")


def test_replay_restarts_the_budget_and_keeps_the_attempts() -> None:
    cluster = Cluster()
    lease = cluster.start(max_attempts=1, idempotency_key="k", deadline_ms=60_000)
    cluster.run(FailJob(lease.job_id, lease.fencing_token, "transient"))
    job = cluster.job(lease.job_id)
    assert job.status == "dead_letter"
    assert cluster.one(ReplayJob(job.id, "fixed the bug", "alice"), at=T0 + 5) == Replayed(job.id)
    assert (job.status, job.attempts_made, len(job.attempts)) == ("pending", 0, 1)
    assert job.idempotency_key == "k" and job.deadline_at_ms is None
    event = job_history(cluster.state, job.id)[-1]
    assert (event.event, event.actor, event.detail, event.at_ms) == (
        "replay",
        "alice",
        "fixed the bug",
        T0 + 5,
    )
    second = cluster.claim_one()
    assert (second.job_id, second.attempt) == (job.id, 2)


def test_replay_only_from_dead_letter() -> None:
    cluster = Cluster()
    job_id = cluster.submit()
    assert_rejected_unchanged(cluster, ReplayJob(job_id), "invalid_state")
    assert_rejected_unchanged(cluster, ReplayJob("missing"), "not_found")


def test_effects_first_writer_wins_and_later_attempts_see_it() -> None:
    cluster = Cluster()
    lease = cluster.start(lease_ms=1_000)
    recorded = cluster.one(RecordEffect("charge:1", lease.job_id, lease.fencing_token, b"\x01"))
    effect = Effect("charge:1", lease.job_id, lease.fencing_token, 1, b"\x01", T0)
    assert recorded == EffectRecorded(effect, replayed=False)
    again = cluster.one(RecordEffect("charge:1", lease.job_id, lease.fencing_token, b"\x02"))
    assert again == EffectRecorded(effect, replayed=True)
    assert get_effect(cluster.state, "charge:1") == effect
    assert get_effect(cluster.state, "other") is None
    cluster.run(Tick(), at=T0 + 1_000)  # expires while running: retried later
    cluster.run(Tick(), at=cluster.job(lease.job_id).next_run_at_ms)
    second = cluster.claim_one()
    cluster.run(StartJob(second.job_id, second.fencing_token))
    later = cluster.one(RecordEffect("charge:1", second.job_id, second.fencing_token, b"\x03"))
    assert later == EffectRecorded(effect, replayed=True)
    # The first attempt retrying its own record (its answer was lost) gets the
    # effect it wrote; any other record with its stale token is lease_lost.
    before = cluster.digest()
    retried = cluster.one(RecordEffect("charge:1", lease.job_id, lease.fencing_token, b"\x09"))
    assert retried == EffectRecorded(effect, replayed=True)
    assert cluster.digest() == before
    assert_rejected_unchanged(
        cluster, RecordEffect("charge:2", lease.job_id, lease.fencing_token), "lease_lost"
    )


def test_configure_sets_retention() -> None:
    cluster = Cluster()
    assert cluster.one(Configure(retention_ms=5_000)) == Ack()
    assert cluster.state.retention_ms == 5_000
    assert cluster.one(Configure()) == Ack()
    assert cluster.state.retention_ms == 5_000
    assert_rejected_unchanged(cluster, Configure(retention_ms=-1), "invalid_request")
