"""Broker sinks: how the leader's relay publishes a subscription's events to
a message broker (docs/relays.md). The relay loop is in node/webhooks.py
(`WebhookDelivery`, the relay of every sink); this module is what differs
per broker.

A sink publishes a run of messages in order on one connection and answers
how many of the first were confirmed (`Published`); it never publishes a
message before an earlier one is confirmed, so what reaches the broker first
is in seq order. Two kinds of failure:

- `Unreachable` (connection refused or lost, a timeout, a broker loading
  its data after a restart): the relay retries without end, with backoff,
  and never parks;
- a refusal (`Published.refused`, the broker's error answer for one
  message): counts as a failed attempt of that message; after
  `max_attempts` the relay parks it and goes on.

The client libraries are optional extras (node/sink_libraries.py) and are
imported only when a sink of their kind is opened.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol
from urllib.parse import unquote, urlsplit

import msgpack

from raftsched.core.events.sinks import NATS, RABBITMQ, REDIS, Sink
from raftsched.core.kernel.outbox import OutboxEvent, decode_data
from raftsched.core.kernel.state import State


class Unreachable(Exception):
    """The broker could not be reached: retried without end."""


@dataclass(frozen=True, slots=True)
class Message:
    """One event as a broker message (docs/relays.md, section 2)."""

    id: str
    type: str
    seq: int
    tenant: str
    key: str
    shard: int
    body: bytes  # the webhook's JSON envelope
    destination: str  # the stream (subject, routing key) with placeholders filled


@dataclass(frozen=True, slots=True)
class Published:
    """`confirmed`: how many of the messages, from the first, the broker
    confirmed; `refused`: the broker's error for the next one, if it refused it."""

    confirmed: int
    refused: str | None = None


class BrokerSink(Protocol):
    async def publish(self, messages: Sequence[Message]) -> Published:
        """Publish `messages` in order, stopping at the first refusal; raises
        `Unreachable` when the broker cannot be reached (some of them may
        have been stored: they are published again, and deduplicated where
        the broker can)."""
        ...

    async def close(self) -> None: ...


def url_passwords(url: str) -> tuple[str, ...]:
    """The passwords in `url` (or in each of a comma-separated list of URLs),
    as written and percent-decoded: what a sink keeps out of its error texts,
    which the relay logs."""
    found: set[str] = set()
    # The whole too: a single URL whose password holds a comma.
    for part in {url, *url.split(",")}:
        with contextlib.suppress(ValueError):
            password = urlsplit(part.strip()).password
            if password:
                found |= {password, unquote(password)}
    return tuple(sorted(found))


def scrubbed(text: str, secrets: Sequence[str]) -> str:
    """`text` with each of `secrets` replaced by `***`."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def destination(template: str, event_type: str, tenant: str, shard: int) -> str:
    """A stream, subject or routing key with `{type}`, `{tenant}` and `{shard}` filled."""
    return (
        template.replace("{type}", event_type)
        .replace("{tenant}", tenant or "_")
        .replace("{shard}", str(shard))
    )


def event_key(state: State, event: OutboxEvent, key_field: str | None) -> tuple[str, str]:
    """(tenant, key) of `event`: the key is the named payload field of the
    event's job where it has one, else the job's idempotency key, else its
    workflow id, else its job id (docs/relays.md, section 2). Read from the
    leader's state: a job already removed by retention falls back to the
    event's own data (workflow id, job id)."""
    data = decode_data(event)
    tenant = str(data.get("tenant") or "")
    job_id = data.get("job_id")
    job = state.jobs.get(job_id) if isinstance(job_id, str) else None
    if job is not None:
        if key_field is not None:
            found = _payload_field(job.payload, key_field)
            if found is not None:
                return tenant, found
        for candidate in (job.idempotency_key, job.workflow_id, job.id):
            if candidate:
                return tenant, str(candidate)
    for name in ("workflow_id", "job_id", "schedule_id"):
        value = data.get(name)
        if value:
            return tenant, str(value)
    return tenant, ""


def _payload_field(payload: bytes | None, name: str) -> str | None:
    if not payload:
        return None
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception:
        return None
    if not isinstance(value, dict):
        return None
    found = value.get(name)
    if found is None or isinstance(found, (dict, list)):
        return None
    return found if isinstance(found, str) else json.dumps(found)


def open_sink(sink: Sink, timeout_s: float, dedup_window_s: int) -> BrokerSink:
    if sink.kind == REDIS:
        return RedisStreamSink(sink, timeout_s, dedup_window_s)
    if sink.kind == NATS:
        from raftsched.node.sink_nats import JetStreamSink  # the `nats` extra

        return JetStreamSink(sink, timeout_s, dedup_window_s)
    if sink.kind == RABBITMQ:
        from raftsched.node.sink_rabbitmq import RabbitMQSink  # the `rabbitmq` extra

        return RabbitMQSink(sink, timeout_s, dedup_window_s)
    raise ValueError(f"no relay for {sink.kind} sinks")


