"""The shard a state is, and the fencing tokens it hands out (core.kernel.shard).

docs/shards.md, section 4: shard k of S hands out `counter * S + k`, where
the counter is the state's own, unchanged. Tokens are then unique across the
shards, strictly increasing for every job, and with no shard set exactly the
counter, in a state whose bytes are today's.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from core_support import Cluster, assert_rejected_unchanged
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule
from test_core_reconcile_stateful import Payments
from test_core_stateful import CoreMachine

from raftsched import core
from raftsched.core import (
    apply_entry,
    check_invariants,
    decode_state,
    encode_state,
    new_state,
    state_digest,
)
from raftsched.core.jobs.commands import (
    ClaimJobs,
    CompleteJob,
    FailJob,
    HeartbeatJob,
    LeaseBatch,
    ReconcileJob,
    RecordEffect,
    StartJob,
)
from raftsched.core.jobs.reconcile_book import book_of
from raftsched.core.kernel import shard
from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.commands import (
    Backoff,
    Barrier,
    Command,
    Entry,
    JobSpec,
    RaiseClusterVersion,
    SetShard,
    Tick,
)
from raftsched.core.kernel.results import (
    Ack,
    BatchApplied,
    Claimed,
    Completed,
    EffectRecorded,
    HeartbeatAccepted,
    OccurrenceDecided,
    Reconciled,
    Rejected,
    Result,
    Started,
)
from raftsched.core.kernel.state import State
from raftsched.core.schedules.commands import CreateSchedule, ScheduleSpec, TriggerSchedule


def section_names(state: State) -> list[str]:
    """The names of the sections `encode_state` wrote (the document's last item)."""
    document = msgpack.unpackb(encode_state(state), use_list=True, strict_map_key=False)
    return [name for name, _ in document[-1]]


def tokens_of(state: State) -> list[int]:
    """Every token the state stores: the jobs' attempts and reconciliation leases."""
    tokens = [attempt.fencing_token for job in state.jobs.values() for attempt in job.attempts]
    tokens += [task.lease[2] for task in book_of(state).tasks.values() if task.lease is not None]
    return tokens


# -- the identity ----------------------------------------------------------------


def test_a_state_without_a_shard_keeps_its_bytes_and_hands_out_the_counter() -> None:
    cluster = Cluster()
    assert shard.identity(cluster.state) is None
    assert shard.SHARD not in section_names(cluster.state)
    for _ in range(3):
        cluster.submit()
    assert [lease.fencing_token for lease in cluster.claim(n=3)] == [1, 2, 3]
    assert cluster.state.last_fencing_token == 3 == shard.last_fencing_token(cluster.state)
    assert shard.SHARD not in section_names(cluster.state)


def test_a_shard_is_named_once_and_its_count_never_changes() -> None:
    cluster = Cluster()
    assert cluster.one(SetShard(2, 4)) == Ack()
    assert shard.identity(cluster.state) == (2, 4)
    assert shard.SHARD in section_names(cluster.state)
    before = cluster.digest()
    assert cluster.one(SetShard(2, 4)) == Ack()  # a repeated proposal changes nothing
    assert cluster.digest() == before
    other = assert_rejected_unchanged(cluster, SetShard(1, 4), "invalid_request")
    assert other.details == {"field": "index", "index": 2, "count": 4}
    more = assert_rejected_unchanged(cluster, SetShard(2, 8), "invalid_request")
    assert more.details is not None and more.details["field"] == "count"
    assert shard.identity(cluster.state) == (2, 4)


@pytest.mark.parametrize(
    ("index", "count", "field"),
    [
        (0, 0, "count"),
        (0, 65, "count"),
        (0, True, "count"),
        (0, "2", "count"),
        (-1, 2, "index"),
        (2, 2, "index"),
        (False, 2, "index"),
        (None, 2, "index"),
    ],
)
def test_a_malformed_shard_is_refused(index: Any, count: Any, field: str) -> None:
    rejected = assert_rejected_unchanged(Cluster(), SetShard(index, count), "invalid_request")
    assert rejected.details == {"field": field}


def test_the_largest_cluster_has_64_shards() -> None:
    cluster = Cluster()
    assert cluster.one(SetShard(63, 64)) == Ack()
    cluster.submit()
    assert cluster.claim_one().fencing_token == 1 * 64 + 63


def test_set_shard_waits_for_cluster_version_9() -> None:
    state = new_state()
    assert core.command_version(SetShard(0, 2)) == shard.SHARD_VERSION == 9
    apply_entry(state, Entry(1, 1_000, (RaiseClusterVersion(8),)))
    assert core.needs_upgrade(state, SetShard(0, 2))
    apply_entry(state, Entry(1, 1_000, (RaiseClusterVersion(9),)))
    assert not core.needs_upgrade(state, SetShard(0, 2))


def test_a_snapshot_keeps_the_shard_and_its_tokens_go_on() -> None:
    cluster = Cluster()
    cluster.run(SetShard(1, 3))
    cluster.submit()
    cluster.submit()
    assert cluster.claim_one().fencing_token == 4
    data = encode_state(cluster.state)
    cluster.state = decode_state(data)
    assert encode_state(cluster.state) == data
    assert shard.identity(cluster.state) == (1, 3)
    assert cluster.claim_one().fencing_token == 7


@pytest.mark.parametrize("data", [(1,), (2, 2), (0, 65), (0, "3"), [0, 3], (-1, 3)])
def test_a_malformed_shard_section_does_not_decode(data: object) -> None:
    with pytest.raises(CodecError):
        shard.SECTION.decode(new_state(), data)


# -- tokens ----------------------------------------------------------------------


def test_every_lease_operation_takes_the_shards_token() -> None:
    cluster = Cluster()
    cluster.run(SetShard(1, 3))
    ids = [cluster.submit() for _ in range(3)]
    leases = cluster.claim(n=3)
    assert [lease.fencing_token for lease in leases] == [4, 7, 10]
    assert cluster.state.last_fencing_token == 3  # the counter is as before
    first = leases[0]
    # A neighbouring slot (another shard's token, or the counter) is not this lease's.
    for wrong in (first.fencing_token + 1, first.fencing_token - 1, 1):
        rejected = cluster.one(StartJob(first.job_id, wrong))
        assert isinstance(rejected, Rejected) and rejected.code == "lease_lost"
    assert isinstance(cluster.one(StartJob(first.job_id, 4)), Started)
    assert isinstance(cluster.one(HeartbeatJob(first.job_id, 4)), HeartbeatAccepted)
    recorded = cluster.one(RecordEffect("pay:1", first.job_id, 4, b"\x01"))
    assert isinstance(recorded, EffectRecorded) and not recorded.replayed
    assert cluster.state.effects["pay:1"][1].fencing_token == 4
    assert isinstance(cluster.one(CompleteJob(first.job_id, 4)), Completed)
    again = cluster.one(CompleteJob(first.job_id, 4))  # a retry after a lost answer
    assert isinstance(again, Completed) and again.replayed
    # A batch's ops and its next claim: the claim takes the shard's next token.
    second = leases[1]
    cluster.submit()
    (batch,) = cluster.run(
        LeaseBatch((CompleteJob(second.job_id, 7),), ClaimJobs("w1", ("q",), 1, None))
    )
    assert isinstance(batch, BatchApplied) and isinstance(batch.claimed, Claimed)
    assert [lease.fencing_token for lease in batch.claimed.leases] == [13]
    assert ids[0] == first.job_id


def test_a_retry_after_the_shard_was_set_takes_a_higher_token() -> None:
    """A token handed out before `SetShard` (the counter) is below every later one."""
    cluster = Cluster()
    job_id = cluster.submit(backoff=Backoff(0, 0, 0), max_attempts=3)
    lease = cluster.claim_one()
    assert lease.fencing_token == 1
    cluster.run(SetShard(2, 3))
    cluster.run(FailJob(job_id, 1, "transient", "try again"))
    cluster.run(Tick(), at=cluster.now_ms + 1)
    retry = cluster.claim_one()
    assert retry.job_id == job_id and retry.fencing_token == 2 * 3 + 2
    assert [attempt.fencing_token for attempt in cluster.job(job_id).attempts] == [1, 8]


def test_a_reconciliation_lease_takes_the_shards_token() -> None:
    cluster = Cluster()
    cluster.run(SetShard(1, 4))
    job_id = cluster.submit(on_unknown="reconcile", backoff=Backoff(0, 0, 0))
    lease = cluster.claim_one()
    assert lease.fencing_token == 5
    cluster.run(StartJob(job_id, 5), FailJob(job_id, 5, "unknown", "timed out"))
    ask = cluster.claim_one()
    assert ask.reconcile is not None and ask.fencing_token == 9
    assert ask.reconcile.fencing_token == 5  # the attempt it asks about
    decided = cluster.one(ReconcileJob(job_id, 9, "happened", b"\xc0", (), "found"))
    assert isinstance(decided, Reconciled) and decided.status == "succeeded"


# -- properties -------------------------------------------------------------------

Step = tuple[str, int]
steps = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(1, 3)),
        st.tuples(st.just("claim"), st.integers(1, 3)),
        st.tuples(st.just("fail"), st.integers(0, 5)),
        st.tuples(st.just("complete"), st.integers(0, 5)),
        st.tuples(st.just("tick"), st.sampled_from([0, 150, 1_000])),
    ),
    max_size=30,
)


