"""LeaseBatch: a worker's lease operations and its next claim, one command.

The property: applying a batch gives the same state, byte for byte, and the
same per-op results as applying its lease operations, then its claim, one
by one; an op that is not a lease operation is rejected in its slot and
changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from core_support import T0, Cluster
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from raftsched.core import (
    REGISTRY,
    apply_entry,
    check_invariants,
    decode_entry,
    encode_entry,
    new_state,
    state_digest,
)
from raftsched.core.jobs.commands import (
    CancelJob,
    ClaimJobs,
    CompleteJob,
    FailJob,
    HeartbeatJob,
    LeaseBatch,
    ReconcileJob,
    SetQueue,
    StartJob,
    SubmitJobs,
)
from raftsched.core.jobs.lease_batch import LEASE_OPS, batch_size
from raftsched.core.kernel.commands import (
    Audited,
    Backoff,
    Command,
    Entry,
    JobSpec,
    TakeOver,
    Tick,
)
from raftsched.core.kernel.results import (
    BatchApplied,
    Claimed,
    Completed,
    Failed,
    Rejected,
    Result,
    Started,
)
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import BATCH_MAX

QUEUES = ("q", "r")
RECONCILE_QUEUE = "rq"


@dataclass
class World:
    """The entries that built a state, and the leases handed out on the way."""

    entries: list[Entry] = field(default_factory=list)
    state: State = field(default_factory=new_state)
    now_ms: int = T0
    epoch: int = 2
    grants: list[tuple[str, int]] = field(default_factory=list)

    def run(self, *commands: Command) -> list[Result]:
        entry = Entry(self.epoch, self.now_ms, commands)
        self.entries.append(entry)
        results = apply_entry(self.state, entry)
        for result in results:
            if isinstance(result, Claimed):
                self.grants += [(lease.job_id, lease.fencing_token) for lease in result.leases]
        return results

    def replica(self) -> State:
        """Another replica that applied the same entries."""
        state = new_state()
        for entry in self.entries:
            apply_entry(state, entry)
        return state


def build_world(data: st.DataObject) -> World:
    """Jobs in every leased status: claimed, running, some whose attempt
    ended unknown held by a reconciliation lease, with concurrency limits
    and ordering keys that a batch's claim may meet."""
    world = World()
    world.run(TakeOver())
    if data.draw(st.booleans(), label="limited"):
        world.run(SetQueue("q", concurrency_limit=data.draw(st.integers(1, 3))))
    count = data.draw(st.integers(1, 10), label="jobs")
    specs = tuple(
        JobSpec(
            data.draw(st.sampled_from(QUEUES)),
            priority=data.draw(st.integers(-1, 1)),
            max_attempts=data.draw(st.integers(1, 3)),
            backoff=Backoff(0, 0, 0),
            ordering_key=data.draw(st.sampled_from([None, None, "k"])),
            on_unknown=data.draw(st.sampled_from([None, "reconcile"])),
            reconcile_queue=RECONCILE_QUEUE,
        )
        for _ in range(count)
    )
    world.run(SubmitJobs(specs, tuple(f"job_{n}" for n in range(count))))
    world.run(ClaimJobs("w1", QUEUES, data.draw(st.integers(0, count)) or 1))
    for job_id, token in list(world.grants):
        action = data.draw(st.sampled_from(["keep", "start", "unknown"]))
        if action == "start":
            world.run(StartJob(job_id, token))
        elif action == "unknown":
            world.run(StartJob(job_id, token), FailJob(job_id, token, "unknown", "lost"))
    world.run(ClaimJobs("r1", (RECONCILE_QUEUE,), 3))
    world.now_ms += data.draw(st.integers(0, 2_000), label="time passes")
    return world


def lease_op(data: st.DataObject, world: World) -> Command:
    current = [(job.id, job.lease.fencing_token) for job in world.state.jobs.values() if job.lease]
    job_id, token = data.draw(
        st.one_of(
            st.sampled_from(current or world.grants),  # mostly a lease that is held
            st.sampled_from([*world.grants, ("job_0", 999), ("nope", 1)]),
        ),
        label="lease",
    )
    kind = data.draw(st.sampled_from(["start", "heartbeat", "complete", "fail", "reconcile"]))
    if kind == "start":
        return StartJob(job_id, token)
    if kind == "heartbeat":
        return HeartbeatJob(job_id, token, data.draw(st.sampled_from([None, 500, 0])))
    if kind == "complete":
        return CompleteJob(job_id, token, data.draw(st.sampled_from([b"\xc0", b"\xa2ok"])))
    if kind == "fail":
        failure = data.draw(st.sampled_from(["transient", "permanent", "unknown", "cancelled"]))
        return FailJob(job_id, token, failure, "x", None, data.draw(st.integers(0, 2**32 - 1)))
    decision = data.draw(st.sampled_from(["happened", "did_not_happen", "cannot_tell", "maybe"]))
    return ReconcileJob(job_id, token, decision)


