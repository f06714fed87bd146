"""Tokens and roles on a real 3-node cluster (issue 15; docs/api.md,
"Authentication, roles and tenants").

One cluster for the module, bootstrapped from an admin token file that the
leader generates; every secret the tests see is remembered, and at the end no
node log line may contain any of them.
"""

from __future__ import annotations

import http.client
import json
import os
import stat
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import cluster_env

from raftsched.api.auth import TOKEN_CATCH_UP_S
from raftsched.client import Client
from raftsched.client import Unauthenticated as ClientUnauthenticated
from raftsched.testing import LocalCluster, http_json, metrics_text, wait_for

SECRETS: list[str] = []
# The module's nodes allow this many failed authentications per address and
# minute: the tests on 127.0.0.1 fail on purpose (and poll for a revocation
# to arrive), and must not lock each other out on a slow run. The limit
# itself is tested from an address of its own (127.0.0.2).
FAILURES_PER_MINUTE = 100


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # No admin.token yet: the leader generates it (and bootstraps from it).
    local = LocalCluster(
        tmp_path_factory.mktemp("auth") / "cluster",
        env=cluster_env(),
        write_admin_token=False,
        extra_args=["--auth-failures-per-minute", str(FAILURES_PER_MINUTE)],
    )
    local.start()
    try:
        local.wait_for_leader(timeout_s=30)
        local.wait_for_auth(timeout_s=30)
        SECRETS.append(local.admin_token)
        yield local
    finally:
        local.stop()
    logs = local.logs()
    leaked = [index for index, secret in enumerate(SECRETS) if secret in logs]
    assert not leaked, f"secrets {leaked} appear in the node logs"


def leader_url(cluster: LocalCluster) -> str:
    return cluster.nodes[cluster.wait_for_leader()].http_url


def followers(cluster: LocalCluster) -> list[str]:
    leader = cluster.wait_for_leader()
    return [node.http_url for node in cluster.nodes.values() if node.id != leader]


def call(
    url: str, method: str, path: str, body: Any = None, *, token: str
) -> tuple[int, dict[str, Any], dict[str, str]]:
    return http_json(method, url + path, body, timeout_s=10, token=token)


def make_token(cluster: LocalCluster, **fields: Any) -> tuple[dict[str, Any], str]:
    body = {"name": "t", "tenants": ["*"], "queues": ["*"], **fields}
    status, answer, _ = call(
        leader_url(cluster), "POST", "/v1/tokens", body, token=cluster.admin_token
    )
    assert status == 201, answer
    SECRETS.append(answer["secret"])
    return answer["token"], answer["secret"]


def test_bootstrap_generates_the_file_0600_and_turns_auth_on_everywhere(
    cluster: LocalCluster,
) -> None:
    path = cluster.admin_token_file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = cluster.admin_token
    assert secret.startswith("rsk_") and len(secret) == 47
    for url in cluster.urls:
        status, body, _ = call(url, "GET", "/readyz", token="")
        assert status == 200 and body["auth"] == "on"
        status, body, _ = call(url, "GET", "/v1/whoami", token=secret)
        assert status == 200, body
        assert body["token"]["role"] == "admin" and body["token"]["tenants"] == ["*"]
        assert "secret" not in body["token"]
    logs = cluster.logs()
    assert "authentication is on" in logs and "bootstrapped the first admin token" in logs
    # Use is recorded coarsely (to the minute, at most one TouchTokens a
    # minute), by the leader: the admin token's first uses show up soon.
    admin_id = body["token"]["id"]

    def last_used() -> str | None:
        status, answer, _ = call(leader_url(cluster), "GET", f"/v1/tokens/{admin_id}", token=secret)
        assert status == 200, answer
        used: str | None = answer["token"]["last_used_at"]
        return used

    assert wait_for(lambda: last_used() is not None, 10)
    assert str(last_used()).endswith(":00.000Z")  # a whole minute


