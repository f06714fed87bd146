"""A data shard's copy of a subscription group 0 records (CopySubscription,
docs/shards.md "Events and subscriptions"): the copy delivers the shard's
events from the subscription's creation in group 0 on, though it is made a
moment later; repeats and conflicts as a create's."""

from __future__ import annotations

import msgpack
from core_support import Cluster, assert_rejected_unchanged

from raftsched import core
from raftsched.core import decode_state, encode_state, new_state
from raftsched.core.events.commands import AckDelivery, CopySubscription, DeleteSubscription
from raftsched.core.events.subscriptions import pending_events, subscriptions
from raftsched.core.jobs.commands import CompleteJob
from raftsched.core.kernel.results import SubscriptionCreated

URL = "https://hooks.example/h"


def finish(cluster: Cluster, at: int) -> None:
    """One job completed at `at`: one `job.succeeded` event then."""
    cluster.now_ms = at
    lease = cluster.start()
    cluster.one(CompleteJob(lease.job_id, lease.fencing_token, msgpack.packb(1)), at=at)


def test_a_copy_delivers_the_events_from_group_zeros_creation_on() -> None:
    cluster = Cluster()
    start = cluster.now_ms
    for step in range(4):
        finish(cluster, start + 1_000 * (step + 1))  # events 1..4 at +1 s .. +4 s
    created_at = start + 2_500  # group 0 created it between events 2 and 3
    result = cluster.one(CopySubscription("sub_1", URL, ("job.*",), "k", created_at))
    assert result == SubscriptionCreated("sub_1", True, 2)
    copy = subscriptions(cluster.state)["sub_1"]
    assert copy.created_at_ms == created_at
    assert [event.seq for event in pending_events(cluster.state, copy, 10)] == [3, 4]
    # From before every held event: all of them; after the newest: none.
    cluster.one(CopySubscription("sub_2", URL, (), "k", start))
    cluster.one(CopySubscription("sub_3", URL, (), "k", start + 60_000))
    assert subscriptions(cluster.state)["sub_2"].cursor == 0
    assert subscriptions(cluster.state)["sub_3"].cursor == 4
    cluster.one(AckDelivery("sub_1", 4))
    data = encode_state(cluster.state)
    assert encode_state(decode_state(data)) == data


def test_a_copy_repeats_and_conflicts_as_a_create_does() -> None:
    cluster = Cluster()
    copy = CopySubscription("sub_1", URL, ("job.succeeded", "job.*"), "k", 5)
    assert cluster.one(copy) == SubscriptionCreated("sub_1", True, 0)
    assert cluster.one(copy) == SubscriptionCreated("sub_1", False, 0)
    for other in (
        CopySubscription("sub_1", URL, (), "k", 5),
        CopySubscription("sub_1", URL, ("job.succeeded", "job.*"), "other", 5),
        CopySubscription("sub_1", URL, ("job.succeeded", "job.*"), "k", 6),
    ):
        assert_rejected_unchanged(cluster, other, "idempotency_conflict")
    cluster.one(DeleteSubscription("sub_1"))
    assert cluster.one(CopySubscription("sub_1", URL, (), "new", 6)).created
    for bad, field in (
        (CopySubscription("sub_2", "ftp://x", (), "k", 1), "url"),
        (CopySubscription("sub_2", URL, (), "", 1), "secret"),
        (CopySubscription("sub_2", URL, (), "k", -1), "created_at_ms"),
        (CopySubscription("sub_2", URL, (), "k", True), "created_at_ms"),
    ):
        rejected = assert_rejected_unchanged(cluster, bad, "invalid_request")
        assert rejected.details == {"field": field}


def test_copy_subscription_waits_for_cluster_version_9() -> None:
    command = CopySubscription("sub_1", URL, (), "k", 1)
    assert core.command_version(command) == 9
    assert core.needs_upgrade(new_state(), command)
