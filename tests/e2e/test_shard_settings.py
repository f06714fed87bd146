"""Settings, quotas and subscriptions in every shard, on a real cluster of 3
nodes x 3 shards (docs/shards.md, section 4 and "Events and subscriptions").

Group 0 records queue and tenant settings and webhook subscriptions; the
node hosting each shard's leader copies them there, and group 0's leader
splits the limits into per-shard quotas (node.shard_settings). So: a paused
queue grants no lease in any shard; a tenant's `max_queued` holds across
the cluster; a queue's concurrency limit is never exceeded cluster-wide
while its backlog moves from shard to shard; a subscription receives the
events of every shard, each id naming its shard, from the moment it was
created (its copies are made a moment later), and the events each shard
parks are listed in its view and retried by the operator's retry. One
cluster serves the module; its logs are checked for error lines when it
stops.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import WebhookReceiver, sharded_cluster, webhook_receiver

from raftsched.client import ApiError, Client
from raftsched.shards import INTERNAL_KEY_HEADER, key_shard, shard_of_id, socket_path
from raftsched.testing import LocalCluster, http_json, wait_for

pytestmark = pytest.mark.e2e

SHARDS = 3
SECRET = "hook-secret"
WEBHOOK_ENV = {
    "RAFTSCHED_WEBHOOK_TIMEOUT_S": "2",
    "RAFTSCHED_WEBHOOK_BACKOFF_S": "0.05",
    "RAFTSCHED_WEBHOOK_BACKOFF_MAX_S": "0.2",
    "RAFTSCHED_WEBHOOK_MAX_ATTEMPTS": "3",
}


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with sharded_cluster(tmp_path_factory.mktemp("ss") / "c", SHARDS, WEBHOOK_ENV) as cluster:
        yield cluster


@pytest.fixture
def client(sharded: LocalCluster) -> Iterator[Client]:
    with Client(sharded.urls, timeout_s=10, retry_budget_s=30) as api:
        yield api


def _every_shard(cluster: LocalCluster, check: Callable[[dict[str, Any]], Any]) -> bool:
    """Whether every node's view of every shard passes `check`."""
    for node_id in cluster.nodes:
        views = cluster.shard_views(node_id)
        if views is None or len(views) != SHARDS or not all(check(view) for view in views):
            return False
    return True


def _in_line(cluster: LocalCluster) -> bool:
    """Every shard's settings and subscriptions are group 0's (as each node's
    replicas say)."""
    return _every_shard(cluster, lambda view: view.get("settings_in_line"))


def wait_in_line(cluster: LocalCluster, timeout_s: float = 30) -> None:
    assert wait_for(lambda: _in_line(cluster), timeout_s), [
        cluster.shard_views(node_id) for node_id in cluster.nodes
    ]


def wait_quotas(cluster: LocalCluster, timeout_s: float = 30) -> None:
    """Until every shard is in line and enforces its quota of every limit."""
    wait_in_line(cluster, timeout_s)
    assert wait_for(
        lambda: _every_shard(cluster, lambda view: view.get("quotas_in_line")), timeout_s
    )


def shard_clients(cluster: LocalCluster) -> list[Client]:
    return [Client(cluster.urls, timeout_s=15, retry_budget_s=30, shard=k) for k in range(SHARDS)]


def keys_in(shard: int, tenant: str, count: int, prefix: str) -> list[str]:
    """`count` idempotency keys that place a job of `tenant` in `shard`."""
    found: list[str] = []
    index = 0
    while len(found) < count:
        key = f"{prefix}-{index}"
        if key_shard(tenant, key, SHARDS) == shard:
            found.append(key)
        index += 1
    return found


# -- pause ----------------------------------------------------------------------------


def test_a_paused_queue_is_paused_in_every_shard(sharded: LocalCluster, client: Client) -> None:
    queue = "pausing"
    clients = shard_clients(sharded)
    try:
        ids = [
            clients[shard].submit(queue, {"n": n})["id"]
            for shard in range(SHARDS)
            for n in range(2)
        ]
        assert sorted(shard_of_id(job_id) for job_id in ids) == [0, 0, 1, 1, 2, 2]
        client.pause_queue(queue)
        wait_in_line(sharded)
        for shard in range(SHARDS):
            leases = clients[shard].claim("w", [queue], max_jobs=5, wait_s=1.5, lease_s=30)
            assert leases == [], (shard, leases)
        client.resume_queue(queue)
        wait_in_line(sharded)
        for shard in range(SHARDS):
            leases = clients[shard].claim("w", [queue], max_jobs=5, wait_s=10, lease_s=30)
            assert sorted(lease["job_id"] for lease in leases) == sorted(
                job_id for job_id in ids if shard_of_id(job_id) == shard
            )
            for lease in leases:
                clients[shard].complete(lease["job_id"], lease["fencing_token"], {"ok": True})
    finally:
        for one in clients:
            one.close()