def test_without_a_valid_token_only_public_routes_answer(cluster: LocalCluster) -> None:
    url = leader_url(cluster)
    for path in ("/healthz", "/readyz", "/openapi.json", "/v1/time"):
        status, _, _ = call(url, "GET", path, token="")
        assert status == 200, path
    with urllib.request.urlopen(url + "/", timeout=10) as page:  # the dashboard asks for one
        assert page.status == 200
    for token in ("", "rsk_" + "A" * 43, "not-a-token"):
        status, body, headers = call(url, "GET", "/v1/jobs", token=token)
        assert status == 401, (token, body)
        assert body["error"]["code"] == "unauthenticated"
        assert headers["WWW-Authenticate"] == "Bearer"
    status, body, _ = call(url, "POST", "/v1/jobs", {"queue": "q"}, token="")
    assert status == 401
    # A wrong scheme is refused the same way.
    status, _, _ = http_json(
        "GET", url + "/v1/jobs", token="", headers={"Authorization": "Basic YWRtaW46YWRtaW4="}
    )
    assert status == 401


def test_tokens_create_list_get_and_revoke_on_every_node(cluster: LocalCluster) -> None:
    admin = cluster.admin_token
    token, secret = make_token(cluster, name="payments-api", role="submitter", tenants=["acme"])
    assert token["id"].startswith("tok_") and token["revoked_at"] is None
    assert set(token) == {
        "id", "name", "role", "tenants", "queues", "created_at", "expires_at",
        "revoked_at", "last_used_at",
    }  # fmt: skip
    url = leader_url(cluster)
    status, listed, _ = call(url, "GET", "/v1/tokens", token=admin)
    assert status == 200 and token["id"] in [t["id"] for t in listed["tokens"]]
    assert all("secret" not in t for t in listed["tokens"])
    status, got, _ = call(url, "GET", f"/v1/tokens/{token['id']}", token=admin)
    assert status == 200 and got["token"] == token
    status, missing, _ = call(url, "GET", "/v1/tokens/tok_nope", token=admin)
    assert status == 404
    status, me, _ = call(url, "GET", "/v1/whoami", token=secret)
    assert status == 200 and me["token"]["id"] == token["id"]
    # Before the revocation every follower accepts the secret on a stale read.
    for follower in followers(cluster):
        status, _, _ = call(follower, "GET", "/v1/jobs?consistency=stale", token=secret)
        assert status == 200
    status, revoked, _ = call(url, "DELETE", f"/v1/tokens/{token['id']}", token=admin)
    assert status == 200 and revoked["token"]["revoked_at"] is not None
    # The leader applied it before answering; every follower once it applies it.
    status, _, _ = call(url, "GET", "/v1/jobs", token=secret)
    assert status == 401
    for follower in followers(cluster):
        assert wait_for(
            lambda f=follower: call(f, "GET", "/v1/jobs?consistency=stale", token=secret)[0] == 401,
            5,
        ), follower
    # Revoking again changes nothing; the last admin token cannot be revoked.
    status, again, _ = call(url, "DELETE", f"/v1/tokens/{token['id']}", token=admin)
    assert status == 200 and again["token"]["revoked_at"] == revoked["token"]["revoked_at"]
    status, me, _ = call(url, "GET", "/v1/whoami", token=admin)
    status, last, _ = call(url, "DELETE", f"/v1/tokens/{me['token']['id']}", token=admin)
    assert status == 409 and last["error"]["code"] == "invalid_state"


def test_roles_are_refused_403_outside_their_permissions(cluster: LocalCluster) -> None:
    url = leader_url(cluster)
    _, viewer = make_token(cluster, name="viewer", role="viewer")
    _, scoped_viewer = make_token(cluster, name="acme-viewer", role="viewer", tenants=["acme"])
    _, submitter = make_token(cluster, name="sub", role="submitter", tenants=["acme"])
    _, operator = make_token(cluster, name="ops", role="operator")
    status, body, _ = call(url, "POST", "/v1/jobs", {"queue": "q"}, token=viewer)
    assert status == 403 and body["error"]["code"] == "forbidden"
    assert call(url, "GET", "/v1/jobs", token=viewer)[0] == 200
    assert call(url, "GET", "/v1/cluster", token=viewer)[0] == 200
    # Cluster-wide views need every tenant.
    assert call(url, "GET", "/v1/cluster", token=scoped_viewer)[0] == 403
    assert call(url, "GET", "/metrics", token=scoped_viewer)[0] == 403
    assert "raftsched_jobs" in metrics_text(url, token=viewer)
    # Only an admin manages tokens.
    for secret in (viewer, submitter, operator):
        status, _, _ = call(url, "POST", "/v1/tokens", {"name": "x", "role": "admin"}, token=secret)
        assert status == 403
        assert call(url, "GET", "/v1/tokens", token=secret)[0] == 403
    # Operators replay and configure; submitters do not.
    assert call(url, "PUT", "/v1/queues/q", {"paused": False}, token=submitter)[0] == 403
    status, body, _ = call(url, "PUT", "/v1/queues/q", {"paused": False}, token=operator)
    assert status == 200, body
    assert (
        call(url, "POST", "/v1/leases", {"worker_id": "w", "queues": ["q"]}, token=operator)[0]
        == 403
    )


