"""node/metrics.py: every family the node exports, with today's names,
types, label names, help text and buckets, on a registry of its own."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from raftsched.config import NodeConfig
from raftsched.node import metrics as families
from raftsched.node.metrics import FAMILIES, Family, NodeMetrics, Sampled

BEFORE = Path(__file__).with_name("metric_families.json")
# Families added since the list was taken (nothing else may differ from it).
ADDED = frozenset(
    {
        "raftsched_proposer_queued_commands",
        "raftsched_proposer_queued_bytes",
        "raftsched_proposer_refused_total",
        "raftsched_raft_disk_full",
        "raftsched_http_auth_failures_total",
        "raftsched_raft_messages_refused_total",
        "raftsched_reconcile_decisions_total",
        "raftsched_unknown_outcomes_total",
        "raftsched_queue_reconciling",
        "raftsched_lease_requests_total",
        "raftsched_raft_snapshot_fork_pause_seconds",
        "raftsched_raft_snapshot_cow_bytes",
        "raftsched_raft_snapshot_bytes",
        "raftsched_raft_snapshot_load_seconds",
        "raftsched_raft_snapshots_total",
        "raftsched_sink_published_total",
        "raftsched_sink_retried_total",
        "raftsched_sink_parked_total",
        "raftsched_sink_lag_events",
        "raftsched_sink_lag_seconds",
        "raftsched_sink_connected",
    }
)


def as_row(family: Family) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": family.name,
        "type": family.kind,
        "labels": list(family.labels),
        "help": family.help,
    }
    if family.buckets:
        row["buckets"] = [float(bound) for bound in family.buckets]
    return row


def test_every_family_keeps_its_name_type_labels_help_and_buckets() -> None:
    expected = json.loads(BEFORE.read_text("utf-8"))["families"]
    for row in expected:
        if "buckets" in row:
            row["buckets"] = [float(bound) for bound in row["buckets"]]
    declared = sorted((as_row(f) for f in FAMILIES), key=lambda row: row["name"])
    assert [row for row in declared if row["name"] not in ADDED] == expected
    assert {row["name"] for row in declared} - {row["name"] for row in expected} == ADDED
    assert len({family.name for family in FAMILIES}) == len(FAMILIES)


def test_a_node_with_its_api_exports_every_declared_family(tmp_path: Path) -> None:
    from raftsched.process import assemble

    async def build() -> list[str]:
        config = NodeConfig("n1", tmp_path, "127.0.0.1", 1, "127.0.0.1:2", "s" * 20)
        node, _ = assemble(config, asyncio.get_running_loop())  # Raft not started
        return node.metrics.unbound()

    assert asyncio.run(build()) == []


def test_a_sampled_counter_is_read_at_scrape_time_and_renders_as_a_counter() -> None:
    totals = {"0": 3.0, "1": 1.0}
    family = Family("demo_collections_total", "counter", "Collections, by generation.", ("gen",))

    def read() -> dict[str, list[tuple[tuple[str, ...], float]]]:
        return {family.name: [((g,), n) for g, n in totals.items()]}

    registry = CollectorRegistry()
    registry.register(Sampled([family], read))
    totals["0"] = 4.0
    assert generate_latest(registry).decode().splitlines() == [
        "# HELP demo_collections_total Collections, by generation.",
        "# TYPE demo_collections_total counter",
        'demo_collections_total{gen="0"} 4.0',
        'demo_collections_total{gen="1"} 1.0',
    ]


@pytest.mark.parametrize(
    ("name", "kind", "buckets"),
    [
        ("demo_pause_seconds_total", "gauge", ()),
        ("demo_pause_seconds", "counter", ()),
        ("demo_seconds", "histogram", ()),
        ("demo_seconds", "gauge", (1.0,)),
    ],
)
def test_a_family_of_the_wrong_shape_is_refused(
    name: str, kind: Any, buckets: tuple[float, ...]
) -> None:
    with pytest.raises(ValueError):
        Family(name, kind, "Demo.", buckets=buckets)


def test_a_sampled_family_is_bound_once_and_only_if_declared() -> None:
    metrics = NodeMetrics()
    metrics.sample(families.JOBS, lambda: [])
    with pytest.raises(ValueError, match="raftsched_jobs"):
        metrics.sample(families.JOBS, lambda: [])
    stray = Family("raftsched_stray", "gauge", "Not declared in node/metrics.py.")
    with pytest.raises(ValueError, match="not a sampled family"):
        metrics.sample(stray, lambda: [])
    assert families.JOBS.name not in metrics.unbound()
    assert families.QUEUE_DEPTH.name in metrics.unbound()


def test_counters_keep_their_total_and_export_no_created_series() -> None:
    metrics = NodeMetrics()
    metrics.ticks.inc()
    metrics.job_failures.labels("q", "permanent").inc(2)
    metrics.commit_seconds.observe(0.003)
    text = metrics.render().decode()
    assert "# TYPE raftsched_ticks_total counter\nraftsched_ticks_total 1.0\n" in text
    assert 'raftsched_job_failures_total{kind="permanent",queue="q"} 2.0' in text
    assert "_created" not in text


def test_histograms_keep_their_buckets() -> None:
    metrics = NodeMetrics()
    metrics.entry_commands.observe(3)
    metrics.commit_seconds.observe(0.003)
    metrics.http_seconds.labels("GET", "/v1/jobs", "200").observe(0.02)
    metrics.claim_latency.labels("q").observe(1.0)
    metrics.execution_seconds.labels("q", "succeeded").observe(7.0)
    bounds: dict[str, list[float]] = {}
    for metric in text_string_to_metric_families(metrics.render().decode()):
        for sample in metric.samples:
            if sample.name.endswith("_bucket"):
                bounds.setdefault(metric.name, []).append(float(sample.labels["le"]))
    histograms = [family for family in FAMILIES if family.kind == "histogram"]
    assert bounds == {
        family.name: [*map(float, family.buckets), float("inf")] for family in histograms
    }


def test_each_node_has_a_registry_of_its_own() -> None:
    first, second = NodeMetrics(), NodeMetrics()
    first.jobs_submitted.labels("q").inc(5)
    assert first.totals(families.JOBS_SUBMITTED) == {("q",): 5.0}
    assert second.totals(families.JOBS_SUBMITTED) == {}
    assert not [m.name for m in REGISTRY.collect() if m.name.startswith("raftsched_")]
