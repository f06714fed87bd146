"""Shared by the end-to-end tests and their fixtures."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from raftsched.testing import LocalCluster

REPO_ROOT = Path(__file__).resolve().parents[2]


def cluster_env() -> dict[str, str]:
    """Environment for node and worker processes: tests' handler modules importable."""
    paths = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def lead_on(cluster: LocalCluster, node_ids: set[str]) -> None:
    """Restart leaders (on the code they run) until one of `node_ids` leads."""
    for _ in range(10):
        leader = cluster.wait_for_leader(timeout_s=60)
        if leader in node_ids:
            return
        cluster.kill(leader, signal.SIGTERM)
        cluster.wait_for_leader(timeout_s=60, exclude=leader)
        cluster.start(leader)
        cluster.wait_converged(timeout_s=60)
    raise AssertionError(f"none of {sorted(node_ids)} became leader")
