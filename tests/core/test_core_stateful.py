"""Random command sequences against a deliberately simple reference model.

The model knows only statuses, lease tokens and expiries, due times and a
few counters, with fixed backoff and no jitter so that it can predict every
outcome. After every step the real state must agree with it and pass
`check_invariants`; tokens and epochs must never decrease.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from raftsched.core import (
    apply_entry,
    check_invariants,
    decode_state,
    encode_state,
    get_job,
    job_trace,
    new_state,
    next_due_ms,
)
from raftsched.core.jobs.commands import (
    CancelJob,
    ClaimJobs,
    ClaimJobsOfKinds,
    CompleteJob,
    ConfigureWheel,
    FailJob,
    HeartbeatJob,
    RecordEffect,
    ReplayJob,
    StartJob,
    SubmitJobs,
)
from raftsched.core.kernel import wheel
from raftsched.core.kernel.commands import (
    Backoff,
    Barrier,
    Command,
    Entry,
    FailureKind,
    JobSpec,
    RaiseClusterVersion,
    TakeOver,
    Tick,
)
from raftsched.core.kernel.results import (
    CancelAccepted,
    Claimed,
    Completed,
    EffectRecorded,
    Failed,
    HeartbeatAccepted,
    Rejected,
    Result,
    Started,
    Submitted,
)

BACKOFF_MS = 100
# Trace contexts a submission may carry (cluster version 8): kept beside the
# job, no part of its idempotency key's request.
TRACEPARENTS = (
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
)
QUEUED = {"scheduled", "pending", "retry_wait"}
LEASED = {"claimed", "running"}
FINAL = {"succeeded", "dead_letter", "cancelled"}


@dataclass
class ModelJob:
    seq: int
    priority: int
    max_attempts: int
    status: str
    due_ms: int | None = None
    token: int | None = None
    expires_ms: int = 0
    lease_ms: int = 0
    attempts_made: int = 0
    cancel_requested: bool = False
    success_token: int | None = None
    # token -> kind of the fail that ended that attempt (a repeat replays it)
    failed_kinds: dict[int, str] = field(default_factory=dict)
    kind: str | None = None  # the job's kind (KindsMachine)


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = new_state()
        self.now_ms = 1_000
        self.epoch = 1
        self.jobs: dict[str, ModelJob] = {}
        self.keys: dict[str, tuple[str, JobSpec]] = {}
        self.traces: dict[str, tuple[str, None] | None] = {}  # job -> its trace context
        self.effects: dict[str, tuple[str, int]] = {}  # key -> (job, token) that wrote it
        self.last_token = 0  # the token counter
        # The shard this state is (kernel.shard): (0, 1) while unset, when a
        # token is the counter itself; else counter * count + index.
        self.shard = (0, 1)
        self.grants: list[tuple[str, int]] = []
        self.submissions: list[SubmitJobs] = []
        self.seen_token = 0
        self.seen_epoch = 0
        self.apply(TakeOver())  # the first leader's first entry

    def apply(self, command: Command, epoch: int | None = None) -> Result:
        entry = Entry(self.epoch if epoch is None else epoch, self.now_ms, (command,))
        (result,) = apply_entry(self.state, entry)
        return result

    # -- time and epochs -------------------------------------------------

    @rule(step_ms=st.integers(0, 1_500))
    def time_passes(self, step_ms: int) -> None:
        self.now_ms += step_ms
        assert self.apply(Barrier()) is not None

    @rule(back_ms=st.integers(1, 1_000))
    def a_clock_runs_behind(self, back_ms: int) -> None:
        entry = Entry(self.epoch, self.now_ms - back_ms, (Barrier(),))
        apply_entry(self.state, entry)
        assert self.state.now_ms == self.now_ms

    @rule()
    def new_leader(self) -> None:
        self.epoch += 1
        for job in self.jobs.values():
            if job.token is not None:
                job.expires_ms = max(job.expires_ms, self.now_ms + job.lease_ms)
        self.apply(TakeOver())

    @rule()
    def deposed_leader_claims(self) -> None:
        result = self.apply(ClaimJobs("old", ("q",), 5), epoch=self.epoch - 1)
        assert isinstance(result, Rejected) and result.code == "stale_epoch"

    # -- submissions ------------------------------------------------------

    @rule(
        priority=st.integers(-2, 2),
        delay_ms=st.sampled_from([None, 0, 500]),
        max_attempts=st.integers(1, 3),
        key=st.sampled_from([None, None, "a", "b"]),
        payload=st.sampled_from([b"\x01", b"\x02"]),
        lease_ms=st.sampled_from([200, 1_000]),
        traceparent=st.sampled_from([None, None, *TRACEPARENTS]),
    )
    def submit(
        self, priority: int, delay_ms: int | None, max_attempts: int, key: str | None,
        payload: bytes, lease_ms: int, kind: str | None = None,
        traceparent: str | None = None,
    ) -> None:  # fmt: skip
        spec = JobSpec(
            "q", payload=payload, priority=priority, delay_ms=delay_ms, max_attempts=max_attempts,
            backoff=Backoff(BACKOFF_MS, BACKOFF_MS, 0), lease_ms=lease_ms, idempotency_key=key,
            kind=kind,
        )  # fmt: skip
        traced = replace(spec, traceparent=traceparent)  # not part of the request's identity
        job_id = f"job_{self.state.next_seq}_{len(self.submissions)}"
        command = SubmitJobs((traced,), (job_id,))
        self.submissions.append(command)
        (item,) = self._items(self.apply(command))
        if key is not None and key in self.keys:
            original, original_spec = self.keys[key]
            if original_spec == spec:
                assert (item.job_id, item.created) == (original, False)  # type: ignore[union-attr]
                assert job_trace(self.state, original) == self.traces[original]
            else:
                assert isinstance(item, Rejected) and item.code == "idempotency_conflict"
            return
        assert not isinstance(item, Rejected) and item.created
        self.traces[job_id] = None if traceparent is None else (traceparent, None)
        assert job_trace(self.state, job_id) == self.traces[job_id]
        waiting = bool(delay_ms)
        self.jobs[job_id] = ModelJob(
            len(self.jobs), priority, max_attempts, "scheduled" if waiting else "pending",
            due_ms=self.now_ms + delay_ms if waiting and delay_ms else None, kind=kind,
        )  # fmt: skip
        if key is not None:
            self.keys[key] = (job_id, spec)

    @rule(data=st.data())
    def a_submission_is_applied_twice(self, data: st.DataObject) -> None:
        if not self.submissions:
            return
        command = data.draw(st.sampled_from(self.submissions))
        (item,) = self._items(self.apply(command))
        assert isinstance(item, Rejected) or not item.created

    @staticmethod
    def _items(result: Result) -> tuple[object, ...]:
        assert isinstance(result, Submitted)
        return result.items

    # -- the worker protocol ----------------------------------------------

    @rule(n=st.integers(1, 3), lease_ms=st.sampled_from([None, 300]))
    def claim(self, n: int, lease_ms: int | None) -> None:
        self._claimed(ClaimJobs("w", ("q",), n, lease_ms), n, lease_ms, None)

    def _claimed(
        self, claim: ClaimJobs, n: int, lease_ms: int | None, quotas: dict[str | None, int] | None
    ) -> None:
        """Apply a claim; the model grants the best pending jobs (of the
        kinds `quotas` allows, as many as each allows; "*": the others)."""
        result = self.apply(claim)
        assert isinstance(result, Claimed)
        pending = sorted(
            (job for job in self.jobs.items() if job[1].status == "pending"),
            key=lambda item: (-item[1].priority, item[1].seq),
        )
        expected = []
        for job_id, job in pending:
            if len(expected) == n:
                break
            if quotas is not None:
                key = job.kind if job.kind in quotas else "*"
                if quotas.get(key, 0) <= 0:
                    continue
                quotas[key] -= 1
            expected.append(job_id)
        assert [lease.job_id for lease in result.leases] == expected
        for lease in result.leases:
            self.last_token += 1
            index, count = self.shard
            assert lease.fencing_token == self.last_token * count + index
            job = self.jobs[lease.job_id]
            job.status, job.token, job.due_ms = "claimed", lease.fencing_token, None
            job.lease_ms = lease.lease_ms
            job.expires_ms = lease.expires_at_ms
            assert lease.expires_at_ms == self.now_ms + (lease_ms or lease.lease_ms)
            self.grants.append((lease.job_id, lease.fencing_token))

    def _grant(self, data: st.DataObject) -> tuple[str, int] | None:
        if not self.grants:
            return None
        job_id, token = data.draw(st.sampled_from(self.grants))
        return job_id, data.draw(st.sampled_from([token, token, token + 1000]))

    def _fenced(self, result: Result, job_id: str, token: int) -> ModelJob | None:
        """The model job when `token` is current; else None (the caller checks
        for lease_lost or for the replay of a repeated fenced write)."""
        job = self.jobs[job_id]
        if job.token is not None and job.token == token:
            return job
        assert isinstance(result, Rejected | Completed | Failed | EffectRecorded), result
        return None

    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        grant = self._grant(data)
        if grant is None:
            return
        result = self.apply(StartJob(*grant))
        job = self._fenced(result, *grant)
        if job is None:
            assert isinstance(result, Rejected) and result.code == "lease_lost"
            return
        assert isinstance(result, Started)
        job.status = "running"

    @rule(data=st.data(), extend_ms=st.sampled_from([None, 50, 2_000]))
    def heartbeat(self, data: st.DataObject, extend_ms: int | None) -> None:
        grant = self._grant(data)
        if grant is None:
            return
        result = self.apply(HeartbeatJob(*grant, extend_ms=extend_ms))
        job = self._fenced(result, *grant)
        if job is None:
            assert isinstance(result, Rejected) and result.code == "lease_lost"
            return
        job.expires_ms = max(job.expires_ms, self.now_ms + (extend_ms or job.lease_ms))
        assert result == HeartbeatAccepted(grant[0], job.expires_ms, job.cancel_requested)

    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        grant = self._grant(data)
        if grant is None:
            return
        result = self.apply(CompleteJob(*grant))
        job = self._fenced(result, *grant)
        if job is None:
            model = self.jobs[grant[0]]
            if model.status == "succeeded" and model.success_token == grant[1]:
                assert isinstance(result, Completed) and result.replayed
            else:
                assert isinstance(result, Rejected) and result.code == "lease_lost"
            return
        assert isinstance(result, Completed) and not result.replayed
        job.status, job.token, job.success_token = "succeeded", None, grant[1]
        job.attempts_made += 1

    @rule(data=st.data(), kind=st.sampled_from(["transient", "permanent", "unknown", "cancelled"]))
    def fail(self, data: st.DataObject, kind: FailureKind) -> None:
        grant = self._grant(data)
        if grant is None:
            return
        result = self.apply(FailJob(*grant, kind=kind))
        job = self._fenced(result, *grant)
        if job is None:
            model = self.jobs[grant[0]]
            if model.failed_kinds.get(grant[1]) == kind:
                assert isinstance(result, Failed) and result.status == model.status
            else:
                assert isinstance(result, Rejected) and result.code == "lease_lost"
            return
        job.failed_kinds[grant[1]] = kind
        job.token = None
        job.attempts_made += 1
        if kind == "cancelled" or job.cancel_requested:
            job.status = "cancelled"
        elif kind == "permanent" or job.attempts_made >= job.max_attempts:
            job.status = "dead_letter"
        else:
            job.status, job.due_ms = "retry_wait", self.now_ms + BACKOFF_MS
        assert isinstance(result, Failed) and result.status == job.status

    @rule(data=st.data(), key=st.sampled_from(["e1", "e2"]))
    def record_effect(self, data: st.DataObject, key: str) -> None:
        grant = self._grant(data)
        if grant is None:
            return
        result = self.apply(RecordEffect(key, *grant))
        job = self._fenced(result, *grant)
        if job is None:
            if self.effects.get(key) == grant:  # its own record, retried
                assert isinstance(result, EffectRecorded) and result.replayed
            else:
                assert isinstance(result, Rejected) and result.code == "lease_lost"
            return
        assert isinstance(result, EffectRecorded)
        assert result.replayed == (key in self.effects)
        self.effects.setdefault(key, grant)

    # -- operators ---------------------------------------------------------

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        if not self.jobs:
            return
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        job = self.jobs[job_id]
        result = self.apply(CancelJob(job_id))
        if job.status in FINAL and job.status != "dead_letter":
            assert isinstance(result, Rejected) and result.code == "invalid_state"
        elif job.status in LEASED:
            job.cancel_requested = True
            assert result == CancelAccepted(job_id, job.status, True)
        else:
            job.status, job.due_ms = "cancelled", None
            assert isinstance(result, CancelAccepted) and result.status == "cancelled"

    @rule(data=st.data())
    def replay(self, data: st.DataObject) -> None:
        if not self.jobs:
            return
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        job = self.jobs[job_id]
        result = self.apply(ReplayJob(job_id))
        if job.status != "dead_letter":
            assert isinstance(result, Rejected) and result.code == "invalid_state"
            return
        job.status, job.attempts_made, job.cancel_requested = "pending", 0, False

    @rule()
    def tick(self) -> None:
        result = self.apply(Tick(seed=7))
        assert not isinstance(result, Rejected)
        for job in sorted(self.jobs.values(), key=lambda job: job.seq):
            if job.token is not None and job.expires_ms <= self.now_ms:
                self._expire(job)
        for job in self.jobs.values():
            waiting = job.status in ("scheduled", "retry_wait")
            if waiting and job.due_ms is not None and job.due_ms <= self.now_ms:
                job.status = "pending"
        assert not result.more

    def _expire(self, job: ModelJob) -> None:
        job.token = None
        if job.cancel_requested:
            job.attempts_made += job.status == "running"  # it ran: the attempt counts
            job.status = "cancelled"
        elif job.status == "claimed":
            job.status = "pending"
        else:
            job.attempts_made += 1
            if job.attempts_made >= job.max_attempts:
                job.status = "dead_letter"
            else:
                job.status, job.due_ms = "retry_wait", self.now_ms + BACKOFF_MS

    # -- invariants ----------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        assert check_invariants(self.state) == []
        for job_id, model in self.jobs.items():
            job = get_job(self.state, job_id)  # live, or packed in the time wheel
            assert job is not None, job_id
            assert job.status == model.status, job_id
            assert (job.lease.fencing_token if job.lease else None) == model.token
            assert job.attempts_made == model.attempts_made
            if model.token is not None:
                assert job.lease is not None and job.lease.expires_at_ms == model.expires_ms
        assert self.state.last_fencing_token == self.last_token >= self.seen_token
        assert self.state.epoch == self.epoch >= self.seen_epoch
        self.seen_token, self.seen_epoch = self.last_token, self.epoch


CoreMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCoreMachine = CoreMachine.TestCase


class WheelMachine(CoreMachine):
    """The same model with the time wheel on (cluster version 7, a 2 s
    horizon in 1 s buckets): far submissions are packed, and operator
    commands, repeats by key, Ticks and snapshots meet packed jobs."""

    def __init__(self) -> None:
        super().__init__()
        assert self.apply(RaiseClusterVersion(7)) is not None
        assert not isinstance(self.apply(ConfigureWheel(2_000, 1_000)), Rejected)

    @rule(
        delay_ms=st.sampled_from([4_000, 6_500, 20_000]),
        key=st.sampled_from([None, "a", "c"]),
        payload=st.sampled_from([b"\x01", b"\x02"]),
        traceparent=st.sampled_from([None, TRACEPARENTS[0]]),
    )
    def submit_far(
        self, delay_ms: int, key: str | None, payload: bytes, traceparent: str | None
    ) -> None:
        self.submit(0, delay_ms, 2, key, payload, 1_000, traceparent=traceparent)

    @rule(step_ms=st.integers(1_000, 8_000))
    def much_time_passes(self, step_ms: int) -> None:
        self.time_passes(step_ms)

    @rule()
    def a_replica_restarts_from_a_snapshot(self) -> None:
        data = encode_state(self.state)
        self.state = decode_state(data)
        assert encode_state(self.state) == data


WheelMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestWheelMachine = WheelMachine.TestCase


class PacedWheelMachine(WheelMachine):
    """The same at cluster version 8: hydration is paced (a bucket spread
    over the first half of its 2 s horizon, one chunk or more a Tick), and
    a Tick leaves no bucket packed past its soft deadline."""

    def __init__(self) -> None:
        super().__init__()
        assert self.apply(RaiseClusterVersion(wheel.PACED_HYDRATION_VERSION)) is not None

    @rule(delay_ms=st.sampled_from([3_000, 5_500]), count=st.integers(33, 100))
    def submit_far_many(self, delay_ms: int, count: int) -> None:
        """Enough jobs in one bucket for sealed chunks: several paced Ticks."""
        for _ in range(count):
            self.submit(0, delay_ms, 2, None, b"\x01", 1_000)

    @rule(ticks=st.integers(1, 12))
    def the_leader_ticks_when_due(self, ticks: int) -> None:
        """Ticks as the leader proposes them: at `next_due_ms` (one a pace
        step while a bucket is paced)."""
        for _ in range(ticks):
            due_ms = next_due_ms(self.state)
            if due_ms is None:
                return
            if due_ms > self.now_ms:
                self.time_passes(min(due_ms - self.now_ms, 1_500))
            self.tick()

    @rule()
    def tick(self) -> None:
        super().tick()
        packed = wheel.wheel_of(self.state)
        for number in packed.order:
            assert wheel.soft_deadline_ms(packed, number) > self.now_ms, number


PacedWheelMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPacedWheelMachine = PacedWheelMachine.TestCase


class KindsMachine(WheelMachine):
    """The same model with job kinds (cluster version 8): jobs of kinds
    beside jobs without one, in lanes of their own, claimed by plain claims
    (any kind, as one lane would) and by claims of kinds with caps, through
    Ticks, expiries, replays, far submissions and snapshot restarts."""

    def __init__(self) -> None:
        super().__init__()
        assert self.apply(RaiseClusterVersion(8)) is not None

    @rule(
        kind=st.sampled_from(["a", "b", "c"]),
        priority=st.integers(-2, 2),
        delay_ms=st.sampled_from([None, 0, 500, 6_500]),
        key=st.sampled_from([None, None, "a", "k"]),
    )
    def submit_of_kind(
        self, kind: str, priority: int, delay_ms: int | None, key: str | None
    ) -> None:
        self.submit(priority, delay_ms, 2, key, b"\x01", 1_000, kind)

    @rule(
        n=st.integers(1, 4),
        quotas=st.dictionaries(
            st.sampled_from([None, "a", "b", "c", "*"]), st.integers(0, 3), min_size=1
        ),
    )
    def claim_of_kinds(self, n: int, quotas: dict[str | None, int]) -> None:
        caps = {kind: min(cap, n) for kind, cap in quotas.items()}
        claim = ClaimJobsOfKinds("w", ("q",), n, None, tuple(caps.items()))
        self._claimed(claim, n, None, dict(caps))


KindsMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestKindsMachine = KindsMachine.TestCase
