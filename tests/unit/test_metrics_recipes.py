"""The operator recipes in cluster/ refer only to metrics the node exports,
and the alert rules cover what issue 8 asks for."""

from __future__ import annotations

import json
import re
from pathlib import Path

from raftsched.node.metrics import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "cluster" / "prometheus-alerts.yml"
GRAFANA = ROOT / "cluster" / "grafana-dashboard.json"
METRIC = re.compile(r"\braftsched_[a-z_]+\b")
SUFFIXES = ("_bucket", "_sum", "_count")


def exported_names() -> set[str]:
    """Every family name the node exports (declared in node/metrics.py)."""
    return {family.name for family in FAMILIES}


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in exported_names():
            return name[: -len(suffix)]
    return name


def test_alert_rules_use_exported_metrics_and_cover_the_issue() -> None:
    text = ALERTS.read_text("utf-8")
    expressions = re.findall(r"^\s+expr: (.+)$", text, flags=re.MULTILINE)
    used = {family(name) for expr in expressions for name in METRIC.findall(expr)}
    assert used and used <= exported_names(), used - exported_names()
    alerts = set(re.findall(r"- alert: (\w+)", text))
    assert alerts == {
        "RaftschedNoLeader",
        "RaftschedLeaderFlapping",
        "RaftschedQueueAgeHigh",
        "RaftschedDeadLettersRising",
        "RaftschedStuckJobs",
        "RaftschedOutboxLag",
        "RaftschedFollowerLagging",
        "RaftschedClockSkew",
        "RaftschedUnreconciledJobs",
        "RaftschedReconcilingPilingUp",
        "RaftschedUnknownOutcomesRising",
        "RaftschedSinkLagGrowing",
    }
    assert "\t" not in text  # YAML forbids tabs for indentation


def test_grafana_dashboard_is_valid_json_using_exported_metrics() -> None:
    dashboard = json.loads(GRAFANA.read_text("utf-8"))
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {family(name) for expr in expressions for name in METRIC.findall(expr)}
    assert used <= exported_names(), used - exported_names()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
