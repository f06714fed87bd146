"""The async client shares routing with the blocking one; these check that
its aiohttp transport classifies failures the same way."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from fakecluster import FakeCluster, Seen, dead_url, error, reply

from raftsched.client import AsyncClient, LeaseLost, NextLeases, OutcomeUnknown, next_claim

JOB = {"id": "job_1", "status": "pending"}


def test_redirect_keeps_body_and_failover_skips_dead_node(cluster: FakeCluster) -> None:
    follower, leader, _ = cluster.nodes
    follower.script = lambda seen: web.Response(
        status=307, headers={"Location": leader.url + seen.path}
    )
    leader.script = lambda seen: reply(201, {"job": {**JOB, "payload": seen.body["payload"]}})

    async def scenario() -> dict[str, object]:
        async with AsyncClient([dead_url(), follower.url], timeout_s=2) as client:
            return await client.submit("q", {"n": 5}, idempotency_key="k")

    assert asyncio.run(scenario())["payload"] == {"n": 5}
    assert leader.seen[0].method == "POST"


def test_unknown_outcome_without_key_is_not_repeated(cluster: FakeCluster) -> None:
    async def slow(seen: Seen) -> web.Response:
        await asyncio.sleep(1.0)
        return reply(201, {"job": JOB})

    for node in cluster.nodes:
        node.script = slow

    async def scenario() -> None:
        async with AsyncClient(cluster.urls, timeout_s=0.3) as client:
            await client.submit("q")

    with pytest.raises(OutcomeUnknown):
        asyncio.run(scenario())
    assert sum(len(node.seen) for node in cluster.nodes) == 1


def test_503_then_lease_lost(cluster: FakeCluster) -> None:
    cluster.nodes[0].script = lambda seen: error(503, "no_leader", "", **{"Retry-After": "0"})
    cluster.nodes[1].script = lambda seen: error(409, "lease_lost", "token 3 is stale")

    async def scenario() -> None:
        async with AsyncClient(cluster.urls, timeout_s=1) as client:
            await client.fail("job_1", 3, kind="permanent", message="bad input")

    with pytest.raises(LeaseLost, match="token 3 is stale"):
        asyncio.run(scenario())
    assert cluster.nodes[1].seen[0].body == {
        "fencing_token": 3,
        "error": {"kind": "permanent", "message": "bad input"},
    }


def test_iter_jobs_and_health(cluster: FakeCluster) -> None:
    pages = {
        None: {"jobs": [{"id": "j2"}], "next_cursor": "c"},
        "c": {"jobs": [{"id": "j1"}], "next_cursor": None},
    }
    cluster.nodes[0].script = lambda seen: (
        reply(200, pages[seen.query.get("cursor")]) if seen.path == "/v1/jobs" else reply(200)
    )

    async def scenario() -> tuple[list[str], bool, bool]:
        async with AsyncClient(cluster.urls) as client:
            ids = [job["id"] async for job in client.iter_jobs(status="pending")]
            return ids, await client.healthz(), await client.healthz(dead_url())

    assert asyncio.run(scenario()) == (["j2", "j1"], True, False)


def test_the_reconciliation_report(cluster: FakeCluster) -> None:
    cluster.nodes[0].script = lambda seen: reply(200, {"hours": 24})

    async def scenario() -> dict[str, object]:
        async with AsyncClient(cluster.urls) as client:
            return await client.reconciliation()

    assert asyncio.run(scenario()) == {"hours": 24}
    (seen,) = cluster.nodes[0].seen
    assert (seen.method, seen.path, seen.query) == ("GET", "/v1/reconciliation", {})


def test_fail_with_a_next_claim_waits_past_the_timeout_for_the_long_poll(
    cluster: FakeCluster,
) -> None:
    lease = {"job_id": "job_2", "fencing_token": 9}

    async def long_poll(seen: Seen) -> web.Response:
        await asyncio.sleep(0.5)  # past timeout_s, within it plus next.wait_s
        failed = {"job_id": "job_1", "status": "pending", "next_run_at": None}
        return reply(200, {**failed, "next": {"leases": [lease]}})

    cluster.nodes[0].script = long_poll

    async def scenario() -> tuple[dict[str, object], NextLeases]:
        async with AsyncClient([cluster.nodes[0].url], timeout_s=0.3) as client:
            return await client.fail("job_1", 7, next_claim=next_claim("q", wait_s=2))

    answer, granted = asyncio.run(scenario())
    assert answer["status"] == "pending" and granted.leases == [lease]
    assert len(cluster.nodes[0].seen) == 1  # one request, not a retry after a timeout
