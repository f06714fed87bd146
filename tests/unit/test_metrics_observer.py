"""The node's Observer: command results in, metrics, log lines and the
on-call views out. Each test builds a real core state, applies real entries,
hands the (commands, results) pairs to the Observer as the proposer would,
and checks the exact figures."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from raftsched.core import State, apply_entry, new_state
from raftsched.core.jobs.commands import (
    CancelJob,
    ClaimJobs,
    CompleteJob,
    FailJob,
    HeartbeatJob,
    LeaseBatch,
    ReplayJob,
    SetUnknownPolicy,
    StartJob,
    SubmitJobs,
)
from raftsched.core.kernel.commands import Backoff, Command, Entry, JobSpec, TakeOver, Tick
from raftsched.core.kernel.results import Claimed, Lease
from raftsched.node.metrics import NodeMetrics
from raftsched.node.observability import Observer, wall_ms
from raftsched.raft import PeerStatus, RaftStatus

T0 = 1_000_000


class Harness:
    def __init__(self, now_ms: int = T0, stuck_after_s: float = 600.0) -> None:
        self.state: State = new_state()
        self.now_ms = now_ms
        self.metrics = NodeMetrics()
        self.raft = RaftStatus("n1", "leader", 3, "n1", 10, 10, ())
        self.observer = Observer(
            "n1", self.metrics, self.reading, lambda: self.raft, stuck_after_s=stuck_after_s
        )
        self.observer.is_leader = lambda: True
        self.ids = 0
        self.run(TakeOver())

    @contextmanager
    def reading(self) -> Iterator[State]:
        yield self.state

    def run(self, *commands: Command, at: int | None = None) -> list[Any]:
        if at is not None:
            self.now_ms = at
        results = apply_entry(self.state, Entry(3, self.now_ms, commands))
        self.observer.observe(list(commands), list(results))
        return results

    def submit(self, **fields: Any) -> str:
        self.ids += 1
        job_id = f"job_{self.ids}"
        self.run(SubmitJobs((JobSpec(**{"queue": "q", **fields}),), (job_id,)))
        return job_id

    def claim(self, at: int | None = None) -> Lease:
        (result,) = self.run(ClaimJobs("w1", ("q",), 1, None), at=at)
        assert isinstance(result, Claimed) and result.leases
        return result.leases[0]

    def metric(self, series: str) -> float:
        """The value of one series, written `name{label="value",...}`."""
        name, _, rest = series.partition("{")
        labels = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        value = self.metrics.registry.get_sample_value(name, labels)
        if value is None:
            raise AssertionError(f"no sample {series}")
        return value

    def render(self) -> str:
        return self.metrics.render().decode()


def test_claim_latency_is_due_to_leased_in_replicated_time() -> None:
    h = Harness()
    h.submit()
    h.claim(at=T0 + 250)
    assert h.metric('raftsched_job_claim_latency_seconds_sum{queue="q"}') == 0.25
    assert h.metric('raftsched_job_claim_latency_seconds_count{queue="q"}') == 1
    assert h.metric('raftsched_job_attempts_total{queue="q"}') == 1
    assert h.metric('raftsched_jobs_submitted_total{queue="q"}') == 1


def test_a_batch_counts_the_jobs_it_created_per_queue() -> None:
    h = Harness()
    specs = (JobSpec("a"), JobSpec("b"), JobSpec("a"), JobSpec("a", idempotency_key="k"))
    h.run(SubmitJobs(specs, ("job_1", "job_2", "job_3", "job_4")))
    h.run(SubmitJobs((JobSpec("a", idempotency_key="k"),), ("job_5",)))  # a repeat
    assert h.metric('raftsched_jobs_submitted_total{queue="a"}') == 3
    assert h.metric('raftsched_jobs_submitted_total{queue="b"}') == 1


def test_claim_latency_of_a_delayed_job_counts_from_its_run_at() -> None:
    h = Harness()
    job_id = h.submit(delay_ms=1_000)
    h.run(Tick(seed=1, max_items=100), at=T0 + 1_400)  # made due late by the tick
    lease = h.claim(at=T0 + 1_500)
    assert h.state.jobs[job_id].run_at_ms == T0 + 1_000
    assert lease.runnable_since_ms == T0 + 1_000
    assert h.metric('raftsched_job_claim_latency_seconds_sum{queue="q"}') == 0.5


def test_execution_latency_failures_and_retries() -> None:
    h = Harness()
    h.submit()
    lease = h.claim(at=T0 + 100)
    h.run(StartJob(lease.job_id, lease.fencing_token), at=T0 + 300)
    h.run(FailJob(lease.job_id, lease.fencing_token, "transient", "flaky", None, 7), at=T0 + 1_300)
    assert h.metric('raftsched_job_execution_seconds_sum{queue="q",outcome="failed"}') == 1.0
    assert h.metric('raftsched_job_failures_total{queue="q",kind="transient"}') == 1
    assert h.metric('raftsched_job_retries_total{queue="q"}') == 1
    (error,) = h.observer.errors_json()
    assert (error["source"], error["kind"], error["job_id"]) == ("attempt", "transient", "job_1")


def test_success_is_counted_once_even_when_the_completion_is_repeated() -> None:
    h = Harness()
    h.submit()
    lease = h.claim()
    h.run(StartJob(lease.job_id, lease.fencing_token), at=T0 + 10)
    complete = CompleteJob(lease.job_id, lease.fencing_token)
    h.run(complete, at=T0 + 2_010)
    h.run(complete, at=T0 + 3_000)  # a retried report: replayed, not counted again
    assert h.metric('raftsched_jobs_succeeded_total{queue="q"}') == 1
    assert h.metric('raftsched_job_execution_seconds_count{queue="q",outcome="succeeded"}') == 1
    assert h.metric('raftsched_job_execution_seconds_sum{queue="q",outcome="succeeded"}') == 2.0


def test_dead_letter_is_counted_logged_with_ids_and_listed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness()
    h.submit(correlation_id="req-7")
    lease = h.claim()
    with caplog.at_level(logging.INFO, logger="raftsched.observe"):
        h.run(FailJob(lease.job_id, lease.fencing_token, "permanent", "bad card", None, 1))
    assert h.metric('raftsched_dead_letters_total{reason="permanent"}') == 1
    (record,) = [r for r in caplog.records if r.getMessage() == "job dead-lettered"]
    assert vars(record)["job_id"] == "job_1"
    assert vars(record)["correlation_id"] == "req-7"
    assert vars(record)["fencing_token"] == lease.fencing_token
    assert vars(record)["epoch"] == 3
    assert [e["source"] for e in h.observer.errors_json()] == ["dead_letter"]


def test_lease_expiry_is_named_in_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    h = Harness()
    h.submit(lease_ms=5_000)
    lease = h.claim()
    with caplog.at_level(logging.INFO, logger="raftsched.observe"):
        h.run(Tick(seed=1, max_items=100), at=T0 + 6_000)
    assert h.metric('raftsched_lease_expirations_total{status="claimed"}') == 1
    (record,) = [r for r in caplog.records if r.getMessage() == "lease expired"]
    assert vars(record)["job_id"] == lease.job_id
    assert vars(record)["fencing_token"] == lease.fencing_token


def test_unknown_outcomes_are_counted_per_queue_whatever_the_policy() -> None:
    h = Harness()
    # Failed `unknown` and retried (the default policy): unknown.
    h.submit(backoff=Backoff(0, 0, 0))
    lease = h.claim()
    h.run(StartJob(lease.job_id, lease.fencing_token))
    h.run(FailJob(lease.job_id, lease.fencing_token, "unknown", "timed out", None, 1))
    assert h.metric('raftsched_unknown_outcomes_total{queue="q"}') == 1
    # Its lease expired while running, the job reconciled: unknown.
    lease = h.claim()
    h.run(StartJob(lease.job_id, lease.fencing_token))
    h.run(SetUnknownPolicy("queue", "q", "reconcile"))
    h.run(Tick(seed=1, max_items=100), at=lease.expires_at_ms)
    assert h.state.jobs[lease.job_id].status == "reconciling"
    assert h.metric('raftsched_unknown_outcomes_total{queue="q"}') == 2
    # Expired before start, or cancelled while it ran: not unknown.
    other = h.submit(queue="q2", lease_ms=1_000)
    (claimed,) = h.run(ClaimJobs("w1", ("q2",), 1, None))
    h.run(Tick(seed=1, max_items=100), at=claimed.leases[0].expires_at_ms)
    (claimed,) = h.run(ClaimJobs("w1", ("q2",), 1, None))
    token = claimed.leases[0].fencing_token
    h.run(StartJob(other, token), CancelJob(other))
    h.run(FailJob(other, token, "unknown", "stopped", None, 1))
    assert h.state.jobs[other].status == "cancelled"
    assert 'raftsched_unknown_outcomes_total{queue="q2"}' not in h.render()


def test_replay_writes_an_audit_line_with_actor_and_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness()
    h.submit()
    lease = h.claim()
    h.run(FailJob(lease.job_id, lease.fencing_token, "permanent", "x", None, 1))
    with caplog.at_level(logging.INFO, logger="raftsched.observe"):
        h.run(ReplayJob(lease.job_id, "fixed the card", actor="dashboard"))
    assert h.metric("raftsched_replays_total") == 1
    (record,) = [r for r in caplog.records if r.getMessage().startswith("audit: job replayed")]
    assert (vars(record)["actor"], vars(record)["reason"]) == ("dashboard", "fixed the card")


def test_a_running_job_without_progress_becomes_stuck() -> None:
    h = Harness(now_ms=wall_ms(), stuck_after_s=0.2)
    h.submit()
    lease = h.claim()
    h.run(StartJob(lease.job_id, lease.fencing_token))
    assert h.observer.stuck_jobs() == []
    h.run(HeartbeatJob(lease.job_id, lease.fencing_token, None, b"\x01"))
    assert h.observer.stuck_jobs() == []
    # Progress seen long ago, and the job started long ago: stuck.
    h.observer._progress[lease.job_id].changed_ms -= 1_000
    h.state.jobs[lease.job_id].attempts[-1].started_at_ms -= 1_000  # type: ignore[operator]
    (stuck,) = h.observer.stuck_jobs()
    assert stuck["job_id"] == lease.job_id and stuck["quiet_s"] >= 1.0
    assert h.metric("raftsched_jobs_stuck") == 1
    assert h.metric("raftsched_lease_renewals_total") == 1


def test_stuck_gauge_is_exported_by_the_leader_only() -> None:
    h = Harness()
    h.observer.is_leader = lambda: False
    samples = [line for line in h.render().splitlines() if not line.startswith("#")]
    assert not any(line.startswith("raftsched_jobs_stuck") for line in samples)


def test_leader_history_records_changes_and_loss(caplog: pytest.LogCaptureFixture) -> None:
    h = Harness()
    h.observer.sample_leader()
    h.observer.sample_leader()  # no change, no entry
    h.raft = RaftStatus("n1", "follower", 4, None, 10, 10, ())
    with caplog.at_level(logging.INFO, logger="raftsched.observe"):
        h.observer.sample_leader()
    h.raft = RaftStatus("n1", "follower", 4, "n2", 10, 10, ())
    h.observer.sample_leader()
    history = h.observer.history_json()
    assert [(c["leader_id"], c["previous_id"]) for c in history] == [
        ("n2", None),
        (None, "n1"),
        ("n1", None),
    ]
    assert h.metric("raftsched_raft_leader_changes_observed_total") == 2
    assert any(r.getMessage() == "leader lost" for r in caplog.records)


def test_follower_lag_is_commit_minus_match_on_the_leader() -> None:
    h = Harness()
    h.raft = RaftStatus(
        "n1",
        "leader",
        3,
        "n1",
        50,
        50,
        (PeerStatus("n2", "a:1", True, 50), PeerStatus("n3", "a:2", False, 38)),
    )
    assert h.metric('raftsched_raft_follower_lag_entries{node="n3"}') == 12
    assert h.metric('raftsched_raft_follower_lag_entries{node="n2"}') == 0


def test_clock_skew_is_peer_clock_minus_midpoint_of_the_round_trip() -> None:
    h = Harness()

    async def fetch(url: str) -> float:
        return float(wall_ms() + 250) if "n2" in url else float(wall_ms() - 40)

    asyncio.run(h.observer.measure_skew({"n2": "http://n2", "n3": "http://n3"}, fetch))
    skew = {s["node_id"]: s["skew_ms"] for s in h.observer.skew_json()}
    assert skew["n1"] == 0
    assert abs(skew["n2"] - 250) < 20 and abs(skew["n3"] + 40) < 20

    async def down(url: str) -> float:
        raise OSError("unreachable")

    asyncio.run(h.observer.measure_skew({"n2": "http://n2"}, down))
    assert "n2" not in {s["node_id"] for s in h.observer.skew_json()}


def test_metric_names_follow_prometheus_conventions() -> None:
    h = Harness()
    h.submit()
    lease = h.claim()
    h.run(FailJob(lease.job_id, lease.fencing_token, "permanent", "x", None, 1))
    text = h.render()
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            _, _, name, kind = line.split()
            assert name.startswith("raftsched_")
            assert (kind == "counter") == name.endswith("_total"), name
            if kind == "histogram" and name != "raftsched_raft_entry_commands":
                assert name.endswith("_seconds"), name  # base units; the other counts commands
    # Bounded label sets: no job ids in labels.
    assert "job_1" not in text


def test_worker_log_fields_carry_the_submitters_correlation_id() -> None:
    from raftsched.worker._context import Lease as WorkerLease
    from raftsched.worker._context import log_fields

    lease = WorkerLease.from_json(
        {
            "job_id": "job_9",
            "attempt": 2,
            "epoch": 4,
            "fencing_token": 77,
            "queue": "q",
            "correlation_id": "req-abc",
            "workflow_id": "wf_1",
            "step": "charge",
        },
        30.0,
    )
    assert log_fields(lease) == {
        "job_id": "job_9",
        "attempt": 2,
        "epoch": 4,
        "fencing_token": 77,
        "queue": "q",
        "correlation_id": "req-abc",
        "workflow_id": "wf_1",
        "step": "charge",
    }


def test_a_lease_batchs_ops_and_claim_count_as_if_they_came_alone() -> None:
    """The same figures as test_execution_latency_failures_and_retries and
    test_claim_latency_is_due_to_leased_in_replicated_time, reached through
    lease batches: starts, a heartbeat, a completion, a fail, and the claim
    that rides on them; a refused op and a refused batch count nothing."""
    h = Harness()
    for _ in range(3):
        h.submit()
    first, second = h.claim(at=T0 + 100), h.claim(at=T0 + 100)
    h.run(
        LeaseBatch(
            (
                StartJob(first.job_id, first.fencing_token),
                StartJob(second.job_id, second.fencing_token),
                CancelJob(first.job_id),  # not a lease operation: refused in its slot
            )
        ),
        at=T0 + 300,
    )
    h.run(
        LeaseBatch(
            (
                HeartbeatJob(first.job_id, first.fencing_token, 1_000, b"\x01"),
                CompleteJob(first.job_id, first.fencing_token),
                FailJob(second.job_id, second.fencing_token, "transient", "flaky", None, 7),
            ),
            ClaimJobs("w1", ("q",), 1),
        ),
        LeaseBatch(()),  # refused whole
        at=T0 + 1_300,
    )
    assert h.metric("raftsched_lease_renewals_total") == 1
    assert h.metric('raftsched_jobs_succeeded_total{queue="q"}') == 1
    assert h.metric('raftsched_job_execution_seconds_sum{queue="q",outcome="succeeded"}') == 1.0
    assert h.metric('raftsched_job_execution_seconds_sum{queue="q",outcome="failed"}') == 1.0
    assert h.metric('raftsched_job_failures_total{queue="q",kind="transient"}') == 1
    assert h.metric('raftsched_job_retries_total{queue="q"}') == 1
    # Two claimed alone, the third by the batch's claim.
    assert h.metric('raftsched_job_attempts_total{queue="q"}') == 3
    assert h.metric('raftsched_job_claim_latency_seconds_count{queue="q"}') == 3
    assert h.state.jobs["job_3"].status == "claimed"
    (error,) = h.observer.errors_json()
    assert (error["source"], error["kind"], error["job_id"]) == ("attempt", "transient", "job_2")