def test_settings_and_their_reset_reach_every_shard(sharded: LocalCluster, client: Client) -> None:
    client.set_queue("tuned", rate_limit_per_s=50, burst=7, circuit_window=8)
    client.set_tenant("weighty", weight=5)
    client.set_queue("reconciled", on_unknown="reconcile")
    wait_in_line(sharded)
    # Back to the defaults: a reset reaches the shards as well.
    client.set_queue("tuned")
    client.set_tenant("weighty")
    client.set_queue("reconciled", on_unknown="retry")
    wait_in_line(sharded)


def _views_of(cluster: LocalCluster, node_id: str, shard: int) -> dict[str, Any] | None:
    views = cluster.shard_views(node_id)
    return None if views is None else views[shard]


def test_a_shard_without_a_leader_is_brought_in_line_once_it_has_one(
    sharded: LocalCluster, client: Client
) -> None:
    """Two of shard 2's three processes stopped: shard 2 has no leader, so
    nothing can be written there, and the other shards go on. Set meanwhile,
    a pause and a limit reach it once it elects a leader again."""
    stopped_on, watcher = sorted(sharded.nodes)[:2], sorted(sharded.nodes)[2]
    pids = [sharded.shard_pid(node_id, 2) for node_id in stopped_on]
    assert all(pid is not None for pid in pids)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)  # type: ignore[arg-type]
    try:
        client.pause_queue("while-down")
        client.set_tenant("while-down", max_queued=9)
        assert wait_for(
            lambda: all(
                (_views_of(sharded, watcher, k) or {}).get("settings_in_line") for k in (0, 1)
            ),
            30,
        )
        time.sleep(2.0)  # passes come and go; shard 2 cannot take anything
        seen = _views_of(sharded, watcher, 2)
        assert seen is not None and seen.get("settings_in_line") is False, seen
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)  # type: ignore[arg-type]
    wait_quotas(sharded, timeout_s=60)
    client.resume_queue("while-down")
    client.set_tenant("while-down")
    wait_quotas(sharded, timeout_s=60)


# -- max_queued ----------------------------------------------------------------------------


def test_a_tenants_max_queued_holds_across_the_cluster(
    sharded: LocalCluster, client: Client
) -> None:
    tenant, limit = "capped", 6
    client.set_tenant(tenant, max_queued=limit)
    wait_quotas(sharded)
    accepted: list[str] = []
    refused = 0
    for index in range(30):
        try:
            accepted.append(client.submit("capped-q", {"i": index}, tenant=tenant)["id"])
        except ApiError as error:
            assert error.code == "queue_full", error
            refused += 1
    assert refused > 0
    assert 0 < len(accepted) <= limit, accepted
    # Keyed submissions all placed in one shard are held to that shard's quota.
    for key in keys_in(1, tenant, 10, "full"):
        try:
            accepted.append(
                client.submit("capped-q", {"k": key}, tenant=tenant, idempotency_key=key)["id"]
            )
        except ApiError as error:
            assert error.code == "queue_full", error
    assert len(accepted) <= limit, accepted
    queued = _queued_of(sharded, tenant, "capped-q")
    assert sum(queued.values()) == len(accepted) <= limit, queued


def _queued_of(cluster: LocalCluster, tenant: str, queue: str) -> dict[int, int]:
    """Each shard's pending jobs of `tenant` in `queue`, from its own list."""
    counts = {}
    for shard, one in enumerate(shard_clients(cluster)):
        with one:
            page = one.list_jobs(queue=queue, tenant=tenant, status="pending", limit=100)
            counts[shard] = len(page["jobs"])
    return counts


# -- concurrency while the backlog moves ----------------------------------------------------


class Meter:
    """Jobs held at once, from each claim's answer to its completion's request:
    within the server's lease, so never more than the server counted."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held = 0
        self.peak = 0
        self.by_shard = [0] * SHARDS
        self.peak_by_shard = [0] * SHARDS
        self.done = 0

    def took(self, shard: int, count: int) -> None:
        with self.lock:
            self.held += count
            self.by_shard[shard] += count
            self.peak = max(self.peak, self.held)
            self.peak_by_shard[shard] = max(self.peak_by_shard[shard], self.by_shard[shard])

    def gave_back(self, shard: int) -> None:
        with self.lock:
            self.held -= 1
            self.by_shard[shard] -= 1
            self.done += 1


def _work(
    cluster: LocalCluster, shard: int, queue: str, meter: Meter, stop: threading.Event
) -> None:
    """One shard's worker of 4 slots: claims, holds each job 0.3 s, completes."""
    with Client(cluster.urls, timeout_s=20, retry_budget_s=30, shard=shard) as one:
        while not stop.is_set():
            leases = one.claim(f"w{shard}", [queue], max_jobs=4, wait_s=1, lease_s=30)
            meter.took(shard, len(leases))
            if not leases:
                continue
            time.sleep(0.3)
            for lease in leases:
                meter.gave_back(shard)
                one.complete(lease["job_id"], lease["fencing_token"], {"ok": True})


