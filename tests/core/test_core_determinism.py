"""The same log gives byte-identical states, with or without a snapshot in the middle."""

from __future__ import annotations

import random

import pytest

from raftsched.core import (
    apply_encoded,
    apply_entry,
    check_invariants,
    decode_state,
    encode_entry,
    encode_state,
    new_state,
)
from raftsched.core.jobs.commands import (
    CancelJob,
    ClaimJobs,
    CompleteJob,
    Configure,
    ConfigureWheel,
    FailJob,
    HeartbeatJob,
    RecordEffect,
    ReplayJob,
    StartJob,
    SubmitJobs,
)
from raftsched.core.kernel.commands import (
    Backoff,
    Barrier,
    Command,
    Entry,
    JobSpec,
    RaiseClusterVersion,
    Tick,
)
from raftsched.core.kernel.results import Claimed, Result
from raftsched.core.kernel.state import State


def _random_command(
    rng: random.Random,
    state: State,
    tokens: list[tuple[str, int]],
    far: bool = False,
    submitted: list[str] | None = None,
) -> Command:
    """With `far`, some jobs are due beyond the time wheel's horizon (packed)
    and operator commands also pick jobs that may still be packed."""
    roll = rng.random()
    job_ids = list(state.jobs)
    if far and submitted and rng.random() < 0.5:
        job_ids = submitted
    if roll < 0.25 or not job_ids:
        count = rng.randint(1, 4)
        specs = tuple(
            JobSpec(
                rng.choice(["a", "b"]),
                payload=bytes([rng.randrange(3)]),
                priority=rng.randint(-1, 1),
                delay_ms=rng.choice(
                    [None, 0, 300, 2_000, 8_000, 30_000, 90_000] if far else [None, 0, 300, 2_000]
                ),
                max_attempts=rng.randint(1, 3),
                backoff=Backoff(100, 1_000, 500),
                lease_ms=rng.choice([200, 1_000]),
                deadline_ms=rng.choice([None, None, 5_000]),
                idempotency_key=rng.choice([None, None, "k1", "k2", "k3"]),
            )
            for _ in range(count)
        )
        ids = tuple(f"job_{rng.getrandbits(40):x}" for _ in range(count))
        if submitted is not None:
            submitted.extend(ids)
        return SubmitJobs(specs, ids)
    if roll < 0.4:
        return ClaimJobs("w", ("a", "b"), rng.randint(1, 3))
    if roll < 0.7 and tokens:
        job_id, token = rng.choice(tokens)
        token += rng.choice([0, 0, 0, 1])
        return rng.choice(
            [
                StartJob(job_id, token),
                HeartbeatJob(job_id, token, rng.choice([None, 3_000])),
                CompleteJob(job_id, token, b"\x01"),
                FailJob(
                    job_id,
                    token,
                    rng.choice(["transient", "unknown", "permanent"]),
                    random_u32=rng.getrandbits(32),
                ),
                RecordEffect(rng.choice(["e1", "e2", "e3"]), job_id, token),
            ]
        )
    if roll < 0.8:
        return Tick(seed=rng.getrandbits(64), max_items=rng.choice([1, 2, 100]))
    if roll < 0.9:
        job_id = rng.choice(job_ids)
        return rng.choice([CancelJob(job_id), ReplayJob(job_id)])
    return rng.choice([Configure(retention_ms=rng.choice([500, 3_000])), Barrier()])


def _random_log(seed: int, length: int, far: bool = False) -> list[bytes]:
    """Drive a state with random commands, recording the encoded entries.
    With `far`, the cluster runs version 7 with a 5 s horizon in 1 s buckets
    and a good part of the jobs go into the time wheel."""
    rng = random.Random(seed)
    state = new_state()
    tokens: list[tuple[str, int]] = []
    submitted: list[str] = []
    log = []
    now_ms, epoch = 10_000, 1
    if far:
        entry = Entry(epoch, now_ms, (RaiseClusterVersion(7), ConfigureWheel(5_000, 1_000)))
        log.append(encode_entry(entry))
        apply_entry(state, entry)
    for _ in range(length):
        now_ms += rng.choice([0, 10, 100, 700])
        if rng.random() < 0.05:
            epoch += 1
        entry_epoch = epoch - 1 if rng.random() < 0.03 else epoch
        entry_now = now_ms - 50 if rng.random() < 0.05 else now_ms
        commands = tuple(
            _random_command(rng, state, tokens, far, submitted) for _ in range(rng.randint(1, 3))
        )
        entry = Entry(entry_epoch, entry_now, commands)
        data = encode_entry(entry)
        log.append(data)
        for result in apply_entry(state, entry):
            if isinstance(result, Claimed):
                tokens.extend((lease.job_id, lease.fencing_token) for lease in result.leases)
    return log


def _replay(log: list[bytes], state: State | None = None) -> tuple[State, list[list[Result]]]:
    state = new_state() if state is None else state
    results = [apply_encoded(state, data) for data in log]
    return state, results


@pytest.mark.parametrize(("seed", "far"), [(1, False), (2, False), (3, False), (8, True)])
def test_the_same_log_gives_the_same_bytes(seed: int, far: bool) -> None:
    log = _random_log(seed, 400, far)
    first, first_results = _replay(log)
    second, second_results = _replay(log)
    assert check_invariants(first) == []
    assert first_results == second_results
    assert encode_state(first) == encode_state(second)
    assert len(first.jobs) > 10


@pytest.mark.parametrize(("seed", "far"), [(4, False), (5, False), (6, True), (7, True)])
def test_a_snapshot_in_the_middle_changes_nothing(seed: int, far: bool) -> None:
    log = _random_log(seed, 400, far)
    whole, whole_results = _replay(log)
    for split in (50, 200, 333):
        head, head_results = _replay(log[:split])
        resumed = decode_state(encode_state(head))
        assert check_invariants(resumed) == []
        tail, tail_results = _replay(log[split:], resumed)
        assert head_results + tail_results == whole_results
        assert encode_state(tail) == encode_state(whole)


def test_far_logs_pack_and_hydrate_jobs() -> None:
    """The far logs above do exercise the wheel: jobs are packed, and some
    are hydrated by the Tick and some by commands that name them."""
    from raftsched.core.kernel import wheel

    log = _random_log(6, 400, far=True)
    state = new_state()
    packed_at_most = 0
    for data in log:
        apply_encoded(state, data)
        packed_at_most = max(packed_at_most, wheel.wheel_of(state).size)
    assert packed_at_most > 5
    assert check_invariants(state) == []
