"""Flow control against a real 3-node cluster: settings, backpressure, pause,
fair sharing, and the limits read back from the replicated history."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from raftsched.client import Client, RateLimited
from raftsched.testing import LocalCluster, http_json


def test_backpressure_answers_429_and_commits_nothing(
    cluster: LocalCluster, client: Client
) -> None:
    tenant = client.set_tenant("acme", max_queued=3, weight=2)
    assert tenant == {
        "name": "acme", "weight": 2, "concurrency_limit": None, "max_queued": 3,
        "queued": 0, "running": 0, "throttled": 0, "on_unknown": "retry",
    }  # fmt: skip
    for i in range(3):
        client.submit("bp", {"i": i}, tenant="acme")
    leader = cluster.nodes[cluster.wait_for_leader()].http_url
    status, body, headers = http_json(
        "POST", leader + "/v1/jobs", {"queue": "bp", "tenant": "acme", "idempotency_key": "k"}
    )
    assert status == 429, body
    assert body["error"]["code"] == "queue_full"
    assert body["error"]["details"]["tenant"] == "acme"
    assert int(headers["Retry-After"]) >= 1
    assert len(client.list_jobs(tenant="acme")["jobs"]) == 3
    assert client.get_tenant("acme")["queued"] == 3
    # Other tenants are unaffected; once a job is claimed there is room again.
    client.submit("bp", tenant="other")
    with pytest.raises(RateLimited):
        client.submit("bp", tenant="acme")
    client.claim("w1", ["bp"], max_jobs=1, wait_s=1)
    client.submit("bp", tenant="acme")
    assert "raftsched_flow_rejected_total" in client.metrics()


def test_bad_settings_are_400_naming_the_field_and_change_nothing(
    cluster: LocalCluster, client: Client
) -> None:
    leader = cluster.nodes[cluster.wait_for_leader()].http_url
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("/v1/tenants/t", {"weight": 0}, "weight"),
        ("/v1/tenants/t", {"wieght": 2}, "wieght"),
        ("/v1/tenants/t", {"max_queued": "many"}, "max_queued"),
        ("/v1/queues/q", {"burst": 10}, "burst"),
        ("/v1/queues/q", {"rate_limit_per_s": -1}, "rate_limit_per_s"),
        ("/v1/queues/q", {"paused": "yes"}, "paused"),
        ("/v1/queues/q", {"circuit_window": 1000}, "circuit_window"),
    ]
    for path, body, field in cases:
        status, answer, _ = http_json("PUT", leader + path, body)
        assert status == 400, (path, body, answer)
        assert answer["error"]["details"]["field"] == field
    assert client.get_tenant("t")["weight"] == 1
    assert client.list_queues() == []


def test_pause_resume_and_queue_figures(cluster: LocalCluster, client: Client) -> None:
    client.submit_batch([{"queue": "pq", "payload": i} for i in range(5)])
    paused = client.pause_queue("pq")
    assert paused["paused"] is True and paused["depth"] == 5
    assert client.claim("w1", ["pq"], max_jobs=5, wait_s=0.5) == []
    (view,) = client.list_queues()
    assert view["name"] == "pq" and view["throttled"] == 5
    assert view["oldest_runnable_age_s"] is not None
    client.resume_queue("pq")
    leases = client.claim("w1", ["pq"], max_jobs=5, wait_s=2)
    assert len(leases) == 5
    view = client.get_queue("pq")
    assert (view["depth"], view["running"], view["paused"]) == (0, 5, False)


def test_a_paused_claim_wakes_on_resume(cluster: LocalCluster, client: Client) -> None:
    import threading

    client.pause_queue("wq")
    client.submit("wq")
    got: list[Any] = []
    waiter = threading.Thread(
        target=lambda: got.append(client.claim("w1", ["wq"], max_jobs=1, wait_s=10))
    )
    waiter.start()
    client.resume_queue("wq")
    waiter.join(15)
    assert len(got) == 1 and len(got[0]) == 1


def test_a_small_tenant_starts_within_a_few_claims(cluster: LocalCluster, client: Client) -> None:
    for _ in range(3):
        client.submit_batch([{"queue": "fair", "tenant": "big"} for _ in range(1000)])
    client.submit_batch([{"queue": "fair", "tenant": "small"} for _ in range(20)])
    claimed: list[str] = []
    for _ in range(4):
        leases = client.claim("w1", ["fair"], max_jobs=10, wait_s=1)
        claimed.extend(client.get_job(lease["job_id"])["tenant"] for lease in leases)
    assert Counter(claimed) == {"big": 20, "small": 20}


def test_ordering_key_blocked_by_a_dead_letter_is_visible(
    cluster: LocalCluster, client: Client
) -> None:
    first = client.submit("ok", ordering_key="acct", max_attempts=1)
    second = client.submit("ok", ordering_key="acct")
    (lease,) = client.claim("w1", ["ok"], max_jobs=5, wait_s=1)
    assert lease["job_id"] == first["id"]
    client.fail(lease["job_id"], lease["fencing_token"], kind="permanent", message="bad")
    view = client.get_queue("ok")
    assert view["blocked_keys"] == 1
    assert view["blocked"] == [{"tenant": "default", "ordering_key": "acct", "job_id": first["id"]}]
    assert client.claim("w1", ["ok"], max_jobs=5, wait_s=0.3) == []
    client.cancel_job(first["id"], "discard")
    (lease,) = client.claim("w1", ["ok"], max_jobs=5, wait_s=2)
    assert lease["job_id"] == second["id"]


def test_cli_queues_and_tenants(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    from raftsched.cli import main

    url = ",".join(cluster.urls)
    assert main(["queues", "set", "cliq", "--rate-limit-per-s", "2.5", "--url", url]) == 0
    assert main(["queues", "pause", "cliq", "--url", url]) == 0
    assert main(["tenants", "set", "t1", "--weight", "3", "--max-queued", "10", "--url", url]) == 0
    capsys.readouterr()
    assert main(["--json", "queues", "get", "cliq", "--url", url]) == 0
    queue = json.loads(capsys.readouterr().out)
    assert (queue["paused"], queue["rate_limit_per_s"], queue["burst"]) == (True, 2.5, 2)
    assert main(["tenants", "get", "--url", url]) == 0
    table = capsys.readouterr().out
    assert "t1" in table and "MAX QUEUED" in table
    assert main(["queues", "resume", "cliq", "--url", url]) == 0
    assert main(["tenants", "set", "t1", "--weight", "0", "--url", url]) == 1
    assert "field: weight" in capsys.readouterr().err
