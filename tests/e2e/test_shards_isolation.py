"""Failure isolation between shards (docs/shards.md, section 6), on 3 real
nodes × 3 shards.

Every shard has a loop that keeps submitting, leasing and completing its
jobs. The process that leads shard 1 is killed with SIGKILL: shard 1 stops
until its other replicas elect a leader, while shards 0 and 2 go on leasing
without a pause; the killed process's node starts it again. Then a node
process killed with SIGKILL takes its shard processes with it, and one
stopped with SIGTERM stops them.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_support import cluster_env

from raftsched.shards import shard_of_id
from raftsched.testing import LocalCluster, http_json, process_running, wait_for

SHARDS = 3
QUEUE = "isolated"
# The longest a healthy shard may go without completing a job while another
# shard elects a leader: one job's submit, claim and complete take tens of
# milliseconds; this leaves room for a loaded 2-core machine.
HEALTHY_GAP_MAX_S = 3.0


def _follow(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """One request, following redirects and waiting out 503s, for at most 10 s."""
    deadline = time.monotonic() + 10
    hops = 0
    while True:
        try:
            status, answer, got = http_json(method, url, body, timeout_s=5, headers=headers)
        except OSError:
            status, answer, got = 0, {}, {}
        if status == 307 and hops < 5:
            url, hops = got["Location"], hops + 1
            continue
        if status in (0, 503) and time.monotonic() < deadline:
            time.sleep(0.1)
            continue
        return status, answer


class ShardLoop(threading.Thread):
    """Submit a job to `shard`, lease it (`Raftsched-Shard`), complete it;
    again and again, noting when each job completed."""

    def __init__(self, urls: list[str], shard: int, stop: threading.Event) -> None:
        super().__init__(name=f"shard-{shard}-loop", daemon=True)
        self.urls, self.shard, self.stop = urls, shard, stop
        self.completed_at: list[float] = []
        self.problems: list[str] = []

    def run(self) -> None:
        named = {"Raftsched-Shard": str(self.shard)}
        turn = 0
        while not self.stop.is_set():
            url = self.urls[turn % len(self.urls)]
            turn += 1
            status, answer = _follow("POST", f"{url}/v1/jobs", {"queue": QUEUE}, named)
            if status != 201:
                continue  # unavailable for now: the shard is electing
            if shard_of_id(answer["job"]["id"]) != self.shard:
                self.problems.append(f"job {answer['job']['id']} is not shard {self.shard}'s")
            claim = {"worker_id": f"loop-{self.shard}", "queues": [QUEUE], "wait_s": 1}
            status, answer = _follow("POST", f"{url}/v1/leases", claim, named)
            if status != 200:
                continue
            for lease in answer["leases"]:
                token = {"fencing_token": lease["fencing_token"]}
                job_url = f"{url}/v1/leases/{lease['job_id']}"
                if _follow("POST", f"{job_url}/start", token)[0] != 200:
                    continue
                if _follow("POST", f"{job_url}/complete", token)[0] == 200:
                    self.completed_at.append(time.monotonic())


def _longest_gap(times: list[float], start: float, end: float) -> float:
    inside = [start, *(t for t in times if start < t < end), end]
    return max(later - earlier for earlier, later in zip(inside, inside[1:], strict=False))


@pytest.mark.expect_log_errors(
    r"shard process 1 \(pid \d+\) exited with status -9",
    reason="the test kills shard 1's leading process with SIGKILL; its node says so",
)
def test_a_shard_leaders_death_pauses_that_shard_only(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c", size=3, env=cluster_env(), shards=SHARDS)
    cluster.start()
    stop = threading.Event()
    loops = [ShardLoop(cluster.urls, shard, stop) for shard in range(SHARDS)]
    try:
        cluster.wait_for_leader(timeout_s=90)
        cluster.wait_for_auth(timeout_s=60)
        cluster.wait_for_shards(timeout_s=90)
        for loop in loops:
            loop.start()
        assert wait_for(lambda: all(len(loop.completed_at) >= 10 for loop in loops), 60)

        leader = cluster.wait_for_shard_leader(1)
        pid = cluster.shard_pid(leader, 1)
        assert pid is not None and process_running(pid)
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)

        # Shard 1 comes back once its other replicas elect a leader.
        def shard1_back() -> bool:
            return any(t > killed_at for t in loops[1].completed_at)

        assert wait_for(shard1_back, 30), "shard 1 never completed a job again"
        recovered_at = next(t for t in loops[1].completed_at if t > killed_at)
        paused_s = recovered_at - killed_at
        # ... and meanwhile the others never stopped.
        for shard in (0, 2):
            gap = _longest_gap(loops[shard].completed_at, killed_at, recovered_at)
            assert gap < HEALTHY_GAP_MAX_S, (
                f"shard {shard} completed nothing for {gap:.2f} s while shard 1 was "
                f"without a leader for {paused_s:.2f} s"
            )
        gaps = [_longest_gap(loops[s].completed_at, killed_at, recovered_at) for s in (0, 2)]
        print(f"shard 1 paused {paused_s:.2f} s; the longest gaps of shards 0 and 2: {gaps}")

        # The node whose shard process was killed starts it again.
        def restarted() -> bool:
            now = cluster.shard_pid(leader, 1)
            return now is not None and now != pid and process_running(now)

        assert wait_for(restarted, 30)

        def node_ready() -> bool:
            try:
                return http_json("GET", cluster.nodes[leader].http_url + "/readyz")[0] == 200
            except OSError:
                return False

        assert wait_for(node_ready, 60)
        stop.set()
        for loop in loops:
            loop.join(timeout=30)
        assert all(not loop.problems for loop in loops), [loop.problems for loop in loops]
        assert all(loop.completed_at[-1] > recovered_at for loop in loops)

        # A node killed outright takes its shard processes with it.
        victim = next(node for node in cluster.nodes if node != leader)
        children = [cluster.shard_pid(victim, shard) for shard in range(1, SHARDS)]
        assert all(child is not None and process_running(child) for child in children)
        cluster.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: not any(process_running(c) for c in children if c), 15)
        cluster.start(victim)
        cluster.wait_for_leader(timeout_s=60)
        assert wait_for(lambda: cluster.shard_pid(victim, 1) is not None, 60)
        running = [
            cluster.shard_pid(node, shard) for node in cluster.nodes for shard in range(1, SHARDS)
        ]
    finally:
        stop.set()
        cluster.stop()
    # SIGTERM stops every node's shard processes with it.
    assert all(pid is not None for pid in running)
    assert wait_for(lambda: not any(process_running(p) for p in running if p), 15)
