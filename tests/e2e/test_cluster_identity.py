"""Node identity with real processes (issue 16, part 2).

A node that comes back under a voted identity with an empty data directory
is refused by its peers (its Raft messages are dropped, so its forgotten
votes count for nothing) and exits 77 with a clear error; a node started
with another cluster's data exits 78; every node names the same cluster id.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from e2e_support import cluster_env

from raftsched.identity import (
    EXIT_FOREIGN_DATA,
    EXIT_INCARNATION_REFUSED,
    IDENTITY_NAME,
    read_identity,
)
from raftsched.testing import LocalCluster, free_port, http_json, metrics_text, wait_for


def cluster_view(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    status, body, _ = http_json(
        "GET", cluster.nodes[node_id].http_url + "/v1/cluster", token=cluster.admin_token
    )
    assert status == 200, body
    return body


def time_identity(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    status, body, _ = http_json("GET", cluster.nodes[node_id].http_url + "/v1/time")
    assert status == 200, body
    identity: dict[str, Any] = body["identity"]
    return identity


def wait_until_every_incarnation_is_recorded(cluster: LocalCluster) -> str:
    """The cluster id, once every node holds every member's incarnation."""
    ids = sorted(cluster.nodes)

    def recorded() -> bool:
        answers = [time_identity(cluster, node_id) for node_id in ids]
        return all(
            answer["cluster_id"] is not None and sorted(answer["incarnations"]) == ids
            for answer in answers
        )

    assert wait_for(recorded, 30), [time_identity(cluster, n) for n in ids]
    cluster_id = time_identity(cluster, ids[0])["cluster_id"]
    assert isinstance(cluster_id, str)
    return cluster_id


def exit_status(cluster: LocalCluster, node_id: str, timeout_s: float) -> int | None:
    process = cluster.nodes[node_id].process
    assert process is not None
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


def refused_total(cluster: LocalCluster, node_id: str, reason: str) -> float:
    text = metrics_text(cluster.nodes[node_id].http_url, cluster.admin_token)
    prefix = f'raftsched_raft_messages_refused_total{{reason="{reason}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


def test_every_node_names_the_same_cluster_id(cluster: LocalCluster) -> None:
    cluster_id = wait_until_every_incarnation_is_recorded(cluster)
    assert cluster_id.startswith("clu_")
    assert wait_for(
        lambda: all(cluster_view(cluster, n)["cluster_id"] == cluster_id for n in cluster.nodes),
        10,
    )
    incarnations = time_identity(cluster, "n1")["incarnations"]
    for node_id, node in cluster.nodes.items():
        on_disk = read_identity(node.data_dir / "raft")
        assert on_disk is not None
        assert (on_disk.node_id, on_disk.cluster_id) == (node_id, cluster_id)
        assert incarnations[node_id] == on_disk.incarnation


@pytest.mark.expect_log_errors(
    r"the cluster refuses node",
    reason="the wiped node is refused on purpose and says why before it exits",
)
def test_a_voted_node_back_with_an_empty_data_directory_is_refused(
    cluster: LocalCluster,
) -> None:
    wait_until_every_incarnation_is_recorded(cluster)
    leader = cluster.wait_for_leader()
    before = cluster_view(cluster, leader)
    wiped = next(node_id for node_id in sorted(cluster.nodes) if node_id != leader)
    old = read_identity(cluster.nodes[wiped].data_dir / "raft")
    assert old is not None
    cluster.kill(wiped)
    shutil.rmtree(cluster.nodes[wiped].data_dir)
    cluster.start(wiped)

    status = exit_status(cluster, wiped, timeout_s=60)
    assert status == EXIT_INCARNATION_REFUSED
    log = cluster.nodes[wiped].log_path.read_text()
    assert f"the cluster refuses node {wiped}" in log
    assert f"recorded it under incarnation {old.incarnation}" in log
    assert "rejoins only as a new member" in log

    # It took no part: the same leader in the same term, the peers dropped
    # its messages (a fresh node campaigns at once), and writes commit.
    after = cluster_view(cluster, leader)
    assert (after["leader"]["id"], after["term"]) == (leader, before["term"])
    assert refused_total(cluster, leader, "incarnation") > 0
    peers_log = cluster.nodes[leader].log_path.read_text()
    assert f"refusing Raft messages from node {wiped}" in peers_log
    status_code, job, _ = http_json(
        "POST", cluster.nodes[leader].http_url + "/v1/jobs", {"queue": "after-refusal"}
    )
    assert status_code == 201, job
    new = read_identity(cluster.nodes[wiped].data_dir / "raft")
    assert new is not None and new.incarnation != old.incarnation and new.cluster_id is None


@pytest.mark.expect_log_errors(
    r"started with another cluster's data",
    reason="the node with a foreign data directory is refused on purpose",
)
def test_a_node_started_with_another_clusters_data_refuses_to_start(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    ours = wait_until_every_incarnation_is_recorded(cluster)
    other = LocalCluster(tmp_path / "other", size=1, env=cluster_env())
    other.start()
    try:
        other.wait_for_leader()
        theirs = wait_for(lambda: time_identity(other, "n1")["cluster_id"] is not None, 30)
        assert theirs
        assert wait_for(
            lambda: (
                (
                    read_identity(other.nodes["n1"].data_dir / "raft")
                    or read_identity(other.nodes["n1"].data_dir / "raft")
                ).cluster_id
                is not None
            ),
            10,
        )
    finally:
        other.stop()
    foreign = read_identity(other.nodes["n1"].data_dir / "raft")
    assert foreign is not None and foreign.cluster_id not in (None, ours)

    # n1's data directory is replaced by the other cluster's n1's.
    leader_before = cluster.wait_for_leader()
    cluster.kill("n1")
    shutil.rmtree(cluster.nodes["n1"].data_dir)
    shutil.copytree(other.nodes["n1"].data_dir, cluster.nodes["n1"].data_dir)
    leader = cluster.wait_for_leader(exclude="n1") if leader_before == "n1" else leader_before
    term = cluster_view(cluster, leader)["term"]
    cluster.start("n1")

    assert exit_status(cluster, "n1", timeout_s=60) == EXIT_FOREIGN_DATA
    log = cluster.nodes["n1"].log_path.read_text()
    assert f"belongs to cluster {foreign.cluster_id}" in log
    assert f"are cluster {ours}" in log
    after = cluster_view(cluster, leader)
    assert (after["leader"]["id"], after["term"]) == (leader, term)
    # Both sides dropped the other's messages: the foreign node the leader's
    # heartbeats, a peer the foreign node's requests for votes.
    assert f"refusing Raft messages from node {leader}" in log
    assert sum(refused_total(cluster, n, "cluster") for n in ("n2", "n3")) > 0


def test_a_node_started_on_another_nodes_data_directory_refuses_to_start(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "n2-data"
    (data_dir / "raft").mkdir(parents=True)
    (data_dir / "raft" / IDENTITY_NAME).write_text(
        '{"format": 1, "node_id": "n2", "incarnation": "inc_n2"}'
    )
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    command = [
        *(sys.executable, "-m", "raftsched", "node", "--id", "n1", "--data-dir", str(data_dir)),
        *("--http", f"127.0.0.1:{free_port()}", "--raft", f"127.0.0.1:{free_port()}"),
        *("--secret-file", str(secret)),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, env={**cluster_env(), "PATH": ""}
    )
    assert done.returncode == EXIT_FOREIGN_DATA, done.stderr
    assert "is node n2's, not n1's" in done.stderr
