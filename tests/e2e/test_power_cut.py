"""A power cut of the whole cluster loses no acknowledged job.

With RAFTSCHED_SIMULATE_POWER_CUT=1 (`raftsched.power_cut`) a byte a node
writes counts as on its disk only once a real fsync of that file has
returned; a node started again after SIGKILL finds everything else gone, so
SIGKILL of every node at once throws away exactly what a power cut would. A
2xx means the job was on a majority's disks: after the restart every
acknowledged job must be there. The same run with durability "none"
(pysyncobj's own behaviour) is the control that shows the test can fail;
leaving the journal's fdatasync out fails it too.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from e2e_support import cluster_env

from raftsched.client import Client, RaftschedError
from raftsched.testing import LocalCluster

SUBMITTERS = 6


def acknowledged_then_power_cut(cluster: LocalCluster, run_s: float) -> set[str]:
    acknowledged: set[str] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def submitter(index: int) -> None:
        with Client(cluster.urls, timeout_s=2, retry_budget_s=2) as api:
            sequence = 0
            while not stop.is_set():
                key = f"cut:{index}:{sequence}"
                sequence += 1
                try:
                    job = api.submit("cut", {"k": key}, idempotency_key=key)
                except (RaftschedError, OSError):
                    continue
                with lock:
                    acknowledged.add(job["id"])

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(SUBMITTERS)]
    for thread in threads:
        thread.start()
    time.sleep(run_s)
    # The cut: every node at once, in the middle of the load.
    for node_id in cluster.nodes:
        cluster.kill(node_id)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    return acknowledged


def surviving_jobs(cluster: LocalCluster) -> set[str]:
    cluster.start()
    cluster.wait_for_leader(timeout_s=60)
    with Client(cluster.urls, retry_budget_s=60) as api:
        return {job["id"] for job in api.iter_jobs(queue="cut", page_size=1000)}


@pytest.mark.slow
def test_power_cut_of_every_node_loses_no_acknowledged_job(tmp_path: Path) -> None:
    env = {**cluster_env(), "RAFTSCHED_SIMULATE_POWER_CUT": "1"}
    cluster = LocalCluster(tmp_path / "fsync", env=env)
    with cluster:
        cluster.wait_for_leader()
        acknowledged = acknowledged_then_power_cut(cluster, run_s=4.0)
        assert len(acknowledged) > 100, "the load did not get going"
        survived = surviving_jobs(cluster)
        missing = acknowledged - survived
        assert not missing, f"{len(missing)} acknowledged jobs lost, e.g. {sorted(missing)[:3]}"
        cluster.wait_converged(timeout_s=60)


@pytest.mark.slow
def test_power_cut_without_fsync_loses_acknowledged_jobs(tmp_path: Path) -> None:
    """Negative control: pysyncobj's own behaviour (no fsync) loses them."""
    env = {**cluster_env(), "RAFTSCHED_SIMULATE_POWER_CUT": "1"}
    cluster = LocalCluster(tmp_path / "none", env=env, durability="none")
    with cluster:
        cluster.wait_for_leader()
        acknowledged = acknowledged_then_power_cut(cluster, run_s=2.0)
        assert len(acknowledged) > 100
        survived = surviving_jobs(cluster)
        assert acknowledged - survived, "without fsync a power cut should lose acknowledged jobs"
