"""Real nodes on bad disks (issue 16, part 5; docs/operations.md).

Every fault is real: each node's data directory is its own `tmpfs` mounted
with `size=` (ENOSPC when a test fills it), bytes are flipped or cut in a
node's real journal file, and an `LD_PRELOAD` shim makes libc's fdatasync
of one node's journal fail with EIO. No acknowledged job may be lost, and
no node may carry on after a failed fsync.
"""

from __future__ import annotations

import contextlib
import signal
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import cluster_env

from bad_disks import fill, fsync_fault_env, fsync_fault_shim, size_limited_tmpfs
from raftsched import raft_journal
from raftsched.client import Client
from raftsched.testing import LocalCluster, http_json, metrics_text, wait_for

NODE_DISK = "96m"


@contextlib.contextmanager
def cluster_on_tmpfs(
    root: Path, size: int = 3, extra_args: list[str] | None = None
) -> Iterator[LocalCluster]:
    """A cluster whose nodes each keep their data directory on a tmpfs of its own."""
    cluster = LocalCluster(root, size=size, env=cluster_env(), extra_args=extra_args or [])
    with contextlib.ExitStack() as mounts:
        for node in cluster.nodes.values():
            mounts.enter_context(size_limited_tmpfs(node.data_dir, NODE_DISK))
        try:
            cluster.start()
            cluster.wait_for_leader(timeout_s=30)
            yield cluster
        finally:
            cluster.stop()


def submit_all(cluster: LocalCluster, prefix: str, count: int) -> set[str]:
    """Submit `count` jobs through any node (the client retries); their ids."""
    ids: set[str] = set()
    with Client(cluster.urls, timeout_s=5, retry_budget_s=60) as api:
        for number in range(count):
            key = f"{prefix}:{number}"
            ids.add(api.submit("disks", {"k": key}, idempotency_key=key)["id"])
    return ids


def jobs_on(cluster: LocalCluster) -> set[str]:
    with Client(cluster.live_urls(), timeout_s=5, retry_budget_s=60) as api:
        return {job["id"] for job in api.iter_jobs(queue="disks", page_size=1000)}


def follower_of(cluster: LocalCluster, leader: str) -> str:
    return next(node_id for node_id in sorted(cluster.nodes) if node_id != leader)


def raft_dir(cluster: LocalCluster, node_id: str) -> Path:
    return cluster.nodes[node_id].data_dir / "raft"


def metrics_of(cluster: LocalCluster, node_id: str) -> str:
    return metrics_text(cluster.nodes[node_id].http_url, token=cluster.admin_token)


def log_of(cluster: LocalCluster, node_id: str) -> str:
    return cluster.nodes[node_id].log_path.read_text(errors="replace")


# -- Disk full -----------------------------------------------------------------


def test_a_follower_with_a_full_disk_acks_nothing_and_catches_up_when_space_returns(
    tmp_path: Path,
) -> None:
    # The others compact their logs while it is full, so it catches up from
    # a snapshot (sent again once it has room).
    compaction = ["--log-compaction-entries", "20"]
    with cluster_on_tmpfs(tmp_path / "cluster", extra_args=compaction) as cluster:
        leader = cluster.wait_for_leader()
        full = follower_of(cluster, leader)
        acknowledged = submit_all(cluster, "before", 20)
        filler = fill(cluster.nodes[full].data_dir)
        # The leader and the other follower are a majority with room.
        acknowledged |= submit_all(cluster, "full", 60)
        assert wait_for(lambda: "disk full" in log_of(cluster, full), 10)
        assert cluster.nodes[full].alive, "a full disk must not stop the node"
        assert "raftsched_raft_disk_full 1.0" in metrics_of(cluster, full)
        filler.unlink()
        assert wait_for(lambda: "there is room again" in log_of(cluster, full), 10)
        assert "raftsched_raft_disk_full 0.0" in metrics_of(cluster, full)
        acknowledged |= submit_all(cluster, "after", 10)
        cluster.wait_converged(timeout_s=60)
        assert cluster.nodes[full].alive
        assert acknowledged <= jobs_on(cluster)