def run_program(program: list[Step], identity: tuple[int, int] | None) -> tuple[State, list[int]]:
    """Apply `program` to a new state (named shard `identity` first, if
    given); the tokens handed out, in order."""
    cluster = Cluster()
    if identity is not None:
        assert cluster.one(SetShard(*identity)) == Ack()
    held: list[tuple[str, int]] = []
    handed: list[int] = []
    for op, n in program:
        if op == "submit":
            for _ in range(n):
                cluster.submit(lease_ms=500, backoff=Backoff(100, 100, 0), max_attempts=3)
        elif op == "claim":
            for lease in cluster.claim(n=n, lease_ms=500):
                held.append((lease.job_id, lease.fencing_token))
                handed.append(lease.fencing_token)
        elif op in ("fail", "complete") and held:
            job_id, token = held.pop(n % len(held))
            command: Command = (
                FailJob(job_id, token, "transient", "again")
                if op == "fail"
                else CompleteJob(job_id, token)
            )
            cluster.run(command)  # lease_lost when the lease expired meanwhile
        elif op == "tick":
            cluster.run(Tick(), at=cluster.now_ms + n)
    return cluster.state, handed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=steps, count=st.integers(2, 8))
def test_every_shard_hands_out_its_own_tokens(program: list[Step], count: int) -> None:
    """The same commands in every shard of `count`, and in a state with no
    shard: the counter moves alike; shard k's tokens are `counter * count +
    k` (so k mod count, and no two shards share one); every job's tokens
    increase; the unsharded state's tokens are the counter itself."""
    plain, counters = run_program(program, None)
    assert counters == list(range(1, len(counters) + 1))
    assert shard.SHARD not in section_names(plain)
    seen: set[int] = set()
    for index in range(count):
        state, handed = run_program(program, (index, count))
        assert handed == [counter * count + index for counter in counters]
        assert state.last_fencing_token == plain.last_fencing_token
        assert not seen & set(tokens_of(state))
        seen |= set(tokens_of(state))
        for job in state.jobs.values():
            tokens = [attempt.fencing_token for attempt in job.attempts]
            assert tokens == sorted(set(tokens))
            assert all(token % count == index for token in tokens)
        # Apart from its section and the tokens, the shard holds what the plain state does.
        assert {job_id: job.status for job_id, job in state.jobs.items()} == {
            job_id: job.status for job_id, job in plain.jobs.items()
        }


