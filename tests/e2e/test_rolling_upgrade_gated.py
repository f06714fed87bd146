"""A rolling upgrade from the previous release, under load: the time wheel's gate.

The previous tagged release (`v0.6.0`, cluster version 6) is extracted from
this repository's history and installed into a virtualenv of its own, as an
operator's old machines would have it. Three nodes of it form a cluster with
authentication on; a client keeps submitting jobs the whole time, every
fifth one scheduled three hours ahead (a far-future job, which this release
packs into the time wheel from cluster version 7). Each node in turn is
stopped and started on the same data directory with today's code (the
runbook's "Rolling upgrade", docs/operations.md).

While any member still runs v0.6.0, after every step: the replicas agree
(same applied index and digest), no replica holds a packed job (a node of
today's code reports `packed_jobs` 0 in `/v1/debug/digest`; v0.6.0 has no
wheel and no such field), although far-future jobs keep arriving through a
leader of today's code, and `PUT /v1/wheel` (`ConfigureWheel`, since 7)
through any node of today's code answers 409 `invalid_state` with
`details.reason` "cluster_version" and changes nothing (`GET /v1/wheel`
still shows the defaults). Once the last node runs today's code and the
leader raises the cluster version (to today's, 7 or above), far-future jobs submitted from then
on are packed on every replica, alike, a batch of them exactly, and `PUT
/v1/wheel` works. No acknowledged job is lost: every one, far-future ones
from before and after the raise included, is listed and readable by id on
every replica and counted in its status counts.

(From v0.5.0 this test checked the gate of `LeaseBatch`, cluster version
6; v0.6.0 has it, so that check tests no gate any more. How the worker
SDK falls back on v0.5.0 nodes, which refuse `next`, is
`tests/e2e/test_lease_next.py`'s.)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2e_support import cluster_env, lead_on, release_tree

from raftsched.client import ApiError, Client, RaftschedError, job_request
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.node.versions import POLL_PERIOD_S
from raftsched.testing import LocalCluster, http_json, wait_for

pytestmark = pytest.mark.slow

PREVIOUS = "v0.6.0"
# The commit the tag names: a clone without tags still has it.
PREVIOUS_COMMIT = "69005c568e851caf80b4bcc4616f11cb6c9afbc6"
PREVIOUS_VERSION = 6
WHEEL_VERSION = 7  # core.kernel.wheel.WHEEL_VERSION, as the wire sees it
# The load: one submission at a time, at most this many, while upgrading.
LOAD_JOBS_MAX = 6000
FAR_EVERY = 5
# Three hours ahead: its hour-wide bucket starts well beyond the default
# ten-minute horizon, and nothing comes due while the test runs.
HOUR_MS = 3600_000
FAR_AHEAD_MS = 3 * HOUR_MS
WHEEL_DEFAULTS = {"horizon_s": 600, "bucket_s": 3600}
BATCH_JOBS = 20


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


@dataclass(frozen=True, slots=True)
class FarJob:
    id: str
    number: int
    started_in: int  # the load's phase when the submission was sent
    acknowledged_in: int  # and when it was answered


class Load:
    """One client submitting jobs back to back until stopped (bounded):
    plain ones to `upgrade`, every FAR_EVERY-th one to `upgrade-far`, three
    hours ahead. The test moves `phase` on (the step under way, then
    `OPEN` once it saw the cluster version raised), and each far-future job
    records the phase it was sent and answered in."""

    OPEN = 1000

    def __init__(self, cluster: LocalCluster) -> None:
        self.client = Client(cluster.urls, token=cluster.admin_token, retry_budget_s=60)
        self.acknowledged: dict[str, str] = {}
        self.far: dict[str, FarJob] = {}
        self.failures: list[str] = []
        self.phase = 0
        # A minute into an hour-wide bucket: the load's far-future jobs
        # (a millisecond apart) share one, and the test's batch (an hour
        # later) takes the next.
        self.far_at_ms = (int(time.time() * 1000) // HOUR_MS) * HOUR_MS + FAR_AHEAD_MS + 60_000
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for number in range(LOAD_JOBS_MAX):
            if self._stop.is_set():
                return
            far = number % FAR_EVERY == FAR_EVERY - 1
            key = f"{'far' if far else 'load'}-{number}"
            started_in = self.phase
            try:
                if far:
                    job = self.client.submit(
                        "upgrade-far", {"n": number}, idempotency_key=key,
                        run_at=self.far_at_ms + number,
                    )  # fmt: skip
                else:
                    job = self.client.submit("upgrade", {"n": number}, idempotency_key=key)
            except RaftschedError as error:  # retried within the budget first
                self.failures.append(f"{key}: {error}")
                continue
            if far:
                self.far[key] = FarJob(job["id"], number, started_in, self.phase)
            else:
                self.acknowledged[key] = job["id"]
            time.sleep(0.02)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        self.client.close()


def runs_today(cluster: LocalCluster, node_id: str) -> bool:
    return cluster.nodes[node_id].python is None


def cluster_view(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    status, body, _ = http_json("GET", cluster.nodes[node_id].http_url + "/v1/cluster")
    assert status == 200, body
    return body


def versions_in_force(cluster: LocalCluster) -> set[int | None]:
    return {cluster_view(cluster, n).get("cluster_version") for n in cluster.nodes}


def packed_per_node(cluster: LocalCluster) -> dict[str, int | None]:
    """Each replica's `packed_jobs` (None from v0.6.0, which has no wheel)."""
    found: dict[str, int | None] = {}
    for node_id, node in cluster.nodes.items():
        status, body, _ = http_json(
            "GET", node.http_url + "/v1/debug/digest", token=cluster.admin_token
        )
        assert status == 200, body
        found[node_id] = body.get("packed_jobs")
    return found


