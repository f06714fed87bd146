"""The HTTP contract against a real 3-node cluster: redirects, errors, leases."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

import pytest

from raftsched.client import Client, IdempotencyConflict, LeaseLost
from raftsched.testing import LocalCluster, http_json, metrics_text


def leader_and_follower(cluster: LocalCluster) -> tuple[str, str]:
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    return cluster.nodes[leader].http_url, cluster.nodes[follower].http_url


def test_write_to_follower_is_redirected_to_leader_keeping_method(cluster: LocalCluster) -> None:
    leader_url, follower_url = leader_and_follower(cluster)
    deadline = time.monotonic() + 5
    while True:  # until the follower has heard from the new leader
        status, body, headers = http_json("POST", follower_url + "/v1/jobs?x=1", {"queue": "q"})
        if status != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status == 307, (status, body)
    assert headers["Location"] == leader_url + "/v1/jobs?x=1"
    assert headers["Raftsched-Leader"] == cluster.wait_for_leader()
    # Following it by hand with the same method and body creates the job.
    status, body, _ = http_json("POST", headers["Location"].replace("?x=1", ""), {"queue": "q"})
    assert status == 201 and body["job"]["status"] == "pending"


def test_linearizable_read_on_follower_redirects_and_stale_read_answers(
    cluster: LocalCluster, client: Client
) -> None:
    job = client.submit("reads", {"n": 1})
    _, follower_url = leader_and_follower(cluster)
    status, _, headers = http_json("GET", f"{follower_url}/v1/jobs/{job['id']}")
    assert status == 307
    deadline = time.monotonic() + 5
    while True:  # the follower applies the submit shortly after the leader
        status, body, headers = http_json(
            "GET", f"{follower_url}/v1/jobs/{job['id']}?consistency=stale"
        )
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status == 200 and body["job"]["id"] == job["id"]
    assert int(headers["Raftsched-Applied-Index"]) > 0


def test_idempotent_resubmission_returns_original_and_conflict_on_change(
    cluster: LocalCluster, client: Client
) -> None:
    leader_url, _ = leader_and_follower(cluster)
    request = {"queue": "pay", "payload": {"a": 1, "b": 2}, "idempotency_key": "charge:1"}
    status, first, _ = http_json("POST", leader_url + "/v1/jobs", request)
    assert status == 201
    reordered = {"queue": "pay", "payload": {"b": 2, "a": 1}, "idempotency_key": "charge:1"}
    status, again, headers = http_json("POST", leader_url + "/v1/jobs", reordered)
    assert status == 200 and headers.get("Idempotent-Replayed") == "true"
    assert again["job"]["id"] == first["job"]["id"]
    with pytest.raises(IdempotencyConflict):
        client.submit("pay", {"a": 2}, idempotency_key="charge:1")


def test_long_poll_claim_returns_as_soon_as_a_job_is_submitted(client: Client) -> None:
    leases: list[Any] = []
    waited: list[float] = []

    def claim() -> None:
        started = time.monotonic()
        leases.extend(client.claim("w-poll", ["wake"], wait_s=15, lease_s=30))
        waited.append(time.monotonic() - started)

    thread = threading.Thread(target=claim)
    thread.start()
    time.sleep(1.0)
    submitted_at = time.monotonic()
    job = client.submit("wake", {"x": 1})
    thread.join(timeout=20)
    assert len(leases) == 1 and leases[0]["job_id"] == job["id"]
    assert waited[0] < 1.0 + (time.monotonic() - submitted_at) + 0.5
    assert waited[0] < 5.0


def test_claim_start_heartbeat_complete_and_stale_token(client: Client) -> None:
    job = client.submit("work", {"n": 1}, lease_s=30)
    [lease] = client.claim("w1", ["work"], wait_s=5)
    token = lease["fencing_token"]
    assert lease["job_id"] == job["id"] and lease["attempt"] == 1
    client.start(job["id"], token)
    beat = client.heartbeat(job["id"], token, extend_s=60)
    assert beat["cancel_requested"] is False
    with pytest.raises(LeaseLost):
        client.complete(job["id"], token - 1, {"ok": False})
    done = client.complete(job["id"], token, {"ok": True})
    assert done["status"] == "succeeded"
    # A repeated completion with the same token returns the original result.
    again = client.complete(job["id"], token, {"ok": "different"})
    assert again["replayed"] is True and again["result"] == {"ok": True}
    final = client.get_job(job["id"])
    assert final["status"] == "succeeded" and final["result"] == {"ok": True}
    assert [a["outcome"] for a in final["attempts"]] == ["succeeded"]


def test_cancel_running_job_is_cooperative(client: Client) -> None:
    job = client.submit("cancel", {})
    [lease] = client.claim("w1", ["cancel"], wait_s=5)
    client.start(job["id"], lease["fencing_token"])
    cancelled = client.cancel_job(job["id"], reason="user asked")
    assert cancelled["status"] == "running" and cancelled["cancel_requested"] is True
    beat = client.heartbeat(job["id"], lease["fencing_token"])
    assert beat["cancel_requested"] is True
    client.fail(job["id"], lease["fencing_token"], kind="cancelled", message="stopped")
    assert client.get_job(job["id"])["status"] == "cancelled"
    queued = client.submit("cancel-queued", {})
    assert client.cancel_job(queued["id"])["status"] == "cancelled"


def test_dead_letter_and_replay(client: Client) -> None:
    job = client.submit("dlq", {}, max_attempts=1)
    [lease] = client.claim("w1", ["dlq"], wait_s=5)
    client.start(job["id"], lease["fencing_token"])
    failed = client.fail(job["id"], lease["fencing_token"], kind="transient", message="boom")
    assert failed["status"] == "dead_letter"
    assert client.get_job(job["id"])["last_error"] == {"kind": "transient", "message": "boom"}
    replayed = client.replay_job(job["id"], reason="fixed the bug")
    assert replayed["status"] == "pending" and replayed["id"] == job["id"]
    [again] = client.claim("w2", ["dlq"], wait_s=5)
    assert again["fencing_token"] > lease["fencing_token"]
    client.complete(job["id"], again["fencing_token"], {"ok": 1})
    history = [e["event"] for e in client.job_history(job["id"])]
    assert "replay" in history


def test_effects_ledger_is_first_writer_wins_and_fenced(client: Client) -> None:
    job = client.submit("fx", {})
    [lease] = client.claim("w1", ["fx"], wait_s=5)
    token = lease["fencing_token"]
    first = client.record_effect("charge:9", job["id"], token, {"charge": "ch_1"})
    assert first["replayed"] is False
    second = client.record_effect("charge:9", job["id"], token, {"charge": "ch_2"})
    assert second["replayed"] is True and second["effect"]["result"] == {"charge": "ch_1"}
    with pytest.raises(LeaseLost):
        client.record_effect("charge:10", job["id"], token + 1000, {"x": 1})
    assert client.get_effect("charge:9")["fencing_token"] == token


BAD_REQUESTS: list[tuple[str, str, Any, str]] = [
    ("POST", "/v1/jobs", {"queue": "q", "unknown": 1}, "unknown"),
    ("POST", "/v1/jobs", {}, "queue"),
    ("POST", "/v1/jobs", {"queue": 5}, "queue"),
    ("POST", "/v1/jobs", {"queue": "q", "priority": 101}, "priority"),
    ("POST", "/v1/jobs", {"queue": "q", "priority": True}, "priority"),
    ("POST", "/v1/jobs", {"queue": "q", "run_at": "2026-12-01T09:00:00Z", "delay_s": 3}, "delay_s"),
    ("POST", "/v1/jobs", {"queue": "q", "run_at": "tomorrow"}, "run_at"),
    ("POST", "/v1/jobs", {"queue": "q", "max_attempts": 0}, "max_attempts"),
    ("POST", "/v1/jobs", {"queue": "q", "backoff": {"initial_s": 5, "max_s": 1}}, "backoff.max_s"),
    ("POST", "/v1/jobs", {"queue": "q", "labels": {"a": 1}}, "labels"),
    ("POST", "/v1/jobs", [1, 2], "body"),
    ("POST", "/v1/jobs/batch", {"jobs": []}, "jobs"),
    ("POST", "/v1/jobs/batch", {"jobs": [{"queue": "q"}, {"queue": ""}]}, "jobs[1].queue"),
    ("GET", "/v1/jobs?status=bogus", None, "status"),
    ("GET", "/v1/jobs?limit=0", None, "limit"),
    ("GET", "/v1/jobs?consistency=eventual", None, "consistency"),
    ("POST", "/v1/leases", {"worker_id": "w", "queues": []}, "queues"),
    ("POST", "/v1/leases", {"worker_id": "w", "queues": ["q"], "wait_s": 999}, "wait_s"),
    ("POST", "/v1/leases/job_x/start", {}, "fencing_token"),
    ("POST", "/v1/leases/job_x/heartbeat", {"fencing_token": "7"}, "fencing_token"),
    ("POST", "/v1/leases/job_x/fail", {"fencing_token": 1, "error": {"kind": "odd"}}, "error.kind"),
    ("POST", "/v1/leases/batch", {"ops": "start"}, "ops"),
    ("POST", "/v1/effects", {"key": "k", "job_id": "j"}, "fencing_token"),
    ("POST", "/v1/jobs/job_x/cancel", {"reason": 7}, "reason"),
]


def test_bad_input_gets_400_naming_the_field_and_commits_nothing(cluster: LocalCluster) -> None:
    leader_url, _ = leader_and_follower(cluster)
    cluster.wait_converged()
    before = cluster.digests()[cluster.wait_for_leader()]
    for method, path, body, field in BAD_REQUESTS:
        status, answer, _ = http_json(method, leader_url + path, body)
        assert status == 400, (path, body, answer)
        assert answer["error"]["code"] == "invalid_request"
        assert answer["error"]["details"]["field"] == field, (path, body, answer)
    # Raw garbage and oversized bodies.
    status, answer, _ = raw_post(leader_url + "/v1/jobs", b"{not json")
    assert status == 400 and answer["error"]["details"]["field"] == "body"
    # Python's json module accepts these; they are not JSON and are refused.
    for not_json in (
        b'{"queue": "q", "payload": {"amount": NaN}}',
        b'{"queue": "q", "payload": [Infinity]}',
        b'{"queue": "q", "payload": "\\ud800"}',
        b'{"queue": "q", "payload": "\xff"}',
    ):
        status, answer, _ = raw_post(leader_url + "/v1/jobs", not_json)
        assert status == 400, (not_json, answer)
        assert answer["error"]["code"] == "invalid_request"
        assert answer["error"]["details"]["field"] == "body"
        assert "not valid JSON" in answer["error"]["message"]
    status, answer, _ = raw_post(leader_url + "/v1/jobs", b'{"queue": "' + b"x" * 1_100_000 + b'"}')
    assert status == 413 and answer["error"]["code"] == "payload_too_large"
    assert answer["error"]["details"] == {"max_body_bytes": 1024 * 1024}  # the default
    assert cluster.digests()[cluster.wait_for_leader()] == before


def test_unknown_job_and_route_are_404_and_stale_lease_ops_are_409(
    client: Client, cluster: LocalCluster
) -> None:
    leader_url, _ = leader_and_follower(cluster)
    status, body, _ = http_json("GET", leader_url + "/v1/jobs/job_nope")
    assert status == 404 and body["error"]["code"] == "not_found"
    status, body, _ = http_json("GET", leader_url + "/v1/nothing-here")
    assert status == 404 and body["error"]["code"] == "not_found"
    status, body, _ = http_json(
        "POST", leader_url + "/v1/leases/job_nope/start", {"fencing_token": 1}
    )
    assert status in (404, 409)
    job = client.submit("q409", {})
    status, body, _ = http_json(
        "POST", f"{leader_url}/v1/leases/{job['id']}/complete", {"fencing_token": 12345}
    )
    assert status == 409 and body["error"]["code"] == "lease_lost"
    status, body, _ = http_json("POST", f"{leader_url}/v1/jobs/{job['id']}/replay", {})
    assert status == 400 and body["error"]["details"] == {"field": "reason"}
    status, body, _ = http_json(
        "POST", f"{leader_url}/v1/jobs/{job['id']}/replay", {"reason": "try it"}
    )
    assert status == 409 and body["error"]["code"] == "invalid_state"


def test_lease_batch_ops_succeed_or_fail_each_on_their_own(client: Client) -> None:
    jobs = [client.submit("batchq", {"i": i}) for i in range(3)]
    leases = client.claim("wb", ["batchq"], max_jobs=3, wait_s=5)
    assert len(leases) == 3
    ops = [
        {"op": "start", "job_id": lease["job_id"], "fencing_token": lease["fencing_token"]}
        for lease in leases
    ]
    stale = max(lease["fencing_token"] for lease in leases) + 1000
    ops.append({"op": "start", "job_id": jobs[0]["id"], "fencing_token": stale})
    ops.append({"op": "bogus", "job_id": jobs[0]["id"], "fencing_token": stale})
    results = client.lease_batch(ops)
    assert [r.get("status") for r in results[:3]] == ["running"] * 3
    assert results[3]["error"]["code"] == "lease_lost"
    assert results[4]["error"]["code"] == "invalid_request"


def test_request_id_is_echoed_and_metrics_are_served(cluster: LocalCluster) -> None:
    leader_url, _ = leader_and_follower(cluster)
    import urllib.request

    request = urllib.request.Request(leader_url + "/healthz", headers={"X-Request-Id": "abc-1"})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.headers["X-Request-Id"] == "abc-1"
    text = metrics_text(leader_url)
    for name in (
        "raftsched_raft_term",
        "raftsched_raft_commit_index",
        "raftsched_jobs",
        "raftsched_http_request_duration_seconds_bucket",
        "raftsched_raft_is_leader",
        'raftsched_gc_pause_seconds_total{generation="0"}',
        'raftsched_gc_pause_max_seconds{generation="1"}',
        'raftsched_gc_collections_total{generation="2"}',
    ):
        assert name in text, name


def test_raft_port_rejects_unauthenticated_garbage(cluster: LocalCluster, client: Client) -> None:
    leader = cluster.wait_for_leader()
    for node in cluster.nodes.values():
        with socket.create_connection(("127.0.0.1", node.raft_port), timeout=2) as sock:
            # A pickle that would run code if the port trusted its input.
            sock.sendall(b"\x00\x00\x00\x30" + b"cos\nsystem\n(S'touch /tmp/pwned'\ntR." * 3)
            time.sleep(0.2)
    job = client.submit("after-garbage", {})
    assert job["status"] == "pending"
    assert cluster.wait_for_leader() == leader


def raw_post(url: str, data: bytes) -> tuple[int, dict[str, Any], dict[str, str]]:
    import urllib.error
    import urllib.request

    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {os.environ['RAFTSCHED_TOKEN']}",
    }
    request = urllib.request.Request(url, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)
