"""`raftsched top --once` against a real cluster: one frame, real figures."""

from __future__ import annotations

import subprocess
import sys

from e2e_support import cluster_env

from raftsched.client import Client
from raftsched.testing import LocalCluster


def test_top_once_shows_nodes_queues_and_dead_letters(
    cluster: LocalCluster, client: Client
) -> None:
    client.submit("mail", payload={})
    client.submit("mail", payload={})
    job = client.submit("billing")
    (lease,) = client.claim("w-top", ["billing"], max_jobs=1, wait_s=5)
    client.fail(job["id"], lease["fencing_token"], kind="permanent", message="no such account")
    follower = next(n for i, n in cluster.nodes.items() if i != cluster.leader_id())
    done = subprocess.run(
        [sys.executable, "-m", "raftsched", "top", "--once", "--url", follower.http_url],
        capture_output=True,
        text=True,
        timeout=30,
        env={**cluster_env(), "PATH": "/usr/bin:/bin", "RAFTSCHED_TOKEN": cluster.admin_token},
    )
    assert done.returncode == 0, done.stderr
    frame = done.stdout
    assert "\x1b[" not in frame  # --once prints no escapes
    leader = cluster.leader_id()
    assert f"leader {leader}" in frame
    assert f"seen from {leader}" in frame  # the follower's view was upgraded to the leader's
    lines = {line.split()[0]: line.split() for line in frame.splitlines() if line.strip()}
    assert lines["mail"][1:3] == ["2", "0"]  # depth 2, running 0
    assert "dead_letter=1" in frame
    assert "no such account" in frame
    for node_id in cluster.nodes:
        assert node_id in lines
