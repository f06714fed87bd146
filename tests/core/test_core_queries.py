"""Queries the API uses."""

from __future__ import annotations

from core_support import T0, Cluster

from raftsched.core import (
    JOB_STATUSES,
    TRANSITIONS,
    get_job,
    job_history,
    list_jobs,
    queue_stats,
    status_counts,
)
from raftsched.core.jobs.commands import CancelJob
from raftsched.core.jobs.queries import QueueStats
from raftsched.core.kernel.commands import Tick


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
