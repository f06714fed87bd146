"""The outbox relayed to a real Redis stream (docs/relays.md): Debian's
`redis-server` put through the relay scenarios every broker shares
(relay_scenarios.py: leader kills, a broker restart and a partition under
load; a refusal parked and retried; two shards with a shard leader killed),
and the Redis sink alone: its dedup script drops repeats within the window
and stops at the first refusal."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_support import RedisServer
from relay_scenarios import (
    SHARD_KILL,
    every_shard_relays_its_own,
    faults_with_broker_in_namespace,
    refused_then_retried,
)

from raftsched.core.events.sinks import make_sink
from raftsched.node.sinks import Message, Published, Unreachable, open_sink
from raftsched.testing import LocalCluster

PASSWORD = "r3dis-pw"


@pytest.fixture
def redis_server(redis_server_binary: str, tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(redis_server_binary, tmp_path / "redis", PASSWORD)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
def test_every_committed_event_reaches_the_stream_through_kills_restarts_and_a_partition(
    redis_server_binary: str, tmp_path: Path, relay_cluster: LocalCluster
) -> None:
    figures = faults_with_broker_in_namespace(
        relay_cluster,
        lambda host, netns: RedisServer(
            redis_server_binary, tmp_path / "redis-ns", PASSWORD, host, netns
        ),
    )
    assert figures.duplicates == 0  # the script's window dropped every repeat


@pytest.mark.slow
def test_a_refused_message_is_parked_then_arrives_when_retried(
    relay_cluster: LocalCluster, redis_server: RedisServer
) -> None:
    parked = refused_then_retried(relay_cluster, redis_server)
    assert "WRONGTYPE" in parked["error"]


@pytest.mark.slow
@pytest.mark.expect_log_errors(SHARD_KILL.pattern, reason=SHARD_KILL.reason)
def test_every_shards_leader_relays_its_own_outbox(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> None:
    every_shard_relays_its_own(tmp_path_factory.mktemp("rr") / "c", redis_server)


def test_the_redis_sink_drops_repeats_and_stops_at_a_refusal(redis_server: RedisServer) -> None:
    """The sink alone against the real server: a republished run is answered
    with the first entries' ids and stored once; a refused message stops the
    run, and nothing after it is stored before it."""

    def message(seq: int, stream: str) -> Message:
        return Message(f"evt_{seq}", "job.cancelled", seq, "t", f"k{seq % 2}", 0, b"{}", stream)

    async def scenario() -> None:
        sink = open_sink(make_sink("redis", {"url": redis_server.url, "stream": "s"}), 5.0, 60)
        try:
            run = [message(seq, "s") for seq in (1, 2, 3)]
            assert await sink.publish(run) == Published(3)
            assert await sink.publish(run[1:]) == Published(2)  # repeats: dropped
            redis_server.client().set("not-a-stream", "x")
            mixed = [message(4, "s"), message(5, "not-a-stream"), message(6, "s")]
            answer = await sink.publish(mixed)
            assert answer.confirmed == 1 and answer.refused and "WRONGTYPE" in answer.refused
            redis_server.restart(down_s=0.5)  # the connection is gone: reconnects
            outages = 0
            while True:
                try:
                    assert await sink.publish([message(6, "s")]) == Published(1)
                    break
                except Unreachable:  # the old connection's end: the relay retries
                    outages += 1
                    assert outages < 3
            assert await sink.publish([message(4, "s")]) == Published(1)  # a repeat
        finally:
            await sink.close()

    asyncio.run(scenario())
    assert [message.seq for message in redis_server.received("s")] == [1, 2, 3, 4, 6]
