"""Shards on a real cluster (docs/shards.md, sections 1 to 3): 3 nodes, each
running group 0 and two shard processes (`raftsched node --shards 3`).

Jobs spread over the shards and their ids name them; keys place them where
every node would; idempotency stays exact; any node reads any job (by
redirect to the node hosting the shard's leader); batches split by shard
and merge in order; workflows and schedules are placed whole; workers of
every shard complete their jobs, effects included; `/v1/cluster` and
`/readyz` report every shard. One cluster serves the module: its logs are
checked for error lines when it stops.
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
from e2e_support import cluster_env, sharded_cluster

from raftsched import child_processes
from raftsched.client import ApiError, Client, IdempotencyConflict
from raftsched.shards import key_shard, shard_of_id
from raftsched.testing import LocalCluster, http_json, wait_for

SHARDS = 3
QUEUE = "sharded"


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with sharded_cluster(tmp_path_factory.mktemp("sh") / "c", SHARDS) as cluster:
        yield cluster


@pytest.fixture
def client(sharded: LocalCluster) -> Iterator[Client]:
    with Client(sharded.urls, timeout_s=10, retry_budget_s=30) as api:
        yield api


def _follow(
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    hops: int = 5,
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """One request, following 307s (method, body and headers kept) and
    waiting out 503s, as a client does."""
    deadline = time.monotonic() + 30
    while True:
        status, answer, got = http_json(method, url, body, timeout_s=30, headers=headers)
        if status == 307 and hops > 0:
            url, hops = got["Location"], hops - 1
            continue
        if status == 503 and time.monotonic() < deadline:
            time.sleep(0.3)
            continue
        return status, answer, got


def test_jobs_spread_over_the_shards_and_keys_place_them(client: Client) -> None:
    keyless = [client.submit(QUEUE, {"i": i})["id"] for i in range(12)]
    assert {shard_of_id(job_id) for job_id in keyless} == set(range(SHARDS)), keyless
    for index in range(9):
        key = f"order-{index}"
        job = client.submit(QUEUE, {"o": index}, ordering_key=key, tenant="acme")
        assert shard_of_id(job["id"]) == key_shard("acme", key, SHARDS), job["id"]
        # An ordering key places the job even with an idempotency key.
        job = client.submit(QUEUE, {"o": index}, ordering_key=key, idempotency_key=f"i-{index}")
        assert shard_of_id(job["id"]) == key_shard("default", key, SHARDS)
    for index in range(9):
        key = f"pay-{index}"
        job = client.submit(QUEUE, {"p": index}, idempotency_key=key)
        assert shard_of_id(job["id"]) == key_shard("default", key, SHARDS)


def test_idempotency_is_exact_from_every_node(sharded: LocalCluster) -> None:
    first: dict[str, str] = {}
    for url in sharded.urls:
        with Client([url], timeout_s=10, retry_budget_s=30) as one:
            for index in range(6):
                job = one.submit(QUEUE, {"n": index}, idempotency_key=f"exact-{index}")
                assert first.setdefault(f"exact-{index}", job["id"]) == job["id"]
                with pytest.raises(IdempotencyConflict):
                    one.submit(QUEUE, {"n": index + 100}, idempotency_key=f"exact-{index}")
    assert {shard_of_id(job_id) for job_id in first.values()} == set(range(SHARDS))
    # The same key in another tenant is another job, placed by its own hash.
    with Client(sharded.urls) as api:
        other = api.submit(QUEUE, {"n": 0}, idempotency_key="exact-0", tenant="other")
        assert other["id"] != first["exact-0"]
        assert shard_of_id(other["id"]) == key_shard("other", "exact-0", SHARDS)


def test_every_node_reads_every_job_of_every_shard(sharded: LocalCluster, client: Client) -> None:
    ids = [client.submit(QUEUE, {"r": i})["id"] for i in range(9)]
    for url in sharded.urls:
        with Client([url], timeout_s=10, retry_budget_s=30) as one:
            for job_id in ids:
                assert one.get_job(job_id)["id"] == job_id
                assert one.job_history(job_id)
        # By hand: the node answers itself or redirects to the shard's leader.
        for job_id in ids:
            status, answer, _ = _follow("GET", f"{url}/v1/jobs/{job_id}")
            assert status == 200 and answer["job"]["id"] == job_id
    # Which node hosts each shard's leader is what the redirects name.
    leaders = {shard: sharded.shard_leader(shard) for shard in range(SHARDS)}
    for node in sharded.nodes.values():
        for job_id in ids:
            shard = shard_of_id(job_id)
            status, _, headers = http_json("GET", f"{node.http_url}/v1/jobs/{job_id}")
            if leaders[shard] == node.id:
                assert status == 200
            else:
                assert status == 307, (status, job_id, node.id)
                assert headers["Location"].startswith(sharded.nodes[leaders[shard]].http_url)
                assert headers["Raftsched-Leader"] == leaders[shard]


def test_ids_of_no_shard_and_bad_headers_are_4xx(sharded: LocalCluster, client: Client) -> None:
    url = sharded.urls[0]
    missing = "job7_01M92JG3GK7J82V40SSRTBNYNR"
    status, answer, _ = http_json("GET", f"{url}/v1/jobs/{missing}")
    assert status == 404 and answer["error"]["code"] == "not_found"
    assert answer["error"]["details"]["shard"] == 7
    status, answer, _ = http_json("POST", f"{url}/v1/leases/{missing}/start", {"fencing_token": 1})
    assert status == 404
    for bad in ("x", "3", "-1", "01", "", "1.0"):
        status, answer, _ = http_json(
            "POST",
            f"{url}/v1/leases",
            {"worker_id": "w", "queues": [QUEUE]},
            headers={"Raftsched-Shard": bad},
        )
        assert status == 400, (bad, answer)
        assert answer["error"]["code"] == "invalid_request"
        assert answer["error"]["details"]["field"] == "Raftsched-Shard"
    # A header that contradicts where a key places the job.
    key = "contradicted"
    elsewhere = (key_shard("default", key, SHARDS) + 1) % SHARDS
    status, answer, _ = http_json(
        "POST",
        f"{url}/v1/jobs",
        {"queue": QUEUE, "ordering_key": key},
        headers={"Raftsched-Shard": str(elsewhere)},
    )
    assert status == 422 and answer["error"]["code"] == "wrong_shard"
    assert answer["error"]["details"]["shard"] == key_shard("default", key, SHARDS)
    # A header names the shard of a job without keys.
    for shard in range(SHARDS):
        status, answer, _ = _follow(
            "POST", f"{url}/v1/jobs", {"queue": QUEUE}, headers={"Raftsched-Shard": str(shard)}
        )
        assert status == 201 and shard_of_id(answer["job"]["id"]) == shard


def test_batches_split_by_shard_and_merge_in_order(client: Client) -> None:
    jobs = [
        {"queue": QUEUE, "payload": {"b": i}, "idempotency_key": f"batch-{i}"} for i in range(9)
    ]
    answers = client.submit_batch(jobs)
    ids = [answer["job"]["id"] for answer in answers]
    assert [shard_of_id(job_id) for job_id in ids] == [
        key_shard("default", f"batch-{i}", SHARDS) for i in range(9)
    ]
    assert len({shard_of_id(job_id) for job_id in ids}) > 1
    assert [answer["job"]["payload"] for answer in answers] == [{"b": i} for i in range(9)]
    # Retried whole: every part is deduplicated in its shard.
    again = client.submit_batch(jobs)
    assert [answer["job"]["id"] for answer in again] == ids
    assert all(answer.get("replayed") for answer in again)
    # Keyless jobs go with the first keyed job.
    mixed = client.submit_batch(
        [{"queue": QUEUE}, {"queue": QUEUE, "ordering_key": "lead"}, {"queue": QUEUE}]
    )
    assert {shard_of_id(answer["job"]["id"]) for answer in mixed} == {
        key_shard("default", "lead", SHARDS)
    }
    # A batch of jobs without keys stays one command in one shard.
    plain = client.submit_batch([{"queue": QUEUE} for _ in range(5)])
    assert len({shard_of_id(answer["job"]["id"]) for answer in plain}) == 1
    # Spanning shards needs an idempotency key on every job.
    spanning = [*jobs[:8], {"queue": QUEUE, "payload": {"no": "key"}}]
    with pytest.raises(ApiError) as refused:
        client.submit_batch(spanning)
    assert refused.value.status == 422 and refused.value.code == "batch_spans_shards"
    assert refused.value.details["index"] == 8
    # A bad item fails the whole batch before any part is proposed.
    bad = [{"queue": QUEUE, "idempotency_key": f"never-{i}"} for i in range(6)]
    bad.append({"queue": QUEUE, "idempotency_key": "never-x", "priority": "high"})
    with pytest.raises(ApiError) as invalid:
        client.submit_batch(bad)
    assert invalid.value.status == 400 and invalid.value.details["field"] == "jobs[6].priority"
    url = client.urls[0]
    for job in bad[:6]:
        status, answer, _ = _follow("POST", f"{url}/v1/jobs", job)
        assert status == 201, answer  # created now: the batch committed nothing


def test_workflows_and_schedules_are_placed_whole(sharded: LocalCluster, client: Client) -> None:
    workflow = client.submit_workflow(
        {
            "idempotency_key": "wf-placed",
            "steps": [
                {"name": "a", "queue": QUEUE},
                {"name": "b", "queue": QUEUE, "depends_on": ["a"]},
            ],
        }
    )
    shard = key_shard("default", "wf-placed", SHARDS)
    assert shard_of_id(workflow["id"]) == shard
    step_job = workflow["steps"]["a"]["job_id"]
    assert shard_of_id(step_job) == shard
    for url in sharded.urls:
        with Client([url]) as one:
            assert one.get_workflow(workflow["id"])["id"] == workflow["id"]
            assert one.get_job(step_job)["workflow_id"] == workflow["id"]
    # A step whose ordering key belongs to another shard is refused.
    keys = [f"k{i}" for i in range(100)]
    key = next(k for k in keys if key_shard("default", k, SHARDS) != shard)
    with pytest.raises(ApiError) as refused:
        client.submit_workflow(
            {
                "idempotency_key": "wf-placed",
                "steps": [
                    {"name": "a", "queue": QUEUE},
                    {"name": "b", "queue": QUEUE, "ordering_key": key},
                ],
            }
        )
    assert refused.value.status == 422 and refused.value.code == "ordering_key_shard"
    assert refused.value.details["shard"] == key_shard("default", key, SHARDS)
    assert refused.value.details["field"] == "steps[1].ordering_key"
    # Without an idempotency key, the first step's ordering key places it.
    keyed = client.submit_workflow({"steps": [{"name": "a", "queue": QUEUE, "ordering_key": key}]})
    assert shard_of_id(keyed["id"]) == key_shard("default", key, SHARDS)
    # A schedule goes where its template's ordering key belongs.
    schedule = client.create_schedule(
        {"interval_s": 3600, "job": {"queue": QUEUE, "ordering_key": key}}
    )
    assert shard_of_id(schedule["id"]) == key_shard("default", key, SHARDS)
    for url in sharded.urls:
        with Client([url]) as one:
            assert one.get_schedule(schedule["id"])["id"] == schedule["id"]
    status, answer, _ = http_json(
        "POST",
        f"{sharded.urls[0]}/v1/schedules",
        {"id": f"sch{shard}_mine", "interval_s": 60, "job": {"queue": QUEUE, "ordering_key": key}},
    )
    assert status == 422 and answer["error"]["code"] == "ordering_key_shard"


def _worker(
    cluster: LocalCluster, shard: int, log_path: Path, sink: Path
) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return child_processes.popen(
            [sys.executable, "-m", "raftsched", "worker", "--queue", QUEUE,
             "--handler", "tests.e2e.handlers:effect_once", "--shard", str(shard),
             "--worker-id", f"w-shard-{shard}", "--poll-wait-s", "1",
             "--shutdown-grace-s", "5", "--log-format", "json",
             "--url", ",".join(cluster.urls)],
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, **cluster_env(), "RAFTSCHED_TEST_SINK": str(sink)},
        )  # fmt: skip


def test_workers_of_every_shard_complete_their_jobs_with_effects(
    sharded: LocalCluster, client: Client, tmp_path: Path
) -> None:
    # The jobs of earlier tests in this queue go first.
    sink = tmp_path / "sink.jsonl"
    workers = [_worker(sharded, shard, tmp_path / f"w{shard}.log", sink) for shard in range(SHARDS)]
    try:
        ids = [client.submit(QUEUE, {"w": i})["id"] for i in range(15)]
        assert {shard_of_id(job_id) for job_id in ids} == set(range(SHARDS))

        def done() -> bool:
            return all(client.get_job(job_id)["status"] == "succeeded" for job_id in ids)

        assert wait_for(done, 90), [client.get_job(j)["status"] for j in ids]
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=30)
    for shard in range(SHARDS):
        text = (tmp_path / f"w{shard}.log").read_text()
        assert "Traceback" not in text, text[-3000:]
    effects = [json.loads(line) for line in sink.read_text().splitlines()]
    for job_id in ids:
        # One side effect each, through the ledger of the job's own shard.
        assert sum(1 for effect in effects if effect["job_id"] == job_id) == 1
        effect = client.get_effect(f"effect:{job_id}")  # every shard is asked
        assert effect["job_id"] == job_id
        assert client.get_job(job_id)["result"]["effect_token"] == effect["result"]["token"]


def test_a_lease_batch_splits_by_its_jobs_shards(sharded: LocalCluster, client: Client) -> None:
    queue = "split-batch"
    ids: dict[int, list[str]] = {shard: [] for shard in range(SHARDS)}
    url = sharded.urls[0]
    for shard in range(SHARDS):
        for _ in range(2):
            _, answer, _ = _follow(
                "POST", f"{url}/v1/jobs", {"queue": queue}, headers={"Raftsched-Shard": str(shard)}
            )
            ids[shard].append(answer["job"]["id"])
    leases: list[dict[str, Any]] = []
    for shard in range(SHARDS):
        status, answer, _ = _follow(
            "POST",
            f"{url}/v1/leases",
            {"worker_id": "raw", "queues": [queue], "max_jobs": 2, "wait_s": 5},
            headers={"Raftsched-Shard": str(shard)},
        )
        assert status == 200, answer
        assert sorted(lease["job_id"] for lease in answer["leases"]) == sorted(ids[shard])
        leases += answer["leases"]
    ops: list[dict[str, Any]] = []
    for lease in leases:
        ops.append(
            {"op": "start", "job_id": lease["job_id"], "fencing_token": lease["fencing_token"]}
        )
    ops.insert(3, {"op": "start", "job_id": ids[1][0]})  # no token: its own 400, in place
    status, answer, _ = _follow("POST", f"{url}/v1/leases/batch", {"ops": ops})
    assert status == 200, answer
    results = answer["results"]
    assert len(results) == len(ops)
    assert results[3]["error"]["code"] == "invalid_request"
    assert results[3]["error"]["details"]["field"] == "ops[3].fencing_token"
    for op, result in zip(ops, results, strict=True):
        if "fencing_token" in op:
            assert result["job_id"] == op["job_id"] and result["status"] == "running", result
    completes = [
        {"op": "complete", "job_id": lease["job_id"], "fencing_token": lease["fencing_token"],
         "result": {"n": index}}
        for index, lease in enumerate(leases)
    ]  # fmt: skip
    status, answer, _ = _follow(
        "POST",
        f"{url}/v1/leases/batch",
        {"ops": completes, "next": {"worker_id": "raw", "queues": [queue]}},
    )
    assert status == 200, answer
    assert [result["status"] for result in answer["results"]] == ["succeeded"] * len(leases)
    assert answer["next"] == {"leases": []}
    for index, lease in enumerate(leases):
        assert client.get_job(lease["job_id"])["result"] == {"n": index}


def test_cluster_and_readiness_name_every_shard(sharded: LocalCluster) -> None:
    for node in sharded.nodes.values():
        status, body, _ = http_json("GET", node.http_url + "/readyz")
        assert status == 200 and body["ready"] and "shards_not_ready" not in body
        view = sharded.cluster_view(node.id)
        assert view is not None
        shards = view["shards"]
        assert [entry["shard"] for entry in shards] == list(range(SHARDS))
        for entry in shards:
            assert entry["status"] == "running" and entry["ready"], entry
            assert entry["leader"]["id"] in sharded.nodes
            assert entry["leader"]["http_url"] == sharded.nodes[entry["leader"]["id"]].http_url
            assert isinstance(entry["pid"], int)
        # Each group names itself.
        assert len({entry["cluster_id"] for entry in shards}) == SHARDS
        # The cluster's version is the lowest of its groups' (group 0's own
        # is `group_cluster_version`); with the header, one group's own.
        assert view["cluster_version"] == min(entry["cluster_version"] for entry in shards)
        assert view["group_cluster_version"] == shards[0]["cluster_version"]
        for entry in shards:
            status, one, _ = http_json(
                "GET",
                node.http_url + "/v1/cluster",
                headers={"Raftsched-Shard": str(entry["shard"])},
            )
            assert status == 200 and "group_cluster_version" not in one, one
            assert isinstance(one["cluster_version"], int)
        # The shard processes' replicas converge, as group 0's do.
    for shard in range(1, SHARDS):

        def converged(shard: int = shard) -> bool:
            digests = set()
            for node in sharded.nodes.values():
                code, body, _ = http_json(
                    "GET",
                    node.http_url + "/v1/debug/digest",
                    headers={"Raftsched-Shard": str(shard)},
                )
                digests.add((code, body.get("applied_index"), body.get("digest")))
            return len(digests) == 1 and next(iter(digests))[0] == 200

        assert wait_for(converged, 30)


def test_each_group_records_its_shard_and_names_it_in_tokens_and_fired_jobs(
    sharded: LocalCluster,
) -> None:
    """Once the cluster version has shards (9), each group's leader records
    its shard (`SetShard`): shard k's fencing tokens are then k modulo S, and
    the jobs its schedules fire have ids that name it, so a request for
    them from any node reaches the shard."""

    def recorded() -> bool:
        for node in sharded.nodes.values():
            view = sharded.cluster_view(node.id)
            if view is None or not all(e.get("identity_recorded") for e in view["shards"]):
                return False
        return True

    assert wait_for(recorded, 60), [sharded.cluster_view(n) for n in sharded.nodes]
    for shard in range(SHARDS):
        queue = f"tokens-{shard}"
        with Client(sharded.urls, timeout_s=10, retry_budget_s=30, shard=shard) as one:
            status, view, _ = http_json(
                "GET", sharded.urls[0] + "/v1/cluster", headers={"Raftsched-Shard": str(shard)}
            )
            assert status == 200 and view["shard_identity"] == {"index": shard, "count": SHARDS}
            for n in range(3):
                one.submit(queue, {"n": n})
            leases = one.claim("token-w", [queue], max_jobs=3, wait_s=5)
            assert len(leases) == 3, leases
            for lease in leases:
                assert shard_of_id(lease["job_id"]) == shard
                assert lease["fencing_token"] % SHARDS == shard, lease
                one.complete(lease["job_id"], lease["fencing_token"], {})
        with Client(sharded.urls, timeout_s=10, retry_budget_s=30, shard=shard) as one:
            schedule = one.create_schedule({"interval_s": 3600, "job": {"queue": queue}})
            assert shard_of_id(schedule["id"]) == shard
            fired = one.trigger_schedule(schedule["id"])
        job_id = fired["job_id"]
        assert shard_of_id(job_id) == shard, fired
        for url in sharded.urls:
            with Client([url], timeout_s=10, retry_budget_s=30) as any_node:
                assert any_node.get_job(job_id)["schedule_id"] == schedule["id"]


def test_a_membership_change_naming_a_shard_goes_to_that_shard(sharded: LocalCluster) -> None:
    """With `Raftsched-Shard: k` a change is shard k's alone (how the
    shards' drivers and an operator's repair reach one group); a change of
    a non-member is refused there by the shard's own membership code."""
    url = sharded.urls[0]
    for shard in range(SHARDS):
        status, answer, _ = _follow(
            "DELETE", url + "/v1/cluster/nodes/n9", headers={"Raftsched-Shard": str(shard)}
        )
        assert status == 404 and answer["error"]["details"]["id"] == "n9", answer
    view = sharded.cluster_view("n1")
    assert view is not None and sorted(node["id"] for node in view["nodes"]) == ["n1", "n2", "n3"]
    assert view["membership"]["shards_behind"] == []
    for entry in view["shards"][1:]:
        assert entry["members"] == ["n1", "n2", "n3"] and entry["membership_change"] is None


def test_a_node_refuses_another_number_of_shards(sharded: LocalCluster) -> None:
    node = sharded.nodes["n3"]
    command = sharded.command(node)
    command[command.index("--shards") + 1] = "2"
    sharded.kill("n3", signal.SIGTERM)
    try:
        refused = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **sharded.env},
        )
        assert refused.returncode == 2, refused.stderr
        assert "created with --shards 3" in refused.stderr
        assert "start it with --shards 3" in refused.stderr
    finally:
        sharded.start("n3")
    sharded.wait_for_leader(timeout_s=60)

    def ready() -> bool:
        try:
            return http_json("GET", node.http_url + "/readyz")[0] == 200
        except OSError:
            return False

    assert wait_for(ready, 60)
