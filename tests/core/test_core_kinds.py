"""Job kinds (issue 20, cluster version 8): the field on specs and jobs, its
encoding, the gate, and claims of the kinds a worker has handlers for."""

from __future__ import annotations

import random
from dataclasses import replace

import msgpack
import pytest
from core_support import T0, Cluster

from raftsched.core import (
    apply_entry,
    check_invariants,
    command_version,
    decode_state,
    encode_state,
    get_job,
    list_jobs,
    needs_upgrade,
    state_digest,
)
from raftsched.core.jobs.commands import (
    ClaimJobs,
    ClaimJobsOfKinds,
    CompleteJob,
    ConfigureWheel,
    LeaseBatch,
    SetQueue,
    SetTenant,
    StartJob,
    SubmitJobs,
)
from raftsched.core.jobs.flow_claim import claimable_at_ms
from raftsched.core.jobs.submit import spec_fingerprint
from raftsched.core.kernel import wheel
from raftsched.core.kernel.codec import decode_spec, spec_row
from raftsched.core.kernel.commands import (
    Audited,
    Command,
    Entry,
    JobSpec,
    RaiseClusterVersion,
    Tick,
)
from raftsched.core.kernel.model import JOB_FIELDS, PENDING
from raftsched.core.kernel.results import BatchApplied, Claimed, Rejected, Submitted
from raftsched.core.schedules.commands import CreateSchedule, ScheduleSpec, UpdateSchedule
from raftsched.core.workflows.commands import StepSpec, SubmitWorkflow

KINDS_VERSION = 8
MIN = 60_000


def _kinds_cluster() -> Cluster:
    cluster = Cluster()
    cluster.run(RaiseClusterVersion(KINDS_VERSION))
    return cluster


def _claimed(cluster: Cluster, command: Command) -> list[str]:
    result = cluster.one(command)
    assert isinstance(result, Claimed), result
    return [lease.job_id for lease in result.leases]


def _kinds_of(kinds: dict[str | None, int]) -> tuple[tuple[str | None, int], ...]:
    return tuple(kinds.items())


# -- the field ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["a", "charge", "email.send:v2", "A_b-9.x:y", "k" * 128])
def test_a_kind_is_1_to_128_letters_digits_and_a_few_marks(kind: str) -> None:
    cluster = _kinds_cluster()
    job_id = cluster.submit(kind=kind)
    assert cluster.job(job_id).kind == kind
    assert get_job(cluster.state, job_id).kind == kind


@pytest.mark.parametrize("kind", ["", "k" * 129, "two words", "é", "a/b", "a\n", 7, b"x"])
def test_anything_else_is_refused_naming_the_field(kind: object) -> None:
    cluster = _kinds_cluster()
    before = cluster.digest()
    result = cluster.one(SubmitJobs((JobSpec("q", kind=kind),), ("j",)))  # type: ignore[arg-type]
    assert isinstance(result, Submitted)
    (item,) = result.items
    assert isinstance(item, Rejected) and item.details == {"field": "kind"}, item
    assert cluster.digest() == before


def test_a_spec_row_grows_only_by_the_fields_it_sets() -> None:
    """14 fields, 16 with the version-5 fields, 17 with a kind: a spec
    without a kind encodes and fingerprints as release 0.7.0's did."""
    plain, policy = JobSpec("q"), JobSpec("q", on_unknown="reconcile")
    kinded = JobSpec("q", kind="charge")
    assert [len(spec_row(spec)) for spec in (plain, policy, kinded)] == [14, 16, 17]
    for spec in (plain, policy, kinded, replace(policy, kind="charge")):
        assert decode_spec(msgpack.unpackb(msgpack.packb(spec_row(spec)), use_list=False)) == spec
    assert spec_fingerprint(kinded) != spec_fingerprint(plain)
    assert spec_fingerprint(replace(kinded, kind="refund")) != spec_fingerprint(kinded)


def test_the_same_key_with_another_kind_is_a_conflict() -> None:
    cluster = _kinds_cluster()
    first = cluster.submit(kind="charge", idempotency_key="k")
    again = cluster.one(SubmitJobs((JobSpec("q", kind="charge", idempotency_key="k"),), ("j2",)))
    assert again.items[0].job_id == first and not again.items[0].created
    other = cluster.one(SubmitJobs((JobSpec("q", kind="refund", idempotency_key="k"),), ("j3",)))
    assert isinstance(other.items[0], Rejected) and other.items[0].code == "idempotency_conflict"