# Commands a batch may not carry: each is rejected in its slot, never applied.
NOT_LEASE_OPS: tuple[Command, ...] = (
    CancelJob("job_0"),
    ClaimJobs("w9", QUEUES, 1),
    SubmitJobs((JobSpec("q"),), ("job_new",)),
    Tick(),
    Audited("ops", CancelJob("job_1")),
    LeaseBatch((CompleteJob("job_0", 1),)),
)


def a_batch(data: st.DataObject, world: World) -> LeaseBatch:
    ops = data.draw(
        st.lists(
            st.one_of(
                *[st.builds(lambda: lease_op(data, world))] * 4,
                st.sampled_from(NOT_LEASE_OPS),
            ),
            max_size=8,
        ),
        label="ops",
    )
    claim = data.draw(
        st.one_of(
            st.none(),
            st.builds(
                ClaimJobs,
                st.just("w2"),
                st.sampled_from([QUEUES, ("q",), (RECONCILE_QUEUE, "r")]),
                st.integers(0, 4),
                st.sampled_from([None, 2_000]),
            ),
            st.just(CompleteJob("job_0", 1)),  # not a claim: rejected in its slot
        ),
        label="claim",
    )
    return LeaseBatch(tuple(ops), claim)


def expected_results(batch: LeaseBatch, singles: list[Result]) -> Result:
    """What the batch must answer, given what its applied commands answered alone."""
    if not batch.ops and batch.claim is None:
        return Rejected("invalid_request", "", {"field": "ops"})
    answers = iter(singles)
    results = tuple(
        next(answers)
        if type(op) in LEASE_OPS
        else Rejected("invalid_request", "", {"field": "ops", "index": index})
        for index, op in enumerate(batch.ops)
    )
    claimed: Result | None = None
    if results and all(isinstance(result, Rejected) for result in results):
        pass  # every op refused: the claim is not applied
    elif type(batch.claim) is ClaimJobs:
        claimed = next(answers)
    elif batch.claim is not None:
        claimed = Rejected("invalid_request", "", {"field": "claim"})
    assert next(answers, None) is None
    return BatchApplied(results, claimed)


def without_messages(value: Any) -> Any:
    """Rejections compared by code and details (the prose is checked elsewhere)."""
    if isinstance(value, Rejected):
        return (value.code, value.details)
    if isinstance(value, BatchApplied):
        claimed = None if value.claimed is None else without_messages(value.claimed)
        return ("BatchApplied", tuple(map(without_messages, value.results)), claimed)
    return value


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_batch_is_its_ops_then_its_claim_one_by_one(data: st.DataObject) -> None:
    world = build_world(data)
    alone = world.replica()
    assert state_digest(alone) == state_digest(world.state)
    batch = a_batch(data, world)
    epoch = world.epoch - data.draw(st.sampled_from([0, 0, 1]), label="stale")
    entry = Entry(epoch, world.now_ms, (batch,))
    if not any(type(op) in REGISTRY.nested for op in batch.ops):
        # Through the codec, as a replica gets it (which refuses a holder
        # of commands inside a batch: that case is applied as built).
        entry = decode_entry(encode_entry(entry))
    (result,) = apply_entry(world.state, entry)

    singles: list[Command] = [op for op in batch.ops if type(op) in LEASE_OPS]
    if singles and data.draw(st.booleans(), label="one entry each"):
        answers = [
            apply_entry(alone, Entry(epoch, world.now_ms, (single,)))[0] for single in singles
        ]
    else:  # (an entry of no command still lets time pass, as the batch's did)
        answers = apply_entry(alone, Entry(epoch, world.now_ms, tuple(singles)))
    # The claim alone, after the ops, unless the batch had ops and all were refused.
    # (an op that is no lease op is refused in its slot, so only the others' answers count)
    all_refused = bool(batch.ops) and all(isinstance(a, Rejected) for a in answers)
    if type(batch.claim) is ClaimJobs and not all_refused:
        singles.append(batch.claim)
        answers += apply_entry(alone, Entry(epoch, world.now_ms, (batch.claim,)))

    assert without_messages(result) == without_messages(expected_results(batch, answers))
    for each in (*getattr(result, "results", ()), getattr(result, "claimed", None)):
        event(type(each).__name__ + (f":{each.code}" if isinstance(each, Rejected) else ""))
    if isinstance(result, BatchApplied):  # the messages too, for the ops applied
        applied = [r for op, r in zip(batch.ops, result.results, strict=True) if op in singles]
        assert applied == answers[: len(applied)]
    assert state_digest(world.state) == state_digest(alone)
    assert check_invariants(world.state) == []


