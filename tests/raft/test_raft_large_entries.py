"""Entries larger than one AppendEntries part, under load, on three toy nodes.

pysyncobj sends an entry of 64 KiB or more to each follower as a
transmission of 64 KiB parts; its parts used to be labelled `finish` too
early, and the followers logged `failed _onTick` with `pickle data was
truncated` (see `raftsched.raft._TransmissionLabels`). The fixture fails the
test on any error-level line in a node's log.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest
from raft_support import Cluster

from raftsched.testing import log_errors

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PROPOSERS = 3
ENTRIES_PER_PROPOSER = 6
# Random bytes: half of them are 0x80 or more, which pysyncobj's pickle
# (protocol 2) stores in two bytes each, so the pickle sent in parts is far
# longer than the command; sizes from one to several parts.
ENTRY_BYTES_MIN = 40_000
ENTRY_BYTES_MAX = 400_000


def test_large_entries_under_load_reach_every_replica_intact(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster()
    cluster.start()
    cluster.wait_leader()
    rng = random.Random(13)
    batches = [
        [
            rng.randbytes(rng.randrange(ENTRY_BYTES_MIN, ENTRY_BYTES_MAX))
            for _ in range(ENTRIES_PER_PROPOSER)
        ]
        for _ in range(PROPOSERS)
    ]
    failures: list[BaseException] = []

    def propose_all(entries: list[bytes]) -> None:
        try:
            for data in entries:
                cluster.propose_on_leader(data, timeout_s=30)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=propose_all, args=(entries,)) for entries in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=100)
    assert not failures, failures

    wanted = sorted(data for entries in batches for data in entries)
    replicated = cluster.wait_converged(lambda entries: sorted(entries) == wanted, timeout_s=30)
    assert sorted(replicated) == wanted
    applied = {node.node_id: node.status()["applied_index"] for node in cluster.live()}
    assert len(set(applied.values())) == 1, applied
    errors = [error for node in cluster.live() for error in log_errors(node.log_path)]
    assert not errors, "\n".join(error.describe() for error in errors)
