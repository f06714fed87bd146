"""The next claim (`next` on complete, fail and the lease batch) against a real
3-node cluster: the op's answer plus leases that are `claimed`, not running;
the long-poll; the errors; and the worker SDK draining a backlog with far
fewer claim requests than jobs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_support import cluster_env, release_tree

from raftsched import child_processes
from raftsched.client import (
    Client,
    Forbidden,
    InvalidRequest,
    LeaseLost,
    item_error,
    job_request,
    next_claim,
    next_refused,
)
from raftsched.testing import LocalCluster, metrics_text

BACKLOG_JOBS = 200
# The release before `next`: its nodes answer it 400, field `next`.
OLD_RELEASE = "v0.5.0"
OLD_RELEASE_COMMIT = "ef9f73e2e90260555fc49bc7c2f8d797bb49bf90"


def _leased(
    client: Client, queue: str, worker_id: str = "w-next", worker: Client | None = None
) -> dict[str, Any]:
    """A job of `queue`, claimed and started by `worker_id` (through `worker`)."""
    worker = worker or client
    job = client.submit(queue, {"n": 0})
    leases = worker.claim(worker_id, [queue], wait_s=5)
    assert [lease["job_id"] for lease in leases] == [job["id"]]
    worker.start(job["id"], leases[0]["fencing_token"])
    return leases[0]


def _field(error: InvalidRequest) -> str:
    return str(error.details.get("field"))


def test_complete_with_next_answers_the_completion_and_claimed_leases(client: Client) -> None:
    lease = _leased(client, "nx-complete")
    waiting = [client.submit("nx-complete", {"n": n})["id"] for n in (1, 2, 3)]

    answer, granted = client.complete(
        lease["job_id"],
        lease["fencing_token"],
        {"ok": 1},
        next_claim=next_claim(["nx-complete"], max_jobs=2, lease_s=60),
    )
    assert answer == {
        "job_id": lease["job_id"], "status": "succeeded", "replayed": False, "result": {"ok": 1},
    }  # fmt: skip
    assert granted.error is None
    assert [grant["job_id"] for grant in granted.leases] == waiting[:2]  # oldest first
    for grant in granted.leases:
        assert grant["lease_s"] == 60 and grant["fencing_token"] > lease["fencing_token"]
        job = client.get_job(grant["job_id"])
        # Claimed, not running, and in the name of the worker whose lease completed.
        assert job["status"] == "claimed"
        assert job["lease"]["worker_id"] == "w-next"
    first = granted.leases[0]
    assert client.start(first["job_id"], first["fencing_token"])["status"] == "running"
    assert client.get_job(waiting[2])["status"] == "pending"


def test_fail_with_next_claims_for_the_named_worker(client: Client) -> None:
    lease = _leased(client, "nx-fail")
    other = client.submit("nx-fail-other", {"n": 1})
    answer, granted = client.fail(
        lease["job_id"],
        lease["fencing_token"],
        kind="transient",
        message="flaky",
        retry_after_s=60,
        next_claim=next_claim("nx-fail-other", worker_id="w-named"),
    )
    assert answer["job_id"] == lease["job_id"] and answer["status"] == "retry_wait"
    assert [grant["job_id"] for grant in granted.leases] == [other["id"]]
    assert client.get_job(other["id"])["lease"]["worker_id"] == "w-named"


def test_a_rejected_op_is_answered_with_its_error_and_claims_nothing(client: Client) -> None:
    lease = _leased(client, "nx-rejected")
    waiting = client.submit("nx-rejected-next", {"n": 1})
    with pytest.raises(LeaseLost):
        client.complete(
            lease["job_id"],
            lease["fencing_token"] + 1000,
            next_claim=next_claim("nx-rejected-next"),
        )
    assert client.get_job(waiting["id"])["status"] == "pending"
    assert client.get_job(lease["job_id"])["status"] == "running"


def test_batch_with_next_claims_after_the_ops_unless_all_are_refused(client: Client) -> None:
    first, second = _leased(client, "nx-batch"), _leased(client, "nx-batch")
    waiting = [client.submit("nx-batch", {"n": n})["id"] for n in range(3)]
    ops = [
        {"op": "complete", "job_id": first["job_id"], "fencing_token": first["fencing_token"]},
        {"op": "fail", "job_id": second["job_id"], "fencing_token": 1,
         "error": {"kind": "permanent"}},
        {"op": "start", "job_id": "job_nope", "fencing_token": 5, "stray": 1},
    ]  # fmt: skip
    results, granted = client.lease_batch(
        ops, next_claim=next_claim("nx-batch", max_jobs=10, worker_id="w-batch")
    )
    assert results[0]["status"] == "succeeded"
    assert results[1]["error"]["code"] == "lease_lost"
    assert results[2]["error"]["details"]["field"] == "ops[2].stray"
    assert sorted(grant["job_id"] for grant in granted.leases) == sorted(waiting)
    assert {client.get_job(job_id)["status"] for job_id in waiting} == {"claimed"}

    # Every op refused (a stale worker): no claim is made.
    left = client.submit("nx-batch", {"n": 3})["id"]
    stale = [{"op": "complete", "job_id": first["job_id"], "fencing_token": 10**9}]
    results, granted = client.lease_batch(
        stale, next_claim=next_claim("nx-batch", max_jobs=10, worker_id="w-batch")
    )
    assert results[0]["error"]["code"] == "lease_lost", results
    assert granted.leases == [] and client.get_job(left)["status"] == "pending"

    # The batch's claim must name its worker; a bad `next` fails the whole request.
    with pytest.raises(InvalidRequest) as refused:
        client.request("POST", "/v1/leases/batch", body={"ops": ops[:1], "next": {"queues": ["q"]}})
    assert _field(refused.value) == "next.worker_id"


def test_next_long_polls_until_a_job_arrives(client: Client) -> None:
    lease = _leased(client, "nx-poll")
    submitted_at: list[float] = []

    def submit_later() -> None:
        time.sleep(0.6)
        submitted_at.append(time.monotonic())
        client.submit("nx-poll-next", {"late": True})

    thread = threading.Thread(target=submit_later)
    began = time.monotonic()
    thread.start()
    try:
        answer, granted = client.complete(
            lease["job_id"],
            lease["fencing_token"],
            next_claim=next_claim("nx-poll-next", wait_s=20),
        )
    finally:
        thread.join()
    answered_at = time.monotonic()
    assert answer["status"] == "succeeded"
    assert [grant["payload"] for grant in granted.leases] == [{"late": True}]
    assert answered_at - began >= 0.6 and answered_at - submitted_at[0] < 5

    # Nothing arrives: the answer comes after wait_s with no leases.
    quiet = _leased(client, "nx-poll")
    began = time.monotonic()
    _, granted = client.complete(
        quiet["job_id"], quiet["fencing_token"], next_claim=next_claim("nx-empty", wait_s=1)
    )
    assert granted.leases == [] and granted.error is None
    assert 0.9 <= time.monotonic() - began < 5


@pytest.mark.parametrize("op", ["start", "heartbeat"])
def test_start_and_heartbeat_take_no_next(client: Client, op: str) -> None:
    job = client.submit(f"nx-{op}", {})
    lease = client.claim("w-next", [f"nx-{op}"], wait_s=5)[0]
    body = {"fencing_token": lease["fencing_token"], "next": {"queues": [f"nx-{op}"]}}
    with pytest.raises(InvalidRequest) as refused:
        client.request("POST", f"/v1/leases/{job['id']}/{op}", body=body)
    assert _field(refused.value) == "next"
    assert client.get_job(job["id"])["status"] == "claimed"  # nothing was proposed


def test_a_next_claim_outside_the_tokens_queues_is_403_and_changes_nothing(
    cluster: LocalCluster, client: Client
) -> None:
    token = client.request(
        "POST",
        "/v1/tokens",
        body={"name": "nx-worker", "role": "worker", "tenants": ["*"], "queues": ["nx-allowed"]},
    ).json()["secret"]
    # The leader knows the new token at once; a follower may not have applied it yet.
    leader_url = cluster.nodes[cluster.wait_for_leader(timeout_s=30)].http_url
    with Client([leader_url], token=token, timeout_s=10, retry_budget_s=30) as worker:
        lease = _leased(client, "nx-allowed", "w-scoped", worker)
        secret_job = client.submit("nx-secret", {})
        with pytest.raises(Forbidden):
            worker.complete(
                lease["job_id"], lease["fencing_token"], next_claim=next_claim("nx-secret")
            )
        ops = [{"op": "complete", "job_id": lease["job_id"], "fencing_token": 1}]
        with pytest.raises(Forbidden):
            worker.lease_batch(ops, next_claim=next_claim("nx-secret", worker_id="w-scoped"))
        assert client.get_job(lease["job_id"])["status"] == "running"
        assert client.get_job(secret_job["id"])["status"] == "pending"
        # Within its queues the same request goes through.
        _, granted = worker.complete(
            lease["job_id"], lease["fencing_token"], next_claim=next_claim("nx-allowed")
        )
        assert granted.leases == []


def test_bad_next_fields_are_400_naming_them(client: Client) -> None:
    lease = _leased(client, "nx-bad")
    path = f"/v1/leases/{lease['job_id']}/complete"
    cases = [
        ({"queues": []}, "next.queues"),
        ({"queues": ["q"], "max_jobs": 0}, "next.max_jobs"),
        ({"queues": ["q"], "wait_s": 61}, "next.wait_s"),
        ({"queues": ["q"], "lease_s": 0}, "next.lease_s"),
        ({"queues": ["q"], "worker_id": ""}, "next.worker_id"),
        ({"queues": ["q"], "stray": 1}, "next.stray"),
        ([1], "next"),
    ]
    for next_body, field in cases:
        with pytest.raises(InvalidRequest) as refused:
            client.request(
                "POST", path, body={"fencing_token": lease["fencing_token"], "next": next_body}
            )
        assert _field(refused.value) == field, next_body
    assert client.get_job(lease["job_id"])["status"] == "running"


def _requests(cluster: LocalCluster, route: str) -> float:
    """POSTs to `route` answered 200 by any node (a redirect is not counted:
    the leader answers the request again), from the nodes' /metrics."""
    pattern = re.compile(
        r'^raftsched_http_request_duration_seconds_count\{method="POST",route="'
        + re.escape(route)
        + r'",status="200"\} (\S+)$',
        re.M,
    )
    return sum(float(count) for url in cluster.urls for count in pattern.findall(metrics_text(url)))