# -- the rules, one by one ----------------------------------------------------------


def _claimed_and_started(cluster: Cluster, n: int, queue: str = "q") -> list[Any]:
    leases = cluster.claim(queues=(queue,), n=n)
    cluster.run(*(StartJob(lease.job_id, lease.fencing_token) for lease in leases))
    return leases


def test_the_claim_comes_after_the_ops_and_takes_the_slots_they_freed() -> None:
    cluster = Cluster()
    cluster.one(SetQueue("q", concurrency_limit=2))
    for _ in range(4):
        cluster.submit()
    first, second = _claimed_and_started(cluster, 4)  # the limit grants two
    result = cluster.one(
        LeaseBatch(
            (CompleteJob(first.job_id, first.fencing_token), StartJob(second.job_id, 999)),
            ClaimJobs("w1", ("q",), 4),
        )
    )
    assert isinstance(result, BatchApplied)
    completed, lost = result.results
    assert isinstance(completed, Completed) and completed.job_id == first.job_id
    assert isinstance(lost, Rejected) and lost.code == "lease_lost"
    assert isinstance(result.claimed, Claimed)
    assert [lease.job_id for lease in result.claimed.leases] == ["job_3"]


def test_an_ordering_key_released_by_a_completion_is_claimable_in_the_same_batch() -> None:
    cluster = Cluster()
    cluster.submit(ordering_key="k")
    cluster.submit(ordering_key="k")
    (first,) = _claimed_and_started(cluster, 2)  # the second waits for the first
    result = cluster.one(
        LeaseBatch((CompleteJob(first.job_id, first.fencing_token),), ClaimJobs("w1", ("q",), 1))
    )
    assert isinstance(result, BatchApplied) and isinstance(result.claimed, Claimed)
    assert [lease.job_id for lease in result.claimed.leases] == ["job_2"]


@pytest.mark.parametrize("op", NOT_LEASE_OPS, ids=lambda op: type(op).__name__)
def test_anything_but_a_lease_operation_is_refused_in_its_slot(op: Command) -> None:
    cluster = Cluster()
    cluster.submit()
    cluster.submit()
    lease = cluster.claim_one()
    before = Cluster()
    before.submit()
    before.submit()
    before.claim_one()
    before.one(StartJob(lease.job_id, lease.fencing_token))
    result = cluster.one(LeaseBatch((op, StartJob(lease.job_id, lease.fencing_token))))
    assert isinstance(result, BatchApplied) and result.claimed is None
    refused, started = result.results
    assert isinstance(refused, Rejected) and refused.code == "invalid_request"
    assert refused.details == {"field": "ops", "index": 0}
    assert isinstance(started, Started)
    assert cluster.digest() == before.digest()  # the refused op changed nothing


def test_a_claim_slot_that_holds_no_claim_is_refused_there() -> None:
    cluster = Cluster()
    lease = cluster.start()
    result = cluster.one(
        LeaseBatch(
            (CompleteJob(lease.job_id, lease.fencing_token),),
            CompleteJob(lease.job_id, lease.fencing_token),  # type: ignore[arg-type]
        )
    )
    assert isinstance(result, BatchApplied)
    assert isinstance(result.results[0], Completed)
    assert isinstance(result.claimed, Rejected) and result.claimed.details == {"field": "claim"}


