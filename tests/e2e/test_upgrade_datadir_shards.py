"""A sharded cluster's data directory, written by an earlier release, starts in place.

From release 0.9.0 each release's `tests/fixtures/<release>/` also holds
`datadir-shards.tar.gz`: the data directories of a real three-node cluster
of three shards (`shards.json`; group 0 in `raft/`, shard k in
`shards/<k>/raft/`), stopped cleanly after a story that put jobs,
effects, a leased running job, schedules and workflows in every shard and
settings and tokens in group 0 (tests/fixtures/datadir_shards_scenario.py).
Today's nodes start on them with `--shards 3`:

1. each node alone, as a rolling upgrade restarts it: no group has a leader,
   so nothing new is committed, and every group of the node (group 0 in the
   node process, shards 1 and 2 in its shard processes) must reach exactly
   its recorded applied index and state digest (its snapshot, then its
   journal) and answer every recorded object as the old release did;
2. then all three together: every group elects a leader of today's code,
   each group's replicas agree, and the old objects work: a resubmit with
   the same idempotency key is placed in the same shard and returns the
   same job, each shard's leased job completes with its old fencing token,
   effects, schedules, workflows, tenants, queues and tokens are there.

The nodes get new Raft and HTTP ports and a new secret: none of them is part
of the data. The story made no membership change, so no group recorded a
member directory (which would hold Raft addresses): every group takes its
peers from the flags, shard k's at the members' Raft ports plus `k x
stride`, the stride the fixture's cluster ran with.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from datadir_support import (
    FINAL_JOB_STATUSES,
    FINAL_WORKFLOW_STATUSES,
    QUEUE_KEYS,
    TENANT_KEYS,
    WORKFLOW_KEYS,
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
from raftsched.shards import RECORD_NAME, SHARD_HEADER, shard_of_id
from raftsched.testing import LocalCluster, http_json

RELEASES = [path for path in golden.release_dirs() if (path / golden.DATADIR_SHARDS_NAME).exists()]
# The release that brought shards: it and every later one keep a sharded data directory.
FIRST_SHARDED_RELEASE = (0, 9, 0)


def release_ids(paths: list[Path]) -> list[str]:
    return [path.name for path in paths]


def test_every_release_from_shards_on_has_a_sharded_data_directory() -> None:
    for release in golden.release_dirs():
        version = tuple(int(part) for part in release.name.lstrip("v").split("."))
        if version >= FIRST_SHARDED_RELEASE:
            expected = golden.read_expected(release)
            assert "datadir_shards" in expected, release
            assert (release / golden.DATADIR_SHARDS_NAME).exists(), release


def follow(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """One request as a client makes it: 307s followed (to group 0's leader
    or to the node hosting a shard's leader, method, body and headers kept),
    503s waited out."""
    deadline = time.monotonic() + 30
    target = url
    while True:
        for _ in range(5):
            status, answer, got = http_json(method, target, body, timeout_s=30, headers=headers)
            if status != 307:
                break
            target = got["Location"]
        if status != 503 or time.monotonic() > deadline:
            return status, answer, got
        time.sleep(0.3)
        target = url


def wait_for_quietly(predicate: Any, timeout_s: float) -> bool:
    """Whether `predicate` holds within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def group_digest(url: str, shard: int) -> tuple[int, str] | None:
    """(applied index, digest) of the node's own replica of group `shard`."""
    try:
        status, body, _ = http_json(
            "GET", url + "/v1/debug/digest", timeout_s=5, headers={SHARD_HEADER: str(shard)}
        )
    except OSError:
        return None
    return (body["applied_index"], body["digest"]) if status == 200 else None


def groups_converged(cluster: LocalCluster, shards: int) -> dict[int, tuple[int, str]]:
    """Every group's replicas agree: shard -> (applied index, digest)."""

    def agreed() -> dict[int, tuple[int, str]] | None:
        found: dict[int, tuple[int, str]] = {}
        for shard in range(shards):
            seen = {group_digest(node.http_url, shard) for node in cluster.nodes.values()}
            if len(seen) != 1 or None in seen:
                return None
            found[shard] = next(iter(seen))  # type: ignore[assignment]
        return found

    converged: dict[int, tuple[int, str]] = wait_for("every group to converge", agreed, 90)
    return converged


@pytest.mark.slow
@pytest.mark.parametrize("release", RELEASES, ids=release_ids(RELEASES))
def test_a_sharded_data_directory_of_the_release_starts_in_place(
    release: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = golden.read_expected(release)["datadir_shards"]
    # Short: each shard's Unix socket lives in its data directory (107 bytes).
    root = tmp_path_factory.mktemp("up") / "c"
    unpack(release, expected, root)
    shards = expected["shards"]
    for node_id in expected["nodes"]:
        assert (root / node_id / RECORD_NAME).is_file(), node_id
    monkeypatch.setenv("RAFTSCHED_TOKEN", expected["admin_secret"])
    cluster = LocalCluster(
        root,
        size=3,
        env=cluster_env(),
        admin_secret=expected["admin_secret"],
        shards=shards,
        shard_port_stride=expected["shard_port_stride"],
    )
    assert sorted(cluster.nodes) == sorted(expected["nodes"])
    try:
        for node_id in cluster.nodes:
            restart_alone(cluster, node_id, expected)
        cluster.start()
        cluster.wait_for_leader(timeout_s=90)
        cluster.wait_for_shards(timeout_s=90)
        groups_converged(cluster, shards)
        use_after_upgrade(cluster, expected)
        tokens_after_upgrade(cluster, expected["tokens"])
        groups_converged(cluster, shards)
    finally:
        cluster.stop()


def restart_alone(cluster: LocalCluster, node_id: str, expected: dict[str, Any]) -> None:
    url = cluster.nodes[node_id].http_url
    recorded = expected["nodes"][node_id]
    cluster.start(node_id)
    try:
        for shard, group in sorted(recorded.items()):

            def applied(shard: int = int(shard), index: int = group["applied_index"]) -> Any:
                found = group_digest(url, shard)
                return None if found is None or found[0] < index else found

            index, digest = wait_for(f"{node_id}'s shard {shard} to apply its journal", applied)
            assert index == group["applied_index"], (node_id, shard)
            assert digest == group["state_digests"].get(str(codec.STATE_FORMAT)), (
                f"{node_id}'s shard {shard} restarted on {expected['file']} holds another "
                f"state.\n{golden.RULE}"
            )
        check_found(url, expected["found"])
        # Each group keeps its own identity (its cluster id) across the
        # upgrade, as the node sees its shard processes (polled each second).
        seen: list[dict[str, Any]] = []

        def identities() -> bool:
            status, view = get(url, "/v1/cluster")
            assert status == 200, view
            seen[:] = [view]
            groups = {str(entry["shard"]): entry.get("cluster_id") for entry in view["shards"]}
            return groups == expected["group_cluster_ids"]

        if not wait_for_quietly(identities, 30):
            raise AssertionError(f"{node_id}'s groups are not the recorded ones: {seen}")
        view = seen[0]
        assert view["cluster_id"] == expected["cluster_id"]
        assert view["cluster_version"] == expected["cluster_version"]
    finally:
        cluster.kill(node_id, signal.SIGTERM)


def check_found(url: str, found: dict[str, Any]) -> None:
    """Every recorded object, read from one node's replicas (stale reads,
    routed by the id to the shard that holds it) that applied nothing new."""
    check_recorded_objects(url, found)


def use_after_upgrade(cluster: LocalCluster, expected: dict[str, Any]) -> None:
    """With every group led by today's code: the old objects are there and work."""
    url = cluster.nodes[cluster.wait_for_leader()].http_url
    found = expected["found"]
    may_be_purged = purged_by_now(expected)
    shards_used: set[int] = set()
    for key, request in expected["submit_requests"].items():
        old = found["jobs"][expected["submitted"][key]]
        shards_used.add(shard_of_id(old["id"]))
        if may_be_purged and old["status"] in FINAL_JOB_STATUSES:
            continue
        # From every node: each places the key in the shard it placed it in.
        for node in cluster.nodes.values():
            status, body, headers = follow("POST", node.http_url + "/v1/jobs", request)
            assert (status, body["job"]["id"]) == (200, old["id"]), (key, status, body)
            assert headers.get("Idempotent-Replayed") == "true"
    assert shards_used == set(range(expected["shards"])), shards_used
    for workflow_id, request in expected["workflow_requests"].items():
        if may_be_purged and found["workflows"][workflow_id]["status"] in FINAL_WORKFLOW_STATUSES:
            continue
        status, body, _ = follow("POST", url + "/v1/workflows", request)
        assert (status, body["workflow"]["id"]) == (200, workflow_id), (status, body)
    for schedule_id, request in expected["schedule_requests"].items():
        status, body, _ = follow("POST", url + "/v1/schedules", request)
        assert (status, body["schedule"]["id"]) == (200, schedule_id), (status, body)
    for key, old in found["effects"].items():
        if may_be_purged and found["jobs"][old["job_id"]]["status"] in FINAL_JOB_STATUSES:
            continue
        status, body, _ = follow("GET", url + f"/v1/effects/{key}")
        assert (status, body.get("effect")) == (200, old), key
    for name, old in found["tenants"].items():
        status, body, _ = follow("GET", url + f"/v1/tenants/{name}")
        check_same(f"tenant {name}", old, body["tenant"], TENANT_KEYS)
    for name, old in found["queues"].items():
        status, body, _ = follow("GET", url + f"/v1/queues/{name}")
        check_same(f"queue {name}", old, body["queue"], QUEUE_KEYS)
    for schedule_id, old in found["occurrences"].items():
        path = f"/v1/schedules/{schedule_id}/occurrences?limit=100"
        status, body, _ = follow("GET", url + path)
        assert body["occurrences"][: len(old)] == old  # a paused schedule adds none
    for workflow_id, old in found["workflows"].items():
        if may_be_purged and old["status"] in FINAL_WORKFLOW_STATUSES:
            continue
        status, body, _ = follow("GET", url + f"/v1/workflows/{workflow_id}")
        assert status == 200, (workflow_id, body)
        check_same(f"workflow {workflow_id}", old, body["workflow"], WORKFLOW_KEYS)
    # Each shard's lease taken before the upgrade still holds: its group's
    # new leader extended it, and its fencing token completes the job.
    for lease in expected["running_leases"]:
        status, body, _ = follow(
            "POST",
            url + f"/v1/leases/{lease['job_id']}/complete",
            {"fencing_token": lease["fencing_token"], "result": {"after": "upgrade"}},
        )
        assert status == 200, (lease, body)
        status, body, _ = follow("GET", url + f"/v1/jobs/{lease['job_id']}")
        assert body["job"]["status"] == "succeeded", body
    # Every shard takes new work too, placed by its key.
    for shard in range(expected["shards"]):
        status, body, _ = follow(
            "POST",
            url + "/v1/jobs",
            {"queue": "after-upgrade", "payload": {"shard": shard}},
            headers={SHARD_HEADER: str(shard)},
        )
        assert status == 201 and shard_of_id(body["job"]["id"]) == shard, body


def tokens_after_upgrade(cluster: LocalCluster, tokens: dict[str, str]) -> None:
    """Group 0's tokens are there: the admin's secret still works, the
    scoped one keeps its role, the revoked one stays revoked."""
    url = cluster.nodes[cluster.wait_for_leader()].http_url
    status, body, _ = http_json("GET", url + "/v1/whoami", timeout_s=10)
    assert status == 200 and body["token"]["id"] == tokens["admin"], body
    status, body, _ = follow("GET", url + "/v1/tokens")
    assert status == 200, body
    listed = {token["id"]: token for token in body["tokens"]}
    assert listed[tokens["submitter"]]["role"] == "submitter"
    assert listed[tokens["revoked"]]["revoked_at"] is not None
    status, _, _ = http_json("GET", url + "/v1/jobs", timeout_s=10, token="")
    assert status == 401
