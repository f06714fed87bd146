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
    FailJob,
    HeartbeatJob,
    RecordEffect,
    ReplayJob,
    StartJob,
    SubmitJobs,
)
from raftsched.core.kernel.commands import Backoff, Barrier, Command, Entry, JobSpec, Tick
from raftsched.core.kernel.results import Claimed, Result
from raftsched.core.kernel.state import State


def _random_command(rng: random.Random, state: State, tokens: list[tuple[str, int]]) -> Command:
    roll = rng.random()
    job_ids = list(state.jobs)
    if roll < 0.25 or not job_ids:
        count = rng.randint(1, 4)
        specs = tuple(
            JobSpec(
                rng.choice(["a", "b"]),
                payload=bytes([rng.randrange(3)]),
                priority=rng.randint(-1, 1),
                delay_ms=rng.choice([None, 0, 300, 2_000]),
                max_attempts=rng.randint(1, 3),
                backoff=Backoff(100, 1_000, 500),
                lease_ms=rng.choice([200, 1_000]),
                deadline_ms=rng.choice([None, None, 5_000]),
                idempotency_key=rng.choice([None, None, "k1", "k2", "k3"]),
            )
            for _ in range(count)
        )
        ids = tuple(f"job_{rng.getrandbits(40):x}" for _ in range(count))
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


def _random_log(seed: int, length: int) -> list[bytes]:
    """Drive a state with random commands, recording the encoded entries."""
    rng = random.Random(seed)
    state = new_state()
    tokens: list[tuple[str, int]] = []
    log = []
    now_ms, epoch = 10_000, 1
    for _ in range(length):
        now_ms += rng.choice([0, 10, 100, 700])
        if rng.random() < 0.05:
            epoch += 1
        entry_epoch = epoch - 1 if rng.random() < 0.03 else epoch
        entry_now = now_ms - 50 if rng.random() < 0.05 else now_ms
        commands = tuple(_random_command(rng, state, tokens) for _ in range(rng.randint(1, 3)))
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


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_same_log_gives_the_same_bytes(seed: int) -> None:
    log = _random_log(seed, 400)
    first, first_results = _replay(log)
    second, second_results = _replay(log)
    assert check_invariants(first) == []
    assert first_results == second_results
    assert encode_state(first) == encode_state(second)
    assert len(first.jobs) > 10


@pytest.mark.parametrize("seed", [4, 5])
def test_a_snapshot_in_the_middle_changes_nothing(seed: int) -> None:
    log = _random_log(seed, 400)
    whole, whole_results = _replay(log)
    for split in (50, 200, 333):
        head, head_results = _replay(log[:split])
        resumed = decode_state(encode_state(head))
        assert check_invariants(resumed) == []
        tail, tail_results = _replay(log[split:], resumed)
        assert head_results + tail_results == whole_results
        assert encode_state(tail) == encode_state(whole)
