"""The audit trail and tenant isolation against a real 3-node cluster.

With authentication on (the clusters of these tests have an admin token),
the actor of every operator action is the calling token's name and id; a
`Raftsched-Actor` header changes nothing. Without authentication (a cluster
with no token) every request acts as `anonymous`, an admin over every
tenant: the actor comes from `Raftsched-Actor`, and isolation hides
nothing. Scoped callers are covered by tests/unit/test_api_scope.py on real
core states and by tests/e2e/test_tenant_isolation.py with real tokens."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from e2e_support import cluster_env

from raftsched.client import Client
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.testing import LocalCluster, http_json, wait_for


def call(
    method: str, url: str, body: Any = None, actor: str | None = None, token: str | None = None
) -> tuple[int, dict[str, Any]]:
    """One request, optionally naming an actor in `Raftsched-Actor` and
    carrying a token (None: the session's admin token, as `http_json`)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if actor is not None:
        request.add_header("Raftsched-Actor", actor)
    if token is None:
        token = os.environ.get("RAFTSCHED_TOKEN", "")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def at_this_release(cluster: LocalCluster) -> str:
    """The leader's URL once the cluster version lets operator commands be audited."""

    def raised() -> bool:
        status, body, _ = http_json(
            "GET", cluster.nodes[cluster.wait_for_leader()].http_url + "/v1/cluster"
        )
        return status == 200 and body.get("cluster_version") == COMMAND_VERSION_MAX

    assert wait_for(raised, timeout_s=30)
    return cluster.nodes[cluster.wait_for_leader()].http_url


def dead_letter(client: Client, key: str) -> dict[str, Any]:
    job = client.submit("audited", {"n": 1}, tenant="acme", idempotency_key=key, max_attempts=1)
    [lease] = client.claim("w1", ["audited"], wait_s=5)
    client.start(job["id"], lease["fencing_token"])
    failed = client.fail(job["id"], lease["fencing_token"], kind="permanent", message="bad card")
    assert failed["status"] == "dead_letter"
    return job


def test_cancel_and_replay_leave_audit_entries_naming_the_actor(
    cluster: LocalCluster, client: Client
) -> None:
    leader = at_this_release(cluster)
    dead = dead_letter(client, "charge:audit-1")
    # One operator token per person; each forges another name in the header.
    secrets: dict[str, str] = {}
    named: dict[str, str] = {}
    for person in ("alice", "bob", "carol", "mallory"):
        made = client.create_token(person, "operator")
        secrets[person] = made["secret"]
        named[person] = f"{person} ({made['token']['id']})"
    alice, bob, carol = named["alice"], named["bob"], named["carol"]

    # Replay needs a reason; without one nothing is proposed.
    replay = f"{leader}/v1/jobs/{dead['id']}/replay"
    status, body = call("POST", replay, {}, "root", secrets["alice"])
    assert status == 400 and body["error"]["details"] == {"field": "reason"}
    status, body = call("POST", replay, {"reason": " "}, token=secrets["alice"])
    assert status == 400
    status, body = call("POST", replay, {"reason": "card fixed"}, "root", secrets["alice"])
    assert status == 200, body
    assert body["job"]["status"] == "pending"
    assert (body["job"]["id"], body["job"]["idempotency_key"]) == (dead["id"], "charge:audit-1")
    # The key still names the same job.
    again = client.submit(
        "audited", {"n": 1}, tenant="acme", idempotency_key="charge:audit-1", max_attempts=1
    )
    assert again["id"] == dead["id"]

    queued = client.submit("audited", {"n": 2}, tenant="globex")
    cancel = f"{leader}/v1/jobs/{queued['id']}/cancel"
    status, body = call("POST", cancel, {"reason": "dup"}, "root", secrets["bob"])
    assert status == 200 and body["job"]["status"] == "cancelled"
    status, _ = call("POST", f"{leader}/v1/queues/audited/pause", None, "root", secrets["carol"])
    assert status == 200
    # A refused action leaves no entry.
    status, _ = call("POST", cancel, {}, "root", secrets["mallory"])
    assert status == 409

    status, body = call("GET", f"{leader}/v1/audit?kind=job.replay")
    assert [e["actor"] for e in body["entries"]] == [alice]
    # Token creation is audited too (by the session's admin token): leave it
    # out of the rest, which is about these three actions.
    status, body = call("GET", f"{leader}/v1/audit")
    assert status == 200 and body["next_cursor"] is None
    made = [e for e in body["entries"] if e["kind"] == "token.create"]
    assert sorted(e["detail"].split()[0] for e in made) == ["alice", "bob", "carol", "mallory"]
    acted = [e for e in body["entries"] if e["kind"] != "token.create"]
    entries = [(e["actor"], e["kind"], e["target"], e["tenant"], e["detail"]) for e in acted]
    assert entries == [
        (carol, "queue.pause", "audited", None, "paused"),
        (bob, "job.cancel", queued["id"], "globex", "dup"),
        (alice, "job.replay", dead["id"], "acme", "card fixed"),
    ]
    seqs = [e["seq"] for e in acted]
    assert seqs == sorted(seqs, reverse=True)

    # The jobs' histories name the same actors.
    replay = [e for e in client.job_history(dead["id"]) if e["event"] == "replay"]
    assert [(e["actor"], e["detail"]) for e in replay] == [(alice, "card fixed")]
    assert client.job_history(queued["id"])[-1]["actor"] == bob

    # Filters and pages.
    status, body = call("GET", f"{leader}/v1/audit?actor={urllib.parse.quote(alice)}")
    assert [e["kind"] for e in body["entries"]] == ["job.replay"]
    status, body = call("GET", f"{leader}/v1/audit?kind=job.cancel")
    assert [e["actor"] for e in body["entries"]] == [bob]
    status, first = call("GET", f"{leader}/v1/audit?limit=2")
    assert len(first["entries"]) == 2 and first["next_cursor"] is not None
    assert [e["actor"] for e in first["entries"]] == [carol, bob]
    status, rest = call("GET", f"{leader}/v1/audit?limit=1&cursor={first['next_cursor']}")
    assert [e["actor"] for e in rest["entries"]] == [alice] and rest["next_cursor"] is not None
    assert call("GET", f"{leader}/v1/audit?cursor=x")[0] == 400
    assert call("GET", f"{leader}/v1/audit?limit=0")[0] == 400
    assert call("GET", f"{leader}/v1/audit?nope=1")[0] == 400
    assert client.audit(kind="queue.pause")["entries"][0]["actor"] == carol

    # The trail is replicated: every replica holds the same entries.
    cluster.wait_converged()
    for node in cluster.nodes.values():
        status, body = call("GET", f"{node.http_url}/v1/audit?consistency=stale")
        assert [e["actor"] for e in body["entries"]][:3] == [carol, bob, alice]


def test_without_authentication_nothing_is_hidden(tmp_path: Path) -> None:
    with (
        LocalCluster(tmp_path / "cluster", size=3, env=cluster_env(), auth=False) as cluster,
        Client(cluster.urls, timeout_s=10, retry_budget_s=30, token="") as client,
    ):
        cluster.wait_for_leader(timeout_s=30)
        nothing_is_hidden(cluster, client)


def nothing_is_hidden(cluster: LocalCluster, client: Client) -> None:
    leader = at_this_release(cluster)
    acme = client.submit("shared", {}, tenant="acme")
    globex = client.submit("shared", {}, tenant="globex")
    # Without tokens the header still labels who asked, as before tokens.
    status, _ = call("POST", f"{leader}/v1/jobs/{globex['id']}/cancel", {"reason": "x"}, "bob@ops")
    assert status == 200
    assert client.job_history(globex["id"])[-1]["actor"] == "bob@ops"
    status, body = call("GET", f"{leader}/v1/jobs?queue=shared")
    assert [job["id"] for job in body["jobs"]] == [globex["id"], acme["id"]]
    assert call("GET", f"{leader}/v1/jobs/{globex['id']}/history")[0] == 200
    status, body = call("GET", f"{leader}/v1/tenants")
    assert {"acme"} <= {tenant["name"] for tenant in body["tenants"]}
    assert call("GET", f"{leader}/v1/tenants/globex")[0] == 200
    for path in ("/v1/queues", "/v1/queues/shared", "/v1/overview", "/v1/subscriptions"):
        status, body = call("GET", leader + path)
        assert status == 200, (path, body)
    with urllib.request.urlopen(leader + "/metrics", timeout=10) as response:
        assert response.status == 200
    status, body = call("GET", f"{leader}/v1/events?types=job.cancelled")
    assert [e["data"]["tenant"] for e in body["events"]] == ["globex"]