def test_a_submitter_submits_only_for_its_tenants(cluster: LocalCluster) -> None:
    url = leader_url(cluster)
    _, submitter = make_token(cluster, name="acme-api", role="submitter", tenants=["acme"])
    status, body, _ = call(
        url, "POST", "/v1/jobs", {"queue": "q", "tenant": "globex"}, token=submitter
    )
    assert status == 403 and body["error"]["details"] == {"tenant": "globex"}
    status, body, _ = call(url, "POST", "/v1/jobs", {"queue": "q"}, token=submitter)
    assert status == 403  # the default tenant is not acme
    batch = {"jobs": [{"queue": "q", "tenant": "acme"}, {"queue": "q", "tenant": "globex"}]}
    assert call(url, "POST", "/v1/jobs/batch", batch, token=submitter)[0] == 403
    status, body, _ = call(
        url, "POST", "/v1/jobs", {"queue": "q", "tenant": "acme"}, token=submitter
    )
    assert status == 201, body
    # The client library carries the token as well.
    with Client(cluster.urls, token=submitter, retry_budget_s=10) as client:
        job = client.submit("q", {"n": 1}, tenant="acme")
        assert job["tenant"] == "acme"
    bad = Client(cluster.urls, token="rsk_" + "B" * 43, retry_budget_s=5)
    with bad, pytest.raises(ClientUnauthenticated):
        bad.submit("q", {}, tenant="acme")


def test_a_worker_works_only_on_its_queues(cluster: LocalCluster) -> None:
    url = leader_url(cluster)
    admin = cluster.admin_token
    _, worker = make_token(cluster, name="pay-worker", role="worker", queues=["payments"])
    status, other, _ = call(url, "POST", "/v1/jobs", {"queue": "emails-w"}, token=admin)
    assert status == 201
    status, mine, _ = call(url, "POST", "/v1/jobs", {"queue": "payments"}, token=admin)
    assert status == 201
    claim = {"worker_id": "w", "queues": ["emails-w"], "wait_s": 0}
    status, body, _ = call(url, "POST", "/v1/leases", claim, token=worker)
    assert status == 403 and body["error"]["code"] == "forbidden"
    # An admin holds the emails job; the worker cannot touch it (404, as if absent).
    status, leased, _ = call(url, "POST", "/v1/leases", claim, token=admin)
    (foreign,) = leased["leases"]
    op = {"fencing_token": foreign["fencing_token"]}
    status, body, _ = call(url, "POST", f"/v1/leases/{foreign['job_id']}/start", op, token=worker)
    assert status == 404, body
    status, body, _ = call(url, "GET", f"/v1/jobs/{other['job']['id']}", token=worker)
    assert status == 404
    # Its own queue: claim, read the leased job, record an effect, complete.
    claim = {"worker_id": "w", "queues": ["payments"], "wait_s": 5}
    status, leased, _ = call(url, "POST", "/v1/leases", claim, token=worker)
    assert status == 200, leased
    (lease,) = leased["leases"]
    assert lease["job_id"] == mine["job"]["id"]
    status, body, _ = call(url, "GET", f"/v1/jobs/{lease['job_id']}", token=worker)
    assert status == 200 and body["job"]["status"] == "claimed"
    effect = {"key": "pay:1", "job_id": lease["job_id"], "fencing_token": lease["fencing_token"]}
    assert call(url, "POST", "/v1/effects", effect, token=worker)[0] == 201
    op = {"fencing_token": lease["fencing_token"], "result": {"ok": True}}
    status, body, _ = call(url, "POST", f"/v1/leases/{lease['job_id']}/complete", op, token=worker)
    assert status == 200, body
    # Done: no lease any more, so the worker no longer reads it.
    assert call(url, "GET", f"/v1/jobs/{lease['job_id']}", token=worker)[0] == 404
    assert call(url, "POST", "/v1/jobs", {"queue": "payments"}, token=worker)[0] == 403