def test_workflow_steps_and_schedule_templates_give_their_jobs_their_kind() -> None:
    cluster = _kinds_cluster()
    steps = (
        StepSpec("pay", JobSpec("q", kind="charge"), compensation=JobSpec("q", kind="refund")),
        StepSpec("mail", JobSpec("q"), ("pay",)),
    )
    cluster.one(SubmitWorkflow("wf", steps))
    template = JobSpec("r", kind="report.daily")
    cluster.one(CreateSchedule(ScheduleSpec("s", template, interval_ms=MIN)))
    cluster.run(Tick(), at=T0 + 2 * MIN)
    kinds = {job.step or job.schedule_id: job.kind for job in cluster.state.jobs.values()}
    assert kinds == {"pay": "charge", "s": "report.daily"}


def test_list_jobs_filters_by_kind() -> None:
    cluster = _kinds_cluster()
    ids = [cluster.submit(kind=kind) for kind in ("charge", None, "charge", "refund")]
    jobs, _ = list_jobs(cluster.state, kind="charge")
    assert [job.id for job in jobs] == [ids[2], ids[0]]
    jobs, _ = list_jobs(cluster.state, kind="nope")
    assert jobs == []


# -- the encoding ---------------------------------------------------------------


def _chunk_arrays(cluster: Cluster) -> list[int]:
    return [len(chunk) for chunk in msgpack.unpackb(encode_state(cluster.state))[6]]


def test_a_chunk_without_kinds_is_encoded_as_before_and_one_with_them_has_a_column() -> None:
    cluster = _kinds_cluster()
    cluster.submit()
    assert _chunk_arrays(cluster) == [len(JOB_FIELDS)]  # values + the 32 older columns
    cluster.submit(kind="charge")
    cluster.submit(kind="charge")
    assert _chunk_arrays(cluster) == [len(JOB_FIELDS) + 1]
    (chunk,) = msgpack.unpackb(encode_state(cluster.state))[6]
    values, kinds = chunk[0], chunk[-1]
    assert [values[i] for i in kinds] == [None, "charge", "charge"]  # shared values


def test_a_state_with_kinds_round_trips_and_its_replica_claims_the_same() -> None:
    cluster = _kinds_cluster()
    rng = random.Random(20)
    specs = tuple(
        JobSpec(
            f"q{i % 2}",
            tenant=f"t{i % 3}",
            priority=rng.choice((0, 0, 5)),
            kind=rng.choice((None, "a", "b", "c")),
        )
        for i in range(600)
    )
    cluster.one(SubmitJobs(specs, tuple(f"j{i:04d}" for i in range(600))))
    cluster.one(ClaimJobsOfKinds("w", ("q0",), 50, None, (("a", 10), (None, 50))))
    data = encode_state(cluster.state)
    decoded = decode_state(data)
    assert check_invariants(decoded) == []
    assert encode_state(decoded) == data
    assert {job.id: job.kind for job in decoded.jobs.values()} == {
        job.id: job.kind for job in cluster.state.jobs.values()
    }
    later = Entry(
        1,
        cluster.now_ms + 1,
        (
            ClaimJobsOfKinds("w", ("q0", "q1"), 70, None, (("b", 20), ("c", 70))),
            ClaimJobs("w", ("q0", "q1"), 100),
        ),
    )
    assert apply_entry(decoded, later) == apply_entry(cluster.state, later)
    assert state_digest(decoded) == cluster.digest()


def test_packed_jobs_keep_their_kind_in_tails_and_sealed_chunks() -> None:
    cluster = _kinds_cluster()
    cluster.one(ConfigureWheel(5 * MIN, MIN))
    run_at = T0 + 60 * MIN
    count = wheel.CHUNK_JOBS + 3
    specs = tuple(
        JobSpec("q", run_at_ms=run_at + i, kind=None if i % 3 else f"k{i % 2}")
        for i in range(count)
    )
    cluster.one(SubmitJobs(specs, tuple(f"p{i:03d}" for i in range(count))))
    assert not cluster.state.jobs  # all packed
    expected = {f"p{i:03d}": spec.kind for i, spec in enumerate(specs)}
    assert {job.id: job.kind for job in wheel.packed_jobs(cluster.state)} == expected
    decoded = decode_state(encode_state(cluster.state))
    assert {job.id: job.kind for job in wheel.packed_jobs(decoded)} == expected
    cluster.run(Tick(), at=run_at)
    assert {job.id: job.kind for job in cluster.state.jobs.values()} == expected


