"""A rolling upgrade from the previous release that has the version gate, under load.

The previous tagged release (`v0.5.0`) is extracted from this repository's
history and installed into a virtualenv of its own, as an operator's old
machines would have it. Three nodes of it form a cluster with
authentication on; a client keeps submitting jobs the whole time. Each node
in turn is stopped and started on the same data directory with today's
code (the runbook's "Rolling upgrade", docs/operations.md). After every
step the replicas agree (same applied index and digest), and while any
member still runs the old release the command kind this release introduced
(`LeaseBatch`, cluster version 6) is never proposed: a complete that carries
the next claim is answered all the same, its op and its claim proposed in
turn. Once the last node runs today's code the leader raises the cluster
version and the same request travels as one command. No acknowledged job is
lost.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import cluster_env, lead_on, release_tree

from raftsched.client import Client, RaftschedError, next_claim
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.node.versions import POLL_PERIOD_S
from raftsched.testing import LocalCluster, http_json, metrics_text, wait_for

pytestmark = pytest.mark.slow

PREVIOUS = "v0.5.0"
# The commit the tag names: a clone without tags still has it.
PREVIOUS_COMMIT = "ef9f73e2e90260555fc49bc7c2f8d797bb49bf90"
PREVIOUS_VERSION = 5
# The load: one submission at a time, at most this many, while upgrading.
LOAD_JOBS_MAX = 3000


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(python, src) of the previous release, installed in its own virtualenv."""
    root = tmp_path_factory.mktemp(PREVIOUS)
    tree = release_tree(PREVIOUS, PREVIOUS_COMMIT, root / "tree")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    installed = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(tree)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-4000:]
    version = subprocess.run(
        [python, "-c", "import raftsched; print(raftsched.__version__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
    ).stdout.strip()
    assert version == PREVIOUS.removeprefix("v"), version
    return python, tree / "src"


class Load:
    """One client submitting jobs back to back until stopped (bounded)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.client = Client(cluster.urls, token=cluster.admin_token, retry_budget_s=60)
        self.acknowledged: dict[str, str] = {}
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for number in range(LOAD_JOBS_MAX):
            if self._stop.is_set():
                return
            key = f"load-{number}"
            try:
                job = self.client.submit("upgrade", {"n": number}, idempotency_key=key)
            except RaftschedError as error:  # retried within the budget first
                self.failures.append(f"{key}: {error}")
                continue
            self.acknowledged[key] = job["id"]
            time.sleep(0.02)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        self.client.close()


def cluster_view(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    status, body, _ = http_json("GET", cluster.nodes[node_id].http_url + "/v1/cluster")
    assert status == 200, body
    return body


def versions_in_force(cluster: LocalCluster) -> set[int | None]:
    return {cluster_view(cluster, n).get("cluster_version") for n in cluster.nodes}


def use_a_new_command(cluster: LocalCluster) -> tuple[dict[str, Any], float]:
    """Complete a job with the next claim on the leader (a node of today's
    code): the answer, and how many requests the leader proposed as one
    `LeaseBatch` command meanwhile (the command kind of this release)."""
    leader = cluster.nodes[cluster.wait_for_leader(timeout_s=60)].http_url
    before = lease_requests(cluster, leader, "one_command")
    with Client(leader, token=cluster.admin_token, retry_budget_s=30) as client:
        job = client.submit("upgrade-gate", {"n": 0})
        waiting = client.submit("upgrade-gate-next", {"n": 1})
        (lease,) = client.claim("w-gate", ["upgrade-gate"], wait_s=5)
        assert lease["job_id"] == job["id"], lease
        client.start(job["id"], lease["fencing_token"])
        answer, granted = client.complete(
            job["id"],
            lease["fencing_token"],
            next_claim=next_claim("upgrade-gate-next", max_jobs=1, wait_s=5),
        )
    assert answer["status"] == "succeeded", answer
    assert [grant["job_id"] for grant in granted.leases] == [waiting["id"]], granted
    return answer, lease_requests(cluster, leader, "one_command") - before


def lease_requests(cluster: LocalCluster, url: str, form: str) -> float:
    text = metrics_text(url, token=cluster.admin_token)
    pattern = re.compile(r'^raftsched_lease_requests_total\{form="' + form + r'"\} (\S+)$', re.M)
    return sum(float(value) for value in pattern.findall(text))


@pytest.fixture
def cluster(tmp_path: Path, previous_release: tuple[str, Path]) -> Iterator[LocalCluster]:
    python, source = previous_release
    local = LocalCluster(tmp_path / "cluster", size=3, env=cluster_env())
    for node in local.nodes.values():
        node.python, node.source_dir = python, source
    try:
        yield local
    finally:
        local.stop()


def test_a_rolling_upgrade_from_the_previous_gated_release_under_load(
    cluster: LocalCluster,
) -> None:
    cluster.start()
    cluster.wait_for_leader(timeout_s=60)
    cluster.wait_for_auth(timeout_s=60)
    assert versions_in_force(cluster) == {PREVIOUS_VERSION}
    with Load(cluster) as load:
        assert wait_for(lambda: len(load.acknowledged) >= 20, timeout_s=60)
        for step, node_id in enumerate(sorted(cluster.nodes), start=1):
            cluster.kill(node_id, signal.SIGTERM)
            node = cluster.nodes[node_id]
            node.python, node.source_dir = None, None
            cluster.start(node_id)
            cluster.wait_for_leader(timeout_s=60)
            cluster.wait_converged(timeout_s=60)
            if step < len(cluster.nodes):
                # A leader of today's code, that has polled every member:
                # the version stays where the oldest member is, and the new
                # command kinds are refused. (A leader of the old release
                # does not know the field at all: 400.)
                lead_on(cluster, {other for other in cluster.nodes if other <= node_id})
                time.sleep(POLL_PERIOD_S + 2)
                assert versions_in_force(cluster) == {PREVIOUS_VERSION}
                _, as_one_command = use_a_new_command(cluster)
                assert as_one_command == 0
            before = len(load.acknowledged)
            assert wait_for(lambda b=before: len(load.acknowledged) > b + 10, timeout_s=60)

        assert wait_for(
            lambda: versions_in_force(cluster) == {COMMAND_VERSION_MAX},
            timeout_s=4 * POLL_PERIOD_S,
        ), versions_in_force(cluster)
        _, as_one_command = use_a_new_command(cluster)
        assert as_one_command == 1
    assert not load.failures, load.failures[:5]
    cluster.wait_converged(timeout_s=60)
    expected = {job_id: key for key, job_id in load.acknowledged.items()}
    for node in cluster.nodes.values():
        with Client(node.http_url, token=cluster.admin_token) as client:
            held = {
                job["id"]: job.get("idempotency_key")
                for job in client.iter_jobs(queue="upgrade", page_size=1000, consistency="stale")
            }
        assert held == expected, (node.id, len(held), len(expected))
