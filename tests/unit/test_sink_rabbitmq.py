"""The RabbitMQ sink without a broker: the message it builds, a refused
connect as `Unreachable` without the password, and aiormq's connection
noise lowered to what the relay does not report itself (docs/relays.md).
Against a real broker: tests/e2e/test_relay_rabbitmq.py."""

from __future__ import annotations

import asyncio
import logging
import socket

import aio_pika
import pytest

from raftsched.core.events.sinks import make_sink
from raftsched.node.sink_rabbitmq import _amqp_message
from raftsched.node.sinks import Message, Unreachable, open_sink


def test_a_message_carries_the_event_in_its_properties_and_headers() -> None:
    event = Message("evt2_7", "job.done", 7, "acme", "pay-1", 2, b'{"id": "evt2_7"}', "rk")
    built = _amqp_message(event)
    assert built.body == b'{"id": "evt2_7"}'
    assert (built.message_id, built.type, built.app_id) == ("evt2_7", "job.done", "raftsched")
    assert built.content_type == "application/json"
    assert built.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert built.headers == {
        "raftsched-seq": 7,
        "raftsched-tenant": "acme",
        "raftsched-key": "pay-1",
        "raftsched-shard": 2,
    }


def test_a_refused_connect_is_unreachable_and_names_no_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"amqp://relay:s%40cret-pw@127.0.0.1:{port}/v"
    sink = open_sink(make_sink("rabbitmq", {"url": url, "routing_key": "rk"}), 2.0, 60)
    message = Message("evt_1", "job.done", 1, "", "k", 0, b"{}", "rk")

    async def publish() -> None:
        try:
            await sink.publish([message])
        finally:
            await sink.close()

    caplog.set_level(logging.INFO)
    with pytest.raises(Unreachable) as failure:
        asyncio.run(publish())
    assert "s%40cret-pw" not in str(failure.value) and "s@cret-pw" not in str(failure.value)
    # aiormq's error line for it is lowered below INFO: the relay reports it.
    assert not [r for r in caplog.records if r.name.startswith("aiormq")]


def test_a_broker_closing_the_connection_is_a_one_line_warning() -> None:
    logger = logging.getLogger("aiormq.connection")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    logger.addHandler(keep)
    try:
        logger.error("Unexpected connection close from remote %s", "amqp://u:******@h/v")
        try:
            raise ConnectionResetError(104, "reset")
        except ConnectionResetError:
            logger.warning("Cancelling cause reader exited abnormally", exc_info=True)
    finally:
        logger.removeHandler(keep)
    assert [(r.levelname, r.exc_info) for r in records] == [("WARNING", None), ("WARNING", None)]
    assert records[1].getMessage().endswith("ConnectionResetError: [Errno 104] reset")


def test_the_passwords_a_sink_keeps_out_of_its_errors() -> None:
    from raftsched.node.sinks import scrubbed, url_passwords

    servers = "nats://relay:p%40ss@n1:4222, nats://relay:other@n2:4222"
    assert url_passwords(servers) == ("other", "p%40ss", "p@ss")
    assert url_passwords("amqp://u:comma,pw@mq:5672/v") == ("comma,pw",)
    assert url_passwords("redis://h:6379/0") == ()
    text = "OSError: nats://relay:p@ss@n1 refused; other"
    assert scrubbed(text, url_passwords(servers)) == "OSError: nats://relay:***@n1 refused; ***"