def nothing_packed(cluster: LocalCluster) -> dict[str, int | None]:
    return {n: 0 if runs_today(cluster, n) else None for n in cluster.nodes}


def wheel_on(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    """`GET /v1/wheel` as this replica holds it (a stale read: no barrier)."""
    status, body, _ = http_json(
        "GET",
        cluster.nodes[node_id].http_url + "/v1/wheel?consistency=stale",
        token=cluster.admin_token,
    )
    assert status == 200, (node_id, body)
    wheel: dict[str, Any] = body["wheel"]
    return wheel


def wheel_refused(cluster: LocalCluster) -> None:
    """`PUT /v1/wheel` through every node of today's code (a follower
    redirects to the leader, which must be of today's code too): 409, the
    upgrade-first answer, and the settings as they were."""
    for node_id, node in cluster.nodes.items():
        if not runs_today(cluster, node_id):
            continue
        with (
            Client(node.http_url, token=cluster.admin_token, retry_budget_s=30) as client,
            pytest.raises(ApiError) as refused,
        ):
            client.request("PUT", "/v1/wheel", body={"horizon_s": 900, "bucket_s": 60})
        error = refused.value
        assert (error.status, error.code) == (409, "invalid_state"), (node_id, error)
        assert error.details == {
            "reason": "cluster_version",
            "command": "ConfigureWheel",
            "command_version": WHEEL_VERSION,
            "cluster_version": PREVIOUS_VERSION,
        }, (node_id, error.details)
    cluster.wait_converged(timeout_s=60)
    for node_id in cluster.nodes:
        if runs_today(cluster, node_id):
            wheel = wheel_on(cluster, node_id)
            assert wheel == {**WHEEL_DEFAULTS, "packed_jobs": 0, "buckets": 0}, (node_id, wheel)


def status_counts(cluster: LocalCluster, node_id: str) -> dict[str, int]:
    status, body, _ = http_json(
        "GET", cluster.nodes[node_id].http_url + "/v1/overview", token=cluster.admin_token
    )
    assert status == 200, body
    counts: dict[str, int] = body["status_counts"]
    return counts


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


def test_a_rolling_upgrade_from_the_previous_release_gates_the_time_wheel_under_load(
    cluster: LocalCluster,
) -> None:
    # Today's code understands job kinds too (version 8): the version goes
    # from the previous release's straight to today's, and the wheel's gate
    # (version 7) is what this test holds closed until then.
    assert COMMAND_VERSION_MAX >= WHEEL_VERSION
    cluster.start()
    cluster.wait_for_leader(timeout_s=60)
    cluster.wait_for_auth(timeout_s=60)
    assert versions_in_force(cluster) == {PREVIOUS_VERSION}
    last_step = len(cluster.nodes)
    with Load(cluster) as load:
        assert wait_for(lambda: len(load.far) >= 4, timeout_s=60)
        cluster.wait_converged(timeout_s=60)
        assert packed_per_node(cluster) == nothing_packed(cluster)
        for step, node_id in enumerate(sorted(cluster.nodes), start=1):
            load.phase = step
            cluster.kill(node_id, signal.SIGTERM)
            node = cluster.nodes[node_id]
            node.python, node.source_dir = None, None
            cluster.start(node_id)
            cluster.wait_for_leader(timeout_s=60)
            cluster.wait_converged(timeout_s=60)
            if step < last_step:
                # A leader of today's code, that has polled every member:
                # the version stays where the oldest member is, far-future
                # jobs it proposes meanwhile stay live on every replica,
                # and ConfigureWheel is refused.
                lead_on(cluster, {other for other in cluster.nodes if other <= node_id})
                time.sleep(POLL_PERIOD_S + 2)
                assert versions_in_force(cluster) == {PREVIOUS_VERSION}
                far_before = len(load.far)
                assert wait_for(lambda b=far_before: len(load.far) >= b + 3, timeout_s=60)
                wheel_refused(cluster)
                cluster.wait_converged(timeout_s=60)
                assert packed_per_node(cluster) == nothing_packed(cluster), step
            before = len(load.acknowledged)
            assert wait_for(lambda b=before: len(load.acknowledged) > b + 10, timeout_s=60)

        assert wait_for(
            lambda: versions_in_force(cluster) == {COMMAND_VERSION_MAX},
            timeout_s=4 * POLL_PERIOD_S,
        ), versions_in_force(cluster)
        load.phase = Load.OPEN
        assert wait_for(
            lambda: sum(j.started_in == Load.OPEN for j in list(load.far.values())) >= 5,
            timeout_s=60,
        )
    assert not load.failures, load.failures[:5]
    cluster.wait_converged(timeout_s=60)

    # Far-future jobs sent after the raise was seen are packed; none answered
    # before the last node was stopped is (packing happens only at
    # submission); every replica holds the same.
    packed = packed_per_node(cluster)
    assert len(set(packed.values())) == 1, packed
    held_packed = packed[sorted(cluster.nodes)[0]]
    assert held_packed is not None
    sent_open = sum(j.started_in == Load.OPEN for j in load.far.values())
    answered_late = sum(j.acknowledged_in >= last_step for j in load.far.values())
    assert sent_open <= held_packed <= answered_late, (sent_open, held_packed, answered_late)

    # A batch of new far-future submissions: every one packed, on every replica.
    with Client(cluster.urls, token=cluster.admin_token, retry_budget_s=30) as client:
        requests = [
            job_request(
                "upgrade-far",
                {"n": -1 - i},
                idempotency_key=f"batch-{i}",
                run_at=load.far_at_ms + HOUR_MS + i,
            )
            for i in range(BATCH_JOBS)
        ]
        items = client.submit_batch(requests)
        batch = {f"batch-{i}": item["job"]["id"] for i, item in enumerate(items)}
        assert len(set(batch.values())) == BATCH_JOBS, items
        cluster.wait_converged(timeout_s=60)
        assert packed_per_node(cluster) == dict.fromkeys(cluster.nodes, held_packed + BATCH_JOBS)

        # The settings can change now (the horizon: the width cannot while
        # jobs are packed), on every replica.
        changed = client.request("PUT", "/v1/wheel", body={"horizon_s": 900, "bucket_s": 3600})
        assert changed.json()["wheel"]["horizon_s"] == 900, changed.json()
    cluster.wait_converged(timeout_s=60)
    for node_id in cluster.nodes:
        assert wheel_on(cluster, node_id) == {
            "horizon_s": 900,
            "bucket_s": 3600,
            "packed_jobs": held_packed + BATCH_JOBS,
            "buckets": 2,
        }, node_id

    # No acknowledged job is lost, packed or not: listed, read by id and
    # counted on every replica.
    expected = {job_id: key for key, job_id in load.acknowledged.items()}
    expected_far = {job.id: (key, {"n": job.number}) for key, job in load.far.items()}
    expected_far |= {job_id: (key, {"n": -1 - i}) for i, (key, job_id) in enumerate(batch.items())}
    assert len(expected_far) == len(load.far) + BATCH_JOBS
    for node in cluster.nodes.values():
        with Client(node.http_url, token=cluster.admin_token) as client:
            held = {
                job["id"]: job.get("idempotency_key")
                for job in client.iter_jobs(queue="upgrade", page_size=1000, consistency="stale")
            }
            assert held == expected, (node.id, len(held), len(expected))
            held_far = {
                job["id"]: job.get("idempotency_key")
                for job in client.iter_jobs(
                    queue="upgrade-far", page_size=1000, consistency="stale"
                )
            }
            assert held_far == {job_id: key for job_id, (key, _) in expected_far.items()}, (
                node.id,
                len(held_far),
                len(expected_far),
            )
            for job_id, (key, payload) in expected_far.items():
                job = client.get_job(job_id, consistency="stale")
                found = (job["id"], job["status"], job.get("idempotency_key"), job["payload"])
                assert found == (job_id, "scheduled", key, payload), (node.id, job)
        counts = status_counts(cluster, node.id)
        assert counts.get("pending", 0) == len(expected), (node.id, counts)
        assert counts.get("scheduled", 0) == len(expected_far), (node.id, counts)
        assert sum(counts.values()) == len(expected) + len(expected_far), (node.id, counts)
