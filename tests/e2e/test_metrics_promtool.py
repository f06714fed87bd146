"""A live node's /metrics passes `promtool check metrics` with no finding at
all (lint warnings included), once traffic has created labelled series."""

from __future__ import annotations

import subprocess
import urllib.request

from raftsched.client import Client
from raftsched.testing import LocalCluster


def make_traffic(client: Client) -> None:
    """Jobs that succeed, fail and retry, and dead-letter: every job family gets samples."""
    client.submit("promtool", {"n": 1})
    client.submit("promtool", {"n": 2}, max_attempts=1)
    client.submit("promtool", {"n": 3}, max_attempts=2, backoff={"initial_s": 0.1})
    outcomes = iter(["complete", "permanent", "transient"])
    for lease in client.claim("w-promtool", ["promtool"], max_jobs=3, wait_s=5):
        job_id, token = lease["job_id"], lease["fencing_token"]
        client.start(job_id, token)
        client.heartbeat(job_id, token, progress={"step": 1})
        outcome = next(outcomes)
        if outcome == "complete":
            client.complete(job_id, token, {"ok": True})
        else:
            client.fail(job_id, token, kind=outcome, message="promtool traffic")


def test_every_node_metrics_pass_promtool(
    promtool: str, cluster: LocalCluster, client: Client
) -> None:
    make_traffic(client)
    labelled = b'raftsched_job_failures_total{queue="promtool",kind="permanent"}'
    texts = []
    for node in cluster.nodes.values():
        with urllib.request.urlopen(node.http_url + "/metrics", timeout=10) as response:
            texts.append(text := response.read())
        checked = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, timeout=30
        )
        findings = (checked.stdout + checked.stderr).decode()
        assert checked.returncode == 0 and findings == "", f"{node.id}: {findings}"
    # Counters count what a node proposed as leader, so one node has them.
    assert any(labelled in text for text in texts)
