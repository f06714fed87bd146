"""Webhook delivery end to end: a misbehaving receiver, parking, a leader kill,
and the targets a node refuses (loopback, metadata) at creation and at delivery.
The receiver is e2e_support's (`webhook_receiver`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import WebhookReceiver, cluster_env, started_cluster, webhook_receiver

from raftsched.client import Client
from raftsched.testing import LocalCluster, assert_no_secrets_in_logs, http_json

SECRET = "s3cret"
WEBHOOK_ENV = {
    "RAFTSCHED_WEBHOOK_TIMEOUT_S": "0.5",
    "RAFTSCHED_WEBHOOK_BACKOFF_S": "0.05",
    "RAFTSCHED_WEBHOOK_BACKOFF_MAX_S": "0.2",
    "RAFTSCHED_WEBHOOK_MAX_ATTEMPTS": "4",
}


async def _misbehave(event: dict[str, Any], attempt: int) -> int:
    """The first delivery of every third event is answered 500 (it will come
    again); of the next, after the sender gave up (a duplicate); else 204."""
    if attempt == 1 and event["seq"] % 3 == 0:
        return 500
    if attempt == 1 and event["seq"] % 3 == 1:
        await asyncio.sleep(1.0)
    return 204


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with webhook_receiver(SECRET, _misbehave) as found:
        yield found


@pytest.fixture
def hook_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with started_cluster(tmp_path / "cluster", WEBHOOK_ENV) as local:
        yield local


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
    hook_cluster: LocalCluster, receiver: WebhookReceiver
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
        assert [event["id"] for event in receiver.arrivals] == receiver.ids
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
    hook_cluster: LocalCluster, receiver: WebhookReceiver
) -> None:
    receiver.refusing = 503
    with Client(hook_cluster.urls, timeout_s=10, retry_budget_s=30) as client:
        client.create_subscription(receiver.url, SECRET, ["job.*"], subscription_id="sub_down")
        jobs = _make_events(client, 3, "c")
        _wait(lambda: client.get_subscription("sub_down")["parked_count"] == 3)
        parked = client.get_subscription("sub_down")["parked"]
        assert {p["event"]["data"]["job_id"] for p in parked} == set(jobs)
        assert all(p["attempts"] == 4 and p["error"] == "HTTP 503" for p in parked)
        receiver.refusing = None
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
    tmp_path: Path, receiver: WebhookReceiver
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
