"""A sharded node's `GET /v1/cluster` reports the lowest of its groups'
cluster versions (docs/shards.md, section 5)."""

from __future__ import annotations

from raftsched.api.cluster import lowest_cluster_version


def test_the_lowest_group_version_is_the_cluster_version() -> None:
    shards = [
        {"shard": 0, "cluster_version": 9},
        {"shard": 1, "cluster_version": 7},
        {"shard": 2, "cluster_version": 9},
    ]
    assert lowest_cluster_version(shards) == 7
    shards[1]["cluster_version"] = 9
    assert lowest_cluster_version(shards) == 9


def test_a_shard_that_does_not_answer_is_left_out() -> None:
    shards = [
        {"shard": 0, "cluster_version": 8},
        {"shard": 1, "leader": None, "ready": False, "status": "down"},
        {"shard": 2, "cluster_version": None},
    ]
    assert lowest_cluster_version(shards) == 8