def test_a_state_of_jobs_without_kinds_encodes_exactly_as_one_whose_jobs_never_had_the_slot() -> (
    None
):
    """The digest of a state without kinds is a function of the 32 older
    slots alone (the golden fixtures check it against releases' bytes)."""
    cluster = _kinds_cluster()
    cluster.submit(ordering_key="o", labels=(("a", "b"),))
    data = encode_state(cluster.state)
    (chunk,) = msgpack.unpackb(data)[6]
    assert len(chunk) == len(JOB_FIELDS)


# -- the gate ------------------------------------------------------------------------


def _kinded_commands() -> list[Command]:
    kinded = JobSpec("q", kind="charge")
    return [
        SubmitJobs((JobSpec("q"), kinded), ("a", "b")),
        CreateSchedule(ScheduleSpec("s", kinded, interval_ms=MIN)),
        UpdateSchedule(ScheduleSpec("s", kinded, interval_ms=MIN)),
        Audited("ops", CreateSchedule(ScheduleSpec("s", kinded, interval_ms=MIN))),
        SubmitWorkflow("wf", (StepSpec("a", JobSpec("q")), StepSpec("b", kinded))),
        SubmitWorkflow("wf", (StepSpec("a", JobSpec("q"), compensation=kinded),)),
        ClaimJobsOfKinds("w", ("q",), 1, None, ((None, 1),)),
        LeaseBatch((CompleteJob("j", 1),), ClaimJobsOfKinds("w", ("q",), 1, None, (("k", 1),))),
    ]


@pytest.mark.parametrize("command", _kinded_commands(), ids=lambda c: type(c).__name__)
def test_every_command_that_carries_a_kind_waits_for_version_8(command: Command) -> None:
    assert command_version(command) == KINDS_VERSION
    cluster = Cluster()
    cluster.one(RaiseClusterVersion(7))
    assert needs_upgrade(cluster.state, command)
    cluster.one(RaiseClusterVersion(KINDS_VERSION))
    assert not needs_upgrade(cluster.state, command)


def test_the_same_commands_without_a_kind_keep_their_versions() -> None:
    policy = JobSpec("q", on_unknown="reconcile")
    assert command_version(SubmitJobs((JobSpec("q"),), ("a",))) == 1
    assert command_version(SubmitJobs((policy,), ("a",))) == 5
    assert command_version(SubmitWorkflow("wf", (StepSpec("a", policy),))) == 5
    assert command_version(LeaseBatch((), ClaimJobs("w", ("q",), 1))) == 6


# -- claims of kinds -------------------------------------------------------------


def test_a_claim_of_kinds_takes_only_those_at_most_its_caps_and_none_means_no_kind() -> None:
    cluster = _kinds_cluster()
    ids = {
        kind: [cluster.submit(kind=kind) for _ in range(3)] for kind in ("charge", None, "refund")
    }
    got = _claimed(cluster, ClaimJobsOfKinds("w", ("q",), 10, None, (("charge", 2),)))
    assert got == ids["charge"][:2]
    got = _claimed(cluster, ClaimJobsOfKinds("w", ("q",), 10, None, ((None, 10), ("nope", 10))))
    assert got == ids[None]
    got = _claimed(cluster, ClaimJobsOfKinds("w", ("q",), 2, None, (("refund", 2), ("charge", 2))))
    assert got == [ids["charge"][2], ids["refund"][0]]  # oldest first, max_jobs in all
    assert _claimed(cluster, ClaimJobs("w", ("q",), 10)) == ids["refund"][1:]