def test_a_queue_concurrency_limit_holds_while_the_backlog_moves(
    sharded: LocalCluster, client: Client
) -> None:
    queue, limit = "limited", 4
    client.set_queue(queue, concurrency_limit=limit)
    wait_quotas(sharded)
    meter = Meter()
    stop = threading.Event()
    workers = [
        threading.Thread(target=_work, args=(sharded, shard, queue, meter, stop), daemon=True)
        for shard in range(SHARDS)
    ]
    for worker in workers:
        worker.start()
    try:
        for shard in (1, 2):  # the whole backlog in one shard, then in another
            target = meter.done + 48
            for key in keys_in(shard, "default", 48, f"move{shard}"):
                client.submit(queue, {"k": key}, idempotency_key=key)
            assert wait_for(lambda: meter.done >= target, 60), meter.done  # noqa: B023
            # Once the quotas follow the demand, the loaded shard runs the limit.
            assert meter.peak_by_shard[shard] >= limit - 1, meter.peak_by_shard
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=30)
    assert meter.peak <= limit, meter.peak
    assert meter.peak == limit  # the limit, not the workers, was what held them back


# -- subscriptions -------------------------------------------------------------------------


def test_a_subscription_receives_the_events_of_every_shard(
    sharded: LocalCluster, client: Client
) -> None:
    receiver = WebhookReceiver(SECRET)
    clients = shard_clients(sharded)
    try:
        sub = client.create_subscription(receiver.url, types=["job.succeeded"], secret=SECRET)
        # No wait for the copies: a shard's copy delivers its events from
        # the subscription's creation in group 0 on, even those before it.
        queue = "hooked"
        ids = [
            clients[shard].submit(queue, {"n": n})["id"]
            for shard in range(SHARDS)
            for n in range(3)
        ]
        for shard in range(SHARDS):
            leases = clients[shard].claim("hw", [queue], max_jobs=3, wait_s=10, lease_s=30)
            assert len(leases) == 3, leases
            for lease in leases:
                clients[shard].complete(lease["job_id"], lease["fencing_token"], {"ok": True})

        def delivered() -> set[str]:
            return {event["data"]["job_id"] for event in receiver.arrivals}

        assert wait_for(lambda: set(ids) <= delivered(), 60), (ids, receiver.arrivals)
        assert receiver.bad_signatures == 0
        by_id: dict[str, str] = {}
        for event, header in zip(receiver.arrivals, receiver.ids, strict=True):
            assert event["id"] == header
            assert event["subscription_id"] == sub["id"]
            shard = event["shard"]
            assert shard == shard_of_id(event["data"]["job_id"]), event
            assert event["id"] == (
                f"evt_{event['seq']}" if shard == 0 else f"evt{shard}_{event['seq']}"
            )
            # Unique: a redelivery carries the same id for the same event.
            assert by_id.setdefault(event["id"], event["data"]["job_id"]) == event["data"]["job_id"]
        assert {event["shard"] for event in receiver.arrivals} == set(range(SHARDS))
        # Deleted in group 0, the copies go too: nothing more is delivered.
        client.delete_subscription(sub["id"])
        wait_in_line(sharded)
        seen = len(receiver.arrivals)
        more = [clients[shard].submit(queue, {"late": shard})["id"] for shard in range(SHARDS)]
        for shard in range(SHARDS):
            for lease in clients[shard].claim("hw", [queue], max_jobs=1, wait_s=10, lease_s=30):
                clients[shard].complete(lease["job_id"], lease["fencing_token"], {"ok": True})
        assert wait_for(
            lambda: all(client.get_job(job_id)["status"] == "succeeded" for job_id in more), 30
        )
        time.sleep(1.0)
        assert len(receiver.arrivals) == seen, receiver.arrivals[seen:]
    finally:
        for one in clients:
            one.close()
        receiver.stop()


def _event_id(shard: int, seq: int) -> str:
    return f"evt_{seq}" if shard == 0 else f"evt{shard}_{seq}"


