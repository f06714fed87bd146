"""The outbox relayed to a real RabbitMQ broker (docs/relays.md): Debian's
`rabbitmq-server`, one per module (it boots in seconds: Erlang), driven by
`rabbitmq_support.RabbitMQServer`.

- The sink alone: a run is confirmed in order, with the documented
  properties and headers; a message the broker returns unroutable, or an
  exchange that does not exist, stops the run with nothing after it
  published; a stopped broker is `Unreachable`, and once it is back the
  sink connects again.
- The relay scenarios every broker shares (relay_scenarios.py): leader
  kills, a broker restart and a partition under load (a broker of its own
  in a network namespace), gapless after deduplication by `message_id`;
  an unroutable message parked and retried; two shards with a shard
  leader killed. Prints the figures."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest
from rabbitmq_support import EXCHANGE, RabbitMQServer
from relay_scenarios import (
    SHARD_KILL,
    every_shard_relays_its_own,
    faults_with_broker_in_namespace,
    refused_then_retried,
)

from raftsched.core.events.sinks import make_sink
from raftsched.node.sinks import Message, Published, Unreachable, open_sink
from raftsched.testing import LocalCluster

PASSWORD = "rabb1t-pw"


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


@pytest.mark.slow
def test_every_committed_event_reaches_rabbitmq_through_kills_restarts_and_a_partition(
    rabbitmq_server_binary: str, tmp_path: Path, relay_cluster: LocalCluster
) -> None:
    figures = faults_with_broker_in_namespace(
        relay_cluster,
        lambda host, netns: RabbitMQServer(
            rabbitmq_server_binary, tmp_path / "rabbitmq-ns", PASSWORD, host, netns
        ),
    )
    # RabbitMQ keeps every copy it confirmed: a consumer dedups by message_id.
    assert figures.lost == 0


@pytest.mark.slow
def test_an_unroutable_message_is_parked_then_arrives_when_retried(
    relay_cluster: LocalCluster, rabbitmq_server: RabbitMQServer
) -> None:
    parked = refused_then_retried(relay_cluster, rabbitmq_server)
    assert "NO_ROUTE" in parked["error"]


@pytest.mark.slow
@pytest.mark.expect_log_errors(SHARD_KILL.pattern, reason=SHARD_KILL.reason)
def test_every_shards_leader_relays_its_own_outbox(
    tmp_path_factory: pytest.TempPathFactory, rabbitmq_server: RabbitMQServer
) -> None:
    every_shard_relays_its_own(tmp_path_factory.mktemp("rq") / "c", rabbitmq_server)
