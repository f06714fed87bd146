"""A rolling upgrade from the previous release, with that release's real code.

The tree of the tag `v0.1.0` is extracted from this repository and run with
the same Python (`PYTHONPATH=<tree>/src`). Three nodes of it take work; then
each node in turn is stopped and started on the same data directory with
today's code. While any member still runs the old release the cluster
version stays 1 (nothing an old replica cannot decode is proposed); once
all run today's code the leader raises it to today's (3). No acknowledged
job is lost, and the replicas agree throughout.

Authentication (cluster version 3) follows the version: every node is given
an admin token file, yet while any member runs v0.1.0 the cluster serves
as before, without tokens (`/readyz` says `"auth": "off"` on today's nodes
and a request without a token succeeds); once the version is raised the
leader bootstraps the admin token and every node refuses a request without
one.

No request of today's release needs a version-2 command, so the gate is
shown with a "next release": today's tree with `SetQueue` declared a
version-2 command. While a member runs v0.1.0, a leader of that release
answers `PUT /v1/queues/{name}` 409 "upgrade every node first"; once the
last member is upgraded, the same request succeeds.
"""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_support import REPO_ROOT, cluster_env, lead_on, release_tree

from raftsched.core import COMMAND_VERSION_MAX
from raftsched.node.versions import POLL_PERIOD_S
from raftsched.testing import LocalCluster, http_json, wait_for

OLD_RELEASE = "v0.1.0"
# The commit the tag names. A clone made without tags still has the commit,
# so the test runs there too instead of skipping.
OLD_RELEASE_COMMIT = "4fb7e8c9d3ad49150f9f7d2bda4430a6d9666700"


@pytest.fixture(scope="module")
def old_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `src` directory of the previous release."""
    root = tmp_path_factory.mktemp(OLD_RELEASE)
    return release_tree(OLD_RELEASE, OLD_RELEASE_COMMIT, root) / "src"


@pytest.fixture(scope="module")
def next_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Today's `src` directory with SetQueue made a version-2 command, as
    the release that introduced it would declare it."""
    root = tmp_path_factory.mktemp("next") / "src"
    shutil.copytree(REPO_ROOT / "src" / "raftsched", root / "raftsched")
    record = root / "raftsched" / "core" / "jobs" / "feature.py"
    text = record.read_text()
    declared = "            flow.apply_set_queue,\n"
    assert declared in text
    record.write_text(text.replace(declared, declared + "            since=2,\n", 1))
    return root


def get(url: str, path: str) -> dict[str, Any]:
    status, body, _ = http_json("GET", url + path, timeout_s=10)
    assert status == 200, (path, status, body)
    return body


NO_ANSWER = 0


def cluster_versions(cluster: LocalCluster) -> dict[str, int | None]:
    """Each live node's cluster version as it reports it (None: an old node,
    NO_ANSWER: one still starting)."""
    found: dict[str, int | None] = {}
    for node_id, node in cluster.nodes.items():
        if node.alive:
            try:
                found[node_id] = get(node.http_url, "/v1/cluster").get("cluster_version")
            except OSError:
                found[node_id] = NO_ANSWER
    return found


def submit(cluster: LocalCluster, key: str) -> str:
    """One job, acknowledged (2xx) by the leader; returns its id."""
    leader = cluster.nodes[cluster.wait_for_leader(timeout_s=60)].http_url
    request = {"queue": "upgrade", "payload": {"key": key}, "idempotency_key": key}
    status, body, _ = http_json("POST", leader + "/v1/jobs", request, timeout_s=10)
    assert status in (200, 201), (status, body)
    job_id: str = body["job"]["id"]
    return job_id


def restart_on_todays_code(cluster: LocalCluster, node_id: str) -> None:
    cluster.kill(node_id, signal.SIGTERM)
    cluster.nodes[node_id].source_dir = None
    cluster.start(node_id)
    cluster.wait_for_leader(timeout_s=60)
    cluster.wait_converged(timeout_s=60)


