"""The outbox relayed to a real Redis stream (docs/relays.md): a 3-node
cluster publishes its events to Debian's `redis-server` while jobs are
submitted and cancelled under load, the leader is SIGKILLed mid-stream
(twice) and Redis is stopped and restarted. Every committed event (as
`GET /v1/events` reads them) arrives in the stream at least once, the ids
are gapless after deduplication, each key's events arrive in order, and
nothing is parked. Then a stream key of the wrong type makes Redis refuse:
those events are parked after `max_attempts`, and arrive once retried.
Prints the figures (events, kills, restarts, duplicates, lost)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import cluster_env, sharded_cluster
from redis_support import RedisServer

from raftsched.client import Client, Conflict
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.core.events.sinks import make_sink
from raftsched.node.sinks import Message, Published, Unreachable, open_sink
from raftsched.testing import LocalCluster, assert_no_secrets_in_logs, http_json

PASSWORD = "r3dis-pw"
STREAM = "payments:events"
KEYS = 7
RELAY_ENV = {
    "RAFTSCHED_WEBHOOK_TIMEOUT_S": "1",
    "RAFTSCHED_WEBHOOK_BACKOFF_S": "0.05",
    "RAFTSCHED_WEBHOOK_BACKOFF_MAX_S": "0.5",
    "RAFTSCHED_WEBHOOK_MAX_ATTEMPTS": "4",
}


@pytest.fixture
def redis_server(redis_server_binary: str, tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(redis_server_binary, tmp_path / "redis", PASSWORD)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def relay_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path / "cluster", size=3, env={**cluster_env(), **RELAY_ENV})
    local.start()
    try:
        local.wait_for_leader(timeout_s=30)
        yield local
    finally:
        local.stop()


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.1)


def _create(
    cluster: LocalCluster, body: dict[str, Any], token: str | None = None
) -> dict[str, Any]:
    """POST /v1/subscriptions at the node that leads (a follower answers 307)."""
    deadline = time.monotonic() + 30
    while True:
        for url in cluster.live_urls():
            try:
                status, answer, _ = http_json(
                    "POST", f"{url}/v1/subscriptions", body, 10, token=token
                )
            except OSError:
                continue
            if status in (200, 201):
                subscription: dict[str, Any] = answer["subscription"]
                return subscription
            assert status == 307 or status >= 500, answer
        assert time.monotonic() < deadline, "no node created the subscription"
        time.sleep(0.2)


class Load:
    """Submits and cancels jobs (one `job.cancelled` event each) until told
    to stop, through leader changes (the client retries)."""

    def __init__(self, cluster: LocalCluster, count: int) -> None:
        self.cluster = cluster
        self.count = count
        self.done = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

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
        after = 0
        while True:
            page = client.events(after, limit=1000)
            found += page["events"]
            if not page["events"]:
                return found
            after = page["events"][-1]["seq"]


def _stream(server: RedisServer, stream: str) -> list[dict[str, str]]:
    entries = server.client().xrange(stream)
    return [
        {name.decode(): value.decode() for name, value in fields.items()} for _, fields in entries
    ]


@pytest.mark.slow
def test_every_committed_event_reaches_the_stream_through_kills_and_a_broker_restart(
    relay_cluster: LocalCluster, redis_server: RedisServer
) -> None:
    cluster = relay_cluster
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        _wait(
            lambda: client.cluster().get("cluster_version") == COMMAND_VERSION_MAX,
            60,
            "the cluster version gate to open",
        )
        sink = {"kind": "redis", "url": redis_server.url, "stream": STREAM, "maxlen": 100000}
        sub = client.create_broker_subscription(
            sink, ["job.*"], subscription_id="sub_redis", key_field="payment_id"
        )
    assert sub["sink"]["url"] == f"redis://:***@127.0.0.1:{redis_server.port}/0"
    assert PASSWORD not in json.dumps(sub)
    total, kills = 240, 0
    load = Load(cluster, total)
    load.thread.start()
    load.wait_for(40)
    cluster.kill(cluster.wait_for_leader())  # the leader dies mid-stream
    kills += 1
    load.wait_for(80)
    redis_server.restart(down_s=3.0)  # the broker goes away, then comes back
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
            lambda: client.get_subscription("sub_redis")["cursor_seq"] >= seqs[-1],
            120,
            "the relay's cursor to reach the newest event",
        )
        view = client.get_subscription("sub_redis")
    assert view["parked_count"] == 0
    assert PASSWORD not in json.dumps(view)

    entries = _stream(redis_server, STREAM)
    first: dict[str, dict[str, str]] = {}
    for entry in entries:
        first.setdefault(entry["id"], entry)
    duplicates = len(entries) - len(first)
    arrived = sorted(int(entry["seq"]) for entry in first.values())
    lost = sorted(set(seqs) - set(arrived))
    # Every message the relay sent runs one GET of its dedup key in the
    # script: the sends beyond the entries were repeats the window dropped.
    republished = redis_server.calls("get") - len(first)
    print(
        f"\nredis relay: events={len(committed)} kills={kills} "
        f"broker_restarts={redis_server.restarts} stream_entries={len(entries)} "
        f"republished_and_dropped={republished} duplicates={duplicates} lost={len(lost)}"
    )
    assert republished >= 0
    assert lost == []
    assert arrived == seqs  # gapless after deduplication, and nothing else
    by_seq = {event["seq"]: event for event in committed}
    keys: dict[str, list[int]] = {}
    for entry in first.values():  # in the stream's order of first arrival
        seq = int(entry["seq"])
        event = by_seq[seq]
        body = json.loads(entry["data"])
        assert entry["id"] == body["id"] == f"evt_{seq}"
        assert (entry["type"], body["seq"], body["subscription_id"]) == (
            event["type"],
            seq,
            "sub_redis",
        )
        assert body["data"] == event["data"]
        assert entry["tenant"] == event["data"]["tenant"] and entry["shard"] == "0"
        keys.setdefault(entry["key"], []).append(seq)
    assert set(keys) == {f"pay-{n}" for n in range(KEYS)}
    for key, order in keys.items():
        assert order == sorted(order), f"key {key} out of order: {order}"
    assert_no_secrets_in_logs(cluster, {"redis password": PASSWORD})


@pytest.mark.slow
def test_a_refused_message_is_parked_then_arrives_when_retried(
    relay_cluster: LocalCluster, redis_server: RedisServer
) -> None:
    cluster = relay_cluster
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        _wait(
            lambda: client.cluster().get("cluster_version") == COMMAND_VERSION_MAX,
            60,
            "the cluster version gate to open",
        )
        leader = cluster.nodes[cluster.wait_for_leader()].http_url
        good = {"kind": "redis", "url": redis_server.url, "stream": "s"}
        for body, field in [
            ({"sink": {**good, "kind": "kafka"}}, "sink.kind"),
            ({"sink": {**good, "url": "http://127.0.0.1/"}}, "sink.url"),
            ({"sink": {**good, "stream": ""}}, "sink.stream"),
            ({"sink": {**good, "maxlen": 0}}, "sink.maxlen"),
            ({"sink": {**good, "maxlen": True}}, "sink.maxlen"),
            ({"sink": {**good, "db": 1}}, "sink.db"),
            ({"sink": good, "url": "https://example.com/h", "secret": "k"}, "url"),
            ({"sink": good, "tenants": "acme"}, "tenants"),
            ({"sink": good, "key_field": ""}, "key_field"),
            ({"sink": "redis"}, "sink"),
        ]:
            status, answer, _ = http_json("POST", f"{leader}/v1/subscriptions", body, 10)
            assert status == 400, (body, answer)
            assert answer["error"]["code"] == "invalid_request"
            assert answer["error"]["details"]["field"] == field, (body, answer)
        assert client.list_subscriptions() == []
        redis_server.client().set("wrong:type", "a string, not a stream")
        _create(
            cluster,
            {
                "id": "sub_refused",
                "sink": {"kind": "redis", "url": redis_server.url, "stream": "wrong:type"},
            },
        )
        job = client.submit("relay", {"payment_id": "pay-x"}, idempotency_key="refused:1")
        client.cancel_job(job["id"])
        _wait(
            lambda: client.get_subscription("sub_refused")["parked_count"] == 1,
            60,
            "the refused event to be parked",
        )
        (parked,) = client.get_subscription("sub_refused")["parked"]
        assert parked["attempts"] == 4 and "WRONGTYPE" in parked["error"]
        assert parked["event"]["data"]["job_id"] == job["id"]
        redis_server.client().delete("wrong:type")
        assert client.retry_parked("sub_refused") == {"retried": 1}
        _wait(
            lambda: client.get_subscription("sub_refused")["parked_count"] == 0,
            60,
            "the retried event to arrive",
        )
    (entry,) = _stream(redis_server, "wrong:type")
    assert json.loads(entry["data"])["data"]["job_id"] == job["id"]
    assert entry["key"] == "refused:1"  # no key_field: the idempotency key


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
    assert [entry["seq"] for entry in _stream(redis_server, "s")] == ["1", "2", "3", "4", "6"]


@pytest.mark.slow
def test_every_shards_leader_relays_its_own_outbox(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> None:
    """Two data shards: the subscription is copied into each with its sink,
    and each shard's leader publishes its own events, to the stream its
    `{shard}` names, with ids that name the shard, gapless and in order."""
    shards = 2
    root = tmp_path_factory.mktemp("rr") / "c"
    with sharded_cluster(root, shards, RELAY_ENV) as cluster:
        token = cluster.admin_token
        body = {
            "id": "sub_sharded",
            "types": ["job.cancelled"],
            "sink": {"kind": "redis", "url": redis_server.url, "stream": "sh:{shard}"},
        }
        _create(cluster, body, token)
        clients = [
            Client(cluster.urls, timeout_s=15, retry_budget_s=30, shard=k, token=token)
            for k in range(shards)
        ]
        jobs: dict[int, list[str]] = {k: [] for k in range(shards)}
        try:
            for n in range(15):
                for k, client in enumerate(clients):
                    job = client.submit("relay", {"n": n})
                    client.cancel_job(job["id"])
                    jobs[k].append(job["id"])

            def arrived(k: int) -> list[dict[str, str]]:
                return _stream(redis_server, f"sh:{k}")

            _wait(
                lambda: all(len(arrived(k)) >= len(jobs[k]) for k in range(shards)),
                90,
                "every shard's events in its stream",
            )
            view = clients[0].get_subscription("sub_sharded")
            assert view["parked_count"] == 0 and "***" in view["sink"]["url"]
        finally:
            for client in clients:
                client.close()
    for k in range(shards):
        entries = arrived(k)
        assert [json.loads(e["data"])["data"]["job_id"] for e in entries] == jobs[k]
        seqs = [int(e["seq"]) for e in entries]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # gapless, in order
        prefix = "evt_" if k == 0 else f"evt{k}_"
        assert all(e["id"] == f"{prefix}{e['seq']}" and e["shard"] == str(k) for e in entries)
