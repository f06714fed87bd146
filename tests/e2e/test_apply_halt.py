"""A replica that meets a committed entry it cannot decode stops applying there.

In a real cluster that entry comes from a newer release (a command kind this
code does not know, proposed before this node was upgraded). No leader of
today's code proposes one, so the test writes it: a real cluster takes work
and stops cleanly, then one node's journal gets two more committed entries,
one with an unknown command tag and a valid one after it, as Raft would have
replicated them. Started alone, that node applies its journal up to the
undecodable entry and stops there: its state stays the one before, it logs
one error line, exports `raftsched_apply_halted 1`, answers `/readyz` 503
with the entry and the reason, stops cleanly on SIGTERM, and halts at the
same entry again when restarted. It never applies the valid entry after it.
"""

from __future__ import annotations

import os
import pickle
import signal
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from e2e_support import cluster_env

from raftsched.core import encode_entry
from raftsched.core.kernel.codec import ENTRY_FORMAT
from raftsched.core.kernel.commands import Barrier, Entry
from raftsched.raft_journal import Disk, DurableJournal
from raftsched.testing import LocalCluster, http_json, metrics_text, wait_for

UNKNOWN_TAG = 99


def journal_command(entry_bytes: bytes) -> bytes:
    """An entry as pysyncobj journals a call of the one replicated method
    (id 0): a command-type byte (0, a regular call) and a protocol-2 pickle."""
    return b"\x00" + pickle.dumps((0, (entry_bytes,)), 2)


def append_committed(raft_dir: Path, entries: list[bytes]) -> int:
    """Append entries of the last term to a stopped node's journal and mark
    them committed; returns the index of the first."""
    journal = DurableJournal(raft_dir, Disk.from_env(fsync=True))
    _, last_index, term = journal[-1]
    for offset, data in enumerate(entries, start=1):
        journal.add(journal_command(data), last_index + offset, term)
    journal.setRaftCommitIndex(last_index + len(entries))
    journal._destroy()  # saves the meta, syncs and closes, as a clean stop does
    return last_index + 1


def readyz(url: str) -> tuple[int, dict[str, Any]]:
    status, body, _ = http_json("GET", url + "/readyz", timeout_s=5)
    return status, body


def halted_gauge(url: str) -> str | None:
    text = metrics_text(url, timeout_s=5)
    for line in text.splitlines():
        if line.startswith("raftsched_apply_halted "):
            return line.split()[1]
    return None


@pytest.mark.slow
@pytest.mark.expect_log_errors(
    "stopped applying at entry",
    reason="the node meets an entry with an unknown command tag on purpose",
)
def test_a_replica_stops_at_an_entry_it_cannot_decode(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", size=3, env=cluster_env())
    try:
        cluster.start()
        leader = cluster.nodes[cluster.wait_for_leader(timeout_s=60)].http_url
        status, _, _ = http_json("POST", leader + "/v1/jobs", {"queue": "q"}, timeout_s=10)
        assert status == 201
        cluster.wait_converged(timeout_s=60)
        # The leader's own duties (the cluster version's raise, token
        # touches) may still commit an entry after convergence: take n3's
        # state once two reads 1.5 s apart agree.
        before = cluster.digests()["n3"]
        deadline = time.monotonic() + 30
        while True:
            time.sleep(1.5)
            again = cluster.digests()["n3"]
            if again == before or time.monotonic() > deadline:
                break
            before = again
        cluster.stop()

        node = cluster.nodes["n3"]
        epoch = 1_000
        undecodable = msgpack.packb([ENTRY_FORMAT, epoch, 0, [[UNKNOWN_TAG, "from the future"]]])
        valid_after = encode_entry(Entry(epoch, 0, (Barrier(),)))
        index = append_committed(node.data_dir / "raft", [undecodable, valid_after])

        for run in ("first start", "restart"):
            cluster.start("n3")
            assert wait_for(lambda: _halted(node.http_url), timeout_s=30), run
            status, body = readyz(node.http_url)
            assert status == 503 and body["ready"] is False
            assert body["halted"]["index"] == index
            assert f"unknown command tag {UNKNOWN_TAG}" in body["halted"]["reason"]
            assert halted_gauge(node.http_url) == "1.0"
            applied, digest = cluster.digests()["n3"]
            assert (applied, digest) == (index - 1, before[1]), run
            assert node.process is not None
            assert cpu_seconds_over(node.process.pid, 2.0) < 0.5, "a halted node must not spin"
            cluster.kill("n3", signal.SIGTERM)
            assert node.process is not None and node.process.returncode == 0, run
        log = node.log_path.read_text()
        assert log.count("stopped applying at entry") == 2  # once per start
    finally:
        cluster.stop()


def cpu_seconds_over(pid: int, seconds: float) -> float:
    """CPU time the process used in the next `seconds` (Linux /proc)."""

    def used() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    start = used()
    time.sleep(seconds)
    return used() - start


def _halted(url: str) -> bool:
    try:
        status, body = readyz(url)
    except OSError:
        return False
    return status == 503 and "halted" in body
