"""A data directory written by an earlier release starts in place on today's code.

Each release's `tests/fixtures/<release>/datadir.tar.gz` holds the data
directories (journal, snapshot, meta) of a real three-node cluster of that
release, stopped cleanly after a story that used every feature (see
tests/fixtures/datadir_scenario.py). Today's nodes start on them:

1. each node alone, as a rolling upgrade restarts it: with no leader nothing
   new is committed, so it must reach exactly the recorded applied index and
   state digest (its snapshot, then its journal), and answer every recorded
   object over HTTP as the old release did;
2. then all three together: a leader of today's code takes over, the
   replicas agree, and the old objects work: a resubmit with the same
   idempotency key returns the same job, the running job's lease token still
   completes it, effects, schedules, workflows, tenants, queues and the
   subscription are there.

The nodes get new ports and a new secret: neither is part of the data.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from datadir_support import (
    FINAL_JOB_STATUSES,
    FINAL_WORKFLOW_STATUSES,
    QUEUE_KEYS,
    SUBSCRIPTION_KEYS,
    TENANT_KEYS,
    check_recorded_objects,
    check_same,
    get,
    golden,
    purged_by_now,
    unpack,
    wait_for,
)
from e2e_support import cluster_env

from raftsched.core.kernel import codec
from raftsched.testing import LocalCluster, http_json

RELEASES = [path for path in golden.release_dirs() if (path / golden.DATADIR_NAME).exists()]


def release_ids(paths: list[Path]) -> list[str]:
    return [path.name for path in paths]


def test_the_first_release_has_a_data_directory_fixture() -> None:
    assert "v0.1.0" in release_ids(RELEASES)


@pytest.mark.slow
@pytest.mark.parametrize("release", RELEASES, ids=release_ids(RELEASES))
def test_a_data_directory_of_the_release_starts_in_place(
    release: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = golden.read_expected(release)["datadir"]
    root = tmp_path / "cluster"
    unpack(release, expected, root)
    # From release 0.3.0 the data directory holds its own admin token: every
    # request of this test carries that secret, not the session's.
    admin_secret = expected.get("admin_secret")
    if admin_secret is not None:
        monkeypatch.setenv("RAFTSCHED_TOKEN", admin_secret)
    cluster = LocalCluster(root, size=3, env=cluster_env(), admin_secret=admin_secret)
    assert sorted(cluster.nodes) == sorted(expected["nodes"])
    try:
        for node_id in cluster.nodes:
            restart_alone(cluster, node_id, expected)
        cluster.start()
        cluster.wait_for_leader(timeout_s=60)
        cluster.wait_converged(timeout_s=60)
        use_after_upgrade(cluster, expected)
        if "tokens" in expected:
            tokens_after_upgrade(cluster, expected["tokens"])
        cluster.wait_converged(timeout_s=60)
    finally:
        cluster.stop()


def restart_alone(cluster: LocalCluster, node_id: str, expected: dict[str, Any]) -> None:
    node = cluster.nodes[node_id]
    recorded = expected["nodes"][node_id]
    cluster.start(node_id)
    try:

        def applied() -> tuple[int, str] | None:
            found = cluster.digests().get(node_id)
            if found is None or found[0] < recorded["applied_index"]:
                return None
            return found

        index, digest = wait_for(f"{node_id} to apply its journal", applied)
        assert index == recorded["applied_index"]
        digests = recorded["state_digests"]
        assert digest == digests.get(str(codec.STATE_FORMAT)), (
            f"{node_id} restarted on {expected['file']} holds another state.\n{golden.RULE}"
        )
        check_found(node.http_url, expected["found"])
        # A release before 0.2.0 had no cluster version: it ran version 1.
        status, view = get(node.http_url, "/v1/cluster")
        assert view["cluster_version"] == expected.get("cluster_version", 1)
    finally:
        cluster.kill(node_id, signal.SIGTERM)


def check_found(url: str, found: dict[str, Any]) -> None:
    """Every recorded object, read from one replica that applied nothing new."""
    check_recorded_objects(url, found)
    for subscription_id, old in found["subscriptions"].items():
        status, body = get(url, f"/v1/subscriptions/{subscription_id}")
        assert status == 200, (subscription_id, body)
        check_same(f"subscription {subscription_id}", old, body["subscription"], SUBSCRIPTION_KEYS)
        assert body["subscription"]["cursor_seq"] == old["cursor_seq"]
    if "audit" in found:  # releases from 0.3.0 on record their audit trail
        status, body = get(url, "/v1/audit?limit=1000")
        assert status == 200, body
        now = {entry["seq"]: entry for entry in body["entries"]}
        assert [now.get(entry["seq"]) for entry in found["audit"]] == found["audit"]


def tokens_after_upgrade(cluster: LocalCluster, tokens: dict[str, str]) -> None:
    """The old release's tokens are there: the admin's secret still works,
    the scoped ones keep their roles, the revoked one stays revoked."""
    leader = cluster.nodes[cluster.wait_for_leader()].http_url
    status, body, _ = http_json("GET", leader + "/v1/whoami", timeout_s=10)
    assert status == 200 and body["token"]["id"] == tokens["admin"], body
    status, body, _ = http_json("GET", leader + "/v1/tokens", timeout_s=10)
    assert status == 200, body
    listed = {token["id"]: token for token in body["tokens"]}
    assert listed[tokens["submitter"]]["role"] == "submitter"
    assert listed[tokens["worker"]]["role"] == "worker"
    assert listed[tokens["revoked"]]["revoked_at"] is not None
    status, _, _ = http_json("GET", leader + "/v1/jobs", timeout_s=10, token="")
    assert status == 401


def use_after_upgrade(cluster: LocalCluster, expected: dict[str, Any]) -> None:
    """With a leader of today's code: the old objects are there and work."""
    leader = cluster.nodes[cluster.wait_for_leader()].http_url
    found = expected["found"]
    may_be_purged = purged_by_now(expected)

    def post(path: str, body: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
        return http_json("POST", leader + path, body, timeout_s=10)

    jobs_by_key = {
        job["idempotency_key"]: job for job in found["jobs"].values() if job["idempotency_key"]
    }
    for key, request in expected["submit_requests"].items():
        old = jobs_by_key[key]
        if may_be_purged and old["status"] in FINAL_JOB_STATUSES:
            continue
        status, body, headers = post("/v1/jobs", request)
        assert (status, body["job"]["id"]) == (200, old["id"]), (key, status, body)
        assert headers.get("Idempotent-Replayed") == "true"
    for workflow_id, request in expected["workflow_requests"].items():
        if may_be_purged and found["workflows"][workflow_id]["status"] in FINAL_WORKFLOW_STATUSES:
            continue
        status, body, _ = post("/v1/workflows", request)
        assert (status, body["workflow"]["id"]) == (200, workflow_id), (status, body)
    for schedule_id, request in expected["schedule_requests"].items():
        status, body, _ = post("/v1/schedules", request)
        assert (status, body["schedule"]["id"]) == (200, schedule_id), (status, body)
    for key, old in found["effects"].items():
        if may_be_purged and found["jobs"][old["job_id"]]["status"] in FINAL_JOB_STATUSES:
            continue
        status, body = get(leader, f"/v1/effects/{key}")
        assert (status, body.get("effect")) == (200, old), key
    for name, old in found["tenants"].items():
        status, body = get(leader, f"/v1/tenants/{name}")
        check_same(f"tenant {name}", old, body["tenant"], TENANT_KEYS)
    for name, old in found["queues"].items():
        status, body = get(leader, f"/v1/queues/{name}")
        check_same(f"queue {name}", old, body["queue"], QUEUE_KEYS)
    for schedule_id, old in found["occurrences"].items():
        status, body = get(leader, f"/v1/schedules/{schedule_id}/occurrences?limit=100")
        assert body["occurrences"][: len(old)] == old  # a paused schedule adds none
    for subscription_id, old in found["subscriptions"].items():
        status, body = get(leader, f"/v1/subscriptions/{subscription_id}")
        check_same(f"subscription {subscription_id}", old, body["subscription"], SUBSCRIPTION_KEYS)
        assert body["subscription"]["cursor_seq"] >= old["cursor_seq"]
    # The lease taken before the upgrade still holds: the takeover extended
    # it, and its fencing token completes the job.
    lease = expected["running_lease"]
    status, body, _ = post(
        f"/v1/leases/{lease['job_id']}/complete",
        {"fencing_token": lease["fencing_token"], "result": {"after": "upgrade"}},
    )
    assert status == 200, body
    status, body = get(leader, f"/v1/jobs/{lease['job_id']}")
    assert body["job"]["status"] == "succeeded"