def test_a_leader_with_a_full_disk_steps_down_and_the_cluster_carries_on(tmp_path: Path) -> None:
    with cluster_on_tmpfs(tmp_path / "cluster") as cluster:
        leader = cluster.wait_for_leader()
        acknowledged = submit_all(cluster, "before", 20)
        filler = fill(cluster.nodes[leader].data_dir)
        # Straight to the full leader. A 201 is an entry that still fitted in
        # its journal's last page (on disk); the first that does not is
        # answered 503 disk_full, and the leader steps down.
        url = cluster.nodes[leader].http_url + "/v1/jobs"
        big = {"queue": "disks", "payload": {"pad": "p" * 8000}}
        for _ in range(500):
            status, body, headers = http_json("POST", url, big)
            if status != 201:
                break
            acknowledged.add(body["job"]["id"])
        assert status in (503, 307), body
        if status == 503 and body["error"]["details"].get("reason") == "disk_full":
            assert headers["Retry-After"] == "1"
        else:
            # The leader's own Tick entry found the disk full first: it had
            # already stepped down, and this node redirects or knows no leader.
            assert "disk full on the leader" in log_of(cluster, leader)
        acknowledged |= submit_all(cluster, "full", 40)
        new_leader = cluster.wait_for_leader(timeout_s=30, exclude=leader)
        assert new_leader != leader
        assert "disk full on the leader: stepping down" in log_of(cluster, leader)
        filler.unlink()
        acknowledged |= submit_all(cluster, "after", 10)
        cluster.wait_converged(timeout_s=60)
        assert cluster.nodes[leader].alive
        assert acknowledged <= jobs_on(cluster)


def test_a_lone_node_with_a_full_disk_answers_503_disk_full_and_carries_on(
    tmp_path: Path,
) -> None:
    with cluster_on_tmpfs(tmp_path / "cluster", size=1) as cluster:
        url = cluster.nodes["n1"].http_url
        acknowledged = submit_all(cluster, "before", 5)
        filler = fill(cluster.nodes["n1"].data_dir)
        # Entries still fit in the journal's last page for a while; each 201
        # is on disk. Then the first append that needs a new page fails, and
        # so does every later one as large.
        big = {"queue": "disks", "payload": {"pad": "p" * 8000}}
        answers = []
        for _ in range(500):
            status, body, headers = http_json("POST", url + "/v1/jobs", big)
            if status == 201:
                acknowledged.add(body["job"]["id"])
            else:
                answers.append((status, body, headers))
                if len(answers) == 5:
                    break
        for status, body, headers in answers:
            assert status == 503, body
            assert body["error"]["code"] == "unavailable"
            assert body["error"]["details"]["reason"] == "disk_full"
            assert headers["Retry-After"] == "1"
        assert cluster.nodes["n1"].alive
        status, body, _ = http_json("GET", url + "/readyz")
        assert status == 503 and body["ready"] is False and "raft" in body["disk_full"], body
        filler.unlink()
        assert wait_for(lambda: http_json("GET", url + "/readyz")[0] == 200, 10)
        acknowledged |= submit_all(cluster, "after", 5)  # no restart
        assert jobs_on(cluster) == acknowledged, "a 503 must have committed nothing"
        cluster.kill("n1")
        cluster.start("n1")
        cluster.wait_for_leader()
        assert jobs_on(cluster) == acknowledged


# -- Corrupted journal ---------------------------------------------------------


def record_offsets(journal: Path) -> list[int]:
    return raft_journal.parse_journal(journal.read_bytes())[1]


