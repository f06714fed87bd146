"""Tick: due jobs, lease expiry, deadlines, retention, bounds, next_due_ms."""

from __future__ import annotations

from core_support import T0, Cluster

from raftsched.core import next_due_ms
from raftsched.core.jobs.commands import CompleteJob, Configure, HeartbeatJob, StartJob, SubmitJobs
from raftsched.core.kernel.commands import Backoff, Barrier, JobSpec, Tick
from raftsched.core.kernel.results import Rejected, SubmitItem, Ticked


def test_due_scheduled_jobs_become_pending() -> None:
    cluster = Cluster()
    job_id = cluster.submit(delay_ms=1_000)
    assert next_due_ms(cluster.state) == T0 + 1_000
    assert cluster.one(Tick(), at=T0 + 999) == Ticked(0, 0, 0, 0, False)
    assert cluster.one(Tick(), at=T0 + 1_000) == Ticked(1, 0, 0, 0, False)
    assert cluster.job(job_id).status == "pending"
    assert cluster.job(job_id).next_run_at_ms == T0 + 1_000
    assert next_due_ms(cluster.state) is None


def test_claimed_lease_expiry_is_a_free_retry() -> None:
    cluster = Cluster()
    cluster.submit(lease_ms=1_000, max_attempts=1)
    lease = cluster.claim_one()
    assert next_due_ms(cluster.state) == T0 + 1_000
    assert cluster.one(Tick(), at=T0 + 1_000) == Ticked(0, 1, 0, 0, False)
    job = cluster.job(lease.job_id)
    assert (job.status, job.attempts_made, job.lease) == ("pending", 0, None)
    assert (job.attempts[0].outcome, job.attempts[0].started_at_ms) == ("lease_expired", None)


def test_running_lease_expiry_counts_with_unknown_outcome() -> None:
    cluster = Cluster()
    lease = cluster.start(lease_ms=1_000, backoff=Backoff(500, 500, 1_000))
    cluster.run(Tick(seed=42), at=T0 + 1_000)
    job = cluster.job(lease.job_id)
    assert (job.status, job.attempts_made) == ("retry_wait", 1)
    assert job.last_error[0] == "lease_expired"
    assert T0 + 1_500 <= job.next_run_at_ms < T0 + 2_500
    assert job.attempts[0].outcome == "lease_expired"


def test_running_expiry_dead_letters_when_the_budget_is_spent() -> None:
    cluster = Cluster()
    lease = cluster.start(lease_ms=1_000, max_attempts=1)
    cluster.run(Tick(), at=T0 + 1_000)
    assert cluster.job(lease.job_id).status == "dead_letter"


def test_heartbeat_keeps_a_lease_alive_across_ticks() -> None:
    cluster = Cluster()
    lease = cluster.start(lease_ms=1_000)
    cluster.run(HeartbeatJob(lease.job_id, lease.fencing_token), at=T0 + 800)
    assert cluster.one(Tick(), at=T0 + 1_000) == Ticked(0, 0, 0, 0, False)
    assert next_due_ms(cluster.state) == T0 + 1_800
    assert cluster.one(Tick(), at=T0 + 1_800).leases_expired == 1


def test_deadline_dead_letters_unfinished_jobs() -> None:
    cluster = Cluster()
    queued = cluster.submit(deadline_ms=1_000)
    leased = cluster.submit(deadline_ms=1_000)
    cluster.submit(deadline_ms=1_000, job_id="done")
    leases = cluster.claim(n=3)
    by_id = {each.job_id: each for each in leases}
    cluster.run(StartJob(leased, by_id[leased].fencing_token))
    cluster.run(CompleteJob("done", by_id["done"].fencing_token))
    cluster.run(CompleteJob(queued, by_id[queued].fencing_token))  # finished in time
    result = cluster.one(Tick(), at=T0 + 1_000)
    assert result.dead_lettered == 1
    job = cluster.job(leased)
    assert (job.status, job.last_error[0], job.lease) == ("dead_letter", "deadline_exceeded", None)
    assert job.attempts[0].outcome == "failed"


def test_retention_purge_frees_the_idempotency_key() -> None:
    cluster = Cluster()
    cluster.run(Configure(retention_ms=10_000))
    spec = JobSpec("q", idempotency_key="k", payload=b"\x01")
    first = cluster.submit(spec, "a")
    lease = cluster.claim_one()
    cluster.run(CompleteJob(first, lease.fencing_token), at=T0 + 100)
    assert next_due_ms(cluster.state) == T0 + 10_100
    assert cluster.one(Tick(), at=T0 + 10_099).purged == 0
    assert cluster.one(Tick(), at=T0 + 10_100).purged == 1
    assert first not in cluster.state.jobs
    other = JobSpec("q", idempotency_key="k", payload=b"\x02")
    result = cluster.one(SubmitJobs((other,), ("b",)))
    assert result.items == (SubmitItem("b", created=True),)


