"""The outbox relayed to NATS JetStream (docs/relays.md), against Debian's
`nats-server`: the sink alone (a republished run dropped by `Nats-Msg-Id`
dedup and stored once, a refusal stopping the run with nothing after it
stored, a full stream's refusal, unreachable while the server is down and
working again after), then a 3-node cluster publishing under load through a
leader SIGKILL (twice) and a nats-server restart: every committed event in
the stream at least once, gapless after deduplication by id, each key in
order, nothing parked, the password in no log. Prints the figures."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_support import Received, free_port
from e2e_support import cluster_env
from nats_support import NatsServer
from test_relay_redis import KEYS, RELAY_ENV, Load, _committed, _wait

from raftsched.client import Client
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.core.events.sinks import make_sink
from raftsched.node.sink_nats import JetStreamSink
from raftsched.node.sinks import Message, Published, Unreachable, open_sink
from raftsched.testing import LocalCluster, assert_no_secrets_in_logs

PASSWORD = "n4ts-relay-pw"
SUBJECT = "payments.events"


@pytest.fixture
def nats_server(nats_server_binary: str, tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(nats_server_binary, tmp_path / "nats", PASSWORD)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _message(seq: int, subject: str = SUBJECT) -> Message:
    body = json.dumps({"id": f"evt_{seq}", "seq": seq}).encode()
    return Message(f"evt_{seq}", "job.cancelled", seq, "acme", f"k{seq % 2}", 0, body, subject)


def test_the_jetstream_sink_drops_repeats_stops_at_refusals_and_outlives_a_restart(
    nats_server: NatsServer,
) -> None:
    """The sink alone against the real server."""
    server = nats_server
    server.prepare(SUBJECT)
    server.prepare("full.events")
    server.limit("full.events", 1)
    failures: list[str] = []

    async def until_published(sink: JetStreamSink, run: list[Message]) -> Published:
        """Publish as the relay does while the server comes back: Unreachable
        is retried (a bounded number of times here)."""
        for _ in range(50):
            try:
                return await sink.publish(run)
            except Unreachable as error:
                failures.append(str(error))
                await asyncio.sleep(0.1)
        raise AssertionError(f"still unreachable: {failures[-1]}")

    async def scenario() -> None:
        # The first server listed is down: the sink connects to the other.
        dead = f"nats://relay:{PASSWORD}@127.0.0.1:{free_port()}"
        sink = open_sink(
            make_sink("nats", {"url": f"{dead},{server.url}", "subject": SUBJECT}), 2.0, 60
        )
        assert isinstance(sink, JetStreamSink)
        try:
            run = [_message(seq) for seq in (1, 2, 3)]
            assert await sink.publish(run) == Published(3)
            assert sink.duplicates_dropped == 0
            assert await sink.publish(run[1:]) == Published(2)  # repeats: confirmed, dropped
            assert sink.duplicates_dropped == 2
            # No stream captures the subject: JetStream's word, so a refusal;
            # the run stops there and 6 is not sent before 5.
            mixed = [_message(4), _message(5, "nowhere.events"), _message(6)]
            answer = await sink.publish(mixed)
            assert answer.confirmed == 1 and answer.refused is not None
            assert "no JetStream stream captures subject 'nowhere.events'" in answer.refused
            # A full stream that discards new messages refuses with an error answer.
            assert await sink.publish([_message(7, "full.events")]) == Published(1)
            answer = await sink.publish([_message(8, "full.events")])
            assert answer.confirmed == 0 and "maximum messages exceeded" in str(answer.refused)
            # A placeholder filled with a wildcard: not publishable, refused.
            answer = await sink.publish([_message(9, "payments.*")])
            assert answer.confirmed == 0 and "wildcard" in str(answer.refused)
            # The driver's refuse/accept: no stream for the subject, then one again.
            server.refuse(SUBJECT)
            answer = await sink.publish([_message(6)])
            assert answer.confirmed == 0 and "no JetStream stream" in str(answer.refused)
            server.accept(SUBJECT)
            assert await sink.publish([_message(6)]) == Published(1)
            # The server goes away: unreachable, promptly (the connection's
            # loss, not a timeout), and a new connection once it is back.
            server.stop()
            started = time.monotonic()
            for _ in range(2):  # the connection lost, then no connection
                with pytest.raises(Unreachable) as raised:
                    await sink.publish([_message(10)])
                failures.append(str(raised.value))
            assert time.monotonic() - started < 3
            server.start()
            # A repeat of one stored before the restart is still dropped: the
            # duplicate window outlives the restart.
            assert await until_published(sink, [_message(6), _message(10)]) == Published(2)
            assert sink.duplicates_dropped == 3
        finally:
            await sink.close()

    asyncio.run(scenario())
    rows = server.received(SUBJECT)
    assert [row.seq for row in rows] == [1, 2, 3, 4, 6, 10]
    assert rows[0] == Received(
        "evt_1", "job.cancelled", 1, "acme", "k1", 0, {"id": "evt_1", "seq": 1}
    )
    assert [row.id for row in server.received("full.events")] == ["evt_7"]
    assert failures and all(PASSWORD not in text and "***" in text for text in failures)


def _repeats_logged(cluster: LocalCluster) -> int:
    """The repeats JetStream dropped, as the nodes' sinks logged them (the
    PubAcks flagged `duplicate`; the server keeps no count of them)."""
    total = 0
    for line in cluster.logs().splitlines():
        if "JetStream dropped repeated messages" in line and line.startswith("{"):
            total += int(json.loads(line).get("repeats", 0))
    return total


@pytest.fixture
def relay_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path / "cluster", size=3, env={**cluster_env(), **RELAY_ENV})
    local.start()
    try:
        local.wait_for_leader(timeout_s=30)
        yield local
    finally:
        local.stop()


@pytest.mark.slow
def test_every_committed_event_reaches_jetstream_through_kills_and_a_server_restart(
    relay_cluster: LocalCluster, nats_server: NatsServer
) -> None:
    cluster, broker = relay_cluster, nats_server
    broker.prepare(SUBJECT)
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        _wait(
            lambda: client.cluster().get("cluster_version") == COMMAND_VERSION_MAX,
            60,
            "the cluster version gate to open",
        )
        sub = client.create_broker_subscription(
            broker.sink(SUBJECT), ["job.*"], subscription_id="sub_nats", key_field="payment_id"
        )
    assert "***" in sub["sink"]["url"] and broker.password not in json.dumps(sub)
    total, kills = 240, 0
    load = Load(cluster, total)
    load.thread.start()
    load.wait_for(40)
    cluster.kill(cluster.wait_for_leader())  # the leader dies mid-stream
    kills += 1
    load.wait_for(80)
    broker.restart(down_s=3.0)  # the broker goes away, then comes back
    load.wait_for(130)
    for node_id, node in cluster.nodes.items():
        if not node.alive:
            cluster.start(node_id)  # the first victim back, so a quorum survives the next kill
    load.wait_for(160)
    cluster.kill(cluster.wait_for_leader())
    kills += 1
    load.wait_for(total, timeout_s=180)
    load.thread.join(timeout=10)

    committed = _committed(cluster)
    seqs = [event["seq"] for event in committed]
    assert len(committed) == total and seqs == list(range(1, total + 1))
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        _wait(
            lambda: client.get_subscription("sub_nats")["cursor_seq"] >= seqs[-1],
            120,
            "the relay's cursor to reach the newest event",
        )
        view = client.get_subscription("sub_nats")
    assert view["parked_count"] == 0
    assert broker.password not in json.dumps(view)

    rows = broker.received(SUBJECT)
    first: dict[str, Received] = {}
    for row in rows:
        first.setdefault(row.id, row)
    duplicates = len(rows) - len(first)
    arrived = sorted(row.seq for row in first.values())
    lost = sorted(set(seqs) - set(arrived))
    dropped = broker.dropped_repeats()
    print(
        f"\nnats relay: events={len(committed)} kills={kills} "
        f"broker_restarts={broker.restarts} stream_entries={len(rows)} "
        f"republished_and_dropped={_repeats_logged(cluster) if dropped is None else dropped} "
        f"duplicates={duplicates} lost={len(lost)} ({broker.durability})"
    )
    assert lost == []
    assert arrived == seqs  # gapless after deduplication, and nothing else
    by_seq = {event["seq"]: event for event in committed}
    keys: dict[str, list[int]] = {}
    for row in first.values():  # in the stream's order of first arrival
        event = by_seq[row.seq]
        assert row.id == row.body["id"] == f"evt_{row.seq}"
        assert (row.type, row.body["seq"], row.body["subscription_id"]) == (
            event["type"],
            row.seq,
            "sub_nats",
        )
        assert row.body["data"] == event["data"]
        assert row.tenant == event["data"]["tenant"] and row.shard == 0
        keys.setdefault(row.key, []).append(row.seq)
    assert set(keys) == {f"pay-{n}" for n in range(KEYS)}
    for key, order in keys.items():
        assert order == sorted(order), f"key {key} out of order: {order}"
    assert_no_secrets_in_logs(cluster, {"nats password": broker.password})


@pytest.mark.slow
def test_a_message_no_stream_takes_is_parked_then_arrives_when_retried(
    relay_cluster: LocalCluster, nats_server: NatsServer
) -> None:
    """JetStream's "no stream captures the subject" is a refusal: parked after
    `max_attempts`, with the reason; once a stream takes the subject again,
    the operator's retry publishes it."""
    cluster, broker = relay_cluster, nats_server
    destination = "refused.events"
    broker.prepare(destination)
    broker.refuse(destination)
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        _wait(
            lambda: client.cluster().get("cluster_version") == COMMAND_VERSION_MAX,
            60,
            "the cluster version gate to open",
        )
        client.create_broker_subscription(
            broker.sink(destination), ["job.cancelled"], subscription_id="sub_refused"
        )
        job = client.submit("relay", {"payment_id": "pay-x"}, idempotency_key="refused:1")
        client.cancel_job(job["id"])
        _wait(
            lambda: client.get_subscription("sub_refused")["parked_count"] == 1,
            60,
            "the refused event to be parked",
        )
        (parked,) = client.get_subscription("sub_refused")["parked"]
        assert parked["attempts"] == 4, parked
        assert "no JetStream stream captures subject 'refused.events'" in parked["error"]
        assert parked["event"]["data"]["job_id"] == job["id"]
        assert broker.received(destination) == []
        broker.accept(destination)
        assert client.retry_parked("sub_refused") == {"retried": 1}
        _wait(
            lambda: client.get_subscription("sub_refused")["parked_count"] == 0,
            60,
            "the retried event to arrive",
        )
    (row,) = broker.received(destination)
    assert row.body["data"]["job_id"] == job["id"] and row.type == "job.cancelled"
    assert row.key == "refused:1"  # no key_field: the idempotency key
    assert_no_secrets_in_logs(cluster, {"nats password": broker.password})
