"""Membership changes of a cluster of several shards (docs/shards.md, section 5).

A 3-node × 3-shard cluster grows to four: the add is recorded in group 0
(`POST /v1/cluster/nodes`), every shard's group follows group 0's directory
(each driven by the node hosting its leader, the member at its Raft address
shifted by k × stride), the new node started with `--join` and `--shards`
waits until every group lists it, and then serves and holds every group's
state. Then it is removed again, in every group.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_support import sharded_cluster

from raftsched.client import Client
from raftsched.shards import shard_of_id, shift_address
from raftsched.testing import LocalCluster, http_json, wait_for

SHARDS = 3


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with sharded_cluster(tmp_path_factory.mktemp("sm") / "c", SHARDS) as cluster:
        yield cluster


def _view(cluster: LocalCluster, node_id: str, shard: int | None = None) -> dict[str, Any] | None:
    headers = None if shard is None else {"Raftsched-Shard": str(shard)}
    try:
        status, body, _ = http_json(
            "GET",
            cluster.nodes[node_id].http_url + "/v1/cluster",
            token=cluster.admin_token,
            headers=headers,
        )
    except OSError:
        return None
    return body if status == 200 else None


def _members(view: dict[str, Any]) -> dict[str, str]:
    return {
        n["id"]: n["raft_address"]
        for n in view["nodes"]
        if n["status"] in ("member", "joining", "adding")
    }


def _every_group_has(cluster: LocalCluster, ids: list[str]) -> bool:
    """Every running node sees every group with exactly `ids` as members,
    none of them still catching up, and no shard behind group 0."""
    for node_id, node in cluster.nodes.items():
        if node.removed or node_id not in ids:
            continue
        view = _view(cluster, node_id)
        if view is None or view["membership"].get("shards_behind") != []:
            return False
        for shard in range(SHARDS):
            one = _view(cluster, node_id, shard)
            if one is None or sorted(_members(one)) != ids:
                return False
            if one["membership"]["change"] is not None or one["membership"]["joining"]:
                return False
            statuses = {n["id"]: n["status"] for n in one["nodes"]}
            if any(statuses[i] != "member" for i in ids if i != node_id):
                return False
    return True


def test_a_node_joins_every_group_and_leaves_every_group(sharded: LocalCluster) -> None:
    cluster = sharded
    n4 = cluster.new_node("n4")
    leader = cluster.wait_for_leader()
    body = {"id": "n4", "raft_address": n4.raft_address, "http_url": n4.http_url}
    status, answer, _ = http_json(
        "POST", cluster.nodes[leader].http_url + "/v1/cluster/nodes", body,
        timeout_s=20, token=cluster.admin_token,
    )  # fmt: skip
    assert status == 202 and answer["change"]["id"] == "n4", answer

    # Every shard's group records n4 at its shifted Raft address (n4 not
    # started yet: it is added, not caught up).
    def shards_record_it() -> bool:
        for shard in range(1, SHARDS):
            view = _view(cluster, leader, shard)
            if view is None or "n4" not in _members(view):
                return False
            assert _members(view)["n4"] == shift_address(n4.raft_address, shard, 100)
        return True

    assert wait_for(shards_record_it, 30)
    cluster.start_joining("n4", cluster.nodes["n1"].http_url)
    ids = ["n1", "n2", "n3", "n4"]
    assert wait_for(lambda: _every_group_has(cluster, ids), 90), [
        _view(cluster, "n1", shard) for shard in range(SHARDS)
    ]

    def ready() -> bool:
        try:
            return http_json("GET", n4.http_url + "/readyz")[0] == 200
        except OSError:
            return False

    assert wait_for(ready, 60)
    # n4 serves every shard's jobs, and holds every group's state.
    with Client([n4.http_url], timeout_s=10, retry_budget_s=30) as client:
        ids_written = [client.submit("grown", {"n": n})["id"] for n in range(9)]
        assert {shard_of_id(job_id) for job_id in ids_written} == set(range(SHARDS))
        for job_id in ids_written:
            assert client.get_job(job_id)["id"] == job_id

    def converged() -> bool:
        for shard in range(SHARDS):
            seen = set()
            for node_id in ids:
                status, digest, _ = http_json(
                    "GET",
                    cluster.nodes[node_id].http_url + "/v1/debug/digest",
                    token=cluster.admin_token,
                    headers={"Raftsched-Shard": str(shard)},
                )
                if status != 200:
                    return False
                seen.add((digest["applied_index"], digest["digest"]))
            if len(seen) != 1:
                return False
        return True

    assert wait_for(converged, 60)

    # Removed again: group 0 first, then every shard follows.
    leader = cluster.wait_for_leader()
    status, answer, _ = http_json(
        "DELETE", cluster.nodes[leader].http_url + "/v1/cluster/nodes/n4",
        timeout_s=20, token=cluster.admin_token,
    )  # fmt: skip
    assert status == 202, answer
    cluster.mark_removed("n4")
    assert wait_for(lambda: _every_group_has(cluster, ["n1", "n2", "n3"]), 90), [
        _view(cluster, "n1", shard) for shard in range(SHARDS)
    ]
    cluster.kill("n4", signal.SIGTERM)
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        for job_id in ids_written:
            assert client.get_job(job_id)["id"] == job_id
