"""The relay scenarios every broker is put through (docs/relays.md, section
6), written once against the broker driver shape (broker_support.py; each
broker's driver is `<kind>_support.py`) and run by `test_relay_<kind>.py`,
one file per broker so that pytest-xdist spreads them over its workers.

- `stream_through_faults`: a 3-node cluster publishes its events under load
  while the leader is SIGKILLed (twice), the broker is stopped and started
  again, and the broker is partitioned from every node (it lives in a
  network namespace of its own). Every committed event (as `GET /v1/events`
  reads them) is kept by the broker at least once, the ids are gapless after
  deduplication, every key's first arrivals are in commit order, and nothing
  is parked. Returns and prints the figures.
- `refused_then_retried`: bad sink bodies are 400s naming the field; a
  destination the broker refuses parks the event after `max_attempts`, and
  the operator's retry delivers it once the broker accepts.
- `every_shard_relays_its_own`: two data shards, `{shard}` in the
  destination, the process that leads shard 1 SIGKILLed mid-stream: each
  shard's events reach its own destination, ids naming the shard, gapless
  and in order.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from broker_support import BrokerNamespace, Received, broker_namespace
from e2e_support import sharded_cluster

from raftsched.client import Client, Conflict
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.testing import (
    ExpectedLogError,
    LocalCluster,
    assert_no_secrets_in_logs,
    http_json,
)

KEYS = 7
RELAY_ENV = {
    # A broker's connect and confirm (RabbitMQ's AMQP handshake on a busy
    # machine takes over a second).
    "RAFTSCHED_WEBHOOK_TIMEOUT_S": "2",
    "RAFTSCHED_WEBHOOK_BACKOFF_S": "0.05",
    "RAFTSCHED_WEBHOOK_BACKOFF_MAX_S": "0.5",
    "RAFTSCHED_WEBHOOK_MAX_ATTEMPTS": "4",
}
# Long enough for several relay timeouts (RAFTSCHED_WEBHOOK_TIMEOUT_S) in a row.
PARTITION_S = 8.0
# The sharded scenario kills shard 1's leading process; its node says so.
SHARD_KILL = ExpectedLogError(
    r"shard process 1 \(pid \d+\) exited with status -9",
    reason="the relay scenario kills shard 1's leading process",
)


class Broker(Protocol):
    kind: str
    password: str
    restarts: int

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def restart(self, down_s: float) -> None: ...
    def sink(self, destination: str) -> dict[str, Any]: ...
    def prepare(self, destination: str) -> None: ...
    def received(self, destination: str) -> list[Received]: ...
    def refuse(self, destination: str) -> None: ...
    def accept(self, destination: str) -> None: ...
    def dropped_repeats(self) -> int | None: ...


def wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.1)


def _gate_open(client: Client) -> None:
    wait(
        lambda: client.cluster().get("cluster_version") == COMMAND_VERSION_MAX,
        60,
        "the cluster version gate to open",
    )


def create(cluster: LocalCluster, body: dict[str, Any], token: str | None = None) -> None:
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
                return
            assert status == 307 or status >= 500, answer
        assert time.monotonic() < deadline, "no node created the subscription"
        time.sleep(0.2)


class Load:
    """Submits and cancels jobs (one `job.cancelled` event each) until
    `count`, through leader changes (the client retries)."""

    def __init__(self, cluster: LocalCluster, count: int) -> None:
        self.cluster = cluster
        self.count = count
        self.done = 0
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
        wait(lambda: self.done >= done or self.error is not None, timeout_s, f"{done} jobs")
        assert self.error is None, repr(self.error)


def committed_events(cluster: LocalCluster) -> list[dict[str, Any]]:
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        found: list[dict[str, Any]] = []
        after = 0
        while True:
            page = client.events(after, limit=1000)
            found += page["events"]
            if not page["events"]:
                return found
            after = page["events"][-1]["seq"]


@dataclass(frozen=True)
class Figures:
    kind: str
    events: int
    kills: int
    broker_restarts: int
    partitions: int
    kept: int  # messages the broker kept, duplicates included
    dropped_repeats: int | None  # republished messages the broker's dedup dropped
    duplicates: int  # messages kept more than once (a consumer dedups them by id)
    lost: int

    def line(self) -> str:
        dropped = "n/a" if self.dropped_repeats is None else self.dropped_repeats
        return (
            f"{self.kind} relay: events={self.events} kills={self.kills} "
            f"broker_restarts={self.broker_restarts} partitions={self.partitions} "
            f"kept={self.kept} dropped_repeats={dropped} "
            f"duplicates={self.duplicates} lost={self.lost}"
        )


def faults_with_broker_in_namespace(
    cluster: LocalCluster, make: Callable[[str, str], Broker]
) -> Figures:
    """`stream_through_faults` with a broker `make(host, netns)` makes in a
    network namespace of its own (skipped, loudly, where none can be made)."""
    with broker_namespace() as space:
        broker = make(space.broker_ip, space.name)
        broker.start()
        try:
            return stream_through_faults(cluster, broker, space)
        finally:
            broker.stop()


def stream_through_faults(
    cluster: LocalCluster, broker: Broker, space: BrokerNamespace, total: int = 240
) -> Figures:
    destination = "payments.events"
    broker.prepare(destination)
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        _gate_open(client)
        sub = client.create_broker_subscription(
            broker.sink(destination), ["job.*"], subscription_id="sub_relay", key_field="payment_id"
        )
    assert "***" in sub["sink"]["url"] and broker.password not in json.dumps(sub)
    kills = partitions = 0
    load = Load(cluster, total)
    load.wait_for(total // 6)
    cluster.kill(cluster.wait_for_leader())  # the leader dies mid-stream
    kills += 1
    load.wait_for(total // 3)
    broker.restart(down_s=3.0)  # the broker goes away, then comes back
    load.wait_for(total // 2)
    for node_id, node in cluster.nodes.items():
        if not node.alive:
            cluster.start(node_id)  # the first victim back: a quorum survives the next kill
    space.partition()  # the broker is cut off from every node, while events commit
    partitions += 1
    time.sleep(PARTITION_S)
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        cut_at = client.get_subscription("sub_relay")["cursor_seq"]
        newest = client.events(cut_at, limit=1000)["events"]
    space.heal()
    # The partition held the relay back: events committed that it could not publish.
    assert newest, "no event committed during the partition"
    load.wait_for(total * 2 // 3)
    cluster.kill(cluster.wait_for_leader())
    kills += 1
    load.wait_for(total, timeout_s=180)
    load.thread.join(timeout=10)

    committed = committed_events(cluster)
    seqs = [event["seq"] for event in committed]
    assert len(committed) == total and seqs == list(range(1, total + 1))
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        wait(
            lambda: client.get_subscription("sub_relay")["cursor_seq"] >= seqs[-1],
            120,
            "the relay's cursor to reach the newest event",
        )
        view = client.get_subscription("sub_relay")
    assert view["parked_count"] == 0  # nothing parked that the broker later accepted
    assert broker.password not in json.dumps(view)

    kept = broker.received(destination)
    first: dict[str, Received] = {}
    for message in kept:
        first.setdefault(message.id, message)
    arrived = sorted(message.seq for message in first.values())
    figures = Figures(
        kind=broker.kind,
        events=len(committed),
        kills=kills,
        broker_restarts=broker.restarts,
        partitions=partitions,
        kept=len(kept),
        dropped_repeats=broker.dropped_repeats(),
        duplicates=len(kept) - len(first),
        lost=len(set(seqs) - set(arrived)),
    )
    print(f"\n{figures.line()}")
    assert figures.lost == 0
    assert arrived == seqs  # gapless after deduplication, and nothing else
    by_seq = {event["seq"]: event for event in committed}
    keys: dict[str, list[int]] = {}
    for message in first.values():  # in the broker's order of first arrival
        event = by_seq[message.seq]
        assert message.id == message.body["id"] == f"evt_{message.seq}"
        assert (message.type, message.body["seq"], message.body["subscription_id"]) == (
            event["type"],
            message.seq,
            "sub_relay",
        )
        assert message.body["data"] == event["data"]
        assert message.tenant == event["data"]["tenant"] and message.shard == 0
        keys.setdefault(message.key, []).append(message.seq)
    assert set(keys) == {f"pay-{n}" for n in range(KEYS)}
    for key, order in keys.items():
        assert order == sorted(order), f"key {key} out of order: {order}"
    assert_no_secrets_in_logs(cluster, {f"{broker.kind} password": broker.password})
    return figures


def refused_then_retried(cluster: LocalCluster, broker: Broker) -> dict[str, Any]:
    """Returns the parked event as the subscription showed it."""
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        _gate_open(client)
        leader = cluster.nodes[cluster.wait_for_leader()].http_url
        good = broker.sink("s")
        for body, field in [
            ({"sink": {**good, "kind": "kafka"}}, "sink.kind"),
            ({"sink": {**good, "url": "http://127.0.0.1/"}}, "sink.url"),
            ({"sink": {**good, "partition": 1}}, "sink.partition"),
            ({"sink": good, "url": "https://example.com/h", "secret": "k"}, "url"),
            ({"sink": good, "tenants": "acme"}, "tenants"),
            ({"sink": good, "key_field": ""}, "key_field"),
            ({"sink": broker.kind}, "sink"),
        ]:
            status, answer, _ = http_json("POST", f"{leader}/v1/subscriptions", body, 10)
            assert status == 400, (body, answer)
            assert answer["error"]["code"] == "invalid_request"
            assert answer["error"]["details"]["field"] == field, (body, answer)
        assert client.list_subscriptions() == []
        destination = "refused"
        broker.prepare(destination)
        broker.refuse(destination)
        create(cluster, {"id": "sub_refused", "sink": broker.sink(destination)})
        job = client.submit("relay", {"payment_id": "pay-x"}, idempotency_key="refused:1")
        client.cancel_job(job["id"])
        wait(
            lambda: client.get_subscription("sub_refused")["parked_count"] == 1,
            60,
            "the refused event to be parked",
        )
        (parked,) = client.get_subscription("sub_refused")["parked"]
        assert parked["attempts"] == 4 and parked["error"]
        assert parked["event"]["data"]["job_id"] == job["id"]
        assert broker.password not in json.dumps(parked)
        broker.accept(destination)
        assert client.retry_parked("sub_refused") == {"retried": 1}
        wait(
            lambda: client.get_subscription("sub_refused")["parked_count"] == 0,
            60,
            "the retried event to arrive",
        )
    (message,) = broker.received(destination)
    assert message.body["data"]["job_id"] == job["id"]
    assert message.key == "refused:1"  # no key_field: the idempotency key
    return dict(parked)


def every_shard_relays_its_own(root: Path, broker: Broker) -> None:
    shards, rounds = 2, 30
    destinations = [f"sh.{k}" for k in range(shards)]
    for destination in destinations:
        broker.prepare(destination)
    with sharded_cluster(root, shards, RELAY_ENV, expected=[SHARD_KILL]) as cluster:
        token = cluster.admin_token
        body = {
            "id": "sub_sharded",
            "types": ["job.cancelled"],
            "sink": broker.sink("sh.{shard}"),
        }
        create(cluster, body, token)
        clients = [
            Client(cluster.urls, timeout_s=15, retry_budget_s=60, shard=k, token=token)
            for k in range(shards)
        ]
        jobs: dict[int, list[str]] = {k: [] for k in range(shards)}
        try:
            for n in range(rounds):
                if n == rounds // 2:  # shard 1's leading process dies mid-stream
                    leader = cluster.wait_for_shard_leader(1)
                    pid = cluster.shard_pid(leader, 1)
                    assert pid is not None
                    os.kill(pid, signal.SIGKILL)
                for k, client in enumerate(clients):
                    job = client.submit("relay", {"n": n})
                    try:
                        client.cancel_job(job["id"])
                    except Conflict:  # a retried cancel that had committed
                        assert client.get_job(job["id"])["status"] == "cancelled"
                    jobs[k].append(job["id"])

            def first_arrivals(k: int) -> list[Received]:
                seen: dict[str, Received] = {}
                for message in broker.received(destinations[k]):
                    seen.setdefault(message.id, message)
                return list(seen.values())

            wait(
                lambda: all(
                    set(jobs[k]) <= {m.body["data"]["job_id"] for m in first_arrivals(k)}
                    for k in range(shards)
                ),
                120,
                "every shard's events at its destination",
            )
            view = clients[0].get_subscription("sub_sharded")
            assert view["parked_count"] == 0 and "***" in view["sink"]["url"]
        finally:
            for client in clients:
                client.close()
    for k in range(shards):
        arrived = first_arrivals(k)
        # A submit the client repeated across the kill may have made one more
        # job: every job it was answered with arrived, in submission order.
        job_ids = [message.body["data"]["job_id"] for message in arrived]
        assert [job_id for job_id in job_ids if job_id in set(jobs[k])] == jobs[k]
        seqs = [message.seq for message in arrived]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # gapless, in order
        prefix = "evt_" if k == 0 else f"evt{k}_"
        assert all(m.id == f"{prefix}{m.seq}" and m.shard == k for m in arrived)
