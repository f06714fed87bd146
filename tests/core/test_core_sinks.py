"""A subscription's broker sink, tenants filter and key field (docs/relays.md,
section 1; cluster version 10): validated, replicated exactly, encoded only
when set (so a webhook's commands and state keep the bytes of before), gated
at version 10, and carried to the shards by `CopySubscription`."""

from __future__ import annotations

import msgpack
import pytest
from core_support import T0, Cluster, assert_rejected_unchanged

from raftsched.core import (
    command_version,
    decode_entry,
    decode_state,
    encode_entry,
    encode_state,
    needs_upgrade,
    newest_spec_field,
)
from raftsched.core.events.commands import CopySubscription, CreateSubscription
from raftsched.core.events.sinks import (
    SINK_VERSION,
    Sink,
    make_sink,
    redacted,
    redacted_url,
)
from raftsched.core.events.subscriptions import pending_events, subscriptions
from raftsched.core.jobs.commands import CompleteJob
from raftsched.core.kernel.commands import Entry, RaiseClusterVersion
from raftsched.core.kernel.results import SubscriptionCreated

REDIS = make_sink(
    "redis", {"url": "redis://:pw@127.0.0.1:6379/0", "stream": "payments:events", "maxlen": 1000}
)


def broker(sub_id: str = "s1", **fields: object) -> CreateSubscription:
    return CreateSubscription(sub_id, "", ("job.*",), "", **{"sink": REDIS, **fields})  # type: ignore[arg-type]


def finish(cluster: Cluster, tenant: str) -> None:
    lease = cluster.start(tenant=tenant)
    cluster.one(CompleteJob(lease.job_id, lease.fencing_token, msgpack.packb(1)))


def test_a_broker_subscription_is_kept_and_replicated_exactly() -> None:
    command = broker(tenants=("acme", "globex"), key_field="payment_id")
    entry = Entry(3, T0, (command,))
    data = encode_entry(entry)
    assert decode_entry(data) == entry and encode_entry(decode_entry(data)) == data
    clusters = [Cluster(), Cluster()]
    for cluster in clusters:
        assert cluster.one(command) == SubscriptionCreated("s1", True, 0)
    assert clusters[0].digest() == clusters[1].digest()
    sub = subscriptions(clusters[0].state)["s1"]
    assert (sub.sink, sub.tenants, sub.key_field) == (REDIS, ("acme", "globex"), "payment_id")
    state_bytes = encode_state(clusters[0].state)
    again = decode_state(state_bytes)
    assert encode_state(again) == state_bytes
    assert subscriptions(again)["s1"].sink == REDIS
    # A repeat is answered as created before; another sink is a conflict.
    assert clusters[0].one(command) == SubscriptionCreated("s1", False, 0)
    other = make_sink("redis", {"url": "redis://127.0.0.1:6379/0", "stream": "other"})
    assert_rejected_unchanged(
        clusters[0], broker(sink=other, tenants=("acme", "globex")), "idempotency_conflict"
    )


def test_a_webhook_keeps_the_bytes_of_before() -> None:
    command = CreateSubscription("s1", "https://hooks.example/h", ("job.*",), "k")
    row = msgpack.unpackb(encode_entry(Entry(1, T0, (command,))))[3][0]
    assert len(row) == 5  # tag and the four fields of version 1
    cluster = Cluster()
    cluster.one(command)
    doc = msgpack.unpackb(encode_state(cluster.state))
    (section,) = [rows for name, rows in doc[7] if name == "subscriptions"]
    assert len(section[0]) == 8  # no version-10 fields
    assert command_version(command) == 1


