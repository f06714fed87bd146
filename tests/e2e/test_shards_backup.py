"""Backup and restore of a cluster of several shards (docs/shards.md, section 5).

A 3-node × 3-shard cluster holds jobs in every shard, some of them
finished by a worker; `raftsched backup` writes one file holding every
group's backup; each part's digest is the digest of its group's replica at
the part's index; `raftsched restore` seeds three fresh data directories
(every group's, and the record of S), and `raftsched node --shards 3` on
them serves every job of every shard with its status. A truncated or
corrupted file is refused and nothing is written.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_support import cluster_env, sharded_cluster

from raftsched.backup import OpenShardedBackup, open_any
from raftsched.client import Client
from raftsched.identity import read_identity
from raftsched.shards import recorded_shards, shard_dir, shard_of_id
from raftsched.testing import LocalCluster, http_json, wait_for

SHARDS = 3
QUEUE = "kept"


def cli(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**cluster_env(), "PATH": ""}
    if token is not None:
        env["RAFTSCHED_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "raftsched", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


def _follow(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """One request, following 307s and waiting out 503s, as a client does."""
    deadline = time.monotonic() + 30
    hops = 5
    while True:
        status, answer, got = http_json(method, url, body, timeout_s=30, headers=headers)
        if status == 307 and hops > 0:
            url, hops = got["Location"], hops - 1
            continue
        if status == 503 and time.monotonic() < deadline:
            time.sleep(0.3)
            continue
        return status, answer


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with sharded_cluster(tmp_path_factory.mktemp("sb") / "c", SHARDS) as cluster:
        yield cluster


def _load(cluster: LocalCluster) -> dict[str, str]:
    """Jobs in every shard, one per shard run to success: {id: status}."""
    url = cluster.urls[0]
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        ids = [client.submit(QUEUE, {"n": n})["id"] for n in range(24)]
    assert {shard_of_id(job_id) for job_id in ids} == set(range(SHARDS)), ids
    for shard in range(SHARDS):
        status, body = _follow(
            "POST",
            url + "/v1/leases",
            {"worker_id": f"w{shard}", "queues": [QUEUE], "max_jobs": 1},
            headers={"Raftsched-Shard": str(shard)},
        )
        assert status == 200 and len(body["leases"]) == 1, body
        lease = body["leases"][0]
        token = lease["fencing_token"]
        path = f"{url}/v1/leases/{lease['job_id']}"
        assert _follow("POST", path + "/start", {"fencing_token": token})[0] == 200
        done = _follow("POST", path + "/complete", {"fencing_token": token, "result": shard})
        assert done[0] == 200, done
    statuses = {}
    for job_id in ids:
        status, body = _follow("GET", f"{url}/v1/jobs/{job_id}")
        assert status == 200, body
        statuses[job_id] = body["job"]["status"]
    assert sorted(statuses.values()).count("succeeded") == SHARDS, statuses
    return statuses


def _digests(cluster: LocalCluster, url: str) -> list[tuple[str, int]]:
    """(digest, applied index) of this node's replica of every group."""
    found = []
    for shard in range(SHARDS):
        status, body, _ = http_json(
            "GET",
            url + "/v1/debug/digest",
            token=cluster.admin_token,
            headers={"Raftsched-Shard": str(shard)},
        )
        assert status == 200, body
        found.append((body["digest"], body["applied_index"]))
    return found


