"""The outbox relayed to NATS JetStream (docs/relays.md), against Debian's
`nats-server`: the sink alone (a republished run dropped by `Nats-Msg-Id`
dedup and stored once, a refusal stopping the run with nothing after it
stored, a full stream's refusal, unreachable while the server is down and
working again after), then the relay scenarios every broker shares
(relay_scenarios.py: leader kills, a server restart and a partition under
load; a subject no stream takes, parked and retried; two shards with a
shard leader killed). Prints the figures."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_support import Received, free_port
from nats_support import NatsServer
from relay_scenarios import (
    SHARD_KILL,
    every_shard_relays_its_own,
    faults_with_broker_in_namespace,
    refused_then_retried,
)

from raftsched.core.events.sinks import make_sink
from raftsched.node.sink_nats import JetStreamSink
from raftsched.node.sinks import Message, Published, Unreachable, open_sink
from raftsched.testing import LocalCluster

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


@pytest.mark.slow
def test_every_committed_event_reaches_jetstream_through_kills_restarts_and_a_partition(
    nats_server_binary: str, tmp_path: Path, relay_cluster: LocalCluster
) -> None:
    figures = faults_with_broker_in_namespace(
        relay_cluster,
        lambda host, netns: NatsServer(
            nats_server_binary, tmp_path / "nats-ns", PASSWORD, host, netns
        ),
    )
    print(f"nats: repeats JetStream dropped={_repeats_logged(relay_cluster)}")
    assert figures.duplicates == 0  # Nats-Msg-Id within the duplicate window


@pytest.mark.slow
def test_a_message_no_stream_takes_is_parked_then_arrives_when_retried(
    relay_cluster: LocalCluster, nats_server: NatsServer
) -> None:
    parked = refused_then_retried(relay_cluster, nats_server)
    assert "no JetStream stream captures subject 'refused'" in parked["error"]


@pytest.mark.slow
@pytest.mark.expect_log_errors(SHARD_KILL.pattern, reason=SHARD_KILL.reason)
def test_every_shards_leader_relays_its_own_outbox(
    tmp_path_factory: pytest.TempPathFactory, nats_server: NatsServer
) -> None:
    every_shard_relays_its_own(tmp_path_factory.mktemp("rn") / "c", nats_server)
