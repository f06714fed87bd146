"""Queries the API uses."""

from __future__ import annotations

from core_support import T0, Cluster

from raftsched.core import (
    JOB_STATUSES,
    TRANSITIONS,
    get_job,
    job_effects,
    job_history,
    list_jobs,
    queue_stats,
    status_counts,
)
from raftsched.core.jobs.commands import CancelJob, ConfigureWheel, RecordEffect
from raftsched.core.jobs.queries import QueueStats
from raftsched.core.kernel import wheel
from raftsched.core.kernel.commands import RaiseClusterVersion, Tick
from raftsched.core.kernel.results import Ack


def test_list_jobs_newest_first_with_filters_and_cursor() -> None:
    cluster = Cluster()
    ids = [cluster.submit(queue="a" if i % 2 else "b", tenant="t") for i in range(7)]
    jobs, cursor = list_jobs(cluster.state, limit=3)
    assert [job.id for job in jobs] == ids[::-1][:3]
    jobs, cursor = list_jobs(cluster.state, limit=3, cursor=cursor)
    assert [job.id for job in jobs] == ids[::-1][3:6]
    jobs, cursor = list_jobs(cluster.state, limit=3, cursor=cursor)
    assert [job.id for job in jobs] == ids[:1]
    assert cursor is None
    only_a, _ = list_jobs(cluster.state, queue="a")
    assert [job.id for job in only_a] == [ids[5], ids[3], ids[1]]
    cluster.run(CancelJob(ids[0]))
    cancelled, _ = list_jobs(cluster.state, status="cancelled", tenant="t")
    assert [job.id for job in cancelled] == [ids[0]]
    assert list_jobs(cluster.state, tenant="other") == ([], None)


def test_queue_stats_and_status_counts() -> None:
    cluster = Cluster()
    cluster.submit(queue="a")
    cluster.run(Tick(), at=T0 + 5)
    cluster.submit(queue="a")
    cluster.submit(queue="b")
    cluster.submit(queue="b", delay_ms=100)
    cluster.claim_one(queues=("b",))
    assert queue_stats(cluster.state) == {
        "a": QueueStats(2, 0, T0),
        "b": QueueStats(0, 1, None),
    }
    counts = status_counts(cluster.state)
    assert set(counts) == set(JOB_STATUSES)
    assert (counts["pending"], counts["claimed"], counts["scheduled"]) == (2, 1, 1)


def test_history_starts_with_the_derived_submission() -> None:
    cluster = Cluster(epoch=4)
    lease = cluster.start()
    events = job_history(cluster.state, lease.job_id)
    assert [(e.event, e.from_status, e.to_status) for e in events] == [
        ("submit", None, "pending"),
        ("claim", "pending", "claimed"),
        ("start", "claimed", "running"),
    ]
    assert [e.epoch for e in events] == [4, 4, 4]
    assert [e.fencing_token for e in events] == [None, 1, 1]
    assert job_history(cluster.state, "missing") is None
    assert get_job(cluster.state, "missing") is None


def test_every_transition_leads_to_a_known_status() -> None:
    for (status, _event), target in TRANSITIONS.items():
        assert status in JOB_STATUSES and target in JOB_STATUSES
    assert not any(status in ("succeeded", "cancelled") for status, _ in TRANSITIONS)


def test_job_effects_in_the_order_recorded_first_writer_wins() -> None:
    cluster = Cluster()
    lease = cluster.start()
    other = cluster.start()
    cluster.run(
        RecordEffect("charge:1", lease.job_id, lease.fencing_token, b"\x01"),
        RecordEffect("mail:1", lease.job_id, lease.fencing_token, b"\x02"),
        # The same key again: the ledger keeps the first, the job no second entry.
        RecordEffect("charge:1", lease.job_id, lease.fencing_token, b"\x03"),
        # Another job's record of the key is not this job's effect.
        RecordEffect("charge:1", other.job_id, other.fencing_token, b"\x04"),
    )
    effects = job_effects(cluster.state, lease.job_id)
    assert effects is not None
    assert [(e.key, e.job_id, e.fencing_token, e.result) for e in effects] == [
        ("charge:1", lease.job_id, lease.fencing_token, b"\x01"),
        ("mail:1", lease.job_id, lease.fencing_token, b"\x02"),
    ]
    assert job_effects(cluster.state, other.job_id) == []
    assert job_effects(cluster.state, "job_nope") is None
    # A packed job (far future, kernel.wheel) has never run: no effects.
    assert cluster.run(RaiseClusterVersion(7), ConfigureWheel(60_000, 60_000)) == [Ack(), Ack()]
    packed = cluster.submit(run_at_ms=cluster.now_ms + 3600_000)
    assert packed not in cluster.state.jobs and wheel.wheel_of(cluster.state).size == 1
    assert job_effects(cluster.state, packed) == []
