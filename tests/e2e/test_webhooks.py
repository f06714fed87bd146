"""Webhook delivery end to end: a misbehaving receiver, parking, a leader kill,
and the targets a node refuses (loopback, metadata) at creation and at delivery."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from e2e_support import cluster_env

from raftsched.client import Client
from raftsched.testing import LocalCluster, assert_no_secrets_in_logs, http_json

SECRET = "s3cret"
WEBHOOK_ENV = {
    "RAFTSCHED_WEBHOOK_TIMEOUT_S": "0.5",
    "RAFTSCHED_WEBHOOK_BACKOFF_S": "0.05",
    "RAFTSCHED_WEBHOOK_BACKOFF_MAX_S": "0.2",
    "RAFTSCHED_WEBHOOK_MAX_ATTEMPTS": "4",
}


class Receiver:
    """A loopback webhook endpoint. `mode(event_seq, attempt)` says what to do:
    `fail` (record, answer 500: the leader will send it again), `slow` (record,
    answer after the sender gave up), `ok`, or `down` (500, not recorded)."""

    def __init__(self) -> None:
        self.arrivals: list[dict[str, Any]] = []
        self.bad_signatures = 0
        self.attempts: Counter[str] = Counter()
        self.always_down = False
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        runner = self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self.loop.run_forever()

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        if request.headers.get("Raftsched-Signature") != expected:
            self.bad_signatures += 1
            return web.Response(status=400)
        event_id = request.headers["Raftsched-Event-Id"]
        if self.always_down:
            return web.Response(status=503)
        self.attempts[event_id] += 1
        attempt = self.attempts[event_id]
        event = json.loads(body)
        assert event["id"] == event_id
        self.arrivals.append(event)
        if attempt == 1 and event["seq"] % 3 == 0:
            return web.Response(status=500)  # recorded, yet it will come again
        if attempt == 1 and event["seq"] % 3 == 1:
            await asyncio.sleep(1.0)  # past the sender's timeout: a duplicate
        return web.Response(status=204)

    def stop(self) -> None:
        async def cleanup() -> None:
            await self._runner.cleanup()
            # Handlers still sleeping (a "slow" answer) end here, not as
            # tasks destroyed while pending, which asyncio logs as errors.
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cleanup(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.stop()


@pytest.fixture
def hook_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path / "cluster", size=3, env={**cluster_env(), **WEBHOOK_ENV})
    local.start()
    try:
        local.wait_for_leader(timeout_s=30)
        yield local
    finally:
        local.stop()


def _make_events(client: Client, count: int, tag: str) -> list[str]:
    """`count` job.cancelled events (submit, then cancel each job)."""
    ids = []
    for index in range(count):
        job = client.submit("hooks", {"n": index}, idempotency_key=f"{tag}:{index}")
        client.cancel_job(job["id"])
        ids.append(job["id"])
    return ids


def _wait(predicate: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.slow
def test_every_event_arrives_at_least_once_signed_and_dedupes_to_exactly_once(
    hook_cluster: LocalCluster, receiver: Receiver
) -> None:
    with Client(hook_cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        sub = client.create_subscription(
            receiver.url, SECRET, ["job.cancelled"], subscription_id="sub_test"
        )
        assert sub["cursor_seq"] == 0
        jobs = _make_events(client, 12, "a")
        # The leader dies mid-stream; the next one resumes from the replicated cursor.
        hook_cluster.kill(hook_cluster.wait_for_leader())
        hook_cluster.wait_for_leader(timeout_s=30)
        jobs += _make_events(client, 12, "b")

        def job_ids_seen() -> set[str]:
            return {event["data"]["job_id"] for event in receiver.arrivals}

        _wait(lambda: job_ids_seen() >= set(jobs), 60)
        assert receiver.bad_signatures == 0
        unique = {event["id"]: event for event in receiver.arrivals}
        assert len(receiver.arrivals) > len(unique)  # duplicates did happen
        assert {e["data"]["job_id"] for e in unique.values()} == set(jobs)
        assert all(e["type"] == "job.cancelled" for e in unique.values())
        last = client.events(0, types=["job.cancelled"])["last_seq"]
        _wait(lambda: client.get_subscription("sub_test")["cursor_seq"] == last)
        assert client.get_subscription("sub_test")["parked_count"] == 0
        metrics = client.metrics()
        assert "raftsched_outbox_depth" in metrics


@pytest.mark.slow
def test_a_receiver_that_stays_down_gets_events_parked_then_retried(
    hook_cluster: LocalCluster, receiver: Receiver
) -> None:
    receiver.always_down = True
    with Client(hook_cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        client.create_subscription(receiver.url, SECRET, ["job.*"], subscription_id="sub_down")
        jobs = _make_events(client, 3, "c")
        _wait(lambda: client.get_subscription("sub_down")["parked_count"] == 3)
        parked = client.get_subscription("sub_down")["parked"]
        assert {p["event"]["data"]["job_id"] for p in parked} == set(jobs)
        assert all(p["attempts"] == 4 and p["error"] == "HTTP 503" for p in parked)
        receiver.always_down = False
        assert client.retry_parked("sub_down") == {"retried": 3}
        _wait(lambda: client.get_subscription("sub_down")["parked_count"] == 0)
        assert {e["data"]["job_id"] for e in receiver.arrivals} == set(jobs)
        client.delete_subscription("sub_down")
        assert client.list_subscriptions() == []


REFUSED_TARGETS = [
    "http://169.254.169.254/latest/meta-data/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://[fd00:ec2::254]/latest",
    "http://10.0.0.1/hook",
]


@pytest.mark.slow
def test_a_node_refuses_loopback_and_metadata_targets_at_creation_and_at_delivery(
    tmp_path: Path, receiver: Receiver
) -> None:
    hook_secret = "refusal-test-hook-secret"
    # First the cluster allows loopback (as test clusters do) and takes a
    # subscription to the receiver; then the operator restarts every node
    # with the default policy, which refuses loopback.
    local = LocalCluster(tmp_path / "cluster", size=3, env={**cluster_env(), **WEBHOOK_ENV})
    with local, Client(local.urls, timeout_s=10, retry_budget_s=30) as client:
        local.wait_for_leader(timeout_s=30)
        client.create_subscription(
            receiver.url, hook_secret, ["job.cancelled"], subscription_id="sub_tight"
        )
        local.stop()
        local.webhook_allow_cidrs = ()
        local.start()
        leader = local.nodes[local.wait_for_leader(timeout_s=30)]

        local_targets = [receiver.url, f"http://localhost:{receiver.port}/hook"]
        for url in local_targets + REFUSED_TARGETS:
            body = {"url": url, "secret": hook_secret, "types": []}
            status, answer, _ = http_json("POST", leader.http_url + "/v1/subscriptions", body)
            assert status == 400, (url, answer)
            assert answer["error"]["code"] == "invalid_request"
            assert answer["error"]["details"] == {"field": "url", "reason": "forbidden_target"}
        jobs = _make_events(client, 2, "refused")
        _wait(lambda: client.get_subscription("sub_tight")["parked_count"] == 2, 60)
        parked = client.get_subscription("sub_tight")["parked"]
        assert {p["event"]["data"]["job_id"] for p in parked} == set(jobs)
        assert all(
            p["error"] == "refused: not an allowed webhook target: 127.0.0.1 is a loopback address"
            for p in parked
        ), parked
        assert receiver.arrivals == [] and receiver.bad_signatures == 0  # never sent
    assert_no_secrets_in_logs(
        local, {"webhook": hook_secret, "raft": local.secret_file.read_text().strip()}
    )