@pytest.mark.slow
def test_a_rolling_upgrade_from_the_previous_release(old_source: Path, tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", size=3, env=cluster_env())
    for node in cluster.nodes.values():
        node.source_dir = old_source
    acknowledged: dict[str, str] = {}
    try:
        cluster.start()
        cluster.wait_for_leader(timeout_s=60)
        for node_id, version in cluster_versions(cluster).items():
            assert version is None, f"{node_id} does not run {OLD_RELEASE}"
        for number in range(10):
            acknowledged[f"old-{number}"] = submit(cluster, f"old-{number}")

        for step, node_id in enumerate(sorted(cluster.nodes), start=1):
            restart_on_todays_code(cluster, node_id)
            for number in range(5):
                key = f"step{step}-{number}"
                acknowledged[key] = submit(cluster, key)
            if step < len(cluster.nodes):
                # Long enough for a leader of today's code to have polled
                # every member: it must not raise past the old one.
                time.sleep(POLL_PERIOD_S + 2)
                versions = cluster_versions(cluster)
                assert all(v in (None, 1) for v in versions.values()), versions
                assert any(v is not None for v in versions.values()), versions
                assert_serves_without_tokens(cluster)

        raised = wait_for(
            lambda: set(cluster_versions(cluster).values()) == {COMMAND_VERSION_MAX},
            timeout_s=4 * POLL_PERIOD_S,
        )
        assert raised, cluster_versions(cluster)
        view = get(cluster.nodes[cluster.wait_for_leader()].http_url, "/v1/cluster")
        assert [n["version"]["command_version_max"] for n in view["nodes"]] == [
            COMMAND_VERSION_MAX
        ] * 3
        # Version 3 in force: the leader bootstraps the admin token from its
        # file, and authentication comes on everywhere.
        cluster.wait_for_auth(timeout_s=30)
        for node in cluster.nodes.values():
            status, body, _ = http_json("GET", node.http_url + "/v1/jobs", token="")
            assert status == 401, body
            status, body, _ = http_json(
                "GET", node.http_url + "/v1/whoami", token=cluster.admin_token
            )
            assert status == 200 and body["token"]["role"] == "admin", body

        acknowledged["after"] = submit(cluster, "after")
        cluster.wait_converged(timeout_s=60)
        for node in cluster.nodes.values():
            for key, job_id in acknowledged.items():
                body = get(node.http_url, f"/v1/jobs/{job_id}?consistency=stale")
                assert body["job"]["idempotency_key"] == key
    finally:
        cluster.stop()


def assert_serves_without_tokens(cluster: LocalCluster) -> None:
    """Before cluster version 3: no node requires a token."""
    for node in cluster.nodes.values():
        if node.source_dir is None:  # today's code says whether it requires one
            status, body, _ = http_json("GET", node.http_url + "/readyz", token="")
            assert body.get("auth") == "off", body
    leader = cluster.nodes[cluster.wait_for_leader(timeout_s=60)].http_url
    request = {"queue": "upgrade", "payload": {}}
    status, body, _ = http_json("POST", leader + "/v1/jobs", request, token="", timeout_s=10)
    assert status == 201, body


def set_queue(cluster: LocalCluster) -> tuple[int, dict[str, Any]]:
    leader = cluster.nodes[cluster.wait_for_leader(timeout_s=60)].http_url
    status, body, _ = http_json(
        "PUT", leader + "/v1/queues/upgrade", {"concurrency_limit": 3}, timeout_s=10
    )
    return status, body


@pytest.mark.slow
def test_a_newer_command_waits_until_every_node_is_upgraded(
    old_source: Path, next_source: Path, tmp_path: Path
) -> None:
    cluster = LocalCluster(tmp_path / "cluster", size=3, env=cluster_env())
    for node in cluster.nodes.values():
        node.source_dir = old_source
    try:
        cluster.start()
        cluster.wait_for_leader(timeout_s=60)
        for node_id in ("n1", "n2"):
            cluster.kill(node_id, signal.SIGTERM)
            cluster.nodes[node_id].source_dir = next_source
            cluster.start(node_id)
            cluster.wait_converged(timeout_s=60)
        lead_on(cluster, {"n1", "n2"})
        time.sleep(POLL_PERIOD_S + 2)  # the leader has polled every member
        status, body = set_queue(cluster)
        assert status == 409, body
        assert body["error"]["code"] == "invalid_state"
        assert body["error"]["message"] == "upgrade every node first"
        assert body["error"]["details"]["command"] == "SetQueue"
        assert body["error"]["details"]["cluster_version"] == 1

        cluster.kill("n3", signal.SIGTERM)
        cluster.nodes["n3"].source_dir = next_source
        cluster.start("n3")
        assert wait_for(
            lambda: set(cluster_versions(cluster).values()) == {COMMAND_VERSION_MAX},
            timeout_s=4 * POLL_PERIOD_S,
        ), cluster_versions(cluster)
        status, body = set_queue(cluster)
        assert status == 200, body
        cluster.wait_converged(timeout_s=60)
    finally:
        cluster.stop()
