"""cluster/prometheus-alerts.yml passes `promtool check rules` (every lint on,
fatal), its unit tests in cluster/prometheus-alerts.test.yml pass, and those
cover every alert both firing and staying quiet."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"
ALERTS = CLUSTER / "prometheus-alerts.yml"
ALERT_TESTS = CLUSTER / "prometheus-alerts.test.yml"


def run(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], cwd=CLUSTER, capture_output=True, text=True, timeout=60
    )


def test_alert_rules_pass_promtool_check_rules(promtool: str) -> None:
    checked = run(promtool, "check", "rules", "--lint=all", "--lint-fatal", ALERTS.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip().splitlines() == [
        f"Checking {ALERTS.name}",
        "  SUCCESS: 12 rules found",
    ], checked.stdout + checked.stderr


def test_alert_rule_unit_tests_pass(promtool: str) -> None:
    tested = run(promtool, "test", "rules", ALERT_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_has_a_firing_case_and_a_quiet_case() -> None:
    rules = yaml.safe_load(ALERTS.read_text("utf-8"))
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    cases: list[dict[str, Any]] = [
        case
        for test in yaml.safe_load(ALERT_TESTS.read_text("utf-8"))["tests"]
        for case in test["alert_rule_test"]
    ]
    fires = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    assert fires == alerts, f"no firing case for {alerts - fires}"
    assert quiet == alerts, f"no quiet case for {alerts - quiet}"
