"""Far-future jobs on a real 3-node cluster: packed by the time wheel
(cluster version 7, default 10-minute horizon in hour-wide buckets), read,
listed and cancelled while packed, the replicas' digests agreeing, and the
rest claimable once due.

Real time cannot be moved, so to bring the jobs due the whole cluster is
restarted with its wall clock four hours ahead, as tests/e2e/
test_schedules_downtime.py does: the restarted replicas rebuild the wheel
from their logs and snapshots, and the leader's Tick hydrates it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from e2e_support import shift_wall_clock

from raftsched.client import ApiError, Client, job_request
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.testing import LocalCluster, http_json, wait_for

JOBS = 60
CANCELLED = 10

pytestmark = pytest.mark.slow


def packed_per_node(cluster: LocalCluster) -> dict[str, int]:
    found = {}
    for node_id, node in cluster.nodes.items():
        status, body, _ = http_json(
            "GET", node.http_url + "/v1/debug/digest", token=cluster.admin_token
        )
        assert status == 200, body
        found[node_id] = body["packed_jobs"]
    return found


def wait_version_7(cluster: LocalCluster) -> None:
    def raised() -> bool:
        leader = cluster.leader_id()
        view = None if leader is None else cluster.cluster_view(leader)
        return view is not None and view.get("cluster_version") == COMMAND_VERSION_MAX

    assert COMMAND_VERSION_MAX >= 7
    assert wait_for(raised, 30), "cluster version not raised"


def test_far_future_jobs_are_packed_read_cancelled_and_run_when_due(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    wait_version_7(cluster)
    # Epoch milliseconds; beyond the horizon and the next bucket.
    run_at = int((time.time() + 3 * 3600) * 1000)
    requests = [
        job_request(
            "wheel",
            {"n": i},
            run_at=run_at + i,
            idempotency_key=f"far-{i}" if i % 2 else None,
            tenant=f"t{i % 3}",
        )
        for i in range(JOBS)
    ]
    items = client.submit_batch(requests)
    ids = [item["job"]["id"] for item in items]
    assert len(set(ids)) == JOBS
    cluster.wait_converged()
    assert packed_per_node(cluster) == dict.fromkeys(cluster.nodes, JOBS)

    # Reads decode packed jobs and hydrate none of them (a linearizable
    # read commits a barrier, so the digest itself moves on).
    job = client.get_job(ids[7])
    assert job["status"] == "scheduled" and job["payload"] == {"n": 7}
    listed = [each["id"] for each in client.iter_jobs(queue="wheel")]
    assert listed == list(reversed(ids))
    page = client.list_jobs(queue="wheel", status="scheduled", tenant="t1", limit=5)
    assert [each["id"] for each in page["jobs"]] == [ids[i] for i in (58, 55, 52, 49, 46)]
    cluster.wait_converged()
    assert packed_per_node(cluster) == dict.fromkeys(cluster.nodes, JOBS)

    # Commands on packed jobs: cancel, an idempotent repeat, a conflict.
    for job_id in ids[:CANCELLED]:
        assert client.cancel_job(job_id, "not needed")["status"] == "cancelled"
    again = client.submit("wheel", {"n": 21}, run_at=run_at + 21, idempotency_key="far-21",
                          tenant="t0")  # fmt: skip
    assert again["id"] == ids[21]
    with pytest.raises(ApiError) as conflict:
        client.submit("wheel", {"n": 0}, run_at=run_at, idempotency_key="far-23", tenant="t2")
    assert conflict.value.status == 409 and conflict.value.code == "idempotency_conflict"
    cluster.wait_converged()
    # The cancelled jobs and the two named by key were made live.
    assert packed_per_node(cluster) == dict.fromkeys(cluster.nodes, JOBS - CANCELLED - 2)

    # The settings: the width cannot change while jobs are packed.
    wheel = client.request("GET", "/v1/wheel").json()["wheel"]
    assert wheel == {"horizon_s": 600, "bucket_s": 3600, "packed_jobs": JOBS - CANCELLED - 2,
                     "buckets": wheel["buckets"]}  # fmt: skip
    with pytest.raises(ApiError) as busy:
        client.request("PUT", "/v1/wheel", body={"horizon_s": 600, "bucket_s": 60})
    assert busy.value.status == 409 and busy.value.code == "invalid_state"
    changed = client.request("PUT", "/v1/wheel", body={"horizon_s": 900, "bucket_s": 3600})
    assert changed.json()["wheel"]["horizon_s"] == 900

    # Four hours later: every replica rebuilt from its log, the Tick
    # hydrates the bucket and the jobs come due.
    cluster.stop()
    shift_wall_clock(cluster, 4 * 3600, tmp_path / "shift_clock")
    cluster.start()
    cluster.wait_for_leader(timeout_s=60)
    claimed: list[str] = []
    deadline = time.monotonic() + 60
    while len(claimed) < JOBS - CANCELLED and time.monotonic() < deadline:
        leases = client.claim("w1", ["wheel"], max_jobs=50, wait_s=2, lease_s=60)
        claimed += [lease["job_id"] for lease in leases]
    assert sorted(claimed) == sorted(ids[CANCELLED:])
    cluster.wait_converged()
    assert packed_per_node(cluster) == dict.fromkeys(cluster.nodes, 0)
