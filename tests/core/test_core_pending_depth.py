"""`pending_depth`: the claim long-poll's cheap question agrees with queue_stats."""

from __future__ import annotations

from core_support import T0, Cluster

from raftsched.core import queue_stats
from raftsched.core.commands import Tick
from raftsched.core.queries import pending_depth


def test_pending_depth_counts_pending_jobs_of_the_named_queues() -> None:
    cluster = Cluster()
    cluster.submit(queue="a")
    cluster.submit(queue="a")
    cluster.submit(queue="b")
    cluster.submit(queue="b", delay_ms=100)  # scheduled, not pending
    cluster.claim_one(queues=("b",))  # claimed, not pending
    state = cluster.state
    assert pending_depth(state, ("a",)) == 2
    assert pending_depth(state, ("b",)) == 0
    assert pending_depth(state, ("a", "b", "unknown")) == 2
    assert pending_depth(state, ()) == 0
    cluster.run(Tick(), at=T0 + 200)  # the delayed job becomes due
    assert pending_depth(state, ("b",)) == 1
    stats = queue_stats(state)
    assert all(pending_depth(state, (q,)) == stats[q].depth for q in stats)
