"""Stale tokens against finished work: the plain examples behind the fencing rules.

Each test builds the one situation in which a check matters and asserts the
exact answer, so that deleting or loosening the check fails it every time.
"""

from __future__ import annotations

from typing import Any

import pytest
from core_support import T0, Cluster, assert_rejected_unchanged

from raftsched.core.jobs.commands import (
    ClaimJobs,
    CompleteJob,
    Configure,
    FailJob,
    HeartbeatJob,
    RecordEffect,
    StartJob,
)
from raftsched.core.kernel.commands import Tick
from raftsched.core.kernel.results import (
    Ack,
    Completed,
    Effect,
    EffectRecorded,
    HeartbeatAccepted,
    Lease,
    Rejected,
)


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


def test_the_rejections_of_fencing_say_what_was_refused() -> None:
    cluster = Cluster(epoch=5)
    first, second = expired_then_reclaimed(cluster)
    assert cluster.one(StartJob(first.job_id, first.fencing_token)) == Rejected(
        "lease_lost",
        "the fencing token is not this job's current lease token",
        {"job_id": first.job_id, "status": "running"},
    )
    assert cluster.one(StartJob("missing", 1)) == Rejected(
        "not_found", "no job missing", {"job_id": "missing"}
    )
    assert cluster.one(ClaimJobs("w", ("q",), 1), epoch=4) == Rejected(
        "stale_epoch", "proposed under an epoch older than one already applied", {"epoch": 5}
    )


def invalid(field: str, message: str) -> Rejected:
    return Rejected("invalid_request", message, {"field": field})


def test_heartbeat_checks_extend_and_progress_before_the_lease() -> None:
    cluster = Cluster()
    lease = cluster.start()
    job, token = lease.job_id, lease.fencing_token
    assert cluster.one(HeartbeatJob(job, token, extend_ms=0)) == invalid(
        "extend", "extend must be an integer from 1 to 86400000"
    )
    assert cluster.one(HeartbeatJob(job, token, progress="50%")) == invalid(  # type: ignore[arg-type]
        "progress", "progress must be at most 1048576 bytes"
    )
    expires = cluster.now_ms + 1
    accepted = cluster.one(HeartbeatJob(job, token, extend_ms=1, progress=b"50%"))
    assert accepted == HeartbeatAccepted(job, max(lease.expires_at_ms, expires), False)


@pytest.mark.parametrize(
    ("key", "result", "expected"),
    [
        ("", b"", invalid("key", "key must be a non-empty string of at most 256 chars")),
        ("k" * 257, b"", invalid("key", "key must be a non-empty string of at most 256 chars")),
        ("k", "text", invalid("result", "result must be at most 1048576 bytes")),
    ],
    ids=["empty-key", "long-key", "text-result"],
)
def test_record_effect_checks_key_and_result(key: str, result: Any, expected: Rejected) -> None:
    cluster = Cluster()
    lease = cluster.start()
    before = cluster.digest()
    assert cluster.one(RecordEffect(key, lease.job_id, lease.fencing_token, result)) == expected
    assert cluster.digest() == before


def test_record_effect_takes_a_key_of_256_chars() -> None:
    cluster = Cluster()
    lease = cluster.start()
    recorded = cluster.one(RecordEffect("k" * 256, lease.job_id, lease.fencing_token))
    assert isinstance(recorded, EffectRecorded) and not recorded.replayed


def test_one_attempt_records_several_effects_on_its_job() -> None:
    cluster = Cluster()
    lease = cluster.start()
    for key in ("a", "b", "c"):
        cluster.one(RecordEffect(key, lease.job_id, lease.fencing_token, key.encode()))
    effects = cluster.job(lease.job_id).effects
    assert [(effect.key, effect.result) for effect in effects] == [
        ("a", b"a"),
        ("b", b"b"),
        ("c", b"c"),
    ]


def test_a_complete_after_the_attempt_failed_is_lease_lost() -> None:
    cluster = Cluster()
    lease = cluster.start()
    cluster.one(FailJob(lease.job_id, lease.fencing_token, "permanent"))
    assert cluster.job(lease.job_id).status == "dead_letter"
    assert_rejected_unchanged(cluster, CompleteJob(lease.job_id, lease.fencing_token), "lease_lost")


def test_a_complete_with_a_job_id_that_is_not_a_string_is_invalid() -> None:
    cluster = Cluster()
    assert cluster.one(CompleteJob(["job_1"], 1)) == invalid(  # type: ignore[arg-type]
        "job_id", "job_id must be a non-empty string of at most 200 chars"
    )


def test_configure_takes_a_retention_of_zero_and_names_the_field() -> None:
    cluster = Cluster()
    assert cluster.one(Configure(retention_ms=0)) == Ack()
    assert cluster.state.retention_ms == 0
    assert cluster.one(Configure(retention_ms=-1)) == invalid(
        "retention", "retention must be an integer from 0 to 9007199254740992"
    )
