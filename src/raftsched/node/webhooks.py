"""The relay: the leader sends outbox events to subscribers, at least once.

A subscription without a sink is a webhook, delivered as below; one with a
broker sink (docs/relays.md) is published by `_relay` through the sink's
client (node/sinks.py), with the same cursor, parking and operator retry.

Theory of operation. While this node leads, one task per subscription reads
the replicated state and delivers every matching event after the
subscription's cursor. Each delivery is a POST of the event as JSON, signed
with HMAC-SHA256 of the exact body bytes under the subscription's secret
(`Raftsched-Signature: sha256=<hex>`), with `Raftsched-Event-Id` for
deduplication. A target the node's policy refuses (node/webhook_targets.py: loopback,
metadata, private addresses...) is never connected to: its name is resolved,
checked, and the checked address is the one connected to; a refusal counts as
a failed attempt whose error starts with `refused:`, so it ends parked with
that reason. A non-2xx answer, a timeout or a connection error is retried
with exponential backoff and full jitter; after `max_attempts` the event is
parked (`ParkDelivery`, replicated) and delivery moves on.

Progress is replicated: once every event of a batch was delivered or parked,
the leader proposes `AckDelivery(through_seq)`, one command per batch. A new
leader starts from the replicated cursor, so an event whose delivery was not
yet acknowledged when the old leader died is delivered again: receivers
deduplicate by event id. Parked events that an operator marked for retry
are delivered the same way and removed with `AckParked` when they arrive.

Broker sinks. The relay publishes a batch of events after the cursor in
seq order on one connection, stopping at the first message the broker
refuses, and proposes `AckDelivery(through_seq)` only once every event of
the batch was confirmed (or parked). On a failure it goes back to the first
unconfirmed event and publishes from there again (go-back-N), so no event
is first published after a later one. A broker it cannot reach is retried
with backoff without end and never parks anything; a refusal counts as a
failed attempt, and after `max_attempts` refusals the event is parked.

Tunables come from the environment (tests shorten them):
RAFTSCHED_WEBHOOK_MAX_ATTEMPTS (8), RAFTSCHED_WEBHOOK_BACKOFF_S (0.5, doubled
per attempt up to RAFTSCHED_WEBHOOK_BACKOFF_MAX_S, 30) and
RAFTSCHED_WEBHOOK_TIMEOUT_S (10), for brokers too; and
RAFTSCHED_RELAY_DEDUP_WINDOW_S (3600), how long a Redis sink remembers an
event id to drop its repeats.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from raftsched import shards
from raftsched.core.events.commands import AckDelivery, AckParked, ParkDelivery
from raftsched.core.events.sinks import Sink
from raftsched.core.events.subscriptions import Subscription, pending_events, subscriptions
from raftsched.core.kernel import outbox
from raftsched.core.kernel.commands import Command
from raftsched.core.kernel.outbox import OutboxEvent, decode_data
from raftsched.node import metrics as families
from raftsched.node.metrics import Samples
from raftsched.node.proposer import NotCommitted, NotLeader, OutcomeUnknown
from raftsched.node.relay_status import WEBHOOK, RelayStatus, lag_s, sink_kind
from raftsched.node.sink_libraries import missing_extra
from raftsched.node.sinks import BrokerSink, Message, Unreachable, destination, event_key, open_sink
from raftsched.node.view import StateView
from raftsched.node.webhook_targets import CheckingResolver, ForbiddenTarget, TargetPolicy
from raftsched.timefmt import format_ms

log = logging.getLogger("raftsched.webhooks")

BATCH_EVENTS_MAX = 64
IN_FLIGHT_MAX = 8
IDLE_WAIT_S = 1.0
UNAVAILABLE_WAIT_S = 30.0
SIGNATURE_HEADER = "Raftsched-Signature"
EVENT_ID_HEADER = "Raftsched-Event-Id"
# How a delivery error that was never sent begins (a parked event's `error`).
REFUSED = "refused: not an allowed webhook target"


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True, slots=True)
class DeliverySettings:
    max_attempts: int = field(
        default_factory=lambda: int(_env_float("RAFTSCHED_WEBHOOK_MAX_ATTEMPTS", 8))
    )
    backoff_s: float = field(default_factory=lambda: _env_float("RAFTSCHED_WEBHOOK_BACKOFF_S", 0.5))
    backoff_max_s: float = field(
        default_factory=lambda: _env_float("RAFTSCHED_WEBHOOK_BACKOFF_MAX_S", 30.0)
    )
    timeout_s: float = field(
        default_factory=lambda: _env_float("RAFTSCHED_WEBHOOK_TIMEOUT_S", 10.0)
    )
    dedup_window_s: int = field(
        default_factory=lambda: int(_env_float("RAFTSCHED_RELAY_DEDUP_WINDOW_S", 3600))
    )


def event_id(event: OutboxEvent, shard: int = 0) -> str:
    """The delivery's id of `event` of shard `shard`'s outbox (shards.event_id)."""
    return shards.event_id(shard, event.seq)


def event_body(event: OutboxEvent, subscription_id: str, shard: int | None = None) -> bytes:
    """The delivery's JSON; `shard` (None in a one-shard cluster, whose
    envelope stays as it was) names the shard whose outbox holds the event."""
    envelope: dict[str, Any] = {
        "id": event_id(event, shard or 0),
        "seq": event.seq,
        "type": event.type,
        "at": format_ms(event.at_ms),
        "subscription_id": subscription_id,
        "data": decode_data(event),
    }
    if shard is not None:
        envelope["shard"] = shard
    return json.dumps(envelope, separators=(",", ":"), sort_keys=True).encode()


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class _Target:
    id: str
    url: str
    secret: str
    sink: Sink | None = None  # None: a webhook
    key_field: str | None = None


class WebhookDelivery:
    """Runs while this node leads: a leader duty of the node (`Node.add_leader_duty`)."""

    def __init__(
        self,
        node: StateView,
        settings: DeliverySettings | None = None,
        *,
        policy: TargetPolicy | None = None,
        shard: int | None = None,
    ) -> None:
        self.node = node
        self.settings = settings or DeliverySettings()
        self.policy = policy or TargetPolicy()
        # The shard whose outbox this node's group holds; None: one shard.
        self.shard = shard
        self._task: asyncio.Task[None] | None = None
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._targets: dict[str, _Target] = {}
        self._unavailable: set[str] = set()  # told once: no client library
        self._session: aiohttp.ClientSession | None = None
        self.metrics = node.metrics
        self.status = RelayStatus(node)  # raftsched_sink_*, the views' connection state
        node.metrics.sample(families.OUTBOX_DEPTH, self._m_depth)
        node.metrics.sample(families.WEBHOOK_OLDEST_AGE, self._m_oldest)

    # -- leadership -----------------------------------------------------------

    def start(self, term: int) -> None:
        self.stop()
        # Called on the node's event loop (its leadership changes run there).
        self._task = asyncio.create_task(self._supervise(term))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for task in self._workers.values():
            task.cancel()
        self._workers = {}
        self.status.forget()

    async def close(self) -> None:
        self.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _supervise(self, term: int) -> None:
        """Keep one worker per subscription while leading in `term`."""
        try:
            while self.node.is_leader:
                changed = self.node.changed()
                with self.node.reading() as state:
                    wanted = {
                        sub.id: _Target(sub.id, sub.url, sub.secret, sub.sink, sub.key_field)
                        for sub in subscriptions(state).values()
                    }
                for sub_id in list(self._workers):
                    if sub_id not in wanted:
                        self.status.forget(sub_id)
                    if sub_id not in wanted or self._workers[sub_id].done():
                        self._workers.pop(sub_id).cancel()
                    elif self._targets.get(sub_id) != wanted[sub_id]:
                        self._workers.pop(sub_id).cancel()  # recreated differently
                for sub_id, target in wanted.items():
                    if sub_id not in self._workers:
                        self._targets[sub_id] = target
                        self._workers[sub_id] = asyncio.create_task(self._serve(target))
                await changed.wait_s(IDLE_WAIT_S)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("webhook supervisor failed")
        finally:
            for task in self._workers.values():
                task.cancel()
            self._workers = {}

    # -- one subscription -----------------------------------------------------

    async def _serve(self, target: _Target) -> None:
        """Send the subscription's events, and its parked events an operator
        retries, until it is deleted or this node stops leading. One loop for
        every sink: what differs (a POST per event, in parallel; a broker's
        ordered publish) is the channel's."""
        channel = self._open(target)
        if channel is None:
            await asyncio.sleep(UNAVAILABLE_WAIT_S)
            return  # the supervisor looks again
        try:
            while True:
                changed = self.node.changed()
                work = self._next_work(target.id)
                if work is None:
                    return  # deleted
                events, through_seq, retries = work
                for event in retries:
                    await self.node.propose(await channel.retry_parked(event), bounded=False)
                if events or through_seq is not None:
                    for command in await channel.deliver(events):
                        await self.node.propose(command, bounded=False)
                    if through_seq is not None:
                        await self.node.propose(AckDelivery(target.id, through_seq), bounded=False)
                    continue
                if not retries:
                    await changed.wait_s(IDLE_WAIT_S)
        except asyncio.CancelledError:
            raise
        except (NotLeader, NotCommitted, OutcomeUnknown) as error:
            # Leadership lost (or the entry not committed) between a delivery
            # and its acknowledgement: an expected turn of events, not a
            # failure. The replicated cursor did not move (or moved without
            # our knowing), so this leader's restarted worker, or the next
            # leader, sends those events again: at least once.
            log.warning(
                f"{channel.noun} progress not recorded; its events will be {channel.sent} again",
                extra={"subscription": target.id, "error": repr(error)},
            )
            await asyncio.sleep(IDLE_WAIT_S)  # the supervisor restarts this worker
        except Exception:
            log.exception(channel.failed, extra={"subscription": target.id})
            await asyncio.sleep(IDLE_WAIT_S)  # the supervisor restarts this worker
        finally:
            await channel.close()

    def _open(self, target: _Target) -> _Channel | None:
        """The subscription's channel; None for a broker whose client library
        this node lacks (nothing is parked: the events wait for a node that
        has it)."""
        if target.sink is None:
            return _WebhookChannel(self, target)
        extra = missing_extra(target.sink.kind)
        if extra is None:
            sink = open_sink(target.sink, self.settings.timeout_s, self.settings.dedup_window_s)
            return _BrokerChannel(self, target, sink)
        self.status.attempted(target.id, False)  # it cannot reach the broker at all
        if target.id not in self._unavailable:
            self._unavailable.add(target.id)
            log.error(
                "relay cannot publish: this node lacks the sink's client library",
                extra={"subscription": target.id, "extra": f"raftsched[{extra}]"},
            )
        return None

    def _next_work(
        self, sub_id: str
    ) -> tuple[list[OutboxEvent], int | None, list[OutboxEvent]] | None:
        """(events to deliver, cursor to ack after them, parked events to retry)."""
        with self.node.reading() as state:
            sub: Subscription | None = subscriptions(state).get(sub_id)
            if sub is None:
                return None
            events = pending_events(state, sub, BATCH_EVENTS_MAX)
            newest = outbox.last_seq(state)
            retries = [item.event for item in sub.parked.values() if item.retry]
            if len(events) == BATCH_EVENTS_MAX:
                through_seq: int | None = events[-1].seq
            else:
                # Everything up to the newest event was looked at; events of
                # other types are passed over, so the cursor moves past them.
                through_seq = newest if newest > sub.cursor else None
            return events, through_seq, retries

    async def _deliver(
        self,
        target: _Target,
        event: OutboxEvent,
        on_success: Command | None,
    ) -> Command | None:
        """POST until a 2xx or `max_attempts`; the command to propose after."""
        body = event_body(event, target.id, self.shard)
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(target.secret, body),
            EVENT_ID_HEADER: event_id(event, self.shard or 0),
        }
        settings = self.settings
        error = ""
        for attempt in range(settings.max_attempts):
            if attempt:
                cap_s = min(settings.backoff_max_s, settings.backoff_s * 2 ** (attempt - 1))
                # Jittered. Local retry timing, never proposed: not one of the
                # node's draws (node/draws.py), which are what commands carry.
                await asyncio.sleep(random.uniform(cap_s / 2, cap_s))
            self.metrics.webhook_attempts.labels(target.id).inc()
            error = await self._post(target.url, body, headers)
            self.status.attempted(target.id, reached_receiver(error))
            if not error:
                self.status.published(target.id, WEBHOOK)
                return on_success
            self.metrics.webhook_failures.labels(target.id).inc()
            if attempt + 1 < settings.max_attempts:
                self.status.retried(target.id, WEBHOOK)
        self.metrics.webhook_parked.labels(target.id).inc()
        self.status.parked(target.id, WEBHOOK)
        log.warning(
            "webhook event parked",
            extra={"subscription": target.id, "seq": event.seq, "error": error},
        )
        return ParkDelivery(target.id, event.seq, settings.max_attempts, error[:1000])

    async def _post(self, url: str, body: bytes, headers: dict[str, str]) -> str:
        """'' on a 2xx answer, else what went wrong."""
        if self._session is None:
            self._session = checked_session(self.policy)
        return await post_once(self._session, self.policy, url, body, headers, self.settings)

    # -- one broker sink's subscription ------------------------------------------

    def _messages(self, target: _Target, events: list[OutboxEvent]) -> list[Message]:
        """`events` as broker messages: their keys are read from the state."""
        assert target.sink is not None
        template = target.sink.destination
        shard = self.shard or 0
        with self.node.reading() as state:

            def message(event: OutboxEvent) -> Message:
                tenant, key = event_key(state, event, target.key_field)
                return Message(
                    id=event_id(event, shard),
                    type=event.type,
                    seq=event.seq,
                    tenant=tenant,
                    key=key,
                    shard=shard,
                    body=event_body(event, target.id, self.shard),
                    destination=destination(template, event.type, tenant, shard),
                )

            return [message(event) for event in events]

    async def _publish_batch(
        self, target: _Target, sink: BrokerSink, messages: list[Message]
    ) -> list[Command]:
        """Publish every message in order, going back to the first unconfirmed
        one on a failure; the parks to propose (before the batch's ack)."""
        settings = self.settings
        kind = sink_kind(target.sink)
        parks: list[Command] = []
        start, refusals, outages = 0, 0, 0
        while start < len(messages):
            try:
                answer = await sink.publish(messages[start:])
            except Unreachable as error:
                self.status.attempted(target.id, False)
                self.status.retried(target.id, kind)
                outages += 1
                if outages == 1 or outages % 20 == 0:
                    log.warning(
                        "relay cannot reach its broker; retrying",
                        extra={"subscription": target.id, "error": str(error)},
                    )
                await self._back_off(outages)
                continue
            outages = 0
            self.status.attempted(target.id, True)
            if answer.confirmed:
                self.metrics.webhook_attempts.labels(target.id).inc(answer.confirmed)
                self.status.published(target.id, kind, answer.confirmed)
                start += answer.confirmed
                refusals = 0
            if answer.refused is None or start >= len(messages):
                continue
            refusals += 1
            self.metrics.webhook_failures.labels(target.id).inc()
            if refusals < settings.max_attempts:
                self.status.retried(target.id, kind)
                await self._back_off(refusals)
                continue
            refused = messages[start]
            self.metrics.webhook_parked.labels(target.id).inc()
            self.status.parked(target.id, kind)
            log.warning(
                "relay event parked",
                extra={"subscription": target.id, "seq": refused.seq, "error": answer.refused},
            )
            parks.append(
                ParkDelivery(target.id, refused.seq, settings.max_attempts, answer.refused[:1000])
            )
            start, refusals = start + 1, 0
        return parks

    async def _back_off(self, attempt: int) -> None:
        settings = self.settings
        cap_s = min(settings.backoff_max_s, settings.backoff_s * 2 ** min(attempt - 1, 30))
        # Local retry timing, never proposed (not one of node/draws.py's).
        await asyncio.sleep(random.uniform(cap_s / 2, cap_s))

    # -- metrics --------------------------------------------------------------

    def _m_depth(self) -> Samples:
        with self.node.reading() as state:
            return [((), float(len(outbox.outbox(state))))]

    def _m_oldest(self) -> Samples:
        samples: list[tuple[tuple[str, ...], float]] = []
        with self.node.reading() as state:
            for sub in subscriptions(state).values():
                # By replicated time, as this gauge always was (the sink
                # gauge's lag is by the leader's clock: relay_status).
                samples.append(((sub.id,), lag_s(state, sub, state.now_ms)))
        return samples


