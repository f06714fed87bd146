"""The leader's proposal queue, bounded for real: nodes started with a tiny
bound, a burst of concurrent batch submissions and lease batches at the
leader. Refused requests are answered 503 unavailable with Retry-After and
the standard error body, and nothing of them commits; every acknowledged
request is there, whole, afterwards."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
from e2e_support import cluster_env
from prometheus_client.parser import text_string_to_metric_families

from raftsched.client import Client
from raftsched.testing import LocalCluster

QUEUE_COMMANDS_MAX = 4
BATCHES = 150  # batch submissions of JOBS_PER_BATCH jobs, each one command
JOBS_PER_BATCH = 3
LEASE_BATCHES = 20  # of OPS_PER_BATCH starts, each batch one LeaseBatch command (version 6)
OPS_PER_BATCH = 3
ROUNDS_MAX = 5


async def burst(
    leader_url: str, round_index: int, leases: list[dict[str, Any]], token: str
) -> tuple[list[tuple[int, dict[str, Any], dict[str, str], list[str]]], list[Any]]:
    """All the submissions at once, then all the lease batches at once:
    (status, body, headers, idempotency keys) per submission and (status,
    body, headers, leases) per lease batch."""
    connector = aiohttp.TCPConnector(limit=0)
    authorization = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(connector=connector, headers=authorization) as http:

        async def post(path: str, body: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
            async with http.post(leader_url + path, json=body, allow_redirects=False) as answer:
                return answer.status, await answer.json(), dict(answer.headers)

        async def submit(batch: int) -> tuple[int, dict[str, Any], dict[str, str], list[str]]:
            keys = [f"r{round_index}-b{batch}-{i}" for i in range(JOBS_PER_BATCH)]
            jobs = [{"queue": "burst", "idempotency_key": key} for key in keys]
            return (*await post("/v1/jobs/batch", {"jobs": jobs}), keys)

        async def start(group: list[dict[str, Any]]) -> Any:
            ops = [
                {"op": "start", "job_id": lease["job_id"], "fencing_token": lease["fencing_token"]}
                for lease in group
            ]
            return (*await post("/v1/leases/batch", {"ops": ops}), group)

        submissions = await asyncio.gather(*(submit(batch) for batch in range(BATCHES)))
        # A lease batch needs room for all its ops: the first ones find it, the
        # ones behind them do not, until an entry commits.
        groups = [leases[i : i + OPS_PER_BATCH] for i in range(0, len(leases), OPS_PER_BATCH)]
        lease_batches = await asyncio.gather(*(start(group) for group in groups))
    return list(submissions), list(lease_batches)


def assert_refused_properly(status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
    assert status == 503, body
    assert int(headers["Retry-After"]) >= 1
    error = body["error"]
    assert error["code"] == "unavailable"
    assert error["details"]["reason"] == "proposal_queue_full"
    assert error["details"]["queue_commands_max"] == QUEUE_COMMANDS_MAX
    assert "nothing was committed" in error["message"]


def refused_total(client: Client) -> float:
    """The leader's count (the client talks to the leader only)."""
    for metric in text_string_to_metric_families(client.metrics()):
        for sample in metric.samples:
            if sample.name == "raftsched_proposer_refused_total":
                return sample.value
    raise AssertionError("no raftsched_proposer_refused_total")


def test_a_full_proposal_queue_answers_503_and_commits_nothing_of_the_request(
    tmp_path: Path,
) -> None:
    args = ["--proposal-queue-commands-max", str(QUEUE_COMMANDS_MAX)]
    with LocalCluster(tmp_path / "cluster", env=cluster_env(), extra_args=args) as cluster:
        leader_id = cluster.wait_for_leader(timeout_s=30)
        # The burst is sent with the admin token, once authentication is on
        # (sent earlier it would race the bootstrap and meet 401s).
        cluster.wait_for_auth(timeout_s=30)
        leader_url = cluster.nodes[leader_id].http_url
        with Client([leader_url], timeout_s=10, retry_budget_s=30) as client:
            acknowledged: set[str] = set()
            refused_keys: set[str] = set()
            started: list[str] = []
            not_started: list[str] = []
            refused_commands = 0
            for round_index in range(ROUNDS_MAX):
                client.submit_batch(
                    [{"queue": "leased"} for _ in range(LEASE_BATCHES * OPS_PER_BATCH)]
                )
                leases = client.claim(
                    "w-burst", ["leased"], max_jobs=LEASE_BATCHES * OPS_PER_BATCH, wait_s=5
                )
                assert len(leases) == LEASE_BATCHES * OPS_PER_BATCH
                submissions, lease_batches = asyncio.run(
                    burst(leader_url, round_index, leases, cluster.admin_token)
                )
                for status, body, headers, keys in submissions:
                    if status == 200:
                        assert all("job" in item for item in body["results"]), body
                        acknowledged.update(keys)
                    else:
                        assert_refused_properly(status, body, headers)
                        refused_keys.update(keys)
                        refused_commands += 1
                for status, body, headers, group in lease_batches:
                    job_ids = [lease["job_id"] for lease in group]
                    if status == 200:
                        assert [r.get("status") for r in body["results"]] == ["running"] * len(
                            group
                        ), body
                        started += job_ids
                    else:
                        assert_refused_properly(status, body, headers)
                        not_started += job_ids
                        refused_commands += 1  # the batch's ops are one command
                if refused_keys and not_started and acknowledged and started:
                    break
            assert refused_keys, "the burst never filled the queue"
            assert not_started and started and acknowledged
            # Every acknowledged job is there, and no refused batch left any.
            jobs = list(client.iter_jobs(queue="burst"))
            keys = [job["idempotency_key"] for job in jobs]
            assert len(keys) == len(set(keys))
            assert set(keys) == acknowledged
            # A refused lease batch started none of its jobs, an accepted one all.
            status_of = {job["id"]: job["status"] for job in client.iter_jobs(queue="leased")}
            assert {status_of[job_id] for job_id in started} == {"running"}
            assert {status_of[job_id] for job_id in not_started} == {"claimed"}
            assert refused_total(client) == refused_commands
