"""Counts of every shard as one (api.shard_counts): what is counted is summed,
what is configured is group 0's, lists are merged and cut, buckets are
aligned, and /metrics labels each process's series with its shard."""

from __future__ import annotations

import subprocess
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from raftsched.api.shard_counts import (
    labelled_metrics,
    merge_named,
    merge_overview,
    merge_queue,
    merge_report,
    merge_series,
    merge_tenant,
)


def _queue(name: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "depth": 0,
        "running": 0,
        "oldest_runnable_at": None,
        "oldest_runnable_age_s": None,
        "paused": False,
        "rate_limit_per_s": None,
        "burst": None,
        "tokens": None,
        "concurrency_limit": None,
        "circuit": None,
        "throttled": 0,
        "blocked_keys": 0,
        "on_unknown": "retry",
        "reconciling": 0,
    }
    body.update(fields)
    return body


def test_a_queue_sums_its_shards_and_keeps_group_0_s_settings() -> None:
    circuit = {"window": 10, "probe_interval_s": 5, "open": False, "recent_failures": 1,
               "recent_outcomes": 4}  # fmt: skip
    group0 = _queue(
        "pay", depth=3, running=1, paused=True, rate_limit_per_s=2.0, tokens=1.5,
        oldest_runnable_at="2026-01-01T00:00:05.000Z", oldest_runnable_age_s=3.0,
        circuit=circuit,
    )  # fmt: skip
    shard1 = _queue(
        "pay", depth=4, running=2, throttled=2, blocked_keys=1,
        oldest_runnable_at="2026-01-01T00:00:01.000Z", oldest_runnable_age_s=7.0,
        circuit={**circuit, "open": True, "recent_failures": 3},
        blocked=[{"tenant": "t", "ordering_key": "k", "job_id": "job1_x"}],
    )  # fmt: skip
    merged = merge_queue([group0, shard1])
    assert merged["depth"] == 7 and merged["running"] == 3 and merged["throttled"] == 2
    assert merged["blocked_keys"] == 1 and merged["blocked"][0]["job_id"] == "job1_x"
    assert merged["oldest_runnable_at"] == "2026-01-01T00:00:01.000Z"
    assert merged["oldest_runnable_age_s"] == 7.0
    assert merged["paused"] is True and merged["rate_limit_per_s"] == 2.0
    assert merged["tokens"] == 1.5
    assert merged["circuit"]["open"] is True and merged["circuit"]["recent_failures"] == 4
    assert merged["circuit"]["recent_outcomes"] == 8


def test_queues_and_tenants_named_in_any_shard_are_listed_once() -> None:
    lists = [[_queue("a", depth=1)], [_queue("b", depth=2), _queue("a", depth=5)]]
    merged = merge_named(lists, merge_queue)
    assert [(q["name"], q["depth"]) for q in merged] == [("a", 6), ("b", 2)]
    tenants = [
        [{"name": "acme", "weight": 3, "queued": 1, "running": 0, "throttled": 0}],
        [{"name": "acme", "weight": 1, "queued": 2, "running": 4, "throttled": 1}],
    ]
    [acme] = merge_named(tenants, merge_tenant)
    assert acme == {"name": "acme", "weight": 3, "queued": 3, "running": 4, "throttled": 1}


def _report(now: str, since: str, buckets: list[str], **parts: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "now": now,
        "since": since,
        "hours": len(buckets),
        "reconciling": {"jobs": [], "total": 0, "truncated": False},
        "unknown_outcomes": {"buckets": buckets, "queues": []},
        "decisions": [],
        "completed": {"jobs": [], "total": 0, "truncated": False},
    }
    body.update(parts)
    return body