def test_the_kind_star_takes_every_job_no_other_entry_names() -> None:
    """A worker that dead-letters what it cannot run claims its kinds, with
    their caps, and "*" for the rest (jobs without a kind too, unless None is
    named with its own cap)."""
    cluster = _kinds_cluster()
    ids = {kind: [cluster.submit(kind=kind) for _ in range(2)] for kind in ("a", None, "b", "c")}
    got = _claimed(cluster, ClaimJobsOfKinds("w", ("q",), 10, None, (("a", 1), ("*", 10))))
    assert got == [ids["a"][0], *ids[None], *ids["b"], *ids["c"]]  # oldest first
    cluster = _kinds_cluster()
    ids = {kind: [cluster.submit(kind=kind) for _ in range(2)] for kind in ("a", None, "b")}
    got = _claimed(cluster, ClaimJobsOfKinds("w", ("q",), 10, None, ((None, 1), ("*", 1))))
    assert got == [ids["a"][0], ids[None][0]]
    left = _claimed(cluster, ClaimJobsOfKinds("w", ("q",), 10, None, (("*", 10),)))
    assert left == [ids["a"][1], ids[None][1], *ids["b"]]
    # A kind named with 0 is left alone, also by "*" (a kind at its limit).
    cluster = _kinds_cluster()
    ids = {kind: [cluster.submit(kind=kind)] for kind in ("a", "b")}
    got = _claimed(cluster, ClaimJobsOfKinds("w", ("q",), 10, None, (("a", 0), ("*", 10))))
    assert got == ids["b"]


def test_a_lease_batch_may_carry_a_claim_of_kinds() -> None:
    cluster = _kinds_cluster()
    done = cluster.start(kind="charge")
    waiting = [cluster.submit(kind=kind) for kind in ("refund", "charge")]
    batch = cluster.one(
        LeaseBatch(
            (CompleteJob(done.job_id, done.fencing_token),),
            ClaimJobsOfKinds("w1", ("q",), 5, None, (("charge", 5),)),
        )
    )
    assert isinstance(batch, BatchApplied) and isinstance(batch.claimed, Claimed), batch
    assert [lease.job_id for lease in batch.claimed.leases] == [waiting[1]]


@pytest.mark.parametrize(
    "kinds",
    [
        (),
        (("a", 1), ("a", 2)),
        ((None, 1), (None, 1)),
        (("bad kind", 1),),
        (("a", 6),),  # above the claim's max_jobs
        (("a",),),
        (("a", 1, 2),),
        (("*", 1), ("*", 2)),
        (("**", 1),),
        tuple((f"k{i}", 1) for i in range(101)),
    ],
)
def test_malformed_kinds_are_refused_whole(kinds: object) -> None:
    cluster = _kinds_cluster()
    cluster.submit(kind="a")
    before = cluster.digest()
    result = cluster.one(ClaimJobsOfKinds("w", ("q",), 5, None, kinds))  # type: ignore[arg-type]
    assert isinstance(result, Rejected) and result.details == {"field": "kinds"}, result
    assert cluster.digest() == before


def _jobs(rng: random.Random, count: int) -> list[JobSpec]:
    return [
        JobSpec(
            rng.choice(("q", "r")),
            tenant=rng.choice(("t0", "t1", "t2", "t3")),
            priority=rng.choice((0, 0, 0, -3, 4, 9)),
            kind=rng.choice((None, "a", "b", "c")),
        )
        for _ in range(count)
    ]


def _setup(cluster: Cluster) -> None:
    """Weights, a tenant's limit and the queue's: shares that a lane split could disturb."""
    cluster.run(
        SetTenant("t0", 3),
        SetTenant("t1", 1, 4),
        SetTenant("t2", 2),
        SetQueue("q", False, None, None, 40),
    )


