"""The RabbitMQ sink of the relay (docs/relays.md): AMQP 0-9-1 with
publisher confirms, through aio-pika (the `rabbitmq` extra).

One connection (`aio_pika.connect`, not `connect_robust`: the relay does its
own retries, from the first unconfirmed message) and one channel in confirm
mode. Each message is published `mandatory`, persistent, and confirmed
before the next one is published: on one channel the broker routes messages
in publish order, but a message returned as unroutable (or nacked) does not
stop the ones published after it, which would then arrive before it when it
is published again. Waiting for each confirm is what keeps "never first
published after a later one" (docs/relays.md, section 3); a confirm of a
persistent message on a durable (or quorum) queue means it is on disk.

A message (docs/relays.md, section 2):

- body: the webhook's JSON envelope; `content_type` `application/json`,
  `delivery_mode` 2 (persistent), `app_id` `raftsched`;
- `message_id`: the event id (`evt_<seq>`, `evt<shard>_<seq>`): RabbitMQ
  has no deduplication of its own, so a consumer deduplicates by it;
- `type`: the event type;
- headers: `raftsched-seq` (integer), `raftsched-tenant`, `raftsched-key`
  (strings), `raftsched-shard` (integer);
- published to the sink's `exchange` (absent: the default exchange, where
  the routing key names the queue) with its `routing_key`, placeholders
  filled (`Message.destination`).

Failures:

- unreachable (`Unreachable`, retried without end): the connection refused,
  closed or lost (a broker restart closes it with `CONNECTION_FORCED`),
  authentication refused, a timeout (connect or confirm, `timeout_s`; a
  broker that blocks publishers on a memory or disk alarm times out too).
  The connection is dropped; the next call opens a new one. What was
  confirmed before the failure is answered (`Published(confirmed)`), so
  the relay publishes only the rest again.
- refused (`Published(confirmed, refused)`): a nack, a mandatory message
  returned unroutable (`NO_ROUTE`), or the channel closed by the broker for
  the message (an exchange that does not exist: 404 `NOT_FOUND`; no write
  permission: 403). The channel is opened again on the next call.

`dedup_window_s` is not used: there is no broker-side window to set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any, Final

import aio_pika
import aiormq

from raftsched.core.events.sinks import Sink
from raftsched.node.sinks import Message, Published, Unreachable, scrubbed, url_passwords

# The names of the headers that carry what `message_id` and `type` do not.
SEQ_HEADER: Final = "raftsched-seq"
TENANT_HEADER: Final = "raftsched-tenant"
KEY_HEADER: Final = "raftsched-key"
SHARD_HEADER: Final = "raftsched-shard"
CONTENT_TYPE: Final = "application/json"
APP_ID: Final = "raftsched"
CLOSE_TIMEOUT_S: Final = 2.0


class _QuietConnectionLog(logging.Filter):
    """aiormq logs a refused connect and a broker's closing of the connection
    (a restart) at error level, and a reset one with a traceback; for the
    relay each is an unreachable broker, which it reports itself (a warning,
    then every 20th retry, with the same text). A refused connect, once per
    retry, is kept at debug level; the closing, once per outage, as a
    one-line warning."""

    LEVELS: Final = {
        "error when creating transport": logging.DEBUG,
        "Unexpected connection close": logging.WARNING,
        "Cancelling cause reader exited abnormally": logging.WARNING,
    }

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        level = next((level for note, level in self.LEVELS.items() if text.startswith(note)), None)
        if level is None:
            return True
        if record.levelno > level:
            record.levelno, record.levelname = level, logging.getLevelName(level)
        if record.exc_info and record.exc_info[1] is not None:
            failure = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {type(failure).__name__}: {failure}"
            record.args = ()
        record.exc_info, record.exc_text = None, None
        # The logger's level was checked before this filter ran: check the new one.
        return logging.getLogger(record.name).isEnabledFor(record.levelno)


_quiet = _QuietConnectionLog()
if _quiet not in logging.getLogger("aiormq.connection").filters:
    logging.getLogger("aiormq.connection").addFilter(_quiet)


class RabbitMQSink:
    """An exchange and routing key on one AMQP connection and one channel
    with publisher confirms; confirm: `basic.ack` of each message."""

    def __init__(self, sink: Sink, timeout_s: float, dedup_window_s: int) -> None:
        del dedup_window_s  # RabbitMQ has no deduplication: consumers dedupe by message_id
        self.url: str = sink.option("url")
        self.exchange_name: str = sink.option("exchange") or ""  # "": the default exchange
        self.timeout_s = timeout_s
        # Scrubbed from every error text this sink returns (they are logged).
        self._secrets = url_passwords(self.url)
        self._connection: Any = None
        self._channel: Any = None
        self._exchange: Any = None

    async def publish(self, messages: Sequence[Message]) -> Published:
        if not messages:
            return Published(0)
        exchange = await self._open()
        confirmed = 0
        for message in messages:
            try:
                await exchange.publish(
                    _amqp_message(message),
                    message.destination,
                    mandatory=True,
                    timeout=self.timeout_s,
                )
            except aiormq.exceptions.DeliveryError as failure:  # a nack, or returned unroutable
                return Published(confirmed, self._text(failure))
            except aiormq.exceptions.ChannelClosed as failure:
                if self._connection_lost():
                    return await self._lost(confirmed, failure)
                # The broker closed the channel for this message (no such
                # exchange, no permission): a refusal; a new channel next call.
                self._channel = self._exchange = None
                return Published(confirmed, self._text(failure))
            except (
                aiormq.exceptions.AMQPConnectionError,  # closed: a restart, a lost socket
                aiormq.exceptions.ChannelInvalidStateError,  # its connection went away
                OSError,
                TimeoutError,  # no confirm in time: the connection is not trusted again
            ) as failure:
                return await self._lost(confirmed, failure)
            confirmed += 1
        return Published(confirmed)

    async def _lost(self, confirmed: int, failure: BaseException) -> Published:
        """The connection failed after `confirmed` messages of this call:
        those are kept (the relay moves past them), and the next call, on a
        new connection, says whether the broker is reachable; with none
        confirmed, it is not."""
        await self._reset()
        if confirmed:
            return Published(confirmed)
        raise Unreachable(self._text(failure)) from None

    async def _open(self) -> Any:
        """The exchange on an open channel, connecting first if need be."""
        if self._connection_lost():
            await self._reset()
            try:
                # `aio_pika.connect` in two steps, so that a connection whose
                # connect failed (a refused login...) is closed here rather
                # than left to the garbage collector's warning.
                self._connection = aio_pika.Connection(aio_pika.connection.make_url(self.url))
                await self._connection.connect(timeout=self.timeout_s)
            # ValueError: a URL the library cannot use (a port that is not a
            # number...): retried, and reported by the relay's warning.
            except (aiormq.exceptions.AMQPError, OSError, TimeoutError, ValueError) as failure:
                await self._reset()
                raise Unreachable(self._text(failure)) from None
        if self._channel is None or self._channel.is_closed or self._exchange is None:
            try:
                self._channel = await asyncio.wait_for(
                    self._connection.channel(publisher_confirms=True, on_return_raises=True),
                    self.timeout_s,
                )
                self._exchange = (
                    await self._channel.get_exchange(self.exchange_name, ensure=False)
                    if self.exchange_name
                    else self._channel.default_exchange
                )
            except (aiormq.exceptions.AMQPError, OSError, TimeoutError) as failure:
                await self._reset()
                raise Unreachable(self._text(failure)) from None
        return self._exchange

    def _connection_lost(self) -> bool:
        """No connection, or the broker closed it (aio-pika's own `is_closed`
        only says whether `close()` was called: look at aiormq's)."""
        connection = self._connection
        if connection is None or connection.is_closed or connection.transport is None:
            return True
        return bool(connection.transport.connection.is_closed)

    def _text(self, failure: BaseException) -> str:
        return scrubbed(f"{type(failure).__name__}: {failure}", self._secrets)[:1000]

    async def _reset(self) -> None:
        """Drop the connection: a late confirm must never be read as the
        next call's, and a broker that came back needs a new one anyway."""
        connection, self._connection = self._connection, None
        self._channel = self._exchange = None
        if connection is not None:
            # Already broken, perhaps: closing is best effort, and bounded.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), CLOSE_TIMEOUT_S)

    async def close(self) -> None:
        await self._reset()


def _amqp_message(message: Message) -> aio_pika.Message:
    return aio_pika.Message(
        message.body,
        content_type=CONTENT_TYPE,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=message.id,
        type=message.type,
        app_id=APP_ID,
        headers={
            SEQ_HEADER: message.seq,
            TENANT_HEADER: message.tenant,
            KEY_HEADER: message.key,
            SHARD_HEADER: message.shard,
        },
    )
