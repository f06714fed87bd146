"""Ordering keys in the core, and flow state under snapshots."""

from __future__ import annotations

import random

from core_support import Cluster

from raftsched.core import check_invariants, decode_state, encode_state
from raftsched.core.jobs.commands import (
    CancelJob,
    ClaimJobs,
    CompleteJob,
    FailJob,
    ReplayJob,
    SetQueue,
    SetTenant,
    StartJob,
    SubmitJobs,
)
from raftsched.core.kernel.commands import Command, JobSpec, Tick
from raftsched.core.kernel.results import Claimed


def claim(cluster: Cluster, n: int = 10) -> list[str]:
    result = cluster.one(ClaimJobs("w1", ("q",), n))
    assert isinstance(result, Claimed), result
    return [lease.job_id for lease in result.leases]


def finish(cluster: Cluster, job_id: str) -> None:
    token = cluster.job(job_id).lease.fencing_token
    cluster.run(CompleteJob(job_id, token))


def test_one_job_per_key_at_a_time_in_submission_order() -> None:
    cluster = Cluster()
    a1, a2, a3 = (cluster.submit(ordering_key="a") for _ in range(3))
    b1 = cluster.submit(ordering_key="b")
    free = cluster.submit()
    assert claim(cluster) == [a1, b1, free]
    assert claim(cluster) == []
    finish(cluster, a1)
    assert claim(cluster) == [a2]
    finish(cluster, a2)
    assert claim(cluster) == [a3]


def test_keys_are_per_tenant() -> None:
    cluster = Cluster()
    x = cluster.submit(ordering_key="k", tenant="x")
    y = cluster.submit(ordering_key="k", tenant="y")
    assert sorted(claim(cluster)) == sorted([x, y])


def test_a_retry_keeps_the_key_and_a_later_job_waits() -> None:
    cluster = Cluster()
    first = cluster.submit(ordering_key="a", max_attempts=3)
    second = cluster.submit(ordering_key="a")
    (job,) = claim(cluster)
    token = cluster.job(job).lease.fencing_token
    cluster.run(StartJob(job, token))
    cluster.run(FailJob(job, token, "transient", random_u32=0))
    assert cluster.job(first).status == "retry_wait"
    assert claim(cluster) == []
    cluster.run(Tick(), at=cluster.now_ms + 60_000)
    assert claim(cluster) == [first]
    finish(cluster, first)
    assert claim(cluster) == [second]


def test_a_dead_letter_blocks_its_key_until_replayed() -> None:
    cluster = Cluster()
    first = cluster.submit(ordering_key="a")
    second = cluster.submit(ordering_key="a")
    (job,) = claim(cluster)
    cluster.run(FailJob(job, cluster.job(job).lease.fencing_token, "permanent"))
    assert cluster.job(first).status == "dead_letter"
    assert claim(cluster) == []
    assert set(cluster.state.runnable.blocked) == {("default", "a")}
    cluster.run(ReplayJob(first))
    assert claim(cluster) == [first]
    assert not cluster.state.runnable.blocked
    finish(cluster, first)
    assert claim(cluster) == [second]


def test_a_dead_letter_blocks_its_key_until_cancelled() -> None:
    cluster = Cluster()
    first = cluster.submit(ordering_key="a")
    second = cluster.submit(ordering_key="a")
    (job,) = claim(cluster)
    cluster.run(FailJob(job, cluster.job(job).lease.fencing_token, "permanent"))
    cluster.run(CancelJob(first, "discard"))
    assert cluster.job(first).status == "cancelled"
    assert claim(cluster) == [second]


def test_cancelling_a_waiting_job_lets_the_next_one_through_later() -> None:
    cluster = Cluster()
    first, middle, last = (cluster.submit(ordering_key="a") for _ in range(3))
    assert claim(cluster) == [first]
    cluster.run(CancelJob(middle))
    finish(cluster, first)
    assert claim(cluster) == [last]


def test_purging_a_blocking_dead_letter_releases_the_key() -> None:
    cluster = Cluster()
    first = cluster.submit(ordering_key="a")
    second = cluster.submit(ordering_key="a")
    (job,) = claim(cluster)
    cluster.run(FailJob(job, cluster.job(job).lease.fencing_token, "permanent"))
    cluster.run(Tick(), at=cluster.now_ms + cluster.state.retention_ms + 1)
    assert first not in cluster.state.jobs
    assert claim(cluster) == [second]


def test_random_workloads_choose_the_same_after_a_snapshot() -> None:
    """A replica that decodes a snapshot now and then makes the same choices as
    one that applied every entry (heap contents differ; decisions must not)."""
    for seed in range(6):
        rng = random.Random(seed)
        live, restored = Cluster(), Cluster()
        setup = (
            SetTenant("t1", weight=2, concurrency_limit=6),
            SetQueue("q", concurrency_limit=9, rate_limit_milli_per_s=50_000, burst=5),
            SetQueue("r", circuit_window=4, circuit_probe_ms=300),
        )
        for step in range(300):
            commands = setup if step == 0 else _random_commands(live, rng)
            for command in commands:
                assert live.run(command) == restored.run(command, at=live.now_ms)
            assert live.digest() == restored.digest()
            if step % 40 == 39:
                restored.state = decode_state(encode_state(restored.state))
                assert check_invariants(restored.state) == []


def _random_commands(cluster: Cluster, rng: random.Random) -> tuple[Command, ...]:
    roll = rng.random()
    cluster.now_ms += rng.randrange(0, 200)
    if roll < 0.35:
        specs = tuple(
            JobSpec(
                rng.choice(("q", "r")),
                tenant=rng.choice(("t1", "t2", "t3")),
                priority=rng.choice((0, 0, 0, 3)),
                ordering_key=rng.choice((None, None, "k1", "k2")),
                max_attempts=2,
                lease_ms=1_000,
            )
            for _ in range(rng.randrange(1, 6))
        )
        ids = tuple(f"job_{cluster.next_id + i}" for i in range(len(specs)))
        cluster.next_id += len(specs)
        return (SubmitJobs(specs, ids),)
    if roll < 0.6:
        return (ClaimJobs("w", (rng.choice(("q", "r")), "q"), rng.randrange(1, 5)),)
    if roll < 0.9:
        leased = [job for job in cluster.state.jobs.values() if job.lease is not None]
        if not leased:
            return ()
        job = rng.choice(leased)
        token = job.lease.fencing_token
        if rng.random() < 0.5:
            return (CompleteJob(job.id, token),)
        kind = rng.choice(("transient", "permanent"))
        return (StartJob(job.id, token), FailJob(job.id, token, kind))
    if roll < 0.95:
        dead = [job for job in cluster.state.jobs.values() if job.status == "dead_letter"]
        if not dead:
            return ()
        job = rng.choice(dead)
        return (rng.choice((ReplayJob(job.id), CancelJob(job.id))),)
    return (Tick(seed=rng.randrange(1000)),)
