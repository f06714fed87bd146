"""A follower that missed more than a compaction's worth of entries is
brought back by snapshot transfer while the leader keeps serving, and
without an election: the term never changes (issue 19, part 3)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
from e2e_support import cluster_env

from raftsched import raft_journal
from raftsched.client import Client, job_request
from raftsched.testing import LocalCluster, http_json

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

BATCH = 500


def _terms(cluster: LocalCluster) -> dict[str, int]:
    terms = {}
    for node_id, node in cluster.nodes.items():
        if node.serving:
            view = cluster.cluster_view(node_id)
            assert view is not None, node_id
            terms[node_id] = view["term"]
    return terms


def _submit_batches(client: Client, prefix: str, batches: int) -> list[str]:
    ids = []
    for batch in range(batches):
        requests = [
            job_request(
                "catchup",
                {"n": index, "pad": "p" * 100},
                idempotency_key=f"{prefix}:{batch}:{index}",
            )
            for index in range(BATCH)
        ]
        for item in client.submit_batch(requests):
            assert "job" in item, item
            ids.append(item["job"]["id"])
    return ids


def test_a_lagging_follower_catches_up_by_snapshot_without_an_election(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path / "catchup",
        env=cluster_env(),
        extra_args=["--log-compaction-entries", "20", "--log-compaction-bytes", "262144"],
    )
    with cluster:
        leader = cluster.wait_for_leader()
        follower = next(node_id for node_id in cluster.nodes if node_id != leader)
        with Client([cluster.nodes[leader].http_url], retry_budget_s=30) as client:
            ids = _submit_batches(client, "before", 6)  # 3,000 jobs
            cluster.wait_converged(timeout_s=60)
            term = _terms(cluster)[leader]

            cluster.kill(follower, signal.SIGTERM)
            # Far past a compaction: 40 entries and ~1.5 MB of journal.
            ids += _submit_batches(client, "while-down", 6)
            for index in range(40):
                ids.append(client.submit("catchup", {"single": index})["id"])
            leader_dir = cluster.nodes[leader].data_dir / "raft"
            follower_dir = cluster.nodes[follower].data_dir / "raft"
            follower_last = raft_journal.read_journal_entries(follower_dir)[-1][1]
            # The leader's snapshot child may still be writing: its journal
            # is cut once the child is done.
            deadline = time.monotonic() + 30
            while raft_journal.read_journal_entries(leader_dir)[0][1] <= follower_last:
                assert time.monotonic() < deadline, (
                    "the leader should have compacted past the follower's log"
                )
                time.sleep(0.1)

            # Serving goes on while the follower comes back: a submitter
            # keeps writing through the leader the whole time.
            stop = threading.Event()
            served: list[str] = []
            failures: list[BaseException] = []

            def keep_submitting() -> None:
                with Client([cluster.nodes[leader].http_url], retry_budget_s=5) as writer:
                    index = 0
                    while not stop.is_set() and index < 2_000:
                        try:
                            served.append(writer.submit("catchup", {"during": index})["id"])
                        except BaseException as error:  # the test reports it
                            failures.append(error)
                            return
                        index += 1
                        time.sleep(0.02)

            submitter = threading.Thread(target=keep_submitting, daemon=True)
            submitter.start()
            restarted_at = time.monotonic()
            cluster.start(follower)
            url = cluster.nodes[follower].http_url
            probe = ids[-1]  # submitted while it was down: ready means caught up
            ready_s = None
            deadline = time.monotonic() + 60
            with Client([url], retry_budget_s=0) as reader:
                while time.monotonic() < deadline:
                    try:
                        status, _, _ = http_json("GET", url + "/readyz", timeout_s=2)
                    except OSError:
                        status = 0
                    if status == 200:
                        # Ready means it answers a read of any job at once.
                        job = reader.get_job(probe, consistency="stale")
                        assert job["id"] == probe
                        ready_s = time.monotonic() - restarted_at
                        break
                    time.sleep(0.05)
            assert ready_s is not None, "the follower never became ready"
            time.sleep(1.0)
            stop.set()
            submitter.join(timeout=30)
            assert not failures, failures
            assert served, "the leader served nothing while the follower caught up"

            cluster.wait_converged(timeout_s=60)
            # No election anywhere: same leader, same term on every node.
            assert cluster.leader_id() == leader
            assert set(_terms(cluster).values()) == {term}
            with Client([url], retry_budget_s=10) as reader:
                for job_id in (ids[0], ids[-1], served[-1]):
                    assert reader.get_job(job_id, consistency="stale")["id"] == job_id
        log_text = cluster.nodes[follower].log_path.read_text()
        assert "loaded a snapshot" in log_text
        assert not cluster.unexpected_log_errors()