def test_a_flipped_byte_mid_journal_refuses_to_start_and_the_runbook_rebuilds_it(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path / "cluster", env=cluster_env())
    with cluster:
        leader = cluster.wait_for_leader()
        acknowledged = submit_all(cluster, "before", 30)
        victim = follower_of(cluster, leader)
        cluster.wait_converged()
        cluster.kill(victim, signal.SIGTERM)
        assert wait_for(lambda: not cluster.nodes[victim].alive, 30)
        journal = raft_dir(cluster, victim) / raft_journal.JOURNAL_NAME
        offsets = record_offsets(journal)
        middle = offsets[len(offsets) // 2]
        data = bytearray(journal.read_bytes())
        data[middle + struct.calcsize("<IIQQ")] ^= 0x01  # one bit of a command
        journal.write_bytes(bytes(data))
        acknowledged |= submit_all(cluster, "while-down", 10)
        cluster.start(victim)
        process = cluster.nodes[victim].process
        assert process is not None
        assert process.wait(timeout=60) == raft_journal.EXIT_CORRUPT_DATA == 65
        output = log_of(cluster, victim)
        assert f"journal {journal}: corrupt record at byte offset {middle}" in output
        assert journal.read_bytes() == bytes(data), "a refused journal is left as it was"
        # The runbook (docs/operations.md, "Corrupted journal"), as printed.
        aside = journal.parent / "corrupt"
        assert f"mkdir -p {aside} && mv {journal} {aside}/" in output
        aside.mkdir(parents=True)
        journal.rename(aside / journal.name)
        cluster.start(victim)
        cluster.wait_converged(timeout_s=60)
        assert acknowledged <= jobs_on(cluster)


def test_a_torn_tail_is_cut_with_a_warning_and_loses_no_acknowledged_job(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path / "cluster", env=cluster_env())
    with cluster:
        leader = cluster.wait_for_leader()
        acknowledged = submit_all(cluster, "before", 30)
        victim = follower_of(cluster, leader)
        cluster.wait_converged()
        cluster.kill(victim)  # SIGKILL, then the tail torn as a power cut would
        journal = raft_dir(cluster, victim) / raft_journal.JOURNAL_NAME
        last = record_offsets(journal)[-1]
        journal.write_bytes(journal.read_bytes()[: last + 11])
        cluster.start(victim)
        cluster.wait_converged(timeout_s=60)
        assert f"journal {journal}: cutting a torn tail at byte {last}" in log_of(cluster, victim)
        acknowledged |= submit_all(cluster, "after", 10)
        cluster.wait_converged(timeout_s=60)
        assert acknowledged <= jobs_on(cluster)


# -- Failed fsync --------------------------------------------------------------


@pytest.mark.expect_log_errors(
    r"storage failure: fdatasync of .*raft\.journal failed: EIO",
    reason="the test makes the leader's journal fdatasync fail with EIO (LD_PRELOAD shim)",
)
def test_a_failed_fsync_on_the_leader_stops_it_at_once_and_loses_nothing(
    tmp_path: Path,
) -> None:
    library = fsync_fault_shim(tmp_path)
    cluster = LocalCluster(tmp_path / "cluster", env=cluster_env())
    # Every node runs with the shim; a node's journal fails once its own
    # trigger file exists.
    for node in cluster.nodes.values():
        trigger = tmp_path / f"fail-fsync-{node.id}"
        node.env = fsync_fault_env(library, trigger, f"/{node.id}/raft/raft.journal")
    with cluster:
        leader = cluster.wait_for_leader()
        acknowledged = submit_all(cluster, "before", 20)
        trigger = tmp_path / f"fail-fsync-{leader}"
        trigger.touch()
        acknowledged |= submit_all(cluster, "during", 20)
        process = cluster.nodes[leader].process
        assert process is not None
        assert process.wait(timeout=30) == raft_journal.EXIT_STORAGE_FAILED == 74
        output = log_of(cluster, leader)
        assert output.count("storage failure") == 1
        assert "see docs/operations.md 'Failed fsync'" in output
        assert cluster.wait_for_leader(timeout_s=30, exclude=leader) != leader
        trigger.unlink()  # the disk replaced: it recovers from what is on it
        cluster.start(leader)
        acknowledged |= submit_all(cluster, "after", 10)
        cluster.wait_converged(timeout_s=60)
        assert acknowledged <= jobs_on(cluster)