def test_reports_add_up_by_hour_and_lists_are_cut_to_the_limit() -> None:
    h0, h1, h2 = (f"2026-01-01T0{hour}:00:00.000Z" for hour in range(3))
    early = _report(
        "2026-01-01T01:59:59.900Z", h0, [h0, h1],
        unknown_outcomes={"buckets": [h0, h1], "queues": [
            {"queue": "pay", "total": 5, "counts": [2, 3]}]},
        decisions=[{"queue": "pay", "happened": 1, "not_happened": 0, "unknown": 0,
                    "unanswered": 0}],
        reconciling={"jobs": [{"job_id": "job_a", "since": "2026-01-01T01:00:00.000Z"}],
                     "total": 1, "truncated": False},
        completed={"jobs": [{"job_id": "job_b", "completed_at": "2026-01-01T01:10:00.000Z"}],
                   "total": 1, "truncated": False},
    )  # fmt: skip
    late = _report(
        "2026-01-01T02:00:00.100Z", h1, [h1, h2],
        unknown_outcomes={"buckets": [h1, h2], "queues": [
            {"queue": "pay", "total": 4, "counts": [1, 3]},
            {"queue": "mail", "total": 1, "counts": [0, 1]}]},
        decisions=[{"queue": "pay", "happened": 2, "not_happened": 1, "unknown": 0,
                    "unanswered": 0}],
        reconciling={"jobs": [{"job_id": "job1_c", "since": "2026-01-01T00:30:00.000Z"}],
                     "total": 3, "truncated": True},
        completed={"jobs": [{"job_id": "job1_d", "completed_at": "2026-01-01T01:50:00.000Z"}],
                   "total": 1, "truncated": False},
    )  # fmt: skip
    merged = merge_report([early, late], limit=1)
    assert merged["since"] == h1 and merged["now"] == "2026-01-01T02:00:00.100Z"
    assert merged["unknown_outcomes"] == {
        "buckets": [h1, h2],
        "queues": [
            {"queue": "mail", "total": 1, "counts": [0, 1]},
            {"queue": "pay", "total": 7, "counts": [4, 3]},  # hour 0 left the window
        ],
    }
    assert merged["decisions"] == [
        {"queue": "pay", "happened": 3, "not_happened": 1, "unknown": 0, "unanswered": 0}
    ]
    assert [job["job_id"] for job in merged["reconciling"]["jobs"]] == ["job1_c"]  # oldest
    assert merged["reconciling"]["total"] == 4 and merged["reconciling"]["truncated"]
    assert [job["job_id"] for job in merged["completed"]["jobs"]] == ["job1_d"]  # newest
    assert merged["completed"]["total"] == 2 and merged["completed"]["truncated"]


def test_the_overview_sums_counts_and_merges_its_lists() -> None:
    def part(node: str, **fields: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "node": {"id": node},
            "status_counts": {},
            "queues": [],
            "dead_letters": [],
            "stuck_jobs": [],
            "recent_errors": [],
            "counters": {},
            "leader_history": [node],
        }
        body.update(fields)
        return body

    group0 = part(
        "n1", status_counts={"pending": 2, "dead_letter": 1},
        queues=[{"name": "q", "depth": 2, "running": 0, "oldest_runnable_age_s": 1.0}],
        dead_letters=[{"id": "job_a", "updated_at": "2026-01-01T00:00:01.000Z"}],
        recent_errors=[{"at_ms": 1, "message": "old"}],
        counters={"q": {"submitted": 2.0}},
    )  # fmt: skip
    shard1 = part(
        "n2", status_counts={"pending": 1, "running": 1},
        queues=[{"name": "q", "depth": 1, "running": 1, "oldest_runnable_age_s": 4.0}],
        dead_letters=[{"id": "job1_b", "updated_at": "2026-01-01T00:00:02.000Z"}],
        stuck_jobs=[{"job_id": "job1_c", "quiet_s": 60.0}],
        recent_errors=[{"at_ms": 2, "message": "new"}],
        counters={"q": {"submitted": 1.0, "succeeded": 1.0}, "r": {"failed": 1.0}},
    )  # fmt: skip
    merged = merge_overview({0: group0, 1: shard1}, errors_shown=1)
    assert merged["node"] == {"id": "n1"} and merged["leader_history"] == ["n1"]
    assert merged["status_counts"] == {"pending": 3, "dead_letter": 1, "running": 1}
    assert merged["queues"] == [
        {"name": "q", "depth": 3, "running": 1, "oldest_runnable_age_s": 4.0}
    ]
    assert [item["id"] for item in merged["dead_letters"]] == ["job1_b", "job_a"]
    assert [item["job_id"] for item in merged["stuck_jobs"]] == ["job1_c"]
    assert merged["recent_errors"] == [{"at_ms": 2, "message": "new"}]
    assert merged["counters"] == {
        "q": {"submitted": 3.0, "succeeded": 1.0},
        "r": {"failed": 1.0},
    }