class _Channel(Protocol):
    """How one subscription's events leave this node."""

    noun: str  # what the log calls it
    sent: str  # what happens to its events again after a lost ack
    failed: str  # the log's line for an unexpected failure

    async def deliver(self, events: list[OutboxEvent]) -> list[Command]:
        """Send `events`; the parks to propose before the batch's ack."""
        ...

    async def retry_parked(self, event: OutboxEvent) -> Command:
        """Send a parked event an operator retries: `AckParked`, or parked again."""
        ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class _WebhookChannel:
    """A POST per event, up to IN_FLIGHT_MAX at once, each retried alone."""

    relay: WebhookDelivery
    target: _Target
    noun: str = "webhook"
    sent: str = "delivered"
    failed: str = "webhook delivery failed"

    async def deliver(self, events: list[OutboxEvent]) -> list[Command]:
        gate = asyncio.Semaphore(IN_FLIGHT_MAX)

        async def one(event: OutboxEvent) -> Command | None:
            async with gate:
                return await self.relay._deliver(self.target, event, None)

        return [cmd for cmd in await asyncio.gather(*(one(e) for e in events)) if cmd]

    async def retry_parked(self, event: OutboxEvent) -> Command:
        on_success = AckParked(self.target.id, event.seq)
        return await self.relay._deliver(self.target, event, on_success) or on_success

    async def close(self) -> None:
        """The session is the deliverer's, shared by every webhook."""