def _lease_requests(cluster: LocalCluster, form: str) -> float:
    """Requests of lease operations the nodes proposed in `form`, from /metrics."""
    pattern = re.compile(r'^raftsched_lease_requests_total\{form="' + form + r'"\} (\S+)$', re.M)
    return sum(float(count) for url in cluster.urls for count in pattern.findall(metrics_text(url)))


def test_the_sdk_worker_drains_a_backlog_with_few_claim_requests(
    cluster: LocalCluster, client: Client
) -> None:
    """Each finished job's report claims its slot's next job, so the worker
    process sends a handful of `POST /v1/leases`, not one per job."""
    requests = [job_request("nx-drain", {"n": n}) for n in range(BACKLOG_JOBS)]
    answers = client.submit_batch(requests)
    assert [item_error(answer) for answer in answers] == [None] * BACKLOG_JOBS
    claims_before = _requests(cluster, "/v1/leases")
    batches_before = _requests(cluster, "/v1/leases/batch")
    one_command_before = _lease_requests(cluster, "one_command")
    log_path = cluster.root / "worker-drain.log"
    worker = _start_worker(cluster, "nx-drain", log_path)
    try:
        _wait_drained(client, "nx-drain", BACKLOG_JOBS, worker, log_path)
        claims = _requests(cluster, "/v1/leases") - claims_before
        batches = _requests(cluster, "/v1/leases/batch") - batches_before
        one_command = _lease_requests(cluster, "one_command") - one_command_before
    finally:
        _stop(worker)
    print(f"{BACKLOG_JOBS} jobs: {claims:.0f} claim requests, {batches:.0f} lease batches")
    assert 1 <= claims <= BACKLOG_JOBS / 20, claims
    assert batches >= BACKLOG_JOBS / 100, batches  # the reports, with their next claims
    # On a cluster of version 6 each report and its claim went as one command.
    assert one_command >= batches, (one_command, batches)
    # Every job ran once, started before its handler: claimed, then running.
    jobs = client.list_jobs(queue="nx-drain", limit=1000)["jobs"]
    assert len(jobs) == BACKLOG_JOBS
    for job in jobs:
        assert job["result"] == job["payload"]
        (attempt,) = job["attempts"]
        assert attempt["worker_id"] == "w-drain" and attempt["started_at"] is not None
    log_text = log_path.read_text()
    assert '"level": "info"' in log_text  # the worker's JSON lines, as read here
    assert '"level": "error"' not in log_text and "Traceback" not in log_text, log_text[-3000:]
    assert "does not take next claims" not in log_text


