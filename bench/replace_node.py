"""Benchmark: replace a dead coordinator in a loaded 3-node cluster (not a test).

Starts three `raftsched node` processes on loopback (durability on, a low
compaction threshold so that the new node catches up by snapshot), fills
the state with `--jobs` jobs, then, while a bounded submit load runs,
SIGKILLs a follower, removes it (`DELETE /v1/cluster/nodes/{id}`), adds a
new node (`POST /v1/cluster/nodes`), starts it with `--join` and waits until
the leader reports no change in progress (the new node's match index
reached the commit index of its addition) and every replica has the same
digest. Prints one JSON object as its last line.

    .venv/bin/python bench/replace_node.py             # about half a minute
    .venv/bin/python bench/replace_node.py --jobs 20000

Figures (seconds, wall clock of this process):
- remove_s: kill -> the DELETE answered (record committed, configuration changed).
- add_s: POST sent -> answered (configuration has the new node).
- catch_up_s: new node started -> the leader reports it caught up.
- replace_s: kill -> caught up (the three above and the gaps between).
- converged_s: kill -> every replica reports the same digest (the load stopped).
- jobs_in_state, submitted_during: the state's size and the load's count.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from raftsched.client import Client
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.node.auth import new_secret
from raftsched.testing import LocalCluster, http_json, wait_for

BATCH = 500


def _fill(client: Client, jobs: int) -> None:
    for start in range(0, jobs, BATCH):
        count = min(BATCH, jobs - start)
        client.submit_batch([{"queue": "fill", "payload": {"i": start + i}} for i in range(count)])


def _load(urls: list[str], token: str, stop: threading.Event, done: list[int], limit: int) -> None:
    with Client(urls, timeout_s=10, retry_budget_s=30, token=token) as client:
        for index in range(limit):
            if stop.is_set():
                return
            client.submit("during", payload={"i": index})
            done[0] += 1
            time.sleep(0.005)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs in the state first")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="raftsched-replace-"))
    secret = new_secret()
    cluster = LocalCluster(
        root / "cluster",
        size=3,
        admin_secret=secret,
        extra_args=["--log-compaction-entries", "50"],
    )
    result: dict[str, Any] = {"jobs_in_state": args.jobs}
    try:
        cluster.start()
        leader = cluster.wait_for_leader()
        cluster.wait_for_auth()
        token = cluster.admin_token

        def version_raised() -> bool:
            view = cluster.cluster_view(cluster.wait_for_leader())
            return view is not None and view["cluster_version"] == COMMAND_VERSION_MAX

        assert wait_for(version_raised, 30), "cluster version not raised"
        with Client(cluster.urls, timeout_s=30, retry_budget_s=60, token=token) as client:
            _fill(client, args.jobs)
        leader = cluster.wait_for_leader()
        victim = next(node_id for node_id in ("n3", "n2") if node_id != leader)
        survivors = [cluster.nodes[n].http_url for n in cluster.nodes if n != victim]
        stop = threading.Event()
        done = [0]
        loader = threading.Thread(target=_load, args=(survivors, token, stop, done, 100_000))
        loader.start()
        time.sleep(1.0)

        killed = time.monotonic()
        cluster.kill(victim)
        leader_url = cluster.nodes[cluster.wait_for_leader()].http_url
        status, answer, _ = http_json(
            "DELETE", f"{leader_url}/v1/cluster/nodes/{victim}", timeout_s=30, token=token
        )
        assert status == 202, answer
        removed = time.monotonic()
        cluster.mark_removed(victim)
        new = cluster.new_node("n4")
        body = {"id": new.id, "raft_address": new.raft_address, "http_url": new.http_url}
        leader = cluster.wait_for_leader()
        leader_url = cluster.nodes[leader].http_url
        snapshot = cluster.nodes[leader].data_dir / "raft" / "raft.snapshot"
        result["leader_log_compacted"] = snapshot.exists()
        added_at = time.monotonic()
        status, answer, _ = http_json(
            "POST", f"{leader_url}/v1/cluster/nodes", body, timeout_s=30, token=token
        )
        assert status == 202, answer
        added = time.monotonic()
        cluster.start_joining(new.id, leader_url)
        started = time.monotonic()

        def caught_up() -> bool:
            view = cluster.cluster_view(cluster.wait_for_leader())
            return view is not None and view["membership"]["change"] is None

        assert wait_for(caught_up, 300), "the new node did not catch up"
        caught = time.monotonic()
        stop.set()
        loader.join(timeout=60)
        cluster.wait_converged(timeout_s=120)
        converged = time.monotonic()
        result.update(
            remove_s=round(removed - killed, 3),
            add_s=round(added - added_at, 3),
            catch_up_s=round(caught - started, 3),
            replace_s=round(caught - killed, 3),
            converged_s=round(converged - killed, 3),
            submitted_during=done[0],
        )
        errors = cluster.unexpected_log_errors()
        result["log_errors"] = len(errors)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