def test_a_sharded_backup_restores_every_shard(
    sharded: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    statuses = _load(sharded)
    work = tmp_path_factory.mktemp("sbf")
    backup_file = work / "cluster.backup"
    done = cli("backup", "--out", str(backup_file), "--url", ",".join(sharded.urls),
               token=sharded.admin_token)  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed["shards"] == SHARDS and len(printed["parts"]) == SHARDS
    with open_any(backup_file) as backup:
        assert isinstance(backup, OpenShardedBackup)
        parts = [(part.header.index, part.header.digest) for part in backup.parts]
        group_ids = [part.header.cluster_id for part in backup.parts]
    assert [(p["index"], p["digest"]) for p in printed["parts"]] == parts
    # Every group's own cluster id, each part from its own group.
    assert len(set(group_ids)) == SHARDS and None not in group_ids

    # Each part's digest is its group's digest at the part's index: a stale
    # backup from one node against that node's replicas, read before and
    # after (a group may commit meanwhile: try again).
    url = sharded.urls[1]

    def parts_match() -> bool:
        before = _digests(sharded, url)
        request = urllib.request.Request(
            url + "/v1/backup?consistency=stale",
            headers={"Authorization": f"Bearer {sharded.admin_token}"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            streamed = response.read()
            headers = response.headers
        assert int(headers["Content-Length"]) == len(streamed)
        assert headers["Raftsched-Shards"] == str(SHARDS)
        streamed_file = work / "streamed.backup"
        streamed_file.write_bytes(streamed)
        with open_any(streamed_file) as again:
            assert isinstance(again, OpenShardedBackup)
            got = [(part.header.digest, part.header.index) for part in again.parts]
            assert headers["Raftsched-Digest"] == got[0][0]
        after = _digests(sharded, url)
        return before == after == got

    assert wait_for(parts_match, 60)

    # Three fresh data directories: n1 gets a new cluster id, n2 and n3 join it.
    fresh = LocalCluster(
        tmp_path_factory.mktemp("rs") / "c", size=3, env=cluster_env(), shards=SHARDS
    )
    first = cli("restore", str(backup_file), "--data-dir", str(fresh.nodes["n1"].data_dir),
                "--id", "n1")  # fmt: skip
    assert first.returncode == 0, first.stderr
    seeded = json.loads(first.stdout)
    assert seeded["shards"] == SHARDS
    assert [(p["index"], p["digest"]) for p in seeded["parts"]] == [
        (max(index, 2), digest) for index, digest in parts
    ]
    assert seeded["jobs"] == sum(p["jobs"] for p in seeded["parts"]) >= len(statuses)
    new_cluster_id = seeded["cluster_id"]
    for node_id in ("n2", "n3"):
        other = cli("restore", str(backup_file), "--data-dir", str(fresh.nodes[node_id].data_dir),
                    "--id", node_id, "--cluster-id", new_cluster_id)  # fmt: skip
        assert other.returncode == 0, other.stderr
    for node in fresh.nodes.values():
        assert recorded_shards(node.data_dir) == SHARDS
        for shard in range(1, SHARDS):
            identity = read_identity(shard_dir(node.data_dir, shard) / "raft")
            assert identity is not None
            assert identity.cluster_id == f"{new_cluster_id}.s{shard}"
            assert identity.restored_from == group_ids[shard]

    fresh.start()
    try:
        fresh.wait_for_leader(timeout_s=90)
        fresh.wait_for_auth(timeout_s=60)
        fresh.wait_for_shards(timeout_s=90)
        for url in fresh.urls:
            with Client([url], timeout_s=10, retry_budget_s=30) as client:
                for job_id, status in statuses.items():
                    assert client.get_job(job_id)["status"] == status, job_id
        with Client(fresh.urls, timeout_s=10, retry_budget_s=30) as client:
            after = [client.submit(QUEUE, {"after": n})["id"] for n in range(9)]
        assert {shard_of_id(job_id) for job_id in after} == set(range(SHARDS))
    finally:
        fresh.stop()
    errors = fresh.unexpected_log_errors()
    assert not errors, "\n".join(error.describe() for error in errors)

    # A truncated file and a file with one byte changed in a shard's part
    # are refused (exit 65), and nothing is written.
    data = backup_file.read_bytes()
    truncated = work / "truncated.backup"
    truncated.write_bytes(data[: len(data) - 100])
    corrupt = work / "corrupt.backup"
    changed = bytearray(data)
    changed[-50] ^= 0xFF  # in the last shard's body
    corrupt.write_bytes(bytes(changed))
    for damaged, says in ((truncated, "truncated"), (corrupt, "corrupt")):
        target = work / f"into-{damaged.stem}"
        refused = cli("restore", str(damaged), "--data-dir", str(target), "--id", "n1")
        assert refused.returncode == 65, refused
        assert says in refused.stderr, refused.stderr
        assert not target.exists() or not any(target.iterdir())