@dataclass(slots=True)
class _BrokerChannel:
    """A broker's ordered publish on one connection (docs/relays.md)."""

    relay: WebhookDelivery
    target: _Target
    sink: BrokerSink
    noun: str = "relay"
    sent: str = "published"
    failed: str = "relay failed"

    async def deliver(self, events: list[OutboxEvent]) -> list[Command]:
        messages = self.relay._messages(self.target, events)
        return await self.relay._publish_batch(self.target, self.sink, messages)

    async def retry_parked(self, event: OutboxEvent) -> Command:
        parks = await self.deliver([event])
        return parks[0] if parks else AckParked(self.target.id, event.seq)

    async def close(self) -> None:
        await self.sink.close()


async def post_once(
    session: aiohttp.ClientSession,
    policy: TargetPolicy,
    url: str,
    body: bytes,
    headers: dict[str, str],
    settings: DeliverySettings,
) -> str:
    """One delivery attempt: '' on a 2xx answer, else what went wrong.
    `session` must come from `checked_session(policy)`."""
    refused = policy.refusal_for_url(url)  # literals: no resolver runs for them
    if refused is not None:
        return f"{REFUSED}: {refused}"
    timeout = aiohttp.ClientTimeout(total=settings.timeout_s)
    try:
        async with session.post(
            url, data=body, headers=headers, timeout=timeout, allow_redirects=False
        ) as response:
            await response.read()
            if 200 <= response.status < 300:
                return ""
            return f"HTTP {response.status}"
    except TimeoutError:
        return "timeout"
    except aiohttp.ClientConnectorError as failure:
        if isinstance(failure.os_error, ForbiddenTarget):
            return f"{REFUSED}: {failure.os_error}"
        return f"{type(failure).__name__}: {failure}"[:1000]
    except aiohttp.ClientError as failure:
        return f"{type(failure).__name__}: {failure}"[:1000]


def reached_receiver(error: str) -> bool:
    """Whether a delivery attempt that `post_once` answered `error` reached
    the receiver: it answered (2xx, or another status). A timeout, a
    connection error or a target the policy refuses did not."""
    return not error or error.startswith("HTTP ")


def checked_session(
    policy: TargetPolicy, resolver: aiohttp.abc.AbstractResolver | None = None
) -> aiohttp.ClientSession:
    """A client session that connects only to addresses `policy` allows: it
    resolves names itself, refuses forbidden answers and connects to the
    address it checked. No proxy from the environment (trust_env is off)."""
    connector = aiohttp.TCPConnector(resolver=CheckingResolver(policy, resolver))
    return aiohttp.ClientSession(connector=connector)


def describe(event: OutboxEvent, shard: int | None = None) -> dict[str, Any]:
    """The JSON a receiver gets (for docs and tests)."""
    parsed: dict[str, Any] = json.loads(event_body(event, "sub", shard))
    return parsed
