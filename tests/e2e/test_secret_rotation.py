"""Rotating the Raft secret by rolling restarts, under a trickle of submits.

Three steps (docs/security.md, "Rotating the Raft secret"), each rolled
through the cluster one node at a time: every node learns the new secret
while still sending with the old (`--secret-file OLD --secret-accept-file
NEW`); every node sends with the new (`--secret-file NEW --secret-accept-file
OLD`); every node forgets the old (`--secret-file NEW`). At every moment any
two running nodes read each other, so the cluster keeps a quorum except
while a restarted node was the leader (an election). Then a node that knows
only a wrong secret cannot join.
"""

from __future__ import annotations

import secrets
import signal
import threading
import time
from pathlib import Path

import pytest
from e2e_support import cluster_env

from raftsched.client import Client
from raftsched.testing import LocalCluster, assert_no_secrets_in_logs, wait_for

pytestmark = pytest.mark.slow

# A submit may wait out one election (about 2 s here) and a restart; a longer
# gap means the cluster lost its quorum.
LONGEST_GAP_S_MAX = 12.0


def write_secret(path: Path) -> Path:
    path.write_text(secrets.token_urlsafe(32))
    path.chmod(0o600)
    return path


class Trickle:
    """Submits a job every few tens of milliseconds and records the acknowledged."""

    def __init__(self, urls: list[str]) -> None:
        self.acknowledged: list[str] = []
        self.ack_times: list[float] = [time.monotonic()]
        self._urls = urls
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with Client(self._urls, timeout_s=5, retry_budget_s=20) as client:
            index = 0
            while not self._stop.is_set():
                try:
                    job = client.submit("rotation", {"n": index}, idempotency_key=f"rot:{index}")
                except Exception:  # noqa: BLE001  # retried with the same key
                    continue
                self.acknowledged.append(str(job["id"]))
                self.ack_times.append(time.monotonic())
                index += 1
                time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.ack_times.append(time.monotonic())

    @property
    def longest_gap_s(self) -> float:
        return max(b - a for a, b in zip(self.ack_times, self.ack_times[1:], strict=False))


def restart_and_catch_up(local: LocalCluster, node_id: str) -> None:
    """A rolling step for one node: stop it cleanly, start it with its new
    flags, and wait until it applied what the leader had applied by then."""
    local.kill(node_id, signal.SIGTERM)
    local.start(node_id)
    leader = local.wait_for_leader(timeout_s=30)
    target = local.digests()[leader][0]

    def caught_up() -> bool:
        found = local.digests().get(node_id)
        return found is not None and found[0] >= target

    assert wait_for(caught_up, 30), f"{node_id} did not catch up; logs in {local.root}"


def test_a_cluster_rotates_its_raft_secret_node_by_node_without_losing_a_job(
    tmp_path: Path,
) -> None:
    local = LocalCluster(tmp_path / "cluster", size=3, env=cluster_env())
    old = local.secret_file
    new = write_secret(tmp_path / "new-secret")
    steps = [(old, [new]), (new, [old]), (new, [])]
    with local:
        local.wait_for_leader(timeout_s=30)
        local.wait_for_auth(timeout_s=30)
        trickle = Trickle(local.urls)
        try:
            assert wait_for(lambda: len(trickle.acknowledged) >= 5, 30)
            for sending, accepted in steps:
                for node in local.nodes.values():
                    node.secret_file, node.secret_accept_files = sending, accepted
                    restart_and_catch_up(local, node.id)
            # Still submitting after the last step: nine restarts take only
            # a few seconds on a quick machine, so this is not a count of
            # what got through during them (the longest gap says that).
            assert wait_for(lambda: len(trickle.acknowledged) > 20, 30)
        finally:
            trickle.stop()
        assert trickle.longest_gap_s < LONGEST_GAP_S_MAX, trickle.longest_gap_s
        local.wait_converged(timeout_s=30)
        with Client(local.urls, timeout_s=10, retry_budget_s=30) as client:
            for job_id in trickle.acknowledged:
                assert client.get_job(job_id)["queue"] == "rotation"
            assert all(
                "--secret-accept-file" not in arg for arg in local.command(local.nodes["n1"])
            )

            # A node that knows only another secret cannot join: the others
            # drop its messages, it never hears a leader, and they go on.
            stranger = local.nodes["n3"]
            stranger.secret_file = write_secret(tmp_path / "wrong-secret")
            local.kill("n3", signal.SIGTERM)
            local.start("n3")
            for index in range(5):
                client.submit("rotation", {"after": index}, idempotency_key=f"after:{index}")
            # n3 serves HTTP, alone: it names no leader and applies nothing new.
            assert wait_for(lambda: local.cluster_view("n3") is not None, 30)
            time.sleep(3)
            assert stranger.alive
            view = local.cluster_view("n3")
            assert view is not None and view.get("leader") is None, view
            digests = local.digests()
            assert digests["n1"] == digests["n2"]
            assert "n3" not in digests or digests["n3"][0] < digests["n1"][0]
    # Whichever side of a connection reads the other's first message reports
    # it (pysyncobj dials from the node with the greater address only).
    refusals = sum(
        "a Raft message failed authentication" in node.log_path.read_text()
        for node in local.nodes.values()
    )
    assert refusals >= 1
    assert_no_secrets_in_logs(
        local,
        {
            "old raft": old.read_text(),
            "new raft": new.read_text(),
            "wrong raft": (tmp_path / "wrong-secret").read_text(),
        },
    )