class ShardedMachine(CoreMachine):
    """The reference model of test_core_stateful in shard k of S: every
    grant's token is the model's counter times S plus k."""

    @initialize(count=st.integers(1, 64), data=st.data())
    def name_the_shard(self, count: int, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, count - 1))
        assert self.apply(SetShard(index, count)) == Ack()
        self.shard = (index, count)

    @rule()
    def a_replica_restarts_from_a_snapshot(self) -> None:
        data = encode_state(self.state)
        self.state = decode_state(data)
        assert encode_state(self.state) == data

    @invariant()
    def tokens_are_the_shards_and_increase_per_job(self) -> None:
        index, count = self.shard
        assert shard.identity(self.state) in (None, (index, count))
        for job in self.state.jobs.values():
            tokens = [attempt.fencing_token for attempt in job.attempts]
            assert tokens == sorted(set(tokens))
            assert all(token % count == index for token in tokens)


ShardedMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestShardedMachine = ShardedMachine.TestCase


class OneShardTwinMachine(CoreMachine):
    """Shard 0 of 1 beside a twin with no shard, given the same entries:
    the same results, and the same bytes but for the `shard` section."""

    def __init__(self) -> None:
        self.twin = new_state()  # before the base applies its first entry
        super().__init__()
        entry = Entry(self.epoch, self.now_ms, (SetShard(0, 1),))
        assert apply_entry(self.state, entry) == [Ack()]

    def apply(self, command: Command, epoch: int | None = None) -> Result:
        entry = Entry(self.epoch if epoch is None else epoch, self.now_ms, (command,))
        (twin,) = apply_entry(self.twin, entry)
        (result,) = apply_entry(self.state, entry)
        assert result == twin
        return result

    @rule(back_ms=st.integers(1, 1_000))
    def a_clock_runs_behind(self, back_ms: int) -> None:
        entry = Entry(self.epoch, self.now_ms - back_ms, (Barrier(),))
        apply_entry(self.twin, entry)
        super().a_clock_runs_behind(back_ms)

    @invariant()
    def the_bytes_are_the_twins_but_the_section(self) -> None:
        assert check_invariants(self.twin) == []
        assert shard.SHARD in section_names(self.state)
        named = self.state.sections[shard.SHARD]
        self.state.sections[shard.SHARD] = shard.ShardIdentity()
        try:
            assert encode_state(self.state) == encode_state(self.twin)
        finally:
            self.state.sections[shard.SHARD] = named


OneShardTwinMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestOneShardTwinMachine = OneShardTwinMachine.TestCase


class ShardedPayments(Payments):
    """The payments of test_core_reconcile_stateful in shard k of S: leases
    and reconciliation leases alike take the shard's tokens, every job's
    tokens (its attempts', then its reconciliations') increase, and no
    payment is charged twice."""

    @initialize(count=st.integers(2, 64), data=st.data())
    def name_the_shard(self, count: int, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, count - 1))
        assert self.cluster.one(SetShard(index, count)) == Ack()
        self.shard = (index, count)

    @invariant()
    def tokens_are_the_shards(self) -> None:
        index, count = getattr(self, "shard", (0, 1))
        state = self.cluster.state
        assert all(token % count == index for token in tokens_of(state))
        for lease in (*self.workers.values(), *self.reconcilers.values()):
            assert lease.fencing_token % count == index
        assert state_digest(decode_state(encode_state(state))) == state_digest(state)


ShardedPayments.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestShardedPayments = ShardedPayments.TestCase


def test_the_jobs_a_schedule_fires_name_their_shard() -> None:
    """An occurrence's job id is derived from the occurrence (the same on
    every replica); in shard k >= 1 it is `job<k>_...`, as the node draws
    ids there, so a request for the job is routed to its shard. Without a
    shard (and in shard 0) it is `job_...`, as before."""

    def fired(shard_command: SetShard | None) -> str:
        cluster = Cluster()
        if shard_command is not None:
            cluster.run(shard_command)
        spec = ScheduleSpec(id="s1", job=JobSpec("q"), interval_ms=60_000)
        cluster.run(CreateSchedule(spec))
        result = cluster.one(TriggerSchedule("s1"))
        assert isinstance(result, OccurrenceDecided) and result.job_id is not None
        return result.job_id

    plain, zero, two = fired(None), fired(SetShard(0, 3)), fired(SetShard(2, 3))
    assert plain.startswith("job_") and zero == plain
    assert two == "job2_" + plain.removeprefix("job_")
