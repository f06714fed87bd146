"""A queue's settings hold in every shard (docs/shards.md, section 7's
status): found by the sharded chaos campaign, where the payments queue's
`on_unknown: reconcile` held in shard 0 only and payments placed in shards
1 and 2 were charged twice (the campaign ran before the nodes copied
settings into the shards, node/shard_settings.py). A shard answers the
queue with group 0's setting within seconds of the PUT."""

from __future__ import annotations

import time
from pathlib import Path

from e2e_support import cluster_env

from raftsched.shards import SHARD_HEADER
from raftsched.testing import LocalCluster, http_json

SHARDS = 3


def test_a_queues_on_unknown_reaches_every_shard(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c", size=3, env=cluster_env(), shards=SHARDS)
    with cluster:
        cluster.start()
        leader = cluster.wait_for_leader(60)
        cluster.wait_for_shards(120)
        url = cluster.nodes[leader].http_url
        status, body, _ = http_json("PUT", url + "/v1/queues/pay", {"on_unknown": "reconcile"})
        assert status == 200, body
        assert body["queue"]["on_unknown"] == "reconcile"
        for shard in range(SHARDS):
            found: dict[str, object] = {}
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                status, body, headers = http_json(
                    "GET", url + "/v1/queues/pay", headers={SHARD_HEADER: str(shard)}
                )
                if status in (307, 308):
                    url_k = headers["Location"]
                    status, body, _ = http_json("GET", url_k, headers={SHARD_HEADER: str(shard)})
                if status == 200:
                    found = body["queue"]
                    break
                time.sleep(0.2)
            assert found.get("on_unknown") == "reconcile", (shard, status, body)