@pytest.mark.parametrize(
    "batch",
    [
        LeaseBatch(()),
        LeaseBatch((CompleteJob("job_1", 1),) * (BATCH_MAX + 1)),
        LeaseBatch([CompleteJob("job_1", 1)]),  # type: ignore[arg-type]
    ],
    ids=["empty", "too many", "not a tuple"],
)
def test_a_malformed_batch_is_refused_whole(batch: LeaseBatch) -> None:
    cluster = Cluster()
    lease = cluster.start()
    before = cluster.digest()
    if type(batch.ops) is tuple and batch.ops:
        batch = LeaseBatch((CompleteJob(lease.job_id, lease.fencing_token),) * len(batch.ops))
    result = cluster.one(batch)
    assert isinstance(result, Rejected) and result.code == "invalid_request"
    assert result.details == {"field": "ops"}
    assert cluster.digest() == before


def test_an_op_whose_handler_raises_is_rolled_back_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in one op is that op's `internal_error`, as if it came alone:
    the ops before and after it stand."""
    cluster = Cluster()
    for _ in range(3):
        cluster.submit()
    a, b, c = _claimed_and_started(cluster, 3)
    real = REGISTRY.handlers[FailJob]

    def broken(state: State, command: FailJob, context: Any) -> Result:
        real(state, command, context)
        raise RuntimeError("a bug after the change")

    monkeypatch.setitem(REGISTRY.handlers, FailJob, broken)
    result = cluster.one(
        LeaseBatch(
            (
                CompleteJob(a.job_id, a.fencing_token),
                FailJob(b.job_id, b.fencing_token, "permanent"),
                CompleteJob(c.job_id, c.fencing_token),
            )
        )
    )
    assert isinstance(result, BatchApplied)
    done, bug, also_done = result.results
    assert isinstance(done, Completed) and isinstance(also_done, Completed)
    assert isinstance(bug, Rejected) and bug.code == "internal_error"
    assert [cluster.job(lease.job_id).status for lease in (a, b, c)] == [
        "succeeded",
        "running",
        "succeeded",
    ]


def test_a_fail_in_a_batch_reports_like_one_alone() -> None:
    cluster = Cluster()
    lease = cluster.start(max_attempts=1)
    result = cluster.one(LeaseBatch((FailJob(lease.job_id, lease.fencing_token, "transient"),)))
    assert isinstance(result, BatchApplied)
    (failed,) = result.results
    assert isinstance(failed, Failed) and failed.status == "dead_letter"


def test_tidying_after_a_batch_counts_the_commands_it_carries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The heaps are tidied in proportion to the commands of an entry; a
    batch of 100 completions is 100 of them, not one."""
    seen: list[int] = []
    monkeypatch.setattr(REGISTRY, "after_entry", (lambda state, n: seen.append(n),))
    cluster = Cluster()
    cluster.run(
        LeaseBatch((CompleteJob("nope", 1),) * 100, ClaimJobs("w", ("q",), 1)),
        Audited("ops", CancelJob("nope")),
        LeaseBatch(()),
    )
    assert seen[-1] == 101 + 1 + 1


def test_the_proposer_weighs_a_batch_by_its_ops_and_its_claims_jobs() -> None:
    assert batch_size(LeaseBatch((CompleteJob("j", 1),) * 3, ClaimJobs("w", ("q",), 10))) == 13
    assert batch_size(LeaseBatch((CompleteJob("j", 1),))) == 1
    assert batch_size(LeaseBatch((), ClaimJobs("w", ("q",), 1))) == 1


def test_when_every_op_is_refused_the_claim_is_not_applied() -> None:
    """A stale worker's batch grants nothing: its answer is the ops' errors,
    and leases granted beside them would be stranded until they expired."""
    cluster = Cluster()
    cluster.submit()
    cluster.submit()
    lease = cluster.claim_one()
    stale = CompleteJob(lease.job_id, lease.fencing_token + 1)
    result = cluster.one(LeaseBatch((stale,), ClaimJobs("w", ("q",), 1)))
    assert isinstance(result, BatchApplied) and result.claimed is None
    (refused,) = result.results
    assert isinstance(refused, Rejected) and refused.code == "lease_lost"
    # One op that stands is enough for the claim.
    good = CompleteJob(lease.job_id, lease.fencing_token)
    result = cluster.one(LeaseBatch((stale, good), ClaimJobs("w", ("q",), 1)))
    assert isinstance(result, BatchApplied) and isinstance(result.claimed, Claimed)
    assert len(result.claimed.leases) == 1