@pytest.mark.parametrize("seed", range(6))
def test_a_claim_over_kinds_chooses_as_it_would_were_the_jobs_in_one_lane(seed: int) -> None:
    """Kinds split a queue's jobs into lanes; an unfiltered claim must grant
    exactly what it grants when no job has a kind (fair shares, weights,
    tenant limits, the high-priority share, the queue's limit)."""
    rng = random.Random(seed)
    specs = _jobs(rng, 400)
    with_kinds, without = _kinds_cluster(), _kinds_cluster()
    for cluster, batch in ((with_kinds, specs), (without, [replace(s, kind=None) for s in specs])):
        _setup(cluster)
        cluster.one(SubmitJobs(tuple(batch), tuple(f"j{i:04d}" for i in range(len(batch)))))
    for step in range(40):
        claim = ClaimJobs("w", rng.choice((("q",), ("r",), ("q", "r"))), rng.randint(1, 12))
        granted = _claimed(with_kinds, claim)
        assert granted == _claimed(without, claim), step
        finishing = rng.sample(granted, len(granted) // 2)
        for cluster in (with_kinds, without):
            for job_id in finishing:
                token = cluster.job(job_id).lease.fencing_token
                cluster.run(StartJob(job_id, token), CompleteJob(job_id, token))


@pytest.mark.parametrize("seed", range(3))
def test_a_claim_of_every_kind_chooses_as_a_plain_claim(seed: int) -> None:
    rng = random.Random(50 + seed)
    specs = _jobs(rng, 300)
    star, plain = _kinds_cluster(), _kinds_cluster()
    for cluster in (star, plain):
        _setup(cluster)
        cluster.one(SubmitJobs(tuple(specs), tuple(f"j{i:04d}" for i in range(len(specs)))))
    for step in range(30):
        queues = rng.choice((("q",), ("r",), ("q", "r")))
        most = rng.randint(1, 12)
        every = ClaimJobsOfKinds("w", queues, most, None, (("*", most),))
        assert _claimed(star, every) == _claimed(plain, ClaimJobs("w", queues, most)), step


@pytest.mark.parametrize("seed", range(6))
def test_a_claim_of_kinds_chooses_as_a_plain_claim_among_only_those_jobs(seed: int) -> None:
    """A claim of kinds K on a queue of many kinds grants what a plain claim
    grants on a queue holding only the jobs of K, under the same shares."""
    rng = random.Random(100 + seed)
    specs = _jobs(rng, 400)
    wanted = {None, "b"}
    mixed, only = _kinds_cluster(), _kinds_cluster()
    for cluster, batch in ((mixed, specs), (only, [s for s in specs if s.kind in wanted])):
        _setup(cluster)
        ids = [f"j{i:04d}" for i, s in enumerate(specs) if cluster is mixed or s.kind in wanted]
        cluster.one(SubmitJobs(tuple(batch), tuple(ids)))
    for step in range(30):
        queues = rng.choice((("q",), ("r",), ("q", "r")))
        most = rng.randint(1, 12)
        kinds = ClaimJobsOfKinds("w", queues, most, None, ((None, most), ("b", most)))
        granted = _claimed(mixed, kinds)
        assert granted == _claimed(only, ClaimJobs("w", queues, most)), step
        for job_id in granted:
            assert mixed.job(job_id).kind in wanted


def test_per_kind_caps_leave_the_rest_of_the_claim_to_the_other_kinds() -> None:
    cluster = _kinds_cluster()
    slow = [cluster.submit(kind="slow", priority=9) for _ in range(5)]
    fast = [cluster.submit(kind="fast") for _ in range(5)]
    got = _claimed(cluster, ClaimJobsOfKinds("w", ("q",), 4, None, (("slow", 1), ("fast", 4))))
    assert got == [slow[0], *fast[:3]]


def test_a_plain_claim_of_a_queue_with_only_jobs_of_kinds_still_takes_them() -> None:
    """A worker of an older SDK claims without kinds: it gets any job."""
    cluster = _kinds_cluster()
    ids = [cluster.submit(kind="a"), cluster.submit(kind="b")]
    assert _claimed(cluster, ClaimJobs("w", ("q",), 5)) == ids
    assert not cluster.state.runnable.kinds and not cluster.state.runnable.queues


def test_lanes_of_kinds_go_when_their_last_job_is_claimed() -> None:
    cluster = _kinds_cluster()
    job_id = cluster.submit(kind="a")
    assert set(cluster.state.runnable.kinds["q"]) == {"a"}
    assert _claimed(cluster, ClaimJobsOfKinds("w", ("q",), 1, None, (("a", 1),))) == [job_id]
    assert cluster.state.runnable.kinds == {}
    assert cluster.job(job_id).status != PENDING


def test_a_claim_of_kinds_is_woken_only_by_jobs_it_may_take() -> None:
    """The long-poll's question (`claimable_at_ms`) is asked as the claim
    takes: a job of another kind, or of a kind named with 0, wakes nobody
    (or a claim would be proposed again and again, granting nothing)."""
    cluster = _kinds_cluster()
    cluster.submit(kind="a")
    now = cluster.now_ms
    for quotas in ({"b": 1}, {None: 1}, {"a": 0}, {"a": 0, "*": 5}):
        assert claimable_at_ms(cluster.state, ("q",), now, quotas) is None, quotas
    for quotas in ({"a": 1}, {"*": 5}, {None: 1, "*": 1}, None):
        assert claimable_at_ms(cluster.state, ("q",), now, quotas) == now, quotas