def test_the_new_fields_wait_for_cluster_version_10() -> None:
    cluster = Cluster()
    cluster.one(RaiseClusterVersion(SINK_VERSION - 1))
    webhook = CreateSubscription("s1", "https://hooks.example/h", (), "k")
    for gated in (
        broker(),
        CreateSubscription("s1", "https://hooks.example/h", (), "k", tenants=("acme",)),
        CreateSubscription("s1", "https://hooks.example/h", (), "k", key_field="payment_id"),
        CopySubscription("s1", "", (), "", 5, REDIS),
    ):
        assert command_version(gated) == SINK_VERSION
        assert needs_upgrade(cluster.state, gated)
    assert not needs_upgrade(cluster.state, webhook)
    # The refusal (409 invalid_state, reason cluster_version) names the field.
    assert newest_spec_field(broker()) == "sink"
    tenants_only = CreateSubscription("s1", "https://h/", (), "k", tenants=("a",))
    assert newest_spec_field(tenants_only) == "tenants"
    assert newest_spec_field(webhook) is None
    cluster.one(RaiseClusterVersion(SINK_VERSION))
    assert not needs_upgrade(cluster.state, broker())


@pytest.mark.parametrize(
    ("command", "field"),
    [
        (broker(sink=Sink("kafka", ())), "sink"),
        (broker(sink=make_sink("redis", {"url": "redis://h/0"})), "sink.stream"),
        (broker(sink=make_sink("redis", {"url": "http://h/", "stream": "s"})), "sink.url"),
        (broker(sink=make_sink("redis", {"url": "redis://h", "stream": "s", "maxlen": 0})),
         "sink.maxlen"),
        (broker(sink=make_sink("redis", {"url": "redis://h", "stream": "s", "db": 1})), "sink.db"),
        (broker(sink=Sink("redis", (("url", "redis://h"), ("stream", "s")))), "sink"),
        (broker(sink="redis"), "sink"),
        (CreateSubscription("s1", "https://h/", (), "k", sink=REDIS), "url"),
        (broker(tenants=("b", "a")), "tenants"),
        (broker(tenants=("",)), "tenants"),
        (broker(key_field=""), "key_field"),
    ],
)  # fmt: skip
def test_a_bad_sink_is_refused_and_changes_nothing(command: CreateSubscription, field: str) -> None:
    cluster = Cluster()
    rejected = assert_rejected_unchanged(cluster, command, "invalid_request")
    assert rejected.details == {"field": field}


def test_the_tenants_filter_keeps_only_those_tenants_events() -> None:
    cluster = Cluster()
    cluster.one(broker(tenants=("acme",)))
    cluster.one(CreateSubscription("all", "https://hooks.example/h", (), "k"))
    for tenant in ("acme", "globex", "acme", "globex", "globex", "acme"):
        finish(cluster, tenant)
    acme = subscriptions(cluster.state)["s1"]
    every = subscriptions(cluster.state)["all"]
    assert [event.seq for event in pending_events(cluster.state, acme, 10)] == [1, 3, 6]
    assert [event.seq for event in pending_events(cluster.state, acme, 2)] == [1, 3]
    assert len(pending_events(cluster.state, every, 10)) == 6


def test_a_copy_carries_the_sink_tenants_and_key_field() -> None:
    cluster = Cluster()
    copy = CopySubscription("s1", "", ("job.*",), "", 5, REDIS, ("acme",), "payment_id")
    assert cluster.one(copy) == SubscriptionCreated("s1", True, 0)
    sub = subscriptions(cluster.state)["s1"]
    assert sub.later_fields() == (REDIS, ("acme",), "payment_id")
    assert cluster.one(copy) == SubscriptionCreated("s1", False, 0)
    assert_rejected_unchanged(
        cluster,
        CopySubscription("s1", "", ("job.*",), "", 5, REDIS, None, "payment_id"),
        "idempotency_conflict",
    )
    row = msgpack.unpackb(encode_entry(Entry(1, T0, (copy,))))[3][0]
    assert decode_entry(encode_entry(Entry(1, T0, (copy,)))).commands == (copy,)
    assert len(row) == 9


def test_the_password_is_never_shown() -> None:
    assert redacted_url("redis://:s3cret@host:6379/0") == "redis://:***@host:6379/0"
    assert redacted_url("amqp://user:pw@[::1]:5672/vh") == "amqp://user:***@[::1]:5672/vh"
    assert redacted_url("redis://host:6379/0") == "redis://host:6379/0"
    assert "pw" not in str(redacted(REDIS))
    assert redacted(REDIS) == {
        "kind": "redis",
        "url": "redis://:***@127.0.0.1:6379/0",
        "stream": "payments:events",
        "maxlen": 1000,
    }
