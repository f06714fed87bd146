"""Flow limits and ordering keys hold across workers and a leader SIGKILL,
checked afterwards from the replicated history (every attempt's claim and end
times in replicated time, with its fencing token)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from raftsched.client import Client, OutcomeUnknown, RaftschedError
from raftsched.testing import LocalCluster

CONCURRENCY = 3
RATE_PER_S = 20
BURST = 4
LIMITED_JOBS = 90
KEYS = ("acct_1", "acct_2", "acct_3")
JOBS_PER_KEY = 8


def _worker(urls: list[str], name: str, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    with Client(urls, timeout_s=5, retry_budget_s=20) as client:
        while not stop.is_set():
            try:
                leases = client.claim(name, ["lim", "ord"], max_jobs=3, wait_s=0.5, lease_s=1.5)
                for lease in leases:
                    job_id, token = lease["job_id"], lease["fencing_token"]
                    if rng.random() < 0.1:
                        continue  # a worker crash: the lease expires
                    client.start(job_id, token)
                    time.sleep(rng.uniform(0.0, 0.05))
                    client.complete(job_id, token, {"by": name})
            except RaftschedError:
                time.sleep(0.1)  # lease lost, failover in progress: carry on


def _read(read: Callable[[], Any]) -> Any:
    """Reads are safe to repeat; during a failover their answer may be lost."""
    for _ in range(50):
        try:
            return read()
        except OutcomeUnknown:
            time.sleep(0.2)
    return read()


def _attempts(client: Client, queue: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    jobs = _read(lambda: client.list_jobs(queue=queue, limit=1000))["jobs"]
    return [(job, attempt) for job in jobs for attempt in job["attempts"]]


def _ms(text: str) -> int:
    from raftsched.timefmt import parse_ms

    return parse_ms(text)


def _check_concurrency(attempts: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    events: list[tuple[int, int]] = []
    for _, attempt in attempts:
        events.append((_ms(attempt["claimed_at"]), 1))
        assert attempt["ended_at"] is not None
        events.append((_ms(attempt["ended_at"]), -1))
    running = 0
    for _, change in sorted(events):  # an end sorts before a start at the same instant
        running += change
        assert running <= CONCURRENCY


def _check_rate(attempts: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    claimed = sorted(_ms(attempt["claimed_at"]) for _, attempt in attempts)
    for first in range(len(claimed)):
        for last in range(first, len(claimed)):
            window_ms = claimed[last] - claimed[first]
            allowed = BURST + RATE_PER_S * window_ms / 1000
            assert last - first + 1 <= allowed + 1e-9, (first, last, window_ms)


def _check_ordering(attempts: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    for key in KEYS:
        mine = [(job, attempt) for job, attempt in attempts if job["ordering_key"] == key]
        mine.sort(key=lambda pair: pair[1]["fencing_token"])
        previous_end = 0
        previous_created = ""
        for job, attempt in mine:
            # Starts follow submission order and never overlap the previous attempt.
            assert job["created_at"] >= previous_created
            assert _ms(attempt["claimed_at"]) >= previous_end
            previous_end = _ms(attempt["ended_at"])
            previous_created = job["created_at"]
        assert len({job["id"] for job, _ in mine}) == JOBS_PER_KEY


@pytest.mark.slow
def test_limits_and_ordering_hold_across_a_leader_kill(
    cluster: LocalCluster, client: Client
) -> None:
    client.set_queue("lim", concurrency_limit=CONCURRENCY, rate_limit_per_s=RATE_PER_S, burst=BURST)
    client.submit_batch(
        [{"queue": "lim", "payload": i, "max_attempts": 50} for i in range(LIMITED_JOBS)]
    )
    for index in range(JOBS_PER_KEY):
        client.submit_batch(
            [
                {"queue": "ord", "ordering_key": key, "payload": index, "max_attempts": 50}
                for key in KEYS
            ]
        )
    stop = threading.Event()
    workers = [
        threading.Thread(target=_worker, args=(cluster.urls, f"w{i}", stop, i), daemon=True)
        for i in range(4)
    ]
    for worker in workers:
        worker.start()
    try:
        time.sleep(2.0)
        leader = cluster.wait_for_leader()
        cluster.kill(leader)
        cluster.wait_for_leader(timeout_s=30, exclude=leader)
        time.sleep(1.0)
        cluster.restart(leader)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            done = _read(lambda: client.list_jobs(status="succeeded", limit=1000))["jobs"]
            if len(done) == LIMITED_JOBS + len(KEYS) * JOBS_PER_KEY:
                break
            time.sleep(0.5)
    finally:
        stop.set()
        for worker in workers:
            worker.join(10)
    succeeded = _read(lambda: client.list_jobs(status="succeeded", limit=1000))["jobs"]
    assert len(succeeded) == LIMITED_JOBS + len(KEYS) * JOBS_PER_KEY
    limited = _attempts(client, "lim")
    _check_concurrency(limited)
    _check_rate(limited)
    _check_ordering(_attempts(client, "ord"))
    cluster.wait_converged()


def _attempt(claimed_ms: int, ended_ms: int, token: int) -> dict[str, Any]:
    from raftsched.timefmt import format_ms

    return {
        "claimed_at": format_ms(claimed_ms),
        "ended_at": format_ms(ended_ms),
        "fencing_token": token,
    }


def test_the_history_checkers_catch_violations() -> None:
    """The checks above would fail on a history that breaks the limits."""
    base = 1_800_000_000_000
    job: dict[str, Any] = {"ordering_key": None, "created_at": "", "id": "j"}
    overlapping = [(job, _attempt(base + i, base + 100, i)) for i in range(CONCURRENCY + 1)]
    with pytest.raises(AssertionError):
        _check_concurrency(overlapping)
    _check_concurrency(overlapping[:CONCURRENCY])
    too_fast = [(job, _attempt(base + i, base + i + 1, i)) for i in range(BURST + 1)]
    with pytest.raises(AssertionError):
        _check_rate(too_fast)
    _check_rate(too_fast[:BURST])
    first = {"ordering_key": KEYS[0], "created_at": "2", "id": "a"}
    second = {"ordering_key": KEYS[0], "created_at": "1", "id": "b"}
    with pytest.raises(AssertionError):  # a later job started first
        _check_ordering(
            [(first, _attempt(base, base + 5, 1)), (second, _attempt(base + 9, base + 9, 2))]
        )