def test_a_tenants_key_map_goes_with_its_last_key() -> None:
    """The idempotency index keeps one map per tenant; purging the tenant's
    last keyed job drops the map, as a rebuild from the jobs would."""
    cluster = Cluster()
    cluster.run(Configure(retention_ms=10_000))
    cluster.submit(JobSpec("q", tenant="acme", idempotency_key="k1"), "a")
    cluster.submit(JobSpec("q", tenant="acme", idempotency_key="k2", delay_ms=1_000), "b")
    cluster.submit(JobSpec("q", idempotency_key="k1", delay_ms=1_000), "c")
    lease = cluster.claim_one()
    assert lease.job_id == "a"
    cluster.run(CompleteJob("a", lease.fencing_token), at=T0 + 100)
    assert cluster.one(Tick(), at=T0 + 10_100).purged == 1
    index = cluster.state.idempotency
    assert index.get("acme", "k1") is None
    assert index.get("acme", "k2") is cluster.state.jobs["b"]
    assert index.get("default", "k1") is cluster.state.jobs["c"]
    assert sorted(index) == [("acme", "k2"), ("default", "k1")]
    for lease in cluster.claim(n=2):
        cluster.run(CompleteJob(lease.job_id, lease.fencing_token))
    assert cluster.one(Tick(), at=cluster.now_ms + 10_000).purged == 2
    assert (len(index), index.by_tenant) == (0, {})


def test_tick_is_bounded_by_max_items() -> None:
    cluster = Cluster()
    specs = tuple(JobSpec("q", delay_ms=10) for _ in range(25))
    cluster.run(SubmitJobs(specs, tuple(f"j{i}" for i in range(25))))
    assert cluster.one(Tick(max_items=10), at=T0 + 10) == Ticked(10, 0, 0, 0, True)
    assert cluster.one(Tick(max_items=10)) == Ticked(10, 0, 0, 0, True)
    assert cluster.one(Tick(max_items=10)) == Ticked(5, 0, 0, 0, False)
    # Oldest first: the first ten submitted became runnable first.
    assert [lease.job_id for lease in cluster.claim(n=3)] == ["j0", "j1", "j2"]


def test_invalid_tick() -> None:
    cluster = Cluster()
    result = cluster.one(Tick(max_items=0))
    assert isinstance(result, Rejected) and result.details == {"field": "max_items"}


def test_next_due_ms_covers_every_kind_of_work() -> None:
    cluster = Cluster()
    assert next_due_ms(cluster.state) is None
    cluster.submit(deadline_ms=5_000)
    assert next_due_ms(cluster.state) == T0 + 5_000
    cluster.submit(delay_ms=3_000)
    assert next_due_ms(cluster.state) == T0 + 3_000
    cluster.claim_one(lease_ms=2_000)
    assert next_due_ms(cluster.state) == T0 + 2_000


def test_every_entry_drops_stale_heap_entries_so_no_tick_inherits_them() -> None:
    """Only the leader settles the heaps in `next_due_ms`; a follower's kept
    every finished lease until a Tick popped them all at once. Each entry now
    drops a few per command, so the heaps stay the size of the live work."""
    cluster = Cluster()
    for batch in range(20):
        specs = tuple(JobSpec("q", deadline_ms=3_600_000) for _ in range(100))
        ids = tuple(f"job_{batch}_{i}" for i in range(100))
        cluster.run(SubmitJobs(specs, ids))
        leases = cluster.claim(n=100)
        cluster.run(*(StartJob(lease.job_id, lease.fencing_token) for lease in leases))
        cluster.run(*(CompleteJob(lease.job_id, lease.fencing_token) for lease in leases))
        assert len(cluster.state.leases) == 0
        assert len(cluster.state.deadlines) == 0
    # A live lease at the top keeps the stale ones behind it until it ends;
    # then the entries that follow drop them, a bounded number each.
    long_running = cluster.start()
    for batch in range(3):
        ids = tuple(f"later_{batch}_{i}" for i in range(100))
        cluster.run(SubmitJobs(tuple(JobSpec("q") for _ in ids), ids))
        leases = cluster.claim(n=100)
        cluster.run(*(CompleteJob(lease.job_id, lease.fencing_token) for lease in leases))
    assert len(cluster.state.leases) == 301
    cluster.run(CompleteJob(long_running.job_id, long_running.fencing_token))
    assert 0 < len(cluster.state.leases) < 301
    for _ in range(20):  # 18 steps per one-command entry: 300 in 17 entries
        cluster.run(Barrier())
    assert len(cluster.state.leases) == 0
