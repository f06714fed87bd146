"""Backup and restore with real processes (issue 16, part 4).

A loaded cluster is backed up through `raftsched backup`; the file is
restored into a fresh three-node cluster with `raftsched restore` (the
first node gets a new cluster id, the others are restored with it); the
restored state has the backup's digest, the jobs are there, and the new
cluster names another cluster id. A damaged backup and a data directory
that is not empty are refused.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from e2e_support import cluster_env

from raftsched.backup import open_backup
from raftsched.identity import read_identity
from raftsched.raft_journal import SNAPSHOT_NAME, decode_snapshot
from raftsched.testing import LocalCluster, http_json, wait_for

JOBS = 300


def cli(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**cluster_env(), "PATH": ""}
    if token is not None:
        env["RAFTSCHED_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "raftsched", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def load(cluster: LocalCluster) -> list[str]:
    """Jobs in a few queues, a few of them finished by a worker's lease."""
    url = cluster.nodes[cluster.wait_for_leader()].http_url
    ids: list[str] = []
    for start in range(0, JOBS, 100):
        jobs = [{"queue": f"q{n % 3}", "payload": {"n": n}} for n in range(start, start + 100)]
        status, body, _ = http_json("POST", url + "/v1/jobs/batch", {"jobs": jobs})
        assert status in (200, 201), body
        ids += [item["job"]["id"] for item in body["results"]]
    status, body, _ = http_json(
        "POST", url + "/v1/leases", {"worker_id": "w1", "queues": ["q0"], "max_jobs": 5}
    )
    assert status == 200, body
    for lease in body["leases"]:
        token = lease["fencing_token"]
        path = f"/v1/leases/{lease['job_id']}"
        assert http_json("POST", url + path + "/start", {"fencing_token": token})[0] == 200
        done = http_json("POST", url + path + "/complete", {"fencing_token": token, "result": 1})
        assert done[0] == 200, done
    return ids


def debug_digest(cluster: LocalCluster, url: str) -> dict[str, Any]:
    status, body, _ = http_json("GET", url + "/v1/debug/digest", token=cluster.admin_token)
    assert status == 200, body
    return {"digest": body["digest"], "applied_index": body["applied_index"]}


def cluster_id_of(cluster: LocalCluster, node_id: str) -> Any:
    status, body, _ = http_json(
        "GET", cluster.nodes[node_id].http_url + "/v1/cluster", token=cluster.admin_token
    )
    assert status == 200, body
    return body["cluster_id"]