def test_an_expired_token_is_refused(cluster: LocalCluster) -> None:
    url = leader_url(cluster)
    expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 4))
    token, secret = make_token(cluster, name="short", role="viewer", expires_at=expires)
    assert token["expires_at"] == expires.replace("Z", ".000Z")
    assert call(url, "GET", "/v1/jobs", token=secret)[0] == 200
    assert wait_for(lambda: call(url, "GET", "/v1/jobs", token=secret)[0] == 401, 10)
    status, body, _ = call(url, "GET", "/v1/whoami", token=secret)
    assert status == 401 and body["error"]["message"] == "the token has expired"
    past = {"name": "x", "role": "viewer", "expires_at": "2020-01-01T00:00:00Z"}
    status, body, _ = call(url, "POST", "/v1/tokens", past, token=cluster.admin_token)
    assert status == 400 and body["error"]["details"]["field"] == "expires_at"


def cli(
    cluster: LocalCluster, *args: str, cwd: Path | None = None, token: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RAFTSCHED_TOKEN"}
    if token is not None:
        env["RAFTSCHED_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "raftsched", "--url", ",".join(cluster.urls), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
        check=False,
    )


def test_the_cli_manages_tokens_and_finds_its_own(cluster: LocalCluster, tmp_path: Path) -> None:
    admin = cluster.admin_token
    made = cli(cluster, "--json", "tokens", "create", "ci", "--role", "viewer", token=admin)
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    SECRETS.append(created["secret"])
    token_id = created["token"]["id"]
    # --token wins over the environment.
    me = cli(cluster, "--json", "whoami", "--token", created["secret"], token=admin)
    assert me.returncode == 0 and json.loads(me.stdout)["token"]["id"] == token_id, me.stderr
    listed = cli(cluster, "tokens", "list", token=admin)
    assert (
        listed.returncode == 0
        and token_id in listed.stdout
        and created["secret"] not in (listed.stdout)
    )
    got = cli(cluster, "--json", "tokens", "get", token_id, token=admin)
    assert got.returncode == 0 and json.loads(got.stdout)["token"]["name"] == "ci"
    revoked = cli(cluster, "tokens", "revoke", token_id, token=admin)
    assert revoked.returncode == 0 and f"revoked {token_id}" in revoked.stdout
    refused = cli(cluster, "whoami", token=created["secret"])
    assert refused.returncode == 1 and "unauthenticated" in refused.stderr
    # Without --token or $RAFTSCHED_TOKEN: data/dev/admin.token under the current directory.
    (tmp_path / "data" / "dev").mkdir(parents=True)
    (tmp_path / "data" / "dev" / "admin.token").write_text(admin + "\n")
    found = cli(cluster, "--json", "whoami", cwd=tmp_path)
    assert found.returncode == 0 and json.loads(found.stdout)["token"]["role"] == "admin"
    nothing = cli(cluster, "whoami")
    assert nothing.returncode == 1 and "unauthenticated" in nothing.stderr


def failures(url: str, token: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for line in metrics_text(url, token=token).splitlines():
        if line.startswith("raftsched_http_auth_failures_total{"):
            reason = line.split('reason="')[1].split('"')[0]
            counts[reason] = float(line.split()[-1])
    return counts


def get_from(source: str, url: str, path: str, token: str) -> tuple[int, dict[str, Any], str]:
    """GET from the local address `source`: the limiter counts per address."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(
        parts.hostname or "", parts.port, timeout=10, source_address=(source, 0)
    )
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = connection.getresponse()
        return response.status, json.loads(response.read()), response.getheader("Retry-After", "")
    finally:
        connection.close()


def test_repeated_failures_from_one_address_are_rate_limited(cluster: LocalCluster) -> None:
    url = followers(cluster)[0]
    admin = cluster.admin_token
    answers = []
    started = time.monotonic()
    for _ in range(FAILURES_PER_MINUTE + 2):
        status, body, retry_after = get_from("127.0.0.2", url, "/v1/jobs", "rsk_" + "C" * 43)
        answers.append(status)
        if status == 429:
            assert body["error"]["code"] == "rate_limited"
            assert 1 <= int(retry_after) <= 60
            break
    assert answers == [401] * FAILURES_PER_MINUTE + [429], answers
    # An unknown secret makes a follower that is not behind ask the leader
    # how far to catch up, not wait out TOKEN_CATCH_UP_S each time.
    assert time.monotonic() - started < FAILURES_PER_MINUTE * TOKEN_CATCH_UP_S / 4
    # A caller with a valid secret from the same address still gets through,
    # and other addresses are not held back.
    assert get_from("127.0.0.2", url, "/v1/jobs?consistency=stale", admin)[0] == 200
    assert get_from("127.0.0.3", url, "/v1/jobs", "rsk_" + "C" * 43)[0] == 401
    counts = failures(url, admin)
    assert counts.get("unknown", 0) >= 1 and counts.get("rate_limited", 0) >= 1, counts
    assert set(counts) <= {"missing", "malformed", "unknown", "expired", "revoked", "rate_limited"}


def test_no_secret_reaches_a_log_line(cluster: LocalCluster) -> None:
    """(The module's fixture checks again after the nodes stopped.)"""
    assert len(SECRETS) >= 5
    logs = cluster.logs()
    for secret in SECRETS:
        assert secret not in logs
    # The logs are the nodes' own: they did log requests and the bootstrap.
    assert Path(cluster.admin_token_file).name in logs


def test_a_token_just_created_is_known_at_once_on_every_follower(cluster: LocalCluster) -> None:
    """A follower that has not applied a token's creation yet waits to catch
    up with the leader's commit index before it calls the secret unknown: a
    client that creates a token and uses it on another node at once is never
    refused. Each round creates a token at the leader and presents it to
    both followers on kept-open connections the moment the 201 arrives."""
    leader = leader_url(cluster)
    connections = {
        url: http.client.HTTPConnection(urllib.parse.urlsplit(url).netloc, timeout=10)
        for url in [leader, *followers(cluster)]
    }

    def send(url: str, method: str, path: str, token: str, body: Any = None) -> None:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        connections[url].request(method, path, body=data, headers=headers)

    def answer(url: str) -> tuple[int, dict[str, Any]]:
        response = connections[url].getresponse()
        return response.status, json.loads(response.read())

    refused = []
    try:
        for round_number in range(40):
            body = {"name": f"fresh-{round_number}", "role": "viewer"}
            send(leader, "POST", "/v1/tokens", cluster.admin_token, body)
            status, created = answer(leader)
            assert status == 201, created
            secret = created["secret"]
            SECRETS.append(secret)
            # Both requests leave before either answer is read.
            for url in followers(cluster):
                send(url, "GET", "/v1/whoami", secret)
            for url in followers(cluster):
                status, me = answer(url)
                if status != 200:
                    refused.append((round_number, url, status, me))
                else:
                    assert me["token"]["id"] == created["token"]["id"]
    finally:
        for connection in connections.values():
            connection.close()
    assert not refused, refused


def test_a_lagging_follower_waits_for_a_token_just_created(cluster: LocalCluster) -> None:
    """A follower that was stopped while the token was created (SIGSTOP, far
    shorter than an election timeout) is asked for it the moment it runs
    again: the request and the leader's entries reach it together, and it
    answers only once it has applied what the leader had committed."""
    leader_id = cluster.wait_for_leader()
    follower = next(node for node in cluster.nodes.values() if node.id != leader_id)
    connection = http.client.HTTPConnection(f"127.0.0.1:{follower.http_port}", timeout=10)
    refused = []
    try:
        for round_number in range(10):
            cluster.pause(follower.id)
            try:
                _, secret = make_token(cluster, name=f"lagging-{round_number}", role="viewer")
                headers = {"Authorization": f"Bearer {secret}"}
                connection.request("GET", "/v1/whoami", headers=headers)
            finally:
                cluster.resume(follower.id)
            response = connection.getresponse()
            body = json.loads(response.read())
            if response.status != 200:
                refused.append((round_number, response.status, body))
            time.sleep(0.3)  # the follower hears the leader again before the next pause
    finally:
        connection.close()
    assert not refused, refused
