"""A live node's /metrics passes `promtool check metrics` with no finding at
all (lint warnings included), once traffic has created labelled series, and
exports exactly the families node/metrics.py declares, with their label names."""

from __future__ import annotations

import re
import subprocess
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from raftsched.client import Client
from raftsched.node.metrics import CONTENT_TYPE, FAMILIES
from raftsched.testing import LocalCluster

SUFFIXES = ("_bucket", "_sum", "_count")


def make_traffic(client: Client) -> None:
    """Jobs that succeed, fail and retry, and dead-letter: every job family gets samples."""
    client.submit("promtool", {"n": 1})
    client.submit("promtool", {"n": 2}, max_attempts=1)
    client.submit("promtool", {"n": 3}, max_attempts=2, backoff={"initial_s": 0.1})
    # An unknown outcome (raftsched_unknown_outcomes_total), retried blindly.
    client.submit("promtool", {"n": 4}, max_attempts=2, backoff={"initial_s": 60, "max_s": 60})
    outcomes = iter(["complete", "permanent", "transient", "unknown"])
    for lease in client.claim("w-promtool", ["promtool"], max_jobs=4, wait_s=5):
        job_id, token = lease["job_id"], lease["fencing_token"]
        client.start(job_id, token)
        client.heartbeat(job_id, token, progress={"step": 1})
        outcome = next(outcomes)
        if outcome == "complete":
            client.complete(job_id, token, {"ok": True})
        else:
            client.fail(job_id, token, kind=outcome, message="promtool traffic")


def check_declared(text: str) -> None:
    """HELP and TYPE of every declared family and of nothing else; each
    sample with exactly its family's label names."""
    heads = dict(re.findall(r"^# HELP (\S+) (.*)$", text, flags=re.MULTILINE))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE))
    declared = {family.name: family for family in FAMILIES}
    assert heads == {name: family.help for name, family in declared.items()}
    assert types == {name: family.kind for name, family in declared.items()}
    for metric in text_string_to_metric_families(text):
        for sample in metric.samples:
            name = sample.name
            if name not in declared:
                name = next(name[: -len(s)] for s in SUFFIXES if name[: -len(s)] in declared)
            labels = set(sample.labels) - ({"le"} if sample.name.endswith("_bucket") else set())
            assert labels == set(declared[name].labels), sample


def test_every_node_metrics_pass_promtool(
    promtool: str, cluster: LocalCluster, client: Client
) -> None:
    make_traffic(client)
    failures: list[float] = []
    unknown: list[float] = []
    for node in cluster.nodes.values():
        request = urllib.request.Request(
            node.http_url + "/metrics",
            headers={"Authorization": f"Bearer {cluster.admin_token}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.headers["Content-Type"] == CONTENT_TYPE
            text = response.read()
        checked = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, timeout=30
        )
        findings = (checked.stdout + checked.stderr).decode()
        assert checked.returncode == 0 and findings == "", f"{node.id}: {findings}"
        check_declared(text.decode())
        failures += [
            sample.value
            for metric in text_string_to_metric_families(text.decode())
            for sample in metric.samples
            if sample.name == "raftsched_job_failures_total"
            and sample.labels == {"queue": "promtool", "kind": "permanent"}
        ]
        unknown += [
            sample.value
            for metric in text_string_to_metric_families(text.decode())
            for sample in metric.samples
            if sample.name == "raftsched_unknown_outcomes_total"
            and sample.labels == {"queue": "promtool"}
        ]
    # Counters count what a node proposed as leader, so one node has them.
    assert failures == [1.0]
    assert unknown == [1.0]
