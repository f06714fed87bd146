"""The outbox relayed to a real RabbitMQ broker (docs/relays.md): Debian's
`rabbitmq-server`, one per module (it boots in seconds: Erlang), driven by
`rabbitmq_support.RabbitMQServer`.

- The sink alone: a run is confirmed in order, with the documented
  properties and headers; a message the broker returns unroutable, or an
  exchange that does not exist, stops the run with nothing after it
  published; a stopped broker is `Unreachable`, and once it is back the
  sink connects again.
- A 3-node cluster under load publishes through the leader SIGKILLed
  (twice) and the broker restarted: every committed event arrives at least
  once, gapless after deduplication by `message_id`, each key's events in
  order of first arrival, nothing parked, no password in the logs. Prints
  the figures."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import aio_pika
import pytest
from e2e_support import cluster_env
from rabbitmq_support import EXCHANGE, RabbitMQServer

from raftsched.client import Client, Conflict
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.core.events.sinks import make_sink
from raftsched.node.sinks import Message, Published, Unreachable, open_sink
from raftsched.testing import LocalCluster, assert_no_secrets_in_logs

PASSWORD = "rabb1t-pw"
KEYS = 7
RELAY_ENV = {
    "RAFTSCHED_WEBHOOK_TIMEOUT_S": "2",
    "RAFTSCHED_WEBHOOK_BACKOFF_S": "0.05",
    "RAFTSCHED_WEBHOOK_BACKOFF_MAX_S": "0.5",
    "RAFTSCHED_WEBHOOK_MAX_ATTEMPTS": "4",
}


@pytest.fixture(scope="module")
def rabbitmq_server(
    rabbitmq_server_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RabbitMQServer]:
    server = RabbitMQServer(rabbitmq_server_binary, tmp_path_factory.mktemp("rabbitmq"), PASSWORD)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        print(f"\nrabbitmq-server boot seconds: {[round(s, 1) for s in server.boot_seconds]}")


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.1)


def _message(seq: int, destination: str) -> Message:
    body = json.dumps({"id": f"evt_{seq}", "seq": seq}).encode()
    return Message(f"evt_{seq}", "job.cancelled", seq, "t", f"k{seq % 2}", 0, body, destination)


def test_the_rabbitmq_sink_confirms_in_order_stops_at_a_refusal_and_reconnects(
    rabbitmq_server: RabbitMQServer,
) -> None:
    server = rabbitmq_server
    queue = "alone.events"
    server.prepare(queue)
    options = {"url": server.url, "exchange": EXCHANGE, "routing_key": queue}

    async def scenario() -> None:
        sink = open_sink(make_sink("rabbitmq", options), 5.0, 60)
        missing = open_sink(make_sink("rabbitmq", {**options, "exchange": "no-such"}), 5.0, 60)
        default = open_sink(make_sink("rabbitmq", {"url": server.url, "routing_key": queue}), 5, 0)
        try:
            assert await sink.publish([_message(seq, queue) for seq in (1, 2, 3)]) == Published(3)
            # Returned unroutable: nothing after it is published.
            run = [_message(4, queue), _message(5, "nowhere"), _message(6, queue)]
            answer = await sink.publish(run)
            assert answer.confirmed == 1 and answer.refused and "NO_ROUTE" in answer.refused
            server.refuse(queue)
            answer = await sink.publish([_message(5, queue), _message(6, queue)])
            assert answer.confirmed == 0 and answer.refused and "NO_ROUTE" in answer.refused
            server.accept(queue)
            # No such exchange: the broker closes the channel (404); the
            # next call opens another, and is refused again, not unreachable.
            for _ in range(2):
                answer = await missing.publish([_message(5, queue)])
                assert answer.confirmed == 0 and answer.refused and "NOT_FOUND" in answer.refused
            assert await sink.publish([_message(5, queue)]) == Published(1)
            # The default exchange: the routing key names the queue.
            assert await default.publish([_message(6, queue)]) == Published(1)
            # A refused login: unreachable (retried), not a refusal of the message.
            wrong = open_sink(
                make_sink("rabbitmq", {**options, "url": server.url.replace(PASSWORD, "nope")}),
                5.0,
                60,
            )
            with pytest.raises(Unreachable):
                await wrong.publish([_message(7, queue)])
            await wrong.close()
            server.stop()
            with pytest.raises(Unreachable) as failure:
                await sink.publish([_message(7, queue)])
            assert PASSWORD not in str(failure.value)
            with pytest.raises(Unreachable):  # connect refused
                await sink.publish([_message(7, queue)])
            server.start()
            assert await sink.publish([_message(7, queue)]) == Published(1)
            many = [_message(seq, queue) for seq in range(8, 208)]
            began = time.monotonic()
            assert await sink.publish(many) == Published(200)
            rate = 200 / (time.monotonic() - began)
            print(f"\nrabbitmq sink: {rate:.0f} messages/s, each confirmed before the next")
            server.prepare("props.events")
            assert await sink.publish([_message(1, "props.events")]) == Published(1)
            await _check_properties(server, "props.events")
        finally:
            for each in (sink, missing, default):
                await each.close()

    asyncio.run(scenario())
    arrived = server.received(queue)
    assert [message.seq for message in arrived] == list(range(1, 208))
    assert [message.id for message in arrived] == [f"evt_{seq}" for seq in range(1, 208)]
    first = arrived[0]
    assert (first.type, first.tenant, first.key, first.shard) == ("job.cancelled", "t", "k1", 0)
    assert first.body == {"id": "evt_1", "seq": 1}
    assert server.received(queue) == arrived  # kept, and nothing more


async def _check_properties(server: RabbitMQServer, queue: str) -> None:
    """The one message in `queue` as a consumer sees it: properties, header types."""
    connection = await aio_pika.connect(server.url, timeout=10)
    try:
        channel = await connection.channel()
        found = await (await channel.get_queue(queue, ensure=False)).get(fail=True, timeout=10)
        assert found.content_type == "application/json"
        assert found.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert (found.message_id, found.type, found.app_id) == (
            "evt_1",
            "job.cancelled",
            "raftsched",
        )
        ours = {name: value for name, value in found.headers.items() if name != "x-delivery-count"}
        assert ours == {  # x-delivery-count: the quorum queue's own
            "raftsched-seq": 1,
            "raftsched-tenant": "t",
            "raftsched-key": "k1",
            "raftsched-shard": 0,
        }
        await found.ack()
    finally:
        await connection.close()


class Load:
    """Submits and cancels jobs (one `job.cancelled` event each) until told
    to stop, through leader changes (the client retries)."""

    def __init__(self, cluster: LocalCluster, count: int) -> None:
        self.cluster, self.count, self.done = cluster, count, 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with Client(self.cluster.urls, timeout_s=10, retry_budget_s=60) as client:
                for index in range(self.count):
                    job = client.submit(
                        "relay",
                        {"payment_id": f"pay-{index % KEYS}", "n": index},
                        idempotency_key=f"relay:{index}",
                    )
                    try:
                        client.cancel_job(job["id"])
                    except Conflict:  # a retried cancel that had committed
                        assert client.get_job(job["id"])["status"] == "cancelled"
                    self.done = index + 1
        except BaseException as error:  # reported by the test's thread
            self.error = error

    def wait_for(self, done: int, timeout_s: float = 120) -> None:
        _wait(lambda: self.done >= done or self.error is not None, timeout_s, f"{done} jobs")
        assert self.error is None, repr(self.error)


def _committed(cluster: LocalCluster) -> list[dict[str, Any]]:
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        found: list[dict[str, Any]] = []
        while True:
            page = client.events(found[-1]["seq"] if found else 0, limit=1000)
            if not page["events"]:
                return found
            found += page["events"]


@pytest.mark.slow
def test_every_committed_event_reaches_rabbitmq_through_kills_and_a_broker_restart(
    tmp_path_factory: pytest.TempPathFactory, rabbitmq_server: RabbitMQServer
) -> None:
    server, destination, total = rabbitmq_server, "payments.events", 240
    root = tmp_path_factory.mktemp("relay") / "cluster"
    cluster = LocalCluster(root, size=3, env={**cluster_env(), **RELAY_ENV})
    cluster.start()
    try:
        cluster.wait_for_leader(timeout_s=30)
        with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
            _wait(
                lambda: client.cluster().get("cluster_version") == COMMAND_VERSION_MAX,
                60,
                "the cluster version gate to open",
            )
            server.prepare(destination)
            sub = client.create_broker_subscription(
                server.sink(destination),
                ["job.*"],
                subscription_id="sub_amqp",
                key_field="payment_id",
            )
        assert "***" in sub["sink"]["url"] and PASSWORD not in json.dumps(sub)
        restarts_before, kills = server.restarts, 0
        load = Load(cluster, total)
        load.wait_for(40)
        cluster.kill(cluster.wait_for_leader())  # the leader dies mid-stream
        kills += 1
        load.wait_for(80)
        server.restart(down_s=3.0)  # the broker goes away, then comes back
        load.wait_for(130)
        for node_id, node in cluster.nodes.items():
            if not node.alive:
                cluster.start(node_id)  # the first victim back: a quorum survives the next kill
        load.wait_for(160)
        cluster.kill(cluster.wait_for_leader())
        kills += 1
        load.wait_for(total, timeout_s=180)
        load.thread.join(timeout=10)

        committed = _committed(cluster)
        seqs = [event["seq"] for event in committed]
        assert seqs == list(range(1, total + 1))
        with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
            _wait(
                lambda: client.get_subscription("sub_amqp")["cursor_seq"] >= seqs[-1],
                120,
                "the relay's cursor to reach the newest event",
            )
            view = client.get_subscription("sub_amqp")
        assert view["parked_count"] == 0 and PASSWORD not in json.dumps(view)
    finally:
        cluster.stop()

    # The cursor moves only after every confirm: all of it is in the queue.
    messages = server.received(destination)
    first: dict[str, Any] = {}
    for message in messages:  # in the queue's order: first arrivals
        first.setdefault(message.id, message)
    duplicates = len(messages) - len(first)
    arrived = sorted(message.seq for message in first.values())
    lost = sorted(set(seqs) - set(arrived))
    print(
        f"\nrabbitmq relay: events={len(committed)} kills={kills} "
        f"broker_restarts={server.restarts - restarts_before} messages={len(messages)} "
        f"duplicates={duplicates} lost={len(lost)}"
    )
    assert lost == [] and arrived == seqs  # gapless after deduplication, nothing else
    by_seq = {event["seq"]: event for event in committed}
    keys: dict[str, list[int]] = {}
    for message in first.values():
        event = by_seq[message.seq]
        assert message.id == message.body["id"] == f"evt_{message.seq}"
        assert (message.type, message.body["seq"], message.body["subscription_id"]) == (
            event["type"],
            message.seq,
            "sub_amqp",
        )
        assert message.body["data"] == event["data"]
        assert message.tenant == event["data"]["tenant"] and message.shard == 0
        keys.setdefault(message.key, []).append(message.seq)
    assert set(keys) == {f"pay-{n}" for n in range(KEYS)}
    for key, order in keys.items():
        assert order == sorted(order), f"key {key} out of order: {order}"
    assert_no_secrets_in_logs(cluster, {"rabbitmq password": PASSWORD})