# -- Redis Streams -------------------------------------------------------------------

# One call publishes a run of messages in order, each at most once within the
# dedup window: a message whose `<stream>:dedup:<event id>` key exists is
# answered with the entry id stored there; else XADD, then that key is set
# to the new entry's id with the window as its expiry. Scripts run atomically,
# so the check and the write are one step (as SET NX and XADD would be). It
# stops at the first error answer (a key of the wrong type, out of memory...),
# so nothing after a refused message is stored before it.
# KEYS: per message, its stream then its dedup key.
# ARGV: the window (s), maxlen (0: none), then per message id, type, seq,
# tenant, key, shard, data.
_PUBLISH_LUA: Final = """
local ids = {}
local window = tonumber(ARGV[1])
local maxlen = tonumber(ARGV[2])
for i = 1, #KEYS / 2 do
  local stream, dedup = KEYS[2 * i - 1], KEYS[2 * i]
  local b = 2 + (i - 1) * 7
  local seen = redis.pcall('GET', dedup)
  if type(seen) == 'table' and seen.err then
    return {ids, seen.err}
  end
  if seen then
    ids[i] = seen
  else
    local fields = {'id', ARGV[b + 1], 'type', ARGV[b + 2], 'seq', ARGV[b + 3],
      'tenant', ARGV[b + 4], 'key', ARGV[b + 5], 'shard', ARGV[b + 6], 'data', ARGV[b + 7]}
    local added
    if maxlen > 0 then
      added = redis.pcall('XADD', stream, 'MAXLEN', '~', maxlen, '*', unpack(fields))
    else
      added = redis.pcall('XADD', stream, '*', unpack(fields))
    end
    if type(added) == 'table' and added.err then
      return {ids, added.err}
    end
    local stored = redis.pcall('SET', dedup, added, 'EX', window)
    if type(stored) == 'table' and stored.err then
      return {ids, stored.err}
    end
    ids[i] = added
  end
end
return {ids, ''}
"""


class RedisStreamSink:
    """A Redis stream (`XADD`), on one connection, deduplicated by event id
    within `dedup_window_s`; confirm: the entry id the script answers."""

    def __init__(self, sink: Sink, timeout_s: float, dedup_window_s: int) -> None:
        import redis.asyncio as redis_asyncio  # the `redis` extra
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self._errors = _redis_errors()
        self.stream: str = sink.option("stream")
        self.maxlen: int = sink.option("maxlen") or 0
        self.window_s = dedup_window_s
        # One connection, and no retries of the library's own: the relay
        # retries, from the first unconfirmed message.
        self._client: Any = redis_asyncio.Redis.from_url(
            sink.option("url"),
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            single_connection_client=True,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
        )
        self._script: Any = self._client.register_script(_PUBLISH_LUA)

    async def publish(self, messages: Sequence[Message]) -> Published:
        if not messages:
            return Published(0)
        keys: list[str] = []
        args: list[str | int | bytes] = [self.window_s, self.maxlen]
        for message in messages:
            keys += [message.destination, f"{message.destination}:dedup:{message.id}"]
            args += [
                message.id,
                message.type,
                message.seq,
                message.tenant,
                message.key,
                message.shard,
                message.body,
            ]
        unreachable, refused = self._errors
        try:
            answer = await self._script(keys=keys, args=args)
        except unreachable as failure:
            await self._reset()
            raise Unreachable(f"{type(failure).__name__}: {failure}") from None
        except refused as failure:  # an error answer to the whole script
            return Published(0, f"{type(failure).__name__}: {failure}"[:1000])
        ids, refusal = answer
        confirmed = len(ids)
        text = refusal.decode(errors="replace") if isinstance(refusal, bytes) else str(refusal)
        return Published(confirmed, text[:1000] or None)

    async def _reset(self) -> None:
        """Drop the connection after a failure: the next call opens a new one
        (a half-read answer must never be read as the next call's)."""
        # Already broken, perhaps: a new one is made on the next call.
        with contextlib.suppress(Exception):
            await self._client.connection.disconnect()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._client.aclose()


def _redis_errors() -> tuple[tuple[type[BaseException], ...], type[BaseException]]:
    """(what means unreachable, what is the broker's refusal)."""
    from redis import exceptions

    unreachable = (
        exceptions.ConnectionError,  # also BusyLoadingError: loading after a restart
        exceptions.TimeoutError,
        OSError,
        TimeoutError,
    )
    return unreachable, exceptions.ResponseError
