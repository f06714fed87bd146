"""Job kinds on real 3-node clusters (issue 20, cluster version 8).

One worker process (`raftsched worker` with a handler per kind) serves two
kinds and the jobs without one from one pool of slots, at most one
`charge` job at a time; a job of a kind it has no handler for waits for a
worker that has one, and a pool that alone serves its queues
(`--dead-letter-unknown-kinds`) dead-letters it with `no_handler_for_kind`.

On a cluster whose version is 7 (one member runs release 0.7.0's code) a
kind is refused everywhere it can be given (409 `cluster_version`, field
`kind`), a claim of kinds too, and the worker falls back: it claims without
kinds for its default handler. Once that member runs today's code the
version is raised to 8, and the same running worker takes jobs of kinds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import cluster_env, lead_on, release_tree

from raftsched import child_processes
from raftsched.client import (
    Client,
    ClusterVersionTooLow,
    job_request,
    kinds_refused,
)
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.node.versions import POLL_PERIOD_S
from raftsched.testing import LocalCluster, wait_for

KINDS_VERSION = 8
# Release 0.7.0 (cluster version 7): written on this commit of main.
VERSION_7 = "v0.7.0"
VERSION_7_COMMIT = "7f273a934790110964b4577eb3fed50f010a65c5"
QUEUE = "kinds"
CHARGES, EMAILS, PLAIN = 5, 6, 3


def _wait_version(
    client: Client, version: int, timeout_s: float = 30, *, at_least: bool = False
) -> None:
    def reached() -> bool:
        current = client.cluster().get("cluster_version") or 0
        return current >= version if at_least else current == version

    assert wait_for(reached, timeout_s), client.cluster()


def _start_worker(
    cluster: LocalCluster, log_path: Path, sink: Path, *options: str
) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return child_processes.popen(
            [sys.executable, "-m", "raftsched", "worker", "--queue", QUEUE,
             "--poll-wait-s", "1", "--shutdown-grace-s", "5", "--log-format", "json",
             *options, "--url", ",".join(cluster.urls)],
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, **cluster_env(), "RAFTSCHED_TEST_SINK": str(sink)},
        )  # fmt: skip


def _stop(worker: subprocess.Popen[bytes]) -> None:
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        raise


def _log_lines(log_path: Path) -> list[dict[str, Any]]:
    text = log_path.read_text()
    assert "Traceback" not in text, text[-3000:]
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert not [line for line in lines if line["level"] == "error"], text[-3000:]
    return lines


def _ran(sink: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in sink.read_text().splitlines()] if sink.exists() else []


def _most_at_once(runs: list[dict[str, Any]]) -> int:
    """How many of `runs` overlapped at most (their handlers' start and end)."""
    edges = sorted([(run["start"], 1) for run in runs] + [(run["end"], -1) for run in runs])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _succeeded(client: Client, ids: list[str]) -> bool:
    return all(client.get_job(job_id)["status"] == "succeeded" for job_id in ids)


@pytest.fixture
def worker_log(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "worker.log"
    yield path
    if path.exists():
        print(path.read_text()[-4000:])


def test_one_pool_serves_two_kinds_within_their_limits_and_leaves_or_dead_letters_others(
    cluster: LocalCluster, client: Client, tmp_path: Path, worker_log: Path
) -> None:
    _wait_version(client, COMMAND_VERSION_MAX)
    assert COMMAND_VERSION_MAX >= KINDS_VERSION
    requests = (
        [job_request(QUEUE, {"n": n}, kind="charge") for n in range(CHARGES)]
        + [job_request(QUEUE, {"n": n}, kind="email.send") for n in range(EMAILS)]
        + [job_request(QUEUE, {"n": n}) for n in range(PLAIN)]
        + [job_request(QUEUE, {"n": 0}, kind="refund")]
    )
    jobs = [item["job"] for item in client.submit_batch(requests)]
    assert [job["kind"] for job in jobs[:CHARGES]] == ["charge"] * CHARGES
    served = [job["id"] for job in jobs[:-1]]
    refund = jobs[-1]["id"]
    listed = [job["id"] for job in client.iter_jobs(queue=QUEUE, kind="email.send")]
    assert sorted(listed) == sorted(job["id"] for job in jobs if job["kind"] == "email.send")

    sink = tmp_path / "ran.jsonl"
    worker = _start_worker(
        cluster, worker_log, sink,
        "--handler", "charge=tests.e2e.handlers:charge_kind",
        "--handler", "email.send=tests.e2e.handlers:email_kind",
        "--handler", "tests.e2e.handlers:default_kind",
        "--kind-concurrency", "charge=1", "--concurrency", "4", "--worker-id", "w-kinds",
    )  # fmt: skip
    try:
        assert wait_for(lambda: _succeeded(client, served), 90), _ran(sink)
        time.sleep(1.5)  # a poll or two more: the refund job is not taken
        assert worker.poll() is None
    finally:
        _stop(worker)
    for job in jobs[:-1]:
        done = client.get_job(job["id"])
        expected = {"charge": "charge", "email.send": "email", None: "default"}[job["kind"]]
        assert done["result"]["handled_by"] == expected, done
        assert done["result"]["kind"] == job["kind"] and len(done["attempts"]) == 1
    waiting = client.get_job(refund)
    assert waiting["status"] == "pending" and waiting["attempts"] == [], waiting
    runs = _ran(sink)
    by_kind = {
        kind: [run for run in runs if run["kind"] == kind] for kind in ("charge", "email.send")
    }
    assert len(by_kind["charge"]) == CHARGES and len(by_kind["email.send"]) == EMAILS
    assert _most_at_once(by_kind["charge"]) == 1, by_kind["charge"]
    assert _most_at_once(runs) >= 2  # the other slots worked on meanwhile
    # The cluster agrees: no two charge attempts' leases were running at once.
    attempts = sorted(
        (client.get_job(job["id"])["attempts"][0] for job in jobs[:CHARGES]),
        key=lambda attempt: attempt["started_at"],
    )
    for first, then in zip(attempts, attempts[1:], strict=False):
        assert then["started_at"] >= first["ended_at"], (first, then)
    claims = [line for line in _log_lines(worker_log) if line.get("msg") == "worker started"]
    assert claims and claims[0]["kinds"] == "charge,email.send" and claims[0]["default_handler"]

    # A pool that alone serves the queue takes what it has no handler for
    # and dead-letters it, unstarted, naming the kind.
    lone_log = tmp_path / "lone.log"
    lone = _start_worker(
        cluster, lone_log, sink,
        "--handler", "charge=tests.e2e.handlers:charge_kind", "--dead-letter-unknown-kinds",
        "--worker-id", "w-lone",
    )  # fmt: skip
    try:
        dead = wait_for(lambda: client.get_job(refund)["status"] == "dead_letter", 60)
        assert dead, client.get_job(refund)
    finally:
        _stop(lone)
    job = client.get_job(refund)
    assert job["last_error"]["kind"] == "permanent"
    message = job["last_error"]["message"]
    assert message.startswith("no_handler_for_kind: worker w-lone has no handler for kind 'refund'")
    assert "'charge'" in message
    (attempt,) = job["attempts"]
    assert attempt["started_at"] is None and attempt["outcome"] == "failed"
    dead_letters = [line for line in _log_lines(lone_log) if "dead-lettered" in line["msg"]]
    assert len(dead_letters) == 1 and dead_letters[0]["level"] == "warning"
    cluster.wait_converged(timeout_s=30)


@pytest.mark.slow
def test_a_cluster_at_version_7_refuses_kinds_and_the_worker_falls_back_until_it_is_raised(
    tmp_path: Path, worker_log: Path
) -> None:
    source = release_tree(VERSION_7, VERSION_7_COMMIT, tmp_path / "v7") / "src"
    cluster = LocalCluster(tmp_path / "cluster", size=3, env=cluster_env())
    old = sorted(cluster.nodes)[-1]
    cluster.nodes[old].source_dir = source  # release 0.7.0's code, today's venv
    cluster.start()
    worker: subprocess.Popen[bytes] | None = None
    try:
        cluster.wait_for_leader(timeout_s=60)
        cluster.wait_for_auth(timeout_s=60)
        lead_on(cluster, set(cluster.nodes) - {old})  # requests meet today's code
        with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
            _wait_version(client, 7, timeout_s=4 * POLL_PERIOD_S)
            time.sleep(POLL_PERIOD_S + 1)
            assert client.cluster()["cluster_version"] == 7  # held by the old member
            _refused_everywhere(cluster, client)

            sink = tmp_path / "ran.jsonl"
            worker = _start_worker(
                cluster, worker_log, sink,
                "--handler", "charge=tests.e2e.handlers:charge_kind",
                "--handler", "tests.e2e.handlers:default_kind", "--worker-id", "w-fallback",
            )  # fmt: skip
            plain = [client.submit(QUEUE, {"n": n})["id"] for n in range(4)]
            assert wait_for(lambda: _succeeded(client, plain), 60), _ran(sink)
            assert {run["handled_by"] for run in _ran(sink)} == {"default"}

            # The last member runs today's code: the version goes to 8 (or
            # past it, to today's), and the running worker takes a job of a
            # kind with its handler.
            cluster.kill(old, signal.SIGTERM)
            cluster.nodes[old].source_dir = None
            cluster.start(old)
            cluster.wait_for_leader(timeout_s=60)
            _wait_version(client, KINDS_VERSION, timeout_s=6 * POLL_PERIOD_S, at_least=True)
            charged = client.submit(QUEUE, {"n": 9}, kind="charge")
            assert charged["kind"] == "charge"
            assert wait_for(lambda: _succeeded(client, [charged["id"]]), 60), _ran(sink)
            assert client.get_job(charged["id"])["result"]["handled_by"] == "charge"
            leases = client.claim("w-probe", [QUEUE], wait_s=0, kinds=["charge"])
            assert leases == []  # claims of kinds are taken now
            cluster.wait_converged(timeout_s=60)
        _stop(worker)
        worker = None
        lines = _log_lines(worker_log)
        refusals = [line for line in lines if "does not take job kinds" in line["msg"]]
        assert len(refusals) == 1 and refusals[0]["level"] == "warning", refusals
    finally:
        if worker is not None:
            _stop(worker)
        cluster.stop()


def _refused_everywhere(cluster: LocalCluster, client: Client) -> None:
    """A kind in a job, a batch, a schedule's template, a workflow's step, and
    a claim of kinds: 409 `cluster_version` through every node of today's
    code (to a leader of today's code), nothing created."""
    body = {"id": "kinds-nightly", "interval_s": 3600,
            "job": {"queue": QUEUE, "kind": "report"}}  # fmt: skip
    workflow = {"steps": [{"name": "pay", "queue": QUEUE, "kind": "charge"}]}
    attempts = [
        lambda c: c.submit(QUEUE, {"n": 1}, kind="charge", idempotency_key="k1"),
        lambda c: c.submit_batch([job_request(QUEUE), job_request(QUEUE, kind="charge")]),
        lambda c: c.request("POST", "/v1/schedules", body=body),
        lambda c: c.request("POST", "/v1/workflows", body=workflow),
    ]
    for node_id, node in cluster.nodes.items():
        if node.source_dir is not None:
            continue
        with Client(node.http_url, timeout_s=10, retry_budget_s=30) as on_node:
            for attempt in attempts:
                with pytest.raises(ClusterVersionTooLow) as refused:
                    attempt(on_node)
                error = refused.value
                assert (error.field, error.command_version, error.cluster_version) == (
                    "kind", KINDS_VERSION, 7,
                ), (node_id, error.details)  # fmt: skip
            with pytest.raises(ClusterVersionTooLow) as refused_claim:
                on_node.claim("w", [QUEUE], wait_s=5, kinds=["charge", None])
            assert kinds_refused(refused_claim.value)
            assert refused_claim.value.details["command"] == "ClaimJobsOfKinds"
    assert client.list_jobs(queue=QUEUE)["jobs"] == []
    assert client.request("GET", "/v1/schedules").json()["schedules"] == []
