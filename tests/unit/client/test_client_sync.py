"""The blocking client against scripted fake nodes: redirects, failover,
503 retries, unknown outcomes, error mapping."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from aiohttp import web
from fakecluster import FakeCluster, Seen, dead_url, error, reply

from raftsched.client import (
    Client,
    ClusterVersionTooLow,
    IdempotencyConflict,
    InvalidRequest,
    InvalidState,
    LeaseLost,
    NextLeases,
    NoLeader,
    NotFound,
    OutcomeUnknown,
    TransportError,
    item_error,
    kinds_refused,
    next_claim,
    next_refused,
)

JOB = {"id": "job_1", "status": "pending"}


def redirect_to(leader_url: str):  # type: ignore[no-untyped-def]
    def script(seen: Seen) -> web.Response:
        query = "?" + "&".join(f"{k}={v}" for k, v in seen.query.items()) if seen.query else ""
        return web.Response(
            status=307,
            headers={"Location": leader_url + seen.path + query, "Raftsched-Leader": "n2"},
        )

    return script


def test_redirect_keeps_method_and_body_and_sticks_to_leader(cluster: FakeCluster) -> None:
    follower, leader, _ = cluster.nodes
    follower.script = redirect_to(leader.url)
    leader.script = lambda seen: reply(201, {"job": {**JOB, "payload": seen.body["payload"]}})
    client = Client(cluster.urls, timeout_s=2)

    job = client.submit("q", {"a": 1}, idempotency_key="k1")

    assert job["payload"] == {"a": 1}
    assert leader.seen[0].method == "POST"
    assert leader.seen[0].body == {"queue": "q", "payload": {"a": 1}, "idempotency_key": "k1"}
    client.submit("q", {"a": 2})
    assert len(follower.seen) == 1  # the second call went straight to the leader
    assert len(leader.seen) == 2


def test_redirect_loop_is_bounded(cluster: FakeCluster) -> None:
    first, second, third = cluster.nodes
    first.script = redirect_to(second.url)
    second.script = redirect_to(first.url)
    third.script = redirect_to(first.url)
    # A loop is retried with backoff (elections settle) but only within the
    # call's budget, and never more than the attempt limit.
    started = time.monotonic()
    with pytest.raises(TransportError, match="redirect"):
        Client(cluster.urls, timeout_s=2, retry_budget_s=1.0).get_job("job_1")
    assert time.monotonic() - started < 3.0
    assert len(first.seen) + len(second.seen) + len(third.seen) <= 30


def test_connection_refused_moves_to_next_node(cluster: FakeCluster) -> None:
    cluster.nodes[0].script = lambda seen: reply(200, JOB)
    client = Client([dead_url(), cluster.nodes[0].url], timeout_s=2)
    assert client.get_job("job_1")["id"] == "job_1"


def test_no_node_reachable_gives_up_within_budget() -> None:
    client = Client([dead_url(), dead_url()], timeout_s=1, retry_budget_s=0.5)
    with pytest.raises(TransportError, match="no node answered"):
        client.get_job("job_1")


def test_503_is_retried_after_retry_after_even_without_key(cluster: FakeCluster) -> None:
    answers = iter([error(503, "no_leader", "electing", **{"Retry-After": "0"})])

    def script(seen: Seen) -> web.Response:
        return next(answers, reply(201, {"job": JOB}))

    for node in cluster.nodes:
        node.script = script
    client = Client(cluster.urls, timeout_s=2)
    assert client.submit("q")["id"] == "job_1"  # no key, still safe: nothing committed
    assert [len(n.seen) for n in cluster.nodes] == [1, 1, 0]


def test_503_for_too_long_raises_no_leader(cluster: FakeCluster) -> None:
    for node in cluster.nodes:
        node.script = lambda seen: error(503, "no_leader", "electing", **{"Retry-After": "0.1"})
    with pytest.raises(NoLeader) as raised:
        Client(cluster.urls, timeout_s=1, retry_budget_s=0.5).get_job("job_1")
    assert raised.value.status == 503
    assert raised.value.retry_after_s == 0.1


def slow_first_then(answer: web.Response, delay_s: float):  # type: ignore[no-untyped-def]
    calls = {"count": 0}

    async def script(seen: Seen) -> web.Response:
        calls["count"] += 1
        if calls["count"] == 1:
            await asyncio.sleep(delay_s)
        return answer

    return script


def test_unknown_outcome_is_retried_with_idempotency_key(cluster: FakeCluster) -> None:
    script = slow_first_then(reply(201, {"job": JOB}), 1.0)
    for node in cluster.nodes:
        node.script = script
    client = Client(cluster.urls, timeout_s=0.3)
    assert client.submit("q", idempotency_key="k")["id"] == "job_1"
    assert len(cluster.nodes[0].seen) == 1 and len(cluster.nodes[1].seen) == 1


def test_unknown_outcome_is_not_retried_without_key(cluster: FakeCluster) -> None:
    async def slow(seen: Seen) -> web.Response:
        await asyncio.sleep(1.0)
        return reply(201, {"job": JOB})

    for node in cluster.nodes:
        node.script = slow
    client = Client(cluster.urls, timeout_s=0.3)
    with pytest.raises(OutcomeUnknown):
        client.submit("q")
    with pytest.raises(OutcomeUnknown):
        client.replay_job("job_1", "operator says so")
    assert sum(len(n.seen) for n in cluster.nodes) == 2


def test_read_is_retried_after_unknown_outcome(cluster: FakeCluster) -> None:
    script = slow_first_then(reply(200, {"jobs": [JOB], "next_cursor": None}), 1.0)
    for node in cluster.nodes:
        node.script = script
    client = Client(cluster.urls, timeout_s=0.3)
    assert client.list_jobs(queue="q")["jobs"][0]["id"] == "job_1"
    assert sum(len(n.seen) for n in cluster.nodes) == 2


def test_fenced_lease_op_is_retried_after_unknown_outcome(cluster: FakeCluster) -> None:
    script = slow_first_then(reply(200, {"expires_at": "x", "cancel_requested": False}), 1.0)
    for node in cluster.nodes:
        node.script = script
    client = Client(cluster.urls, timeout_s=0.3)
    answer = client.heartbeat("job_1", 7, extend_s=30)
    assert answer["cancel_requested"] is False
    assert cluster.nodes[1].seen[0].body == {"fencing_token": 7, "extend_s": 30}


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (409, "lease_lost", LeaseLost),
        (409, "idempotency_conflict", IdempotencyConflict),
        (404, "not_found", NotFound),
        (400, "invalid_request", InvalidRequest),
    ],
)
def test_errors_map_to_classes(
    cluster: FakeCluster, status: int, code: str, expected: type[Exception]
) -> None:
    cluster.nodes[0].script = lambda seen: error(status, code, "nope")
    with pytest.raises(expected) as raised:
        Client(cluster.urls, timeout_s=1).complete("job_1", 3, {"ok": True})
    assert raised.value.code == code  # type: ignore[attr-defined]
    assert raised.value.details == {"field": "x"}  # type: ignore[attr-defined]
    assert len(cluster.nodes[0].seen) == 1


def test_request_id_is_sent_and_kept_across_retries(cluster: FakeCluster) -> None:
    cluster.nodes[0].script = lambda seen: error(503, "unavailable", "", **{"Retry-After": "0"})
    cluster.nodes[1].script = lambda seen: reply(200, JOB)
    Client(cluster.urls, timeout_s=1).get_job("job_1")
    first = cluster.nodes[0].seen[0].headers["x-request-id"]
    assert first and cluster.nodes[1].seen[0].headers["x-request-id"] == first


def test_stale_reads_and_query_encoding(cluster: FakeCluster) -> None:
    cluster.nodes[0].script = lambda seen: reply(200, {"jobs": [], "next_cursor": None})
    Client(cluster.urls).list_jobs(queue="a b", status="pending", limit=5, consistency="stale")
    assert cluster.nodes[0].seen[0].query == {
        "queue": "a b",
        "status": "pending",
        "limit": "5",
        "consistency": "stale",
    }


def test_iter_jobs_follows_cursor(cluster: FakeCluster) -> None:
    pages = {
        None: {"jobs": [{"id": "j3"}, {"id": "j2"}], "next_cursor": "c1"},
        "c1": {"jobs": [{"id": "j1"}], "next_cursor": None},
    }
    cluster.nodes[0].script = lambda seen: reply(200, pages[seen.query.get("cursor")])
    ids = [job["id"] for job in Client(cluster.urls).iter_jobs(queue="q", page_size=2)]
    assert ids == ["j3", "j2", "j1"]


def test_batch_item_errors_are_readable(cluster: FakeCluster) -> None:
    results = [{"expires_at": "x"}, {"error": {"code": "lease_lost", "message": "stale"}}]
    cluster.nodes[0].script = lambda seen: reply(200, {"results": results})
    ops = [{"op": "heartbeat", "job_id": "j", "fencing_token": 1}]
    answer = Client(cluster.urls).lease_batch(ops)
    assert item_error(answer[0]) is None
    lost = item_error(answer[1])
    assert isinstance(lost, LeaseLost) and lost.status == 409


def test_effect_path_is_escaped(cluster: FakeCluster) -> None:
    cluster.nodes[0].script = lambda seen: error(404, "not_found", "no effect")
    with pytest.raises(NotFound):
        Client(cluster.urls).get_effect("charge:pay/1")
    assert cluster.nodes[0].seen[0].path == "/v1/effects/charge:pay/1"


def test_client_is_shared_by_threads(cluster: FakeCluster) -> None:
    cluster.nodes[0].script = lambda seen: reply(200, {"id": seen.path.rsplit("/", 1)[1]})
    client = Client(cluster.urls)
    failures: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            for round_ in range(20):
                job_id = f"job_{index}_{round_}"
                assert client.get_job(job_id)["id"] == job_id
        except BaseException as failure:  # noqa: BLE001 - reported below
            failures.append(failure)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert len(cluster.nodes[0].seen) == 160


def test_health_checks_target_one_node(cluster: FakeCluster) -> None:
    cluster.nodes[1].script = lambda seen: reply(503 if seen.path == "/readyz" else 200, {})
    client = Client(cluster.urls)
    assert client.healthz(cluster.nodes[1].url) is True
    assert client.readyz(cluster.nodes[1].url) is False
    assert client.healthz(dead_url()) is False


def test_the_reconciliation_report_sends_its_window(cluster: FakeCluster) -> None:
    report = {"hours": 6, "reconciling": {"jobs": [], "total": 0, "truncated": False}}
    cluster.nodes[0].script = lambda seen: reply(200, report)
    client = Client(cluster.urls)
    assert client.reconciliation(hours=6, limit=10, consistency="stale") == report
    (seen,) = cluster.nodes[0].seen
    assert (seen.method, seen.path) == ("GET", "/v1/reconciliation")
    assert seen.query == {"hours": "6", "limit": "10", "consistency": "stale"}


def test_complete_with_a_next_claim_sends_it_and_returns_the_leases(cluster: FakeCluster) -> None:
    lease = {"job_id": "job_2", "fencing_token": 9}
    done = {"job_id": "job_1", "status": "succeeded", "replayed": False, "result": 1}
    cluster.nodes[0].script = lambda seen: reply(200, {**done, "next": {"leases": [lease]}})
    client = Client([cluster.nodes[0].url])
    answer, granted = client.complete(
        "job_1", 7, 1, next_claim=next_claim("q", max_jobs=3, wait_s=2, lease_s=30)
    )
    assert answer == done and granted == NextLeases([lease])
    assert cluster.nodes[0].seen[0].body == {
        "fencing_token": 7, "result": 1,
        "next": {"queues": ["q"], "max_jobs": 3, "wait_s": 2, "lease_s": 30},
    }  # fmt: skip


def test_a_next_claim_that_failed_leaves_the_ops_answer_standing(cluster: FakeCluster) -> None:
    claim_error = {"code": "no_leader", "message": "lost", "details": {}}
    results = [{"job_id": "a", "status": "retry_wait", "next_run_at": None}]
    cluster.nodes[0].script = lambda seen: reply(
        200, {"results": results, "next": {"error": claim_error}}
    )
    client = Client([cluster.nodes[0].url])
    ops = [{"op": "fail", "job_id": "a", "fencing_token": 1, "error": {"kind": "transient"}}]
    answered, granted = client.lease_batch(ops, next_claim=next_claim(["q"], worker_id="w"))
    assert answered == results
    assert granted.leases == [] and isinstance(granted.error, NoLeader)
    assert cluster.nodes[0].seen[0].body["next"]["worker_id"] == "w"
    # An answer without `next` (it cannot come from a node that took it) costs the claim only.
    cluster.nodes[0].script = lambda seen: reply(200, {"results": results})
    answered, granted = client.lease_batch(ops, next_claim=next_claim(["q"], worker_id="w"))
    assert answered == results and isinstance(granted.error, TransportError)


def test_an_older_node_refusing_next_is_recognized(cluster: FakeCluster) -> None:
    body = {"error": {"code": "invalid_request", "message": "next: unknown field",
                      "details": {"field": "next"}}}  # fmt: skip
    cluster.nodes[0].script = lambda seen: reply(400, body)
    client = Client([cluster.nodes[0].url])
    with pytest.raises(InvalidRequest) as refused:
        client.fail("job_1", 7, kind="permanent", next_claim=next_claim("q"))
    assert next_refused(refused.value)
    assert not next_refused(InvalidRequest(400, "invalid_request", "x", {"field": "next.queues"}))


def test_a_kind_is_sent_only_when_given_and_filters_a_listing(cluster: FakeCluster) -> None:
    cluster.nodes[0].script = lambda seen: reply(201, {"job": JOB})
    client = Client([cluster.nodes[0].url])
    client.submit("q", {"n": 1})
    client.submit("q", {"n": 2}, kind="charge")
    first, second = cluster.nodes[0].seen
    assert "kind" not in first.body and second.body["kind"] == "charge"
    cluster.nodes[0].script = lambda seen: reply(200, {"jobs": [], "next_cursor": None})
    client.list_jobs(queue="q", kind="charge")
    assert cluster.nodes[0].seen[-1].query == {"queue": "q", "kind": "charge"}


def test_a_claim_sends_its_kinds_and_caps_only_when_given(cluster: FakeCluster) -> None:
    cluster.nodes[0].script = lambda seen: reply(200, {"leases": []})
    client = Client([cluster.nodes[0].url])
    client.claim("w", ["q"], wait_s=0)
    client.claim("w", ["q"], wait_s=0, kinds=["charge", None], kind_max_jobs={"charge": 2})
    plain, kinded = cluster.nodes[0].seen
    assert "kinds" not in plain.body and "kind_max_jobs" not in plain.body
    assert kinded.body["kinds"] == ["charge", None]
    assert kinded.body["kind_max_jobs"] == {"charge": 2}
    assert next_claim("q", kinds=("a",)).body()["kinds"] == ["a"]
    assert "kinds" not in next_claim("q").body()


def test_a_cluster_too_old_for_a_kind_is_a_clear_error_and_nothing_is_resent(
    cluster: FakeCluster,
) -> None:
    details = {"reason": "cluster_version", "command": "SubmitJobs", "command_version": 8,
               "cluster_version": 7, "field": "kind"}  # fmt: skip
    body = {"error": {"code": "invalid_state", "message": "upgrade every node first",
                      "details": details}}  # fmt: skip
    cluster.nodes[0].script = lambda seen: reply(409, body)
    client = Client([cluster.nodes[0].url])
    with pytest.raises(ClusterVersionTooLow) as refused:
        client.submit("q", kind="charge", idempotency_key="k")
    error = refused.value
    assert isinstance(error, InvalidState) and error.code == "invalid_state"
    assert (error.field, error.command_version, error.cluster_version) == ("kind", 8, 7)
    assert "'kind' needs cluster version 8, the cluster runs 7" in str(error)
    assert len(cluster.nodes[0].seen) == 1  # not repeated, and not without its kind
    assert kinds_refused(error)


def test_a_claim_of_kinds_refused_by_an_old_node_or_cluster_is_recognized() -> None:
    old_node = InvalidRequest(400, "invalid_request", "unknown field", {"field": "kinds"})
    old_next = InvalidRequest(400, "invalid_request", "unknown field", {"field": "next.kinds"})
    assert kinds_refused(old_node) and kinds_refused(old_next)
    assert not kinds_refused(InvalidRequest(400, "invalid_request", "x", {"field": "queues"}))
    assert not kinds_refused(InvalidState(409, "invalid_state", "x", {}))
    assert not kinds_refused(None)


def test_series_and_job_effects_send_their_query_and_check_their_answer(
    cluster: FakeCluster,
) -> None:
    node = cluster.nodes[0]
    effects = {"effects": [{"key": "k", "job_id": "job_1", "fencing_token": 3, "epoch": 1,
                            "result": None, "recorded_at": "2026-12-01T09:00:00.000Z"}],
               "total": 4}  # fmt: skip
    node.script = lambda seen: reply(200, effects)
    client = Client([node.url], timeout_s=2)
    assert client.job_effects("job_1", limit=1, consistency="stale") == effects
    assert node.seen[-1].path == "/v1/jobs/job_1/effects"
    assert node.seen[-1].query == {"limit": "1", "consistency": "stale"}
    client.job_effects("job_1")
    assert node.seen[-1].query == {}
    # An answer without the promised fields is not taken for one.
    node.script = lambda seen: reply(200, {"effects": {}, "total": 0})
    with pytest.raises(TransportError, match="not a list"):
        client.job_effects("job_1")
    node.script = lambda seen: reply(200, {"node_id": "n1", "queue": "q"})
    with pytest.raises(TransportError, match="lacks at, dead_lettered_per_s"):
        client.stats_series("q", window_s=60)
    assert node.seen[-1].path == "/v1/stats/series"
    assert node.seen[-1].query == {"queue": "q", "window_s": "60"}
    client.close()
