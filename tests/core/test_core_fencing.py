"""Stale tokens against finished work: the plain examples behind the fencing rules.

Each test builds the one situation in which a check matters and asserts the
exact answer, so that deleting or loosening the check fails it every time.
"""

from __future__ import annotations

from core_support import T0, Cluster, assert_rejected_unchanged

from raftsched.core.commands import CompleteJob, RecordEffect, StartJob, Tick
from raftsched.core.results import Completed, Effect, EffectRecorded, Lease


def expired_then_reclaimed(cluster: Cluster) -> tuple[Lease, Lease]:
    """The first attempt's lease expires; a second attempt holds the job."""
    cluster.submit(lease_ms=1_000)
    first = cluster.claim_one()
    cluster.run(Tick(), at=T0 + 1_000)
    second = cluster.claim_one()
    assert second.job_id == first.job_id and second.fencing_token > first.fencing_token
    cluster.one(StartJob(second.job_id, second.fencing_token))
    return first, second


def test_a_stale_complete_after_a_newer_attempt_succeeded_is_lease_lost() -> None:
    cluster = Cluster()
    first, second = expired_then_reclaimed(cluster)
    done = cluster.one(CompleteJob(second.job_id, second.fencing_token, b"\x02"))
    assert done == Completed(second.job_id, b"\x02", replayed=False)
    # The old attempt did not succeed: it must not be told it did.
    assert_rejected_unchanged(
        cluster, CompleteJob(first.job_id, first.fencing_token, b"\x01"), "lease_lost"
    )
    assert_rejected_unchanged(cluster, CompleteJob(first.job_id, 999, b"\x01"), "lease_lost")
    again = cluster.one(CompleteJob(second.job_id, second.fencing_token, b"\x03"))
    assert again == Completed(second.job_id, b"\x02", replayed=True)


def test_a_stale_token_never_reveals_another_attempts_effect() -> None:
    cluster = Cluster()
    first, second = expired_then_reclaimed(cluster)
    recorded = cluster.one(RecordEffect("charge", second.job_id, second.fencing_token, b"\x02"))
    effect = Effect("charge", second.job_id, second.fencing_token, 1, b"\x02", T0 + 1_000)
    assert recorded == EffectRecorded(effect, replayed=False)
    # Same job, the older attempt's token: the effect is not its own.
    assert_rejected_unchanged(
        cluster, RecordEffect("charge", first.job_id, first.fencing_token, b"\x01"), "lease_lost"
    )
    # Another job, with the token that wrote the effect: not its own either.
    other = cluster.submit()
    assert_rejected_unchanged(
        cluster, RecordEffect("charge", other, second.fencing_token, b"\x01"), "lease_lost"
    )
    retried = cluster.one(RecordEffect("charge", second.job_id, second.fencing_token, b"\x09"))
    assert retried == EffectRecorded(effect, replayed=True)