def test_the_parked_events_of_every_shard_are_listed_and_retried(
    sharded: LocalCluster, client: Client
) -> None:
    """A receiver that refuses: each shard's leader parks its own events in
    its copy. The subscription's view lists every shard's, with ids naming
    their shards; the operator's retry reaches every shard's copy, and once
    the receiver takes them every parked event arrives and none is left."""
    clients = shard_clients(sharded)
    try:
        with webhook_receiver(SECRET) as receiver:
            receiver.refusing = 500
            sub = client.create_subscription(receiver.url, types=["job.cancelled"], secret=SECRET)
            ids = [
                clients[shard].submit("parking", {"n": n})["id"]
                for shard in range(SHARDS)
                for n in range(2)
            ]
            for job_id in ids:
                client.cancel_job(job_id)

            def view() -> dict[str, Any]:
                return client.get_subscription(sub["id"])

            assert wait_for(lambda: view()["parked_count"] == len(ids), 60), view()
            seen = view()
            parked = seen["parked"]
            assert sorted(item["event"]["data"]["job_id"] for item in parked) == sorted(ids)
            for item in parked:
                event, shard = item["event"], item["shard"]
                assert event["shard"] == shard == shard_of_id(event["data"]["job_id"]), item
                assert event["id"] == _event_id(shard, event["seq"]), item
                assert item["attempts"] == 3 and item["error"] == "HTTP 500", item
                assert item["retry"] is False
            # Oldest parked first, by (parked_at, shard).
            assert [(item["parked_at"], item["shard"]) for item in parked] == sorted(
                (item["parked_at"], item["shard"]) for item in parked
            )
            assert seen["parked_dropped"] == 0
            shards = seen["shards"]
            assert [part["shard"] for part in shards] == list(range(SHARDS))
            assert all(part["copied"] and part["parked_count"] == 2 for part in shards), shards
            assert seen["cursor_seq"] == "v1." + ".".join(
                str(part["cursor_seq"]) for part in shards
            )
            # The list shows the same counts; a shard's copy alone with the header.
            [listed] = [one for one in client.list_subscriptions() if one["id"] == sub["id"]]
            assert listed["parked_count"] == len(ids) and "parked" not in listed
            assert [part["parked_count"] for part in listed["shards"]] == [2] * SHARDS
            own = clients[1].get_subscription(sub["id"])
            assert own["parked_count"] == 2 and "shards" not in own
            assert {item["event"]["seq"] for item in own["parked"]} == {
                item["event"]["seq"] for item in parked if item["shard"] == 1
            }
            # Every shard's leader refused them (attempts of every shard's ids).
            assert {item["event"]["id"] for item in parked} <= set(receiver.refused)

            receiver.refusing = None
            assert client.retry_parked(sub["id"]) == {
                "retried": len(ids),
                "shards": [{"shard": k, "copied": True, "retried": 2} for k in range(SHARDS)],
            }
            wanted = {item["event"]["id"] for item in parked}
            assert wait_for(lambda: wanted <= set(receiver.ids), 60), (wanted, receiver.ids)
            assert {event["shard"] for event in receiver.arrivals} == set(range(SHARDS))
            assert {event["data"]["job_id"] for event in receiver.arrivals} == set(ids)
            assert wait_for(lambda: view()["parked_count"] == 0, 30), view()
            seen = view()
            assert seen["parked"] == []
            assert [part["parked_count"] for part in seen["shards"]] == [0] * SHARDS
            assert receiver.bad_signatures == 0
            # A subscription no shard has is 404, for the view and the retry.
            for call in (client.get_subscription, client.retry_parked):
                with pytest.raises(ApiError) as missing:
                    call("sub_nowhere")
                assert missing.value.status == 404 and missing.value.code == "not_found"
            client.delete_subscription(sub["id"])
    finally:
        for one in clients:
            one.close()


# -- the internal routes ------------------------------------------------------------------


def _over_socket(path: Path, body: dict[str, Any], headers: dict[str, str]) -> int:
    """POST a JSON body to a shard process's internal route over its socket."""

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(str(path))

    connection = UnixConnection("shard", timeout=10)
    try:
        connection.request(
            "POST",
            "/v1/internal/shard/propose",
            json.dumps(body),
            {"Content-Type": "application/json", **headers},
        )
        return connection.getresponse().status
    finally:
        connection.close()


def test_the_internal_routes_are_a_nodes_own(sharded: LocalCluster) -> None:
    """No client reaches a shard process's internal routes through a node
    (it has no such route, and drops the key header), and a shard process
    refuses them without its node's key."""
    command = {"kind": "SetQueue", "fields": ["sneaky", True, None, None, None, None, 5000]}
    for url in sharded.urls:
        for headers in ({}, {"Raftsched-Shard": "1", INTERNAL_KEY_HEADER: "x" * 64}):
            status, _, _ = http_json(
                "POST", f"{url}/v1/internal/shard/propose", {"commands": [command]}, headers=headers
            )
            assert status == 404, (url, status)
    node = next(iter(sharded.nodes.values()))
    path = socket_path(node.data_dir, 1)
    assert _over_socket(path, {"commands": [command]}, {}) == 401
    assert _over_socket(path, {"commands": [command]}, {INTERNAL_KEY_HEADER: "0" * 64}) == 401
