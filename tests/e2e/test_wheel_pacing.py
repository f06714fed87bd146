"""Paced hydration on a real 3-node cluster (cluster version 8).

A bucket of 3,000 packed jobs, a 20 s horizon in 1 s buckets: the bucket
enters the horizon 20 s before it begins and should be live 10 s before.
The leader proposes one paced Tick every 100 ms meanwhile (about 32 jobs a
Tick), so the packed count falls steadily over those 10 s instead of at
once (at version 7 it went in three Ticks of 1,000 back to back), every
job is live by the soft deadline on every replica, and the jobs come due
and are claimed at their time.
"""

from __future__ import annotations

import time

import pytest

from raftsched.client import Client, job_request
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.core.kernel.wheel import PACED_HYDRATION_VERSION
from raftsched.testing import LocalCluster, http_json, wait_for

JOBS = 3_000
HORIZON_S = 20
BATCH = 1_000

pytestmark = pytest.mark.slow


def packed_on(cluster: LocalCluster, node_id: str) -> int:
    url = cluster.nodes[node_id].http_url + "/v1/debug/digest"
    status, body, _ = http_json("GET", url, token=cluster.admin_token)
    assert status == 200, body
    packed: int = body["packed_jobs"]
    return packed


def test_a_bucket_is_hydrated_in_paced_ticks_and_live_by_its_soft_deadline(
    cluster: LocalCluster, client: Client
) -> None:
    assert COMMAND_VERSION_MAX >= PACED_HYDRATION_VERSION

    def raised() -> bool:
        leader = cluster.leader_id()
        view = None if leader is None else cluster.cluster_view(leader)
        return view is not None and view.get("cluster_version") == COMMAND_VERSION_MAX

    assert wait_for(raised, 30), "cluster version not raised"
    client.request("PUT", "/v1/wheel", body={"horizon_s": HORIZON_S, "bucket_s": 1})
    start_ms = (int(time.time() * 1000) + 40_000) // 1000 * 1000
    enters_ms, soft_ms = start_ms - HORIZON_S * 1000, start_ms - HORIZON_S * 500
    ids: list[str] = []
    for at in range(0, JOBS, BATCH):
        requests = [job_request("paced", {"n": i}, run_at=start_ms + i % 900)
                    for i in range(at, at + BATCH)]  # fmt: skip
        ids += [item["job"]["id"] for item in client.submit_batch(requests)]
    assert time.time() * 1000 < enters_ms - 2_000, "the submissions took too long"
    leader = cluster.leader_id()
    assert leader is not None
    assert packed_on(cluster, leader) == JOBS

    samples: list[tuple[float, int]] = []
    while time.time() * 1000 < soft_ms + 2_000:
        samples.append((time.time() * 1000, packed_on(cluster, leader)))
        time.sleep(0.2)
    assert cluster.leader_id() == leader, "the leader changed: the samples mix replicas"
    before = [packed for at, packed in samples if at < enters_ms - 500]
    paced = [packed for at, packed in samples if enters_ms + 2_000 <= at <= soft_ms - 2_000]
    after = [packed for at, packed in samples if at >= soft_ms + 500]
    assert before and set(before) == {JOBS}, samples
    # Between entering the horizon and the deadline: going, not gone.
    assert paced and all(0 < packed < JOBS for packed in paced), samples
    assert paced[0] > paced[-1], samples
    # Never a burst: no 200 ms between samples made more than a few paced
    # Ticks' worth live (unpaced, 1,000 a Tick, all 3,000 went at once).
    drops = [a - b for (_, a), (_, b) in zip(samples, samples[1:], strict=False)]
    assert max(drops) < 900, samples
    assert after and set(after) == {0}, samples
    cluster.wait_converged(timeout_s=30)
    assert {packed_on(cluster, node_id) for node_id in cluster.nodes} == {0}

    # The jobs come due at their time and are claimed.
    claimed: set[str] = set()
    deadline = time.monotonic() + 90
    while len(claimed) < JOBS and time.monotonic() < deadline:
        leases = client.claim("w1", ["paced"], max_jobs=200, wait_s=2, lease_s=60)
        claimed.update(lease["job_id"] for lease in leases)
    assert claimed == set(ids)
