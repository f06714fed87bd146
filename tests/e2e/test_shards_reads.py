"""Reads of every shard on a real cluster (docs/shards.md, section 3, "Lists
and counts", and "Events and subscriptions"): 3 nodes, each running group 0
and two shard processes (`raftsched node --shards 3`).

Lists page across the shards while jobs are submitted, from every node
(each shard's part from its leader, wherever it is); filters, the dead
letters and a scoped token see every shard; counts (queues, tenants, the
overview, the reconciliation report, the charts' series) add the shards up;
the event stream merges the shards' outboxes with ids that name them, and
long-polls all of them; /metrics labels each process's series with its
shard and passes promtool. One cluster serves the module.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from e2e_support import cluster_env, sharded_cluster
from prometheus_client.parser import text_string_to_metric_families

from raftsched.client import Client
from raftsched.node.metrics import FAMILIES
from raftsched.shards import key_shard, shard_of_id
from raftsched.testing import LocalCluster, http_json, wait_for

SHARDS = 3


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with sharded_cluster(tmp_path_factory.mktemp("sr") / "c", SHARDS) as cluster:
        yield cluster


@pytest.fixture
def client(sharded: LocalCluster) -> Iterator[Client]:
    with Client(sharded.urls, timeout_s=10, retry_budget_s=30) as api:
        yield api


def _get(url: str, token: str | None = None, **query: Any) -> dict[str, Any]:
    """A read that any node answers itself (200, never a redirect)."""
    text = "&".join(f"{name}={quote(str(value))}" for name, value in query.items())
    deadline = time.monotonic() + 30
    while True:
        status, answer, _ = http_json("GET", f"{url}?{text}", timeout_s=30, token=token)
        if status == 503 and time.monotonic() < deadline:
            time.sleep(0.3)  # a shard electing its leader
            continue
        assert status == 200, (status, answer)
        return answer


def _submit_to_every_shard(client: Client, queue: str, count: int, **fields: Any) -> list[str]:
    ids = [client.submit(queue, {"n": index}, **fields)["id"] for index in range(count)]
    assert {shard_of_id(job_id) for job_id in ids} == set(range(SHARDS)), ids
    return ids


def _page_through(
    url: str, limit: int, between: Any = None, token: str | None = None, **query: Any
) -> list[list[dict[str, Any]]]:
    pages: list[list[dict[str, Any]]] = []
    cursor = None
    for _ in range(200):
        extra = {} if cursor is None else {"cursor": cursor}
        answer = _get(f"{url}/v1/jobs", token=token, limit=limit, **query, **extra)
        pages.append(answer["jobs"])
        cursor = answer["next_cursor"]
        if cursor is None:
            return pages
        assert cursor.startswith("v1.") and len(cursor.split(".")) == SHARDS + 1, cursor
        if between is not None:
            between()
    raise AssertionError("the listing did not end")


def test_lists_page_across_the_shards_while_jobs_are_submitted(
    sharded: LocalCluster, client: Client
) -> None:
    queue = "paged"
    submitted = _submit_to_every_shard(client, queue, 31)
    added: list[str] = []

    def submit_more() -> None:
        added.extend(client.submit(queue, {"late": len(added)})["id"] for _ in range(3))

    for url in sharded.urls:  # every node answers, leading each shard or not
        pages = _page_through(url, 7, submit_more, queue=queue)
        listed = [job["id"] for page in pages for job in page]
        assert len(listed) == len(set(listed)), "a job listed twice"
        # Everything there when the listing began; nothing submitted after
        # (newer than the listing's start, as with one shard).
        assert set(listed) == set(submitted)
        assert all(len(page) == 7 for page in pages[:-1])
        stamps = [job["created_at"] for page in pages for job in page]
        assert stamps == sorted(stamps, reverse=True)
        submitted += added
        added.clear()
    assert {shard_of_id(job_id) for job_id in submitted} == set(range(SHARDS))

    # A stale read answers from each node's own replicas, pages alike.
    def caught_up() -> bool:
        answer = _get(sharded.urls[2] + "/v1/jobs", queue=queue, limit=1000, consistency="stale")
        return len(answer["jobs"]) == len(submitted)

    assert wait_for(caught_up, 30)
    stale = _page_through(sharded.urls[2], 50, queue=queue, consistency="stale")
    assert sorted(job["id"] for page in stale for job in page) == sorted(submitted)


def test_filters_and_dead_letters_cover_every_shard(sharded: LocalCluster, client: Client) -> None:
    queue = "filtered"
    ids = _submit_to_every_shard(client, queue, 9, kind="invoice", correlation_id="corr-7")
    url = sharded.urls[1]
    for query in ({"kind": "invoice"}, {"correlation_id": "corr-7"}, {"queue": queue}):
        listed = {job["id"] for job in _get(url + "/v1/jobs", limit=100, **query)["jobs"]}
        assert listed == set(ids), query
    # An idempotency key with an ordering key may name a job in every shard.
    keys = [f"ok-{index}" for index in range(40)]
    keyed = []
    for shard in range(SHARDS):
        key = next(k for k in keys if key_shard("default", k, SHARDS) == shard)
        keyed.append(client.submit(queue, {}, idempotency_key="same", ordering_key=key)["id"])
    found = _get(url + "/v1/jobs", idempotency_key="same")["jobs"]
    assert sorted(job["id"] for job in found) == sorted(keyed)
    # Dead letters of every shard: a worker per shard fails its jobs for good.
    dead_queue = "dead-everywhere"
    dead = _submit_to_every_shard(client, dead_queue, 6, max_attempts=1)
    for shard in range(SHARDS):
        with Client(sharded.urls, shard=shard, timeout_s=10, retry_budget_s=30) as worker:
            for lease in worker.claim(f"w{shard}", [dead_queue], max_jobs=10, wait_s=5):
                worker.fail(lease["job_id"], lease["fencing_token"], kind="permanent")
    letters = _get(url + "/v1/jobs", status="dead_letter", queue=dead_queue, limit=100)["jobs"]
    assert {job["id"] for job in letters} == set(dead)
    overview = _get(url + "/v1/overview")
    shown = {item["id"] for item in overview["dead_letters"]}
    assert set(dead) <= shown
    assert [entry["shard"] for entry in overview["shards"]] == list(range(SHARDS))
    assert all(entry["from"] in sharded.nodes for entry in overview["shards"])


def test_bad_cursors_are_400_naming_the_field(sharded: LocalCluster) -> None:
    url = sharded.urls[0]
    for bad in ("12", "v1.1.2", "v1.1.2.3.4", "v2.1.2.3", "v1.x.1.1", "v1.~!.1.1"):
        for path in ("/v1/jobs", "/v1/workflows", "/v1/schedules"):
            status, answer, _ = http_json("GET", f"{url}{path}?cursor={quote(bad)}")
            assert status == 400, (path, bad, answer)
            assert answer["error"]["code"] == "invalid_request"
            assert answer["error"]["details"]["field"] == "cursor"
    for bad in ("v1.1.2", "x", "-1", "v1.1.-.2"):
        status, answer, _ = http_json("GET", f"{url}/v1/events?after={quote(bad)}")
        assert status == 400 and answer["error"]["details"]["field"] == "after", (bad, answer)
    # Each shard's own list (the header) keeps its own digit cursors.
    status, answer, _ = http_json(
        "GET", f"{url}/v1/jobs?limit=1&consistency=stale", headers={"Raftsched-Shard": "1"}
    )
    assert status == 200, answer
    assert answer["next_cursor"] is None or answer["next_cursor"].isdigit()


def test_a_scoped_token_sees_its_tenants_jobs_of_every_shard(
    sharded: LocalCluster, client: Client
) -> None:
    queue = "scoped"
    mine = _submit_to_every_shard(client, queue, 9, tenant="acme")
    theirs = _submit_to_every_shard(client, queue, 9, tenant="globex")
    secret = client.create_token("acme-viewer", "viewer", tenants=["acme"])["secret"]
    # An operator of one tenant reads the event stream, filtered to it.
    operator = client.create_token("acme-operator", "operator", tenants=["acme"])["secret"]
    by_tenant = _get(sharded.urls[0] + "/v1/jobs", tenant="acme", queue=queue, limit=100)
    assert sorted(job["id"] for job in by_tenant["jobs"]) == sorted(mine)
    for url in sharded.urls:
        pages = _page_through(url, 4, token=secret, queue=queue)
        listed = [job for page in pages for job in page]
        assert sorted(job["id"] for job in listed) == sorted(mine)
        assert {job["tenant"] for job in listed} == {"acme"}
        tenants = _get(url + "/v1/tenants", token=secret)["tenants"]
        assert [tenant["name"] for tenant in tenants] == ["acme"]
        for path in ("/v1/queues", "/v1/events"):  # these mix every tenant's jobs
            status, _, _ = http_json("GET", url + path, token=secret)
            assert status == 403
    for job_id in mine + theirs:  # an event each, in the job's shard
        client.cancel_job(job_id, reason="scope test")
    for url in sharded.urls:
        seen = _get(url + "/v1/events", token=operator, types="job.cancelled", limit=1000)
        assert {event["data"].get("tenant") for event in seen["events"]} == {"acme"}
        assert {event["data"]["job_id"] for event in seen["events"]} >= set(mine)


def test_counts_add_the_shards_up(sharded: LocalCluster, client: Client) -> None:
    queue = "counted"
    ids = _submit_to_every_shard(client, queue, 12, tenant="counting")
    for url in sharded.urls:
        queues = {q["name"]: q for q in _get(url + "/v1/queues")["queues"]}
        assert queues[queue]["depth"] == len(ids) and queues[queue]["running"] == 0
        one = _get(f"{url}/v1/queues/{queue}")["queue"]
        assert one["depth"] == len(ids) and one["oldest_runnable_at"] is not None
        tenant = _get(url + "/v1/tenants/counting")["tenant"]
        assert tenant["queued"] == len(ids)
        listed = {t["name"]: t for t in _get(url + "/v1/tenants")["tenants"]}
        assert listed["counting"]["queued"] == len(ids)
        overview = _get(url + "/v1/overview")
        depths = {q["name"]: q["depth"] for q in overview["queues"]}
        assert depths[queue] == len(ids)
        every = _get(url + "/v1/jobs", limit=1000)
        assert sum(overview["status_counts"].values()) >= len(every["jobs"])
        report = _get(url + "/v1/reconciliation", hours=2)
        assert report["hours"] == 2 and len(report["unknown_outcomes"]["buckets"]) == 2
        assert report["reconciling"]["total"] == 0
    status, answer, _ = http_json("GET", sharded.urls[0] + "/v1/queues/never-seen")
    assert status == 404 and answer["error"]["code"] == "not_found"

    # The charts: every shard's replica counts its own jobs' depth.
    def charted() -> bool:
        url = f"{sharded.urls[0]}/v1/stats/series?queue={queue}&window_s=60"
        status, series, _ = http_json("GET", url)
        if status == 404:  # until each replica's next sample makes the series
            return False
        assert status == 200, series
        return series["node_id"] == "n1" and series["depth"][-1] == len(ids)

    assert wait_for(charted, 30)


def test_events_merge_the_shards_outboxes(sharded: LocalCluster, client: Client) -> None:
    url = sharded.urls[2]
    start = _get(url + "/v1/events", limit=1)["last_seq"]
    assert start.startswith("v1.") and len(start.split(".")) == SHARDS + 1
    ids = _submit_to_every_shard(client, "evented", 12)
    for job_id in ids:  # each cancellation is an event in the job's shard
        client.cancel_job(job_id, reason="events test")
    seen: list[dict[str, Any]] = []
    after = start
    for _ in range(50):
        page = _get(url + "/v1/events", after=after, types="job.cancelled", limit=5)
        stamps = [event["at"] for event in page["events"]]
        assert stamps == sorted(stamps), "a page is merged by time"
        seen += page["events"]
        after = page["next_after"]
        if not page["events"]:
            break
    submitted = {event["data"]["job_id"]: event for event in seen}
    assert set(submitted) == set(ids)
    assert len(seen) == len({event["id"] for event in seen})
    for job_id, event in submitted.items():
        shard = shard_of_id(job_id)
        assert event["shard"] == shard
        assert event["id"] == f"evt{'' if shard == 0 else shard}_{event['seq']}"
    # `raftsched events tail` follows every shard with the cursor.
    tail = subprocess.run(
        [sys.executable, "-m", "raftsched", "--url", url, "events", "tail", "--no-follow",
         "--after", start, "--types", "job.cancelled"],
        capture_output=True, text=True, timeout=60, env={**os.environ, **cluster_env()},
    )  # fmt: skip
    assert tail.returncode == 0, tail.stderr
    printed = [json.loads(line) for line in tail.stdout.splitlines()]
    assert sorted(event["id"] for event in printed) == sorted(event["id"] for event in seen)
    # Digits are shard 0's seq: the others' events all come from their start.
    early = _get(url + "/v1/events", after=0, limit=1000)
    assert {event["shard"] for event in early["events"]} == set(range(SHARDS))
    # A long poll waits on every shard and answers with the first event.
    got: dict[str, Any] = {}

    def poll() -> None:
        got.update(_get(url + "/v1/events", after=after, wait_s=20, types="job.cancelled"))

    waiting = threading.Thread(target=poll)
    began = time.monotonic()
    waiting.start()
    time.sleep(1.0)
    keyed = next(f"wake-{i}" for i in range(50) if key_shard("default", f"wake-{i}", SHARDS) == 2)
    late = client.submit("evented", {}, ordering_key=keyed)["id"]
    time.sleep(1.0)
    client.cancel_job(late, reason="wake the poll")
    waiting.join(30)
    assert not waiting.is_alive()
    assert time.monotonic() - began < 15
    assert [event["data"]["job_id"] for event in got["events"]] == [late]
    assert got["events"][0]["shard"] == shard_of_id(late)


def test_metrics_label_each_shard_and_pass_promtool(
    sharded: LocalCluster, client: Client, promtool: str
) -> None:
    _submit_to_every_shard(client, "metered", 6)
    declared = {family.name: family for family in FAMILIES}
    for node in sharded.nodes.values():
        request = urllib.request.Request(
            node.http_url + "/metrics",
            headers={"Authorization": f"Bearer {sharded.admin_token}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
        checked = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, timeout=30
        )
        findings = (checked.stdout + checked.stderr).decode()
        assert checked.returncode == 0 and findings == "", f"{node.id}: {findings}"
        # The families node/metrics.py declares, each sample with its
        # family's labels and the shard of the process it came from.
        heads = set(re.findall(r"^# HELP (\S+) ", text.decode(), flags=re.MULTILINE))
        assert heads == set(declared)
        leaders: dict[str, float] = {}
        for metric in text_string_to_metric_families(text.decode()):
            family = declared.get(metric.name) or declared[metric.name + "_total"]
            for sample in metric.samples:
                assert sample.labels.get("shard") in {"0", "1", "2"}, sample
                labels = set(sample.labels) - {"shard", "le"}
                assert labels == set(family.labels), sample
                if sample.name == "raftsched_raft_is_leader":
                    leaders[sample.labels["shard"]] = sample.value
        assert sorted(leaders) == ["0", "1", "2"], leaders
    # Each shard has one leader among the nodes' series.
    totals = {str(shard): 0.0 for shard in range(SHARDS)}
    for node in sharded.nodes.values():
        request = urllib.request.Request(
            node.http_url + "/metrics",
            headers={"Authorization": f"Bearer {sharded.admin_token}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            for metric in text_string_to_metric_families(response.read().decode()):
                for sample in metric.samples:
                    if sample.name == "raftsched_raft_is_leader":
                        totals[sample.labels["shard"]] += sample.value
    assert totals == {str(shard): 1.0 for shard in range(SHARDS)}
