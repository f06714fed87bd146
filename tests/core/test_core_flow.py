"""Flow control in the core: fair sharing, priorities, limits, pause, admission."""

from __future__ import annotations

from collections import Counter

from core_support import Cluster, assert_rejected_unchanged

from raftsched.core import apply_entry, check_invariants, decode_state, encode_state, state_digest
from raftsched.core.jobs.commands import (
    ClaimJobs,
    CompleteJob,
    FailJob,
    PauseQueue,
    SetQueue,
    SetTenant,
    StartJob,
    SubmitJobs,
)
from raftsched.core.jobs.flow_claim import claimable_at_ms
from raftsched.core.kernel.commands import Entry, JobSpec
from raftsched.core.kernel.results import Ack, Claimed, Rejected, Submitted


def fill(cluster: Cluster, count: int, queue: str = "q", **fields: object) -> list[str]:
    """Submit `count` jobs in batches of 1,000 (fast, no invariant check per job)."""
    ids: list[str] = []
    for base in range(0, count, 1000):
        n = min(1000, count - base)
        batch = tuple(f"job_{cluster.next_id + i}" for i in range(n))
        cluster.next_id += n
        spec = JobSpec(queue=queue, **fields)  # type: ignore[arg-type]
        entry = Entry(cluster.epoch, cluster.now_ms, (SubmitJobs((spec,) * n, batch),))
        (result,) = apply_entry(cluster.state, entry)  # invariants checked once, below
        assert isinstance(result, Submitted)
        ids.extend(batch)
    assert check_invariants(cluster.state) == []
    return ids


def claim(cluster: Cluster, n: int = 1, queues: tuple[str, ...] = ("q",)) -> list[str]:
    result = cluster.one(ClaimJobs("w1", queues, n))
    assert isinstance(result, Claimed), result
    return [lease.job_id for lease in result.leases]


def tenants_of(cluster: Cluster, job_ids: list[str]) -> list[str]:
    return [cluster.job(job_id).tenant for job_id in job_ids]


def test_a_small_tenant_is_not_stuck_behind_a_big_backlog() -> None:
    cluster = Cluster()
    fill(cluster, 50_000, tenant="a")
    assert tenants_of(cluster, claim(cluster, 10)) == ["a"] * 10
    fill(cluster, 100, tenant="b")
    # Equal weights: from now on every other claim is b's, whatever a has queued.
    claimed = [job for _ in range(20) for job in claim(cluster, 10)]
    assert Counter(tenants_of(cluster, claimed)) == {"a": 100, "b": 100}
    first_b = tenants_of(cluster, claimed).index("b")
    assert first_b <= 1


def test_weights_split_claims_in_proportion() -> None:
    cluster = Cluster()
    cluster.one(SetTenant("a", weight=3))
    fill(cluster, 2_000, tenant="a")
    fill(cluster, 2_000, tenant="b")
    claimed = claim(cluster, 400)
    assert Counter(tenants_of(cluster, claimed)) == {"a": 300, "b": 100}


def test_high_priority_gets_its_reserved_share_across_tenants() -> None:
    cluster = Cluster()
    for tenant in ("a", "b", "c"):
        fill(cluster, 1_000, tenant=tenant)
    urgent = fill(cluster, 10, tenant="d", priority=5)
    # Half of the claims go to high-priority work while there is any.
    claimed = claim(cluster, 20)
    assert set(urgent) <= set(claimed)
    assert claimed[0] in urgent or claimed[1] in urgent


def test_queue_concurrency_limit() -> None:
    cluster = Cluster()
    cluster.one(SetQueue("q", concurrency_limit=2))
    fill(cluster, 10)
    first = claim(cluster, 10)
    assert len(first) == 2 and claim(cluster, 10) == []
    lease = cluster.job(first[0]).lease
    cluster.run(CompleteJob(first[0], lease.fencing_token))
    assert len(claim(cluster, 10)) == 1


def test_tenant_concurrency_limit_holds_across_queues() -> None:
    cluster = Cluster()
    cluster.one(SetTenant("a", concurrency_limit=3))
    fill(cluster, 10, queue="q1", tenant="a")
    fill(cluster, 10, queue="q2", tenant="a")
    fill(cluster, 5, queue="q2", tenant="b")
    claimed = claim(cluster, 20, queues=("q1", "q2"))
    assert Counter(tenants_of(cluster, claimed)) == {"a": 3, "b": 5}


