"""Schema-driven fuzzing of a live 3-node cluster.

schemathesis reads the description a node serves at `/openapi.json` and sends
requests generated from it: the document's examples, boundary and wrong-typed
values for every field (its coverage phase), random valid bodies (fuzzing),
and chains of calls along inferred links (stateful). Each answer is checked
for a server error, a status code the document does not list, a content type
it does not list, and a body that does not match its schema. Any finding
fails the test with schemathesis's own report, which shows a curl command
that reproduces it. A few seeded objects (jobs, a lease and its effect, a
workflow, a schedule, a subscription) give path parameters real ids.

The first two passes run as admin. Then one bounded pass per other role
(operator, submitter, worker, viewer; issue 15) runs with a token of that role,
scoped as a real deployment would scope it, so that most operations end in
`403 forbidden` or a scoped `404`: these must be documented answers too, with
bodies matching the error schema. Role passes send the document's examples
and a few random cases per operation (no coverage or stateful phase), and the
tokens they use are never revoked or deleted (those operations are excluded).
The figures of every pass (operations, test cases, findings) are printed.

Each run is bounded (a fixed number of examples per operation, one worker, a
hard timeout) and deterministic, so a failure replays exactly. It sends
nothing off this machine: the base URLs are the nodes' loopback URLs, the
seeded subscription delivers to a loopback receiver the test runs, and the
one operation that would make a node connect to a URL taken from the request
(creating a subscription) is left out. Afterwards every node must still
answer, the replicas must agree, and no node may have logged an error.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftsched.client import Client
from raftsched.testing import LocalCluster, http_json

pytestmark = pytest.mark.slow

CHECKS = (
    "not_a_server_error",
    "response_schema_conformance",
    "status_code_conformance",
    "content_type_conformance",
)
# Two passes: the leader handles everything; a follower validates, answers
# reads with ?consistency=stale and redirects the rest (redirects not followed,
# so that its 307 answers are checked against the document too).
LEADER_EXAMPLES_PER_OPERATION = 30
FOLLOWER_EXAMPLES_PER_OPERATION = 10
REQUEST_TIMEOUT_S = 20
PASS_TIMEOUT_S = 240
# One pass per other role: few examples, the examples and fuzzing phases only.
ROLE_EXAMPLES_PER_OPERATION = 4
ROLE_PASS_TIMEOUT_S = 90
ROLE_PHASES = "examples,fuzzing"
# The role tokens' scope: (tenants, queues). The seeded objects are acme's, on
# queue payments; the viewer is scoped, so cluster-wide views refuse it.
ROLE_SCOPES: dict[str, tuple[list[str], list[str]]] = {
    "operator": (["acme"], ["*"]),
    "submitter": (["acme"], ["*"]),
    "worker": (["*"], ["payments"]),
    "viewer": (["acme"], ["*"]),
}

# Operations the fuzzer must not call, by operationId, and why.
EXCLUDED_OPERATIONS = {
    "addClusterNode": "changes the membership under the fuzzer (tests/e2e/test_membership.py)",
    "removeClusterNode": "could remove the nodes the fuzzer talks to "
    "(tests/e2e/test_membership.py)",
    "getBackup": "forks a child that encodes the whole state per call "
    "(tests/e2e/test_backup_restore.py)",
    "createSubscription": "makes the leader POST events to a URL taken from the request",
    "createToken": "makes credentials (the cluster runs with tokens; tests/e2e/test_auth.py)",
    "revokeToken": "could revoke a credential (tests/e2e/test_auth.py covers it)",
    "listTokens": "under /v1/tokens, guarded; tests/e2e/test_auth.py covers it",
    "getToken": "under /v1/tokens, guarded; tests/e2e/test_auth.py covers it",
}
# Paths whose operations could take the cluster away from the fuzzer (a
# membership change, a restore, a first token that turns authentication on):
# the test refuses to run until each such operation is excluded above.
GUARDED_PATH_PREFIXES = ("/v1/cluster/nodes", "/v1/backup", "/v1/restore", "/v1/tokens")


@contextlib.contextmanager
def _webhook_receiver() -> Iterator[str]:
    """A loopback endpoint for the one seeded subscription: it answers 204 to
    every delivery, so the leader never retries or parks an event."""

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the standard library's name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _seed(client: Client, webhook_url: str) -> dict[str, list[str]]:
    """Real objects for path parameters, so that not every call ends in 404."""
    subscription = client.create_subscription(webhook_url, "fuzz-secret-fuzz-secret", [])
    client.set_queue("payments", concurrency_limit=10)
    client.set_tenant("acme", weight=1)
    pending = client.submit("payments", {"n": 1}, tenant="acme", idempotency_key="fuzz:1")
    leased = client.submit("payments", {"n": 2}, tenant="acme")
    leases = client.claim("fuzz-worker", ["payments"], max_jobs=2, wait_s=5)
    assert leases, "the seeded jobs could not be claimed"
    lease = leases[0]
    client.record_effect("charge:pay_1", lease["job_id"], lease["fencing_token"], {"ok": True})
    workflow = client.submit_workflow(
        {"steps": [{"name": "reserve", "queue": "inventory"},
                   {"name": "charge", "queue": "payments", "depends_on": ["reserve"]}]}
    )  # fmt: skip
    schedule = {"id": "nightly-settlement", "cron": "0 2 * * *", "timezone": "UTC",
                "paused": True, "job": {"queue": "settlement"}}  # fmt: skip
    client.request("POST", "/v1/schedules", body=schedule)
    return {
        "job_ids": [pending["id"], leased["id"]],
        "workflow_ids": [workflow["id"]],
        "schedule_ids": ["nightly-settlement"],
        "effect_keys": ["charge:pay_1"],
        "names": ["payments", "acme", "app.js", "uPlot.iife.min.js"],
        "subscription_ids": [subscription["id"]],
    }


def _config(path: Path, seeds: dict[str, list[str]]) -> Path:
    """A schemathesis config that draws path parameters from the seeded ids
    half the time and generates them the other half."""
    bindings = {
        "path.job_id": "job_ids",
        "path.workflow_id": "workflow_ids",
        "path.schedule_id": "schedule_ids",
        "path.key": "effect_keys",
        "path.name": "names",
        "path.subscription_id": "subscription_ids",
    }
    lines = ["[dictionaries]"]
    lines += [f"{name} = {{ values = {json.dumps(values)} }}" for name, values in seeds.items()]
    lines += ["", "[parameters]"]
    lines += [
        f'"{parameter}" = {{ dictionary = "{name}", probability = 0.5 }}'
        for parameter, name in bindings.items()
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _run_fuzzer(
    base_url: str,
    config: Path,
    examples: int,
    extra: list[str],
    token: str | None = None,
    timeout_s: float = PASS_TIMEOUT_S,
) -> tuple[dict[str, Any], str, float]:
    """One schemathesis run: (its JSON report, its text output, seconds taken).
    `token`: the bearer secret the hooks send (default: the session's admin)."""
    report = config.parent / f"report-{len(list(config.parent.glob('report-*')))}.json"
    command = [
        sys.executable, "-m", "schemathesis.cli",
        "--config-file", str(config),
        "run", base_url + "/openapi.json",
        "--url", base_url,
        "--checks", ",".join(CHECKS),
        "--max-examples", str(examples),
        "--generation-deterministic",
        "--workers", "1",
        "--request-timeout", str(REQUEST_TIMEOUT_S),
        "--no-color",
        "--report", "json",
        "--report-json-path", str(report),
        *extra,
    ]  # fmt: skip
    for operation_id in EXCLUDED_OPERATIONS:
        command += ["--exclude-operation-id", operation_id]
    here = str(Path(__file__).parent)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "SCHEMATHESIS_HOOKS": "fuzz_hooks"}
    if token is not None:
        env["RAFTSCHED_TOKEN"] = token  # what fuzz_hooks.before_call sends
    started = time.monotonic()
    finished = subprocess.run(
        command,
        cwd=config.parent,  # schemathesis keeps a cache directory in its working directory
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    elapsed_s = time.monotonic() - started
    output = finished.stdout + finished.stderr
    assert report.exists(), f"schemathesis wrote no report (exit {finished.returncode}):\n{output}"
    return json.loads(report.read_text()), output, elapsed_s


def _unguarded_operations(document: dict[str, Any]) -> list[str]:
    return sorted(
        f"{method.upper()} {path} ({operation.get('operationId')})"
        for path, item in document["paths"].items()
        if path.startswith(GUARDED_PATH_PREFIXES)
        for method, operation in item.items()
        if isinstance(operation, dict)
        and "responses" in operation
        and operation.get("operationId") not in EXCLUDED_OPERATIONS
    )


def _findings(report: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted(
        (operation, failure["code"])
        for failure in report["failures"]
        for operation in failure["operations"]
    )


def _log_records(cluster: LocalCluster, node_id: str) -> list[dict[str, Any]]:
    """A node's log lines (one JSON object each), skipping any cut-off line."""
    records = []
    for line in cluster.nodes[node_id].log_path.read_text(errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _role_token(url: str, role: str) -> str:
    tenants, queues = ROLE_SCOPES[role]
    body = {"name": f"fuzz-{role}", "role": role, "tenants": tenants, "queues": queues}
    status, answer, _ = http_json("POST", url + "/v1/tokens", body, timeout_s=REQUEST_TIMEOUT_S)
    assert status == 201, answer
    secret: str = answer["secret"]
    return secret


def _check_pass(report: dict[str, Any], output: str, who: str, elapsed_s: float) -> None:
    findings = _findings(report)
    # schemathesis lists the operations that answered 401 or 403 ("missing_auth"):
    # for a role pass, those its role or scope may not call.
    refused = report.get("warnings", {}).get("missing_auth", [])
    print(
        f"fuzz pass {who}: {report['operations']['tested']} operations "
        f"({len(refused)} of them refused 401/403), {report['test_cases']['generated']} "
        f"test cases, {len(findings)} failures in {elapsed_s:.0f}s; findings: {findings}"
    )
    assert report["complete"] and report["stop_reason"] == "completed", output
    assert findings == [], f"schemathesis found {findings} ({who}):\n{output}"
    assert report["errors"] == [], f"schemathesis could not test everything ({who}):\n{output}"
    assert report["operations"]["tested"] == report["operations"]["selected"], output


@pytest.mark.timeout(2 * PASS_TIMEOUT_S + len(ROLE_SCOPES) * ROLE_PASS_TIMEOUT_S + 120)
def test_fuzzer_finds_nothing_and_the_cluster_survives(
    tmp_path: Path, cluster: LocalCluster, client: Client
) -> None:
    with _webhook_receiver() as webhook_url:
        seeds = _seed(client, webhook_url)
        leader = cluster.wait_for_leader(timeout_s=30)
        follower = next(node for node in cluster.nodes.values() if node.id != leader)
        config = _config(tmp_path / "schemathesis.toml", seeds)
        status, document, _ = http_json("GET", cluster.nodes[leader].http_url + "/openapi.json")
        assert status == 200
        assert _unguarded_operations(document) == [], "exclude these from the fuzzer first"
        passes = [
            (cluster.nodes[leader].http_url, LEADER_EXAMPLES_PER_OPERATION, []),
            (follower.http_url, FOLLOWER_EXAMPLES_PER_OPERATION, ["--max-redirects", "0"]),
        ]
        for base_url, examples, extra in passes:
            report, output, elapsed_s = _run_fuzzer(base_url, config, examples, extra)
            print(output)
            _check_pass(report, output, f"admin at {base_url}", elapsed_s)
        leader_url = cluster.nodes[leader].http_url
        for role in ROLE_SCOPES:
            report, output, elapsed_s = _run_fuzzer(
                leader_url,
                config,
                ROLE_EXAMPLES_PER_OPERATION,
                ["--phases", ROLE_PHASES],
                token=_role_token(leader_url, role),
                timeout_s=ROLE_PASS_TIMEOUT_S,
            )
            _check_pass(report, output, f"{role} at {leader_url}", elapsed_s)

        for url in cluster.urls:
            assert http_json("GET", url + "/healthz")[0] == 200, url
        cluster.wait_for_leader(timeout_s=30)
        for url in cluster.urls:
            assert http_json("GET", url + "/readyz")[0] == 200, url
        cluster.wait_converged(timeout_s=30)
    # No node may have logged an error: the e2e log gate (conftest.py) checks
    # every node's log once the cluster has stopped.


def test_a_request_that_cannot_be_parsed_is_a_400_and_a_warning(cluster: LocalCluster) -> None:
    """The fuzzer's first probe, a NUL byte in a header, made aiohttp log an
    error: the client's fault must not read as the node's."""
    node = cluster.nodes["n1"]
    with socket.create_connection(("127.0.0.1", node.http_port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Probe: \x00\r\n\r\n")
        status_line = sock.recv(4096).split(b"\r\n", 1)[0]
    assert status_line.split(b" ")[1] == b"400", status_line

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        records = _log_records(cluster, "n1")
        if any("Error handling request" in r.get("msg", "") for r in records):
            break
        time.sleep(0.1)
    reports = [r for r in records if "Error handling request" in r.get("msg", "")]
    assert [r["level"] for r in reports] == ["warning"], reports
    assert http_json("GET", node.http_url + "/healthz")[0] == 200
