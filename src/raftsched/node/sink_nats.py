"""The NATS JetStream sink (docs/relays.md): each message a JetStream publish
on one connection, waited for its PubAck before the next is sent, so what a
stream stores first is in seq order and nothing after a refused message is
sent before it. The `nats` extra (nats-py).

The event id is the `Nats-Msg-Id` header: a stream drops a message whose id
it saw within its own duplicate window (the stream's `duplicate_window`,
2 minutes unless its creator chose otherwise; the relay cannot set it, so
`dedup_window_s` is not used) and answers with a PubAck flagged `duplicate`,
a confirm like any other. Those are counted (`duplicates_dropped`) and
logged at info level.

What is a refusal (counted toward the relay's `max_attempts`, then parked)
and what is unreachable (retried without end, never parked):

- An error answer to the publish (a full stream with `discard new`, a
  message larger than the stream allows, a wrong expected sequence...) is
  a refusal, except "JetStream system temporarily unavailable" and the
  other answers of a clustered JetStream without a leader
  (`_UNAVAILABLE_ERR_CODES`), which are unreachable.
- No responders: nothing answered the publish while the connection was up.
  That is a subject no stream captures, or a JetStream that is not there
  (starting, stopping, not enabled) or a stream without a leader yet. The
  sink tells them apart by asking JetStream's API which stream captures the
  subject (`$JS.API.STREAM.NAMES` with the subject as filter): an answer
  naming no stream is a refusal; an answer naming one (it exists but did not
  answer), an error answer, no answer or no responders to the API itself
  are unreachable. Only JetStream's own word that no stream takes the
  subject parks an event.
- A subject that is not a literal NATS subject (whitespace, an empty
  token, a `*` or `>` token: a placeholder filled with such a value), a
  message over the server's `max_payload`, and a reply that is not a
  PubAck are refusals: sending again would not help.
- No connection, a connection lost (the sink learns it from the client's
  disconnect callback and does not wait out the timeout), a timeout: unreachable.

nats-py's own recovery is off: no reconnect (`allow_reconnect=False`; a
reconnecting client buffers publishes, and a request sent into that buffer
can only time out), so a lost connection closes the client and the next
publish opens a new one; at most two attempts per server to connect, each
bounded by the timeout, and every wait bounded. After a timeout the
connection is closed too: one that stopped answering is not trusted again.
The URL (one or several comma-separated servers of one cluster) holds the
password: only its redacted form is ever put in an error or a log line,
and the client's own error callback (which would log each at error level)
only keeps the last error's type.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
from collections.abc import Awaitable, Sequence
from typing import Final, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js.client import JetStreamContext

from raftsched.core.events.sinks import Sink, redacted_url
from raftsched.node.sinks import Message, Published, Unreachable, scrubbed, url_passwords

log = logging.getLogger(__name__)

T = TypeVar("T")

MSG_ID_HEADER: Final = "Nats-Msg-Id"
HEADER_PREFIX: Final = "Raftsched-"
_STREAM_NAMES: Final = "$JS.API.STREAM.NAMES"
# JetStream errors that say the system (or a clustered stream) has no leader
# for now, not that this message is refused: "JetStream system temporarily
# unavailable", "JetStream cluster can not handle request", "JetStream
# cluster not assigned to this server", "stream is offline" (and with its reason).
_UNAVAILABLE_ERR_CODES: Final = frozenset({10007, 10008, 10009, 10118, 10194})
_BAD_SUBJECT_CHARS: Final = re.compile(r"[\s\x00-\x1f\x7f]")
# Transport-level failures: the connection is closed and the message is
# published again on a new one.
_UNREACHABLE: Final[tuple[type[BaseException], ...]] = (
    nats.errors.TimeoutError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.FlushTimeoutError,
    TimeoutError,
    OSError,
)


class _Lost(Exception):
    """The wait for an answer ended without one: lost connection or time."""


# What a publish or a connect retries (`Unreachable`): the above, a lost wait,
# and any other client error (never parked on a guess).
_RETRIED: Final[tuple[type[BaseException], ...]] = (_Lost, nats.errors.Error, *_UNREACHABLE)


class JetStreamSink:
    """A JetStream subject, on one connection, deduplicated by event id
    within the stream's duplicate window; confirm: the PubAck."""

    def __init__(self, sink: Sink, timeout_s: float, dedup_window_s: int) -> None:
        url = str(sink.option("url"))
        self.servers = [part.strip() for part in url.split(",") if part.strip()]
        self.shown = redacted_url(url)
        self.timeout_s = timeout_s
        del dedup_window_s  # the stream's duplicate_window decides (module doc)
        self.duplicates_dropped = 0  # PubAcks flagged `duplicate`, since this sink opened
        self._secrets = url_passwords(url)
        self._client: NatsClient | None = None
        self._js: JetStreamContext | None = None
        self._lost = asyncio.Event()
        self._last_error = ""

    async def publish(self, messages: Sequence[Message]) -> Published:
        """Each message published and confirmed before the next. A failure to
        reach the broker after some were confirmed answers those (the relay
        then calls again, and learns it cannot reach the broker from that call)."""
        if not messages:
            return Published(0)
        js = await self._connect()
        confirmed = repeats = 0
        try:
            for message in messages:
                try:
                    refused, repeat = await self._publish_one(js, message)
                except Unreachable:
                    await self._reset()
                    if confirmed:
                        return Published(confirmed)
                    raise
                if refused is not None:
                    return Published(confirmed, refused[:1000])
                confirmed += 1
                repeats += repeat
            return Published(confirmed)
        finally:
            if repeats:
                self.duplicates_dropped += repeats
                log.info(
                    "relay: JetStream dropped repeated messages (ids within the "
                    "stream's duplicate window)",
                    extra={"repeats": repeats, "subject": messages[0].destination},
                )

    async def close(self) -> None:
        await self._reset()

    # -- one message ----------------------------------------------------------------

    async def _publish_one(self, js: JetStreamContext, message: Message) -> tuple[str | None, bool]:
        """(None, whether JetStream took it as a duplicate) once confirmed, else
        (the refusal, False); raises `Unreachable`."""
        subject = message.destination
        bad = _not_literal(subject)
        if bad is not None:
            return f"not a literal NATS subject ({bad}): {subject!r}", False
        headers = {
            MSG_ID_HEADER: message.id,
            f"{HEADER_PREFIX}Type": message.type,
            f"{HEADER_PREFIX}Seq": str(message.seq),
            f"{HEADER_PREFIX}Tenant": message.tenant,
            f"{HEADER_PREFIX}Key": message.key,
            f"{HEADER_PREFIX}Shard": str(message.shard),
        }
        try:
            ack = await self._bounded(
                js.publish(subject, message.body, timeout=self.timeout_s, headers=headers)
            )
        except (nats.js.errors.NoStreamResponseError, nats.errors.NoRespondersError):
            return await self._no_responders(subject), False
        except nats.js.errors.APIError as error:
            if error.err_code in _UNAVAILABLE_ERR_CODES:
                raise Unreachable(f"JetStream at {self.shown}: {error}") from None
            return f"JetStream refused {message.id}: {error}", False
        except nats.errors.MaxPayloadError:
            return f"{message.id} is larger than the server's max_payload", False
        except (nats.errors.BadSubjectError, nats.errors.BadHeaderError) as error:
            return f"{message.id} cannot be published: {type(error).__name__}", False
        except (ValueError, TypeError, KeyError) as error:  # not a PubAck (JSON, fields)
            return f"the answer to {message.id} is not a PubAck: {type(error).__name__}", False
        except _RETRIED as failure:
            raise Unreachable(self._describe(failure)) from None
        return None, bool(ack.duplicate)

    async def _no_responders(self, subject: str) -> str:
        """Nothing answered a publish to `subject` while connected: a refusal
        if JetStream's API says no stream captures it; raises `Unreachable`
        otherwise (module doc)."""
        client = self._client
        if client is None or not client.is_connected:
            raise Unreachable(self._describe(_Lost("connection lost")))
        query = json.dumps({"subject": subject}).encode()
        try:
            reply = await self._bounded(
                client.request(_STREAM_NAMES, query, timeout=self.timeout_s)
            )
        except nats.errors.NoRespondersError:
            raise Unreachable(
                f"JetStream at {self.shown} is not answering (starting, stopping or not enabled)"
            ) from None
        except _RETRIED as failure:
            raise Unreachable(self._describe(failure)) from None
        try:
            answer = json.loads(reply.data)
        except ValueError:
            raise Unreachable(f"JetStream at {self.shown}: its API answered non-JSON") from None
        if not isinstance(answer, dict) or "error" in answer:
            error = answer.get("error") if isinstance(answer, dict) else answer
            raise Unreachable(f"JetStream at {self.shown} could not list streams: {error}")
        streams = answer.get("streams") or []
        if not streams:
            return f"no JetStream stream captures subject {subject!r}"
        raise Unreachable(
            f"stream {streams[0]} captures {subject!r} but did not answer "
            "(starting, or without a leader)"
        )

    # -- the connection -------------------------------------------------------------

    async def _connect(self) -> JetStreamContext:
        if self._client is not None and self._js is not None and self._client.is_connected:
            return self._js
        await self._reset()
        self._last_error = ""
        lost = asyncio.Event()

        async def disconnected() -> None:
            lost.set()

        async def error(failure: Exception) -> None:
            # Instead of nats-py's default, which logs every one at error level.
            self._last_error = type(failure).__name__

        client = NatsClient()
        # A bound on top of the client's own (two tries per server, each
        # bounded by connect_timeout, then the handshake).
        connect_s = max(1, math.ceil(self.timeout_s))
        bound_s = connect_s * (2 * len(self.servers) + 2)
        try:
            await asyncio.wait_for(
                client.connect(
                    servers=self.servers,
                    name="raftsched-relay",
                    error_cb=error,
                    disconnected_cb=disconnected,
                    closed_cb=disconnected,
                    allow_reconnect=False,
                    max_reconnect_attempts=1,
                    reconnect_time_wait=0,
                    connect_timeout=connect_s,
                    flush_timeout=self.timeout_s,
                ),
                bound_s,
            )
        except _RETRIED as failure:
            await _close_quietly(client, self.timeout_s)
            raise Unreachable(f"cannot connect: {self._describe(failure)}") from None
        self._client, self._lost = client, lost
        self._js = client.jetstream(timeout=self.timeout_s)
        return self._js

    async def _bounded(self, work: Awaitable[T]) -> T:
        """`work`'s result, or `_Lost` once the connection is lost or twice the
        timeout passed (the client's own timeouts should come first)."""
        task = asyncio.ensure_future(work)
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            await asyncio.wait(
                (task, lost), timeout=2 * self.timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            lost.cancel()
            if not task.done():
                task.cancel()
        if task.done() and not task.cancelled():
            return task.result()
        raise _Lost("connection lost" if self._lost.is_set() else "timed out")

    async def _reset(self) -> None:
        """Close the connection (after a failure, or at the end): the next
        publish opens a new one."""
        client, self._client, self._js = self._client, None, None
        if client is not None:
            await _close_quietly(client, self.timeout_s)

    def _describe(self, failure: BaseException) -> str:
        text = f"{type(failure).__name__}: {failure}".rstrip(": ")
        if self._last_error and self._last_error not in text:
            text += f" (last client error: {self._last_error})"
        return f"{self.shown}: {scrubbed(text, self._secrets)}"[:1000]


async def _close_quietly(client: NatsClient, timeout_s: float) -> None:
    # Already closed or broken, perhaps: nothing more to do about it.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.close(), timeout_s)


def _not_literal(subject: str) -> str | None:
    """Why `subject` is not one a message can be published to, or None."""
    if not subject:
        return "empty"
    if _BAD_SUBJECT_CHARS.search(subject):
        return "whitespace or a control character"
    for token in subject.split("."):
        if not token:
            return "an empty token"
        if token in ("*", ">"):
            return "a wildcard"
    return None
