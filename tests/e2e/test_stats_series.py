"""`GET /v1/stats/series` and `GET /v1/jobs/{id}/effects` on a real 3-node cluster.

The series: every node counts what happened by replicated time, so every node
answers the same counts in the same buckets, a new leader (after the old one
is killed) still has them, and the killed node, restarted, fills its hour
back in from the replicated outbox and its own Raft log. Bad input gets the
documented 4xx with a stable code; a token scoped to some tenants gets 403.
The Python clients (sync and async) read both, typed.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest

from raftsched.client import (
    AsyncClient,
    Client,
    Forbidden,
    InvalidRequest,
    JobEffects,
    NotFound,
    StatsSeries,
)
from raftsched.testing import LocalCluster, http_json

QUEUE = "charts-q"
PERIOD_S = 5


def series(url: str, query: str = f"queue={QUEUE}", token: str | None = None) -> dict[str, Any]:
    status, body, headers = http_json("GET", f"{url}/v1/stats/series?{query}", token=token)
    assert status == 200, (status, body)
    assert int(headers["Raftsched-Applied-Index"]) > 0
    return body


def nonzero(body: dict[str, Any], field: str) -> dict[str, float]:
    """The buckets with a count, as {bucket start: count} (rates back to counts)."""
    return {
        at: round(value * body["period_s"])
        for at, value in zip(body["at"], body[field], strict=True)
        if value
    }


def wait_until(check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        else:
            if value is not None:
                return value
        time.sleep(0.5)


def run_jobs(client: Client) -> str:
    """3 succeed, 2 fail and will be retried, 1 fails for good: a dead letter."""
    for i in range(6):
        client.submit(QUEUE, payload={"n": i}, max_attempts=3)
    leases = client.claim("charts-w", [QUEUE], max_jobs=6, wait_s=5)
    assert len(leases) == 6
    for lease in leases[:3]:
        client.complete(lease["job_id"], lease["fencing_token"], result={"ok": True})
    for lease in leases[3:5]:
        client.fail(lease["job_id"], lease["fencing_token"], kind="transient", message="busy")
    dead = leases[5]
    client.fail(dead["job_id"], dead["fencing_token"], kind="permanent", message="declined")
    return str(dead["job_id"])


def counted(url: str) -> dict[str, dict[str, float]]:
    body = series(url)
    found = {
        field: nonzero(body, field)
        for field in ("succeeded_per_s", "failed_per_s", "dead_lettered_per_s")
    }
    totals = {field: sum(values.values()) for field, values in found.items()}
    assert totals == {"succeeded_per_s": 3, "failed_per_s": 3, "dead_lettered_per_s": 1}, totals
    return found


def test_every_node_charts_the_same_counts_across_a_leader_change(
    cluster: LocalCluster, client: Client
) -> None:
    run_jobs(client)
    urls = {node_id: node.http_url for node_id, node in cluster.nodes.items()}
    seen = {node_id: wait_until(lambda url=url: counted(url)) for node_id, url in urls.items()}
    first = next(iter(seen.values()))
    assert all(found == first for found in seen.values()), seen

    leader = cluster.wait_for_leader()
    body = series(urls[leader])
    assert body["node_id"] == leader and body["queue"] == QUEUE and body["period_s"] == PERIOD_S
    assert len(body["at"]) == 720 and QUEUE in body["queues"]
    lags = [value for value in body["due_to_lease_p99_s"] if value is not None]
    assert lags and all(0 <= value < 30 for value in lags)
    assert any(value is not None for value in body["depth"])  # sampled since start
    cluster_wide = series(urls[leader], "")
    assert cluster_wide["queue"] is None
    assert sum(nonzero(cluster_wide, "succeeded_per_s").values()) >= 3

    # The leader dies: the new one answers the same counts in the same buckets.
    cluster.kill(leader, signal.SIGKILL)
    new_leader = cluster.wait_for_leader(timeout_s=30, exclude=leader)
    assert counted(urls[new_leader]) == first

    # The killed node comes back: the outbox and its own log give it the hour back.
    cluster.start(leader)
    cluster.wait_converged(timeout_s=60)
    restarted = wait_until(lambda: counted(urls[leader]))
    assert restarted == first
    body = series(urls[leader])
    assert body["sampling_since"] > min(first["succeeded_per_s"])


def test_bad_input_scope_and_a_jobs_effects(cluster: LocalCluster, client: Client) -> None:
    url = cluster.nodes[cluster.wait_for_leader()].http_url
    bad = {
        "window_s=0": "window_s",
        "window_s=3601": "window_s",
        "window_s=1.5": "window_s",
        "window_s=%C2%B2": "window_s",
        "queue=": "queue",
        "queue=" + "q" * 201: "queue",
        "queue=a&limit=3": "limit",
    }
    for query, field in bad.items():
        status, body, _ = http_json("GET", f"{url}/v1/stats/series?{query}")
        assert status == 400, (query, status, body)
        assert body["error"]["code"] == "invalid_request"
        assert body["error"]["details"]["field"] == field, (query, body)
    status, body, _ = http_json("GET", f"{url}/v1/stats/series?queue=never-used")
    assert (status, body["error"]["code"]) == (404, "not_found")
    assert body["error"]["details"] == {"queue": "never-used"}
    status, body, _ = http_json("GET", f"{url}/v1/stats/series", token="")
    assert (status, body["error"]["code"]) == (401, "unauthenticated")
    assert series(url, "window_s=60")["at"].__len__() == 12

    def token(role: str, tenants: list[str], queues: list[str] | None = None) -> str:
        made = client.create_token(f"{role}-{'-'.join(tenants)}", role, tenants=tenants,
                                   queues=queues or ["*"])  # fmt: skip
        return str(made["secret"])

    scoped_viewer = token("viewer", ["acme"])
    status, body, _ = http_json("GET", f"{url}/v1/stats/series", token=scoped_viewer)
    assert (status, body["error"]["code"]) == (403, "forbidden")
    status, body, _ = http_json("GET", f"{url}/v1/stats/series", token=token("submitter", ["*"]))
    assert (status, body["error"]["code"]) == (403, "forbidden")
    assert series(url, "", token=token("viewer", ["*"]))["queue"] is None

    # A job's effects, oldest first, scoped as the effects are.
    job = client.submit("effects-q", tenant="acme")
    (lease,) = client.claim("effects-w", ["effects-q"], max_jobs=1, wait_s=5)
    for key in ("charge:1", "email:1"):
        client.record_effect(key, lease["job_id"], lease["fencing_token"], {"key": key})
    client.complete(lease["job_id"], lease["fencing_token"])
    path = f"{url}/v1/jobs/{quote(job['id'])}/effects"
    status, body, _ = http_json("GET", path)
    assert status == 200, body
    assert [effect["key"] for effect in body["effects"]] == ["charge:1", "email:1"]
    assert body["total"] == 2
    assert body["effects"][0]["fencing_token"] == lease["fencing_token"]
    assert body["effects"][0]["result"] == {"key": "charge:1"}
    status, body, _ = http_json("GET", path + "?limit=1&consistency=stale")
    assert (status, len(body["effects"]), body["total"]) == (200, 1, 2)
    for query, field in {"limit=0": "limit", "limit=x": "limit", "color=red": "color"}.items():
        status, body, _ = http_json("GET", f"{path}?{query}")
        assert (status, body["error"]["details"]["field"]) == (400, field), (query, body)
    status, body, _ = http_json("GET", f"{url}/v1/jobs/job_nope/effects")
    assert (status, body["error"]["code"]) == (404, "not_found")
    for outsider in (token("viewer", ["globex"]), token("worker", ["*"], ["other-q"])):
        status, body, _ = http_json("GET", path, token=outsider)
        assert (status, body["error"]["code"]) == (404, "not_found")
    status, body, _ = http_json("GET", path, token=token("worker", ["*"], ["effects-q"]))
    assert status == 200 and body["total"] == 2
    status, body, _ = http_json("GET", path, token=scoped_viewer)
    assert status == 200 and body["total"] == 2


def test_the_python_clients_read_series_and_effects(cluster: LocalCluster, client: Client) -> None:
    dead_id = run_jobs(client)
    job = client.submit("effects-q", tenant="acme")
    (lease,) = client.claim("effects-w", ["effects-q"], max_jobs=1, wait_s=5)
    for key in ("charge:1", "email:1", "receipt:1"):
        client.record_effect(key, lease["job_id"], lease["fencing_token"], {"key": key})
    client.complete(lease["job_id"], lease["fencing_token"])

    def counts(body: StatsSeries) -> dict[str, float]:
        fields = ("succeeded_per_s", "failed_per_s", "dead_lettered_per_s")
        return {field: sum(nonzero(dict(body), field).values()) for field in fields}

    # The blocking client: the node it reaches answers, from its own memory.
    expected = {"succeeded_per_s": 3, "failed_per_s": 3, "dead_lettered_per_s": 1}

    def all_counted() -> StatsSeries | None:
        body = client.stats_series(QUEUE)
        return body if counts(body) == expected else None

    queue_series = wait_until(all_counted)
    assert queue_series["queue"] == QUEUE and queue_series["period_s"] == PERIOD_S
    assert queue_series["node_id"] in cluster.nodes and QUEUE in queue_series["queues"]
    assert len(queue_series["at"]) == 720 == len(queue_series["depth"])
    short = client.stats_series(QUEUE, window_s=60)
    assert len(short["at"]) == 12 and len(short["due_to_lease_p99_s"]) == 12

    # The whole cluster's series counts effects-q's completion too, once the
    # node answering has applied it (it reads its own memory).
    def whole_counted() -> StatsSeries | None:
        body = client.stats_series()
        return body if counts(body)["succeeded_per_s"] >= 4 else None

    whole = wait_until(whole_counted)
    assert whole["queue"] is None
    with pytest.raises(NotFound) as not_found:
        client.stats_series("never-used")
    assert not_found.value.details == {"queue": "never-used"}
    with pytest.raises(InvalidRequest) as invalid:
        client.stats_series(window_s=0)
    assert invalid.value.details["field"] == "window_s"

    effects: JobEffects = client.job_effects(job["id"])
    assert [effect["key"] for effect in effects["effects"]] == ["charge:1", "email:1", "receipt:1"]
    assert effects["total"] == 3
    first = effects["effects"][0]
    assert (first["job_id"], first["fencing_token"]) == (job["id"], lease["fencing_token"])
    assert first["result"] == {"key": "charge:1"} and first["recorded_at"].endswith("Z")
    assert first == client.get_effect("charge:1")
    one = client.job_effects(job["id"], limit=1, consistency="stale")
    assert (len(one["effects"]), one["total"]) == (1, 3)
    assert client.job_effects(dead_id) == {"effects": [], "total": 0}
    for missing in ("job_nope", "a/b"):
        with pytest.raises(NotFound):
            client.job_effects(missing)

    # Scope, as the routes say: a token of another tenant sees no such job,
    # and one scoped to some tenants may not read the cluster's series.
    outsider = client.create_token("globex-viewer", "viewer", tenants=["globex"])["secret"]
    with Client(cluster.urls, token=outsider, timeout_s=10, retry_budget_s=30) as scoped:
        with pytest.raises(NotFound):
            scoped.job_effects(job["id"])
        with pytest.raises(Forbidden):
            scoped.stats_series()

    # The async client: the same answers.
    async def read() -> tuple[StatsSeries, StatsSeries, JobEffects, JobEffects]:
        async with AsyncClient(cluster.urls, timeout_s=10, retry_budget_s=30) as aclient:
            series_answer = await aclient.stats_series(QUEUE, window_s=3600)
            whole_answer = await aclient.stats_series()
            effects_answer = await aclient.job_effects(job["id"])
            limited = await aclient.job_effects(job["id"], limit=2, consistency="stale")
            with pytest.raises(NotFound):
                await aclient.job_effects("job_nope")
            return series_answer, whole_answer, effects_answer, limited

    async_series, async_whole, async_effects, limited = asyncio.run(read())
    assert counts(async_series) == expected and async_series["queue"] == QUEUE
    assert async_whole["queue"] is None
    assert async_effects == effects
    assert ([e["key"] for e in limited["effects"]], limited["total"]) == (
        ["charge:1", "email:1"],
        3,
    )