def test_rate_limit_is_a_token_bucket_in_replicated_time() -> None:
    cluster = Cluster()
    cluster.one(SetQueue("q", rate_limit_milli_per_s=2_000, burst=2))
    fill(cluster, 20)
    assert len(claim(cluster, 10)) == 2  # the burst
    assert claim(cluster, 10) == []
    assert claimable_at_ms(cluster.state, ("q",), cluster.now_ms) == cluster.now_ms + 500
    cluster.now_ms += 499
    assert claim(cluster, 10) == []
    cluster.now_ms += 1
    assert len(claim(cluster, 10)) == 1
    cluster.now_ms += 10_000  # refills to the burst, not beyond
    assert len(claim(cluster, 10)) == 2


def test_pause_and_resume() -> None:
    cluster = Cluster()
    fill(cluster, 3)
    cluster.one(PauseQueue("q", True))
    assert claim(cluster, 10) == []
    assert claimable_at_ms(cluster.state, ("q",), cluster.now_ms) is None
    cluster.one(PauseQueue("q", False))
    assert len(claim(cluster, 10)) == 3


def test_max_queued_answers_queue_full_and_stores_nothing() -> None:
    cluster = Cluster()
    cluster.one(SetTenant("a", max_queued=2))
    fill(cluster, 2, tenant="a")
    before = cluster.digest()
    result = cluster.one(SubmitJobs((JobSpec("q", tenant="a"),), ("job_x",)))
    assert isinstance(result, Submitted)
    (item,) = result.items
    assert isinstance(item, Rejected) and item.code == "queue_full"
    assert item.details["tenant"] == "a" and item.details["retry_after_s"] >= 1
    assert cluster.digest() == before
    # Other tenants are not affected; a claimed job frees a place.
    fill(cluster, 1, tenant="b")
    claim(cluster, 1)
    fill(cluster, 1, tenant="a")


def test_a_batch_is_admitted_up_to_the_maximum() -> None:
    cluster = Cluster()
    cluster.one(SetTenant("a", max_queued=3))
    specs = (JobSpec("q", tenant="a"),) * 5
    result = cluster.one(SubmitJobs(specs, tuple(f"j{i}" for i in range(5))))
    assert isinstance(result, Submitted)
    codes = [getattr(item, "code", "ok") for item in result.items]
    assert codes == ["ok", "ok", "ok", "queue_full", "queue_full"]


def test_bad_settings_are_rejected_unchanged() -> None:
    cluster = Cluster()
    assert_rejected_unchanged(cluster, SetTenant("a", weight=0), "invalid_request")
    assert_rejected_unchanged(cluster, SetTenant("", weight=1), "invalid_request")
    assert_rejected_unchanged(cluster, SetQueue("q", burst=5), "invalid_request")
    assert_rejected_unchanged(cluster, SetQueue("q", concurrency_limit=-1), "invalid_request")
    assert_rejected_unchanged(cluster, SetQueue("q", circuit_window=100), "invalid_request")
    assert_rejected_unchanged(cluster, PauseQueue("q", 1), "invalid_request")  # type: ignore[arg-type]


def test_settings_survive_a_snapshot_and_defaults_store_nothing() -> None:
    cluster = Cluster()
    empty = cluster.digest()
    assert cluster.one(SetTenant("a", weight=1)) == Ack()
    assert cluster.digest() == empty
    cluster.one(SetTenant("a", weight=2, concurrency_limit=5, max_queued=9))
    cluster.one(SetQueue("q", rate_limit_milli_per_s=500, concurrency_limit=4))
    restored = decode_state(encode_state(cluster.state))
    assert state_digest(restored) == cluster.digest()


def test_the_circuit_slows_claims_after_failures_and_recovers() -> None:
    cluster = Cluster()
    cluster.one(SetQueue("q", circuit_window=4, circuit_probe_ms=1_000))
    fill(cluster, 20, max_attempts=100)
    (ok,) = claim(cluster, 1)
    cluster.run(CompleteJob(ok, cluster.job(ok).lease.fencing_token))
    # Window 4: open once at least 2 outcomes are known and most failed.
    for _ in range(2):
        (job_id,) = claim(cluster, 1)
        token = cluster.job(job_id).lease.fencing_token
        cluster.run(StartJob(job_id, token))
        cluster.run(FailJob(job_id, token, "transient"))
        assert not cluster.state.sections["flow"].queues["q"].circuit_open or _ == 1
    record = cluster.state.sections["flow"].queues["q"]
    assert record.circuit_open
    assert claim(cluster, 10) == []  # until the probe is due
    cluster.now_ms += 1_000
    (probe,) = claim(cluster, 10)  # one probe only
    assert claim(cluster, 10) == []
    token = cluster.job(probe).lease.fencing_token
    cluster.run(CompleteJob(probe, token))
    assert not record.circuit_open
    assert len(claim(cluster, 10)) == 10