def _window(at: list[str], **fields: list[Any]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "node_id": "n1",
        "queue": "q",
        "period_s": 5,
        "sampling_since": "2026-01-01T00:00:00.000Z",
        "queues": ["q"],
        "at": at,
    }
    for name in ("succeeded_per_s", "failed_per_s", "dead_lettered_per_s", "depth",
                 "oldest_runnable_age_s", "due_to_lease_p99_s"):  # fmt: skip
        body[name] = fields.get(name, [0.0] * len(at))
    return body


def test_series_add_up_per_bucket_and_keep_the_buckets_every_shard_has() -> None:
    a, b, c, d = (f"2026-01-01T00:00:{second:02d}.000Z" for second in (0, 5, 10, 15))
    group0 = _window(
        [a, b, c], succeeded_per_s=[1.0, None, 2.0], depth=[3, 4, 5],
        oldest_runnable_age_s=[1.0, 2.0, None], due_to_lease_p99_s=[0.1, None, None],
    )  # fmt: skip
    shard1 = _window(
        [b, c, d], succeeded_per_s=[1.0, 0.5, 9.0], depth=[1, 1, 1],
        oldest_runnable_age_s=[5.0, 1.0, 1.0], due_to_lease_p99_s=[0.3, None, 0.2],
    )  # fmt: skip
    shard1["sampling_since"] = "2026-01-01T00:00:03.000Z"
    shard1["queues"] = ["q", "r"]
    merged = merge_series([group0, shard1])
    assert merged["at"] == [b, c]
    assert merged["succeeded_per_s"] == [None, 2.5]  # unknown in a shard: unknown
    assert merged["depth"] == [5, 6]
    assert merged["oldest_runnable_age_s"] == [5.0, None]
    assert merged["due_to_lease_p99_s"] == [0.3, None]  # the greatest known
    assert merged["queues"] == ["q", "r"]
    assert merged["sampling_since"] == "2026-01-01T00:00:03.000Z"


def _process_metrics(leader: float, submitted: float) -> bytes:
    registry = CollectorRegistry()
    Gauge("raftsched_raft_is_leader", "1 if this node is the leader.", registry=registry).set(
        leader
    )
    counter = Counter("raftsched_jobs_submitted", "Jobs submitted.", ["queue"], registry=registry)
    counter.labels("pay").inc(submitted)
    histogram = Histogram(
        "raftsched_commit_seconds", "Commit latency.", buckets=(0.1, 1.0), registry=registry
    )
    histogram.observe(0.5)
    return generate_latest(registry)


def test_metrics_of_every_process_get_their_shard_label(promtool: str) -> None:
    text = labelled_metrics([(0, _process_metrics(1, 3)), (1, _process_metrics(0, 5))])
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, timeout=30
    )
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()
    assert text.decode().count("# HELP raftsched_raft_is_leader ") == 1
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }
    assert samples[("raftsched_raft_is_leader", (("shard", "0"),))] == 1
    assert samples[("raftsched_raft_is_leader", (("shard", "1"),))] == 0
    assert samples[("raftsched_jobs_submitted_total", (("queue", "pay"), ("shard", "1")))] == 5
    bucket = ("raftsched_commit_seconds_bucket", (("le", "1.0"), ("shard", "0")))
    assert samples[bucket] == 1
    assert all(dict(labels).get("shard") in {"0", "1"} for _, labels in samples)