def _succeeded(client: Client, queue: str) -> int:
    return len(client.list_jobs(queue=queue, status="succeeded", limit=1000)["jobs"])


def _start_worker(cluster: LocalCluster, queue: str, log_path: Path) -> subprocess.Popen[bytes]:
    """A worker process of today's SDK, four slots, next claims on (the default)."""
    with log_path.open("ab") as log:
        return child_processes.popen(
            [sys.executable, "-m", "raftsched", "worker", "--queue", queue,
             "--handler", "tests.e2e.handlers:echo", "--concurrency", "4",
             "--worker-id", "w-drain", "--poll-wait-s", "2", "--shutdown-grace-s", "5",
             "--url", ",".join(cluster.urls)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **cluster_env()},
        )  # fmt: skip


def _wait_drained(
    client: Client, queue: str, jobs: int, worker: subprocess.Popen[bytes], log_path: Path
) -> None:
    deadline = time.monotonic() + 120
    while _succeeded(client, queue) < jobs:
        assert worker.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{_succeeded(client, queue)} succeeded"
        time.sleep(0.5)


def _stop(worker: subprocess.Popen[bytes]) -> None:
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        raise


@pytest.mark.slow
def test_on_a_cluster_of_the_previous_release_the_worker_claims_separately(
    tmp_path: Path,
) -> None:
    """Nodes of v0.5.0 refuse `next` (400, field `next`) and apply nothing:
    the SDK worker sends each refused batch again plain, says so once at
    warning level, and drains the queue with claims of its own."""
    source = release_tree(OLD_RELEASE, OLD_RELEASE_COMMIT, tmp_path / "old") / "src"
    cluster = LocalCluster(tmp_path / "cluster", size=3, env=cluster_env())
    for node in cluster.nodes.values():
        node.source_dir = source
    cluster.start()
    try:
        cluster.wait_for_leader(timeout_s=60)
        cluster.wait_for_auth(timeout_s=60)
        with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
            assert "NextClaim" not in client.request("GET", "/openapi.json").text()  # old code
            lease = _leased(client, "nx-old")
            with pytest.raises(InvalidRequest) as refused:
                client.complete(
                    lease["job_id"], lease["fencing_token"], next_claim=next_claim("nx-old")
                )
            assert next_refused(refused.value)
            assert client.get_job(lease["job_id"])["status"] == "running"  # nothing applied
            client.complete(lease["job_id"], lease["fencing_token"])

            jobs = 40
            answers = client.submit_batch([job_request("nx-old", {"n": n}) for n in range(jobs)])
            assert [item_error(answer) for answer in answers] == [None] * jobs
            log_path = tmp_path / "worker-old.log"
            worker = _start_worker(cluster, "nx-old", log_path)
            try:
                _wait_drained(client, "nx-old", jobs + 1, worker, log_path)
            finally:
                _stop(worker)
            drained = client.list_jobs(queue="nx-old", limit=1000)["jobs"]
            for job in (job for job in drained if job["id"] != lease["job_id"]):
                assert len(job["attempts"]) == 1 and job["result"] == job["payload"]
        log_text = log_path.read_text()
        (refusal,) = [line for line in log_text.splitlines() if "does not take next" in line]
        assert json.loads(refusal)["level"] == "warning"
        assert '"level": "error"' not in log_text and "Traceback" not in log_text
    finally:
        cluster.stop()