def test_a_backup_restores_into_a_new_cluster_with_the_same_state(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    ids = load(cluster)
    assert wait_for(lambda: cluster_id_of(cluster, "n1") is not None, 30)
    old_cluster_id = cluster_id_of(cluster, "n1")
    backup_file = tmp_path / "cluster.backup"

    done = cli("backup", "--out", str(backup_file), "--url", ",".join(cluster.urls),
               token=cluster.admin_token)  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    with open_backup(backup_file) as backup:
        header = backup.header
        body_sha256 = hashlib.sha256(backup.body).hexdigest()
    assert printed["digest"] == header.digest == body_sha256
    assert header.cluster_id == old_cluster_id and header.index >= 2

    # The HTTP headers name the same index and digest as the body.
    leader_url = cluster.nodes[cluster.wait_for_leader()].http_url

    # ... and the digest is /v1/debug/digest's at that index (read before
    # and after; the leader may commit a token's use meanwhile: try again).
    def digest_matches() -> bool:
        before = debug_digest(cluster, leader_url)
        request = urllib.request.Request(
            leader_url + "/v1/backup?consistency=stale",
            headers={"Authorization": f"Bearer {cluster.admin_token}"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            streamed = response.read()
            headers = response.headers
        assert headers["Content-Type"] == "application/octet-stream"
        assert int(headers["Content-Length"]) == len(streamed)
        streamed_file = tmp_path / "streamed.backup"
        streamed_file.write_bytes(streamed)
        with open_backup(streamed_file) as again:
            assert int(headers["Raftsched-Applied-Index"]) == again.header.index >= header.index
            assert headers["Raftsched-Digest"] == again.header.digest
            after = debug_digest(cluster, leader_url)
            if before == after and before["applied_index"] == again.header.index:
                assert before["digest"] == again.header.digest
                return True
        return False

    assert wait_for(digest_matches, 30)

    # A fresh three-node cluster: n1 gets a new cluster id, n2 and n3 join it.
    fresh = LocalCluster(tmp_path / "restored", size=3, env=cluster_env())
    first = cli("restore", str(backup_file), "--data-dir", str(fresh.nodes["n1"].data_dir),
                "--id", "n1")  # fmt: skip
    assert first.returncode == 0, first.stderr
    seeded = json.loads(first.stdout)
    new_cluster_id = seeded["cluster_id"]
    assert new_cluster_id != old_cluster_id and seeded["restored_from"] == old_cluster_id
    assert (seeded["digest"], seeded["index"], seeded["jobs"]) == (
        header.digest,
        header.index,
        JOBS,
    )
    for node_id in ("n2", "n3"):
        other = cli("restore", str(backup_file), "--data-dir", str(fresh.nodes[node_id].data_dir),
                    "--id", node_id, "--cluster-id", new_cluster_id)  # fmt: skip
        assert other.returncode == 0, other.stderr
    for node in fresh.nodes.values():
        raft_dir = node.data_dir / "raft"
        snapshot_header, body = decode_snapshot((raft_dir / SNAPSHOT_NAME).read_bytes())
        assert hashlib.sha256(body).hexdigest() == header.digest  # the exact state
        assert snapshot_header.last_entry[1] == header.index
        identity = read_identity(raft_dir)
        assert identity is not None and identity.cluster_id == new_cluster_id

    fresh.start()
    try:
        fresh.wait_for_leader()
        url = fresh.nodes[fresh.wait_for_leader()].http_url
        # Restored tokens: the old cluster's admin token works on the new one.
        assert wait_for(
            lambda: all(cluster_id_of(fresh, n) == new_cluster_id for n in fresh.nodes), 30
        )
        for job_id in (ids[0], ids[len(ids) // 2], ids[-1]):
            status, job, _ = http_json("GET", f"{url}/v1/jobs/{job_id}", token=fresh.admin_token)
            assert status == 200 and job["job"]["id"] == job_id, job
        status, body, _ = http_json("GET", url + "/v1/jobs?status=succeeded&limit=100")
        assert status == 200 and len(body["jobs"]) == 5, body
        fresh.wait_converged()
        status, body, _ = http_json("POST", url + "/v1/jobs", {"queue": "after-restore"})
        assert status == 201, body
    finally:
        fresh.stop()


def test_a_damaged_backup_and_a_used_data_directory_are_refused(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    load(cluster)
    backup_file = tmp_path / "good.backup"
    done = cli("backup", "--out", str(backup_file), "--stale", "--url", cluster.urls[0],
               token=cluster.admin_token)  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = backup_file.read_bytes()

    truncated = tmp_path / "truncated.backup"
    truncated.write_bytes(data[: len(data) - 100])
    flipped = tmp_path / "flipped.backup"
    middle = len(data) // 2
    flipped.write_bytes(data[:middle] + bytes([data[middle] ^ 0x40]) + data[middle + 1 :])
    for bad, why in ((truncated, "truncated"), (flipped, "corrupt")):
        target = tmp_path / f"data-{bad.stem}"
        refused = cli("restore", str(bad), "--data-dir", str(target), "--id", "n1")
        assert refused.returncode == 65, refused.stderr
        assert why in refused.stderr
        assert not (target / "raft" / SNAPSHOT_NAME).exists()

    # A running node's data directory is never overwritten.
    used = cluster.nodes["n1"].data_dir
    before = sorted(path.name for path in (used / "raft").iterdir())
    refused = cli("restore", str(backup_file), "--data-dir", str(used), "--id", "n1")
    assert refused.returncode == 73, refused.stderr
    assert "not empty" in refused.stderr
    assert sorted(path.name for path in (used / "raft").iterdir()) == before

    # Without a token (or with a non-admin one) there is no backup.
    assert http_json("GET", cluster.urls[0] + "/v1/backup", token="")[0] == 401


def test_a_cluster_that_changed_its_members_restores_into_one_new_cluster(
    tmp_path: Path,
) -> None:
    """The backed-up state records a member directory (n4 joined, then left):
    the old cluster's Raft addresses. Restored on new machines, the nodes
    must follow their own flags until the new cluster has renamed the
    state, and the rename drops the old directory; three nodes that each
    believed they were alone would elect three leaders."""
    source = LocalCluster(tmp_path / "source", size=3, env=cluster_env())
    source.start()
    try:
        source.wait_for_leader()
        source.wait_for_auth()
        assert wait_for(lambda: cluster_id_of(source, "n1") is not None, 30)
        url = source.nodes[source.wait_for_leader()].http_url
        n4 = source.new_node("n4")
        member = {"id": "n4", "raft_address": n4.raft_address, "http_url": n4.http_url}
        assert http_json("POST", url + "/v1/cluster/nodes", member, timeout_s=30)[0] == 202
        source.start_joining("n4", url)
        source.wait_converged(timeout_s=60)
        url = source.nodes[source.wait_for_leader()].http_url
        assert http_json("DELETE", url + "/v1/cluster/nodes/n4", timeout_s=30)[0] == 202
        source.kill("n4")
        source.mark_removed("n4")
        recorded = http_json("GET", url + "/v1/cluster")[1]["membership"]["recorded"]
        assert recorded is True
        backup_file = tmp_path / "cluster.backup"
        done = cli("backup", "--out", str(backup_file), "--url", url, token=source.admin_token)
        assert done.returncode == 0, done.stderr
    finally:
        source.stop()

    fresh = LocalCluster(tmp_path / "restored", size=3, env=cluster_env())
    first = cli("restore", str(backup_file), "--data-dir", str(fresh.nodes["n1"].data_dir),
                "--id", "n1")  # fmt: skip
    assert first.returncode == 0, first.stderr
    new_cluster_id = json.loads(first.stdout)["cluster_id"]
    for node_id in ("n2", "n3"):
        other = cli("restore", str(backup_file), "--data-dir", str(fresh.nodes[node_id].data_dir),
                    "--id", node_id, "--cluster-id", new_cluster_id)  # fmt: skip
        assert other.returncode == 0, other.stderr
    fresh.start()
    try:
        fresh.wait_for_leader(timeout_s=60)
        assert wait_for(
            lambda: all(cluster_id_of(fresh, n) == new_cluster_id for n in fresh.nodes), 30
        )
        for node_id in fresh.nodes:
            status, view, _ = http_json("GET", fresh.nodes[node_id].http_url + "/v1/cluster")
            assert status == 200 and view["membership"]["recorded"] is False, view
            assert sorted(node["id"] for node in view["nodes"]) == ["n1", "n2", "n3"], view

        def leaders() -> set[str | None]:
            views = [
                http_json("GET", node.http_url + "/v1/cluster")[1] for node in fresh.nodes.values()
            ]
            return {(view.get("leader") or {}).get("id") for view in views}

        # One leader that all three follow. On a loaded machine an election
        # may still be under way when the restored cluster first answers, so
        # the nodes are given time to agree rather than asked once.
        assert wait_for(lambda: len(agreed := leaders()) == 1 and None not in agreed, 60)
        leader = fresh.wait_for_leader(timeout_s=60)
        status, body, _ = http_json(
            "POST", fresh.nodes[leader].http_url + "/v1/jobs", {"queue": "after-restore"}
        )
        assert status == 201, body
        fresh.wait_converged()
    finally:
        fresh.stop()


def test_backups_one_after_another_are_never_told_the_node_is_busy(
    cluster: LocalCluster,
) -> None:
    """A backup's last byte leaves only once its child is reaped: a client
    that asks again as soon as it has read one gets the next, not a 503."""
    url = cluster.nodes[cluster.wait_for_leader()].http_url
    for _ in range(10):
        request = urllib.request.Request(
            url + "/v1/backup?consistency=stale",
            headers={"Authorization": f"Bearer {cluster.admin_token}"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200
            assert len(response.read()) == int(response.headers["Content-Length"])
