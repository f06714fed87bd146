"""The dashboard in a real headless chromium against a real 3-node cluster.

The page is opened on a follower, so every test also proves that the page
reaches the leader across origins. Each test renders real data, and the
action tests change the cluster from the browser and check the change
through the API (and the audit trail in the job history). The cluster
requires tokens: each test logs in with the admin token (the login, roles
and scopes themselves: test_dashboard_login.py).
"""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from browser_support import csp_violations, login, shot

from raftsched.client import Client
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.testing import LocalCluster, http_json

pytestmark = pytest.mark.e2e


def follower_url(cluster: LocalCluster) -> str:
    leader = cluster.wait_for_leader()
    follower = next(node for node_id, node in cluster.nodes.items() if node_id != leader)
    return follower.http_url


def dead_letter_one(client: Client, queue: str) -> str:
    job = client.submit(queue, payload={"card": "4242"})
    (lease,) = client.claim("browser-w", [queue], max_jobs=1, wait_s=5)
    client.fail(lease["job_id"], lease["fencing_token"], kind="permanent", message="card declined")
    return str(job["id"])


def wait_for(predicate: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def admin_actor(client: Client) -> str:
    """How history names the admin token: `name (tok_...)`."""
    token = client.whoami()["token"]
    return f"{token['name']} ({token['id']})"


def confirm(page: Any, reason: str) -> None:
    page.wait_for_selector("#confirm[open]")
    page.fill("#confirm-reason", reason)
    page.click("#confirm-yes")


def test_on_call_view_shows_cluster_queues_stuck_and_dead_letters(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    dead_id = dead_letter_one(client, "payments")
    client.submit("emails", payload={"to": "a@example.com"})
    running = client.submit("reports")
    (lease,) = client.claim("browser-w", ["reports"], max_jobs=1, wait_s=5)
    client.start(lease["job_id"], lease["fencing_token"])  # and never a heartbeat: stuck

    login(page, follower_url(cluster) + "/", cluster.admin_token)
    nodes = page.locator("#nodes tbody tr")
    nodes.first.wait_for()
    assert nodes.count() == 3
    assert page.locator("#nodes").get_by_text("leader").count() >= 1
    page.locator("#queues").get_by_text("emails").wait_for()
    page.locator(f"#dlq >> text={dead_id}").wait_for()
    page.locator("#errors").get_by_text("card declined").first.wait_for()
    # Stuck after RAFTSCHED_STUCK_AFTER_S=2 without heartbeat progress; the
    # page updates by itself (polling), without a reload.
    page.evaluate("window.notReloaded = true")
    page.locator(f"#stuck >> text={running['id']}").wait_for(timeout=15_000)
    assert page.evaluate("window.notReloaded") is True
    page.locator("#leaders tbody tr").first.wait_for()
    page.locator("#nodes").get_by_text("ms").first.wait_for()  # clock skew measured
    shot(page, "oncall")


class _Receiver(BaseHTTPRequestHandler):
    """A webhook receiver that takes every delivery (204) and counts it."""

    received = 0

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).received += 1
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port  # closed again: nothing listens there


def test_events_view_lists_every_subscription_with_its_relay(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    """Each relay (docs/relays.md, section 5): a webhook whose receiver takes
    every delivery is connected and caught up; a Redis sink whose server is
    not there is unreachable and falls behind. Its URL's password is never
    on the page."""
    assert wait_for(lambda: client.cluster().get("cluster_version") == COMMAND_VERSION_MAX, 30)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    password, port = "ui-r3dis-pw", _closed_port()
    try:
        client.create_subscription(
            f"http://127.0.0.1:{server.server_port}/hook",
            "s3cret",
            ["job.cancelled"],
            subscription_id="sub_ui_hook",
        )
        sink = {"kind": "redis", "url": f"redis://:{password}@127.0.0.1:{port}/0", "stream": "ui"}
        client.create_broker_subscription(sink, ["job.cancelled"], subscription_id="sub_ui_redis")
        job = client.submit("relay-ui", {"n": 1})
        client.cancel_job(job["id"])
        assert wait_for(lambda: _Receiver.received >= 1, 15)

        login(page, follower_url(cluster) + "/", cluster.admin_token)
        hook = page.locator("#subscriptions tr", has_text="sub_ui_hook")
        hook.get_by_text("connected").wait_for()
        redis = page.locator("#subscriptions tr", has_text="sub_ui_redis")
        redis.get_by_text("unreachable").wait_for()
        cells = redis.locator("td").all_inner_texts()
        assert cells[1:4] == [
            "redis",
            f"redis://:***@127.0.0.1:{port}/0 · stream ui",
            "job.cancelled",
        ], cells
        assert int(cells[4]) >= 1 and cells[5].endswith(("s", "min")) and cells[6] == "0"
        hooked = hook.locator("td").all_inner_texts()
        assert hooked[1:5] == [
            "webhook",
            f"http://127.0.0.1:{server.server_port}/hook",
            "job.cancelled",
            "0",
        ], hooked
        assert hooked[5:7] == ["–", "0"]  # nothing waits, nothing parked
        assert password not in page.content()
        shot(page, "subscriptions")
    finally:
        client.delete_subscription("sub_ui_hook")
        client.delete_subscription("sub_ui_redis")
        server.shutdown()
        server.server_close()


def test_replay_from_the_dead_letter_queue_in_the_browser(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    dead_id = dead_letter_one(client, "refunds")
    login(page, follower_url(cluster) + "/", cluster.admin_token)
    row = page.locator("#dlq tr", has_text=dead_id)
    row.get_by_role("button", name="Replay").click()
    confirm(page, "card updated by customer")
    replayed = wait_for(lambda: client.get_job(dead_id)["status"] == "pending")
    assert replayed, client.get_job(dead_id)
    events = client.job_history(dead_id)
    replay = next(e for e in events if e["event"] == "replay")
    assert replay["actor"] == admin_actor(client)  # the token, not the header
    assert replay["detail"] == "card updated by customer"
    page.locator("#toast", has_text="done").wait_for()
    shot(page, "replayed")


def test_job_search_job_page_and_cancel(cluster: LocalCluster, client: Client, page: Any) -> None:
    job = client.submit(
        "invoices",
        payload={"invoice": 17},
        correlation_id="req-browser-17",
        idempotency_key="invoice:17",
        delay_s=3600,
    )
    login(page, follower_url(cluster) + "/#/jobs", cluster.admin_token)
    page.fill("input[name=correlation_id]", "req-browser-17")
    page.click("#job-search button[type=submit]")
    page.locator(f"#job-results >> text={job['id']}").wait_for()
    shot(page, "job-search")

    page.goto(follower_url(cluster) + "/#/jobs?idempotency_key=invoice:17")
    page.locator(f"#job-results >> text={job['id']}").click()
    page.locator("#job").get_by_text("invoice:17").wait_for()
    page.locator("#history li[data-event=submit]").wait_for()
    page.get_by_role("button", name="Cancel job").click()
    confirm(page, "customer withdrew the order")
    cancelled = wait_for(lambda: client.get_job(job["id"])["status"] == "cancelled")
    assert cancelled, client.get_job(job["id"])
    event = client.job_history(job["id"])[-1]
    assert (event["event"], event["actor"]) == ("cancel", admin_actor(client))
    page.locator("#history li[data-event=cancel]").wait_for()  # live update
    shot(page, "job-cancelled")


def test_jobs_are_searched_by_kind_and_show_it(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    """Job kinds (cluster version 8): the search form's `kind`, the table's
    column and the job page's field."""
    raised = wait_for(lambda: client.cluster().get("cluster_version") == COMMAND_VERSION_MAX, 30)
    assert raised, client.cluster()
    kinded = client.submit("kinded", {"n": 1}, kind="invoice.send", delay_s=3600)
    plain = client.submit("kinded", {"n": 2}, delay_s=3600)
    login(page, follower_url(cluster) + "/#/jobs?kind=invoice.send", cluster.admin_token)
    page.locator(f"#job-results >> text={kinded['id']}").wait_for()
    results = page.locator("#job-results").inner_text()
    assert "invoice.send" in results and plain["id"] not in results
    assert page.input_value("input[name=kind]") == "invoice.send"
    page.locator(f"#job-results >> text={kinded['id']}").click()
    page.locator("#job dd", has_text="invoice.send").wait_for()
    shot(page, "job-kind")


def test_job_page_shows_the_trace_id(cluster: LocalCluster, client: Client, page: Any) -> None:
    """A job submitted inside a trace (cluster version 8) shows its trace id
    on its page, the whole traceparent in the title, to find it in a tracing
    backend."""
    raised = wait_for(lambda: client.cluster().get("cluster_version") == COMMAND_VERSION_MAX, 30)
    assert raised, client.cluster()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = f"00-{trace_id}-00f067aa0ba902b7-01"
    leader = cluster.nodes[cluster.wait_for_leader()]
    status, answer, _ = http_json(
        "POST",
        leader.http_url + "/v1/jobs",
        {"queue": "traced", "delay_s": 3600},
        token=cluster.admin_token,
        headers={"traceparent": traceparent},
    )
    assert status == 201, answer
    job = answer["job"]
    assert job["traceparent"] == traceparent, job
    login(page, follower_url(cluster) + f"/#/jobs/{job['id']}", cluster.admin_token)
    trace = page.locator("#job dd span", has_text=trace_id)
    trace.wait_for()
    assert trace.get_attribute("title") == traceparent
    shot(page, "job-trace")


def test_job_page_shows_attempts_and_timeline(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    job = client.submit("exports", max_attempts=3)
    (lease,) = client.claim("browser-w", ["exports"], max_jobs=1, wait_s=5)
    client.start(lease["job_id"], lease["fencing_token"])
    client.complete(lease["job_id"], lease["fencing_token"], {"rows": 12})
    login(page, follower_url(cluster) + f"/#/jobs/{job['id']}", cluster.admin_token)
    page.locator("#attempts tbody tr").first.wait_for()
    assert "browser-w" in page.locator("#attempts").inner_text()
    for event in ("submit", "claim", "start", "complete"):
        page.locator(f"#history li[data-event={event}]").wait_for()
    assert "succeeded" in page.locator("#job").inner_text()
    shot(page, "job-page")


def test_queue_pause_schedule_and_workflow_pages_work_or_say_not_available(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    """These views use other features' endpoints; on a build without them the
    page says so instead of failing."""
    base = follower_url(cluster)
    leader_url = cluster.nodes[cluster.wait_for_leader()].http_url
    client.submit("pausable")
    login(page, base + "/", cluster.admin_token)
    row = page.locator("#queues tr", has_text="pausable")
    row.get_by_role("button", name="Pause queue").click()
    confirm(page, "maintenance")
    status, body, _ = http_json("GET", leader_url + "/v1/queues/pausable")
    if status == 404 and body.get("error", {}).get("message", "").startswith("no route"):
        page.locator("#toast", has_text="not available").wait_for()
    else:
        paused = wait_for(
            lambda: (
                http_json("GET", leader_url + "/v1/queues/pausable")[1]
                .get("queue", {})
                .get("paused")
            )
        )
        assert paused, body

    # A change of hash alone does not reload the page: the old view stays in
    # <main> until the new one renders, so wait for the view the router marks.
    for view, heading in (("schedules", "Schedules"), ("workflows", "Workflows")):
        page.goto(base + "/#/" + view)
        page.locator(f"main[data-view={view}] section").first.wait_for()
        text = page.locator("main").inner_text()
        assert heading in text
    shot(page, "workflows")


def unknown_outcome(client: Client, queue: str) -> str:
    """A `reconcile` job whose running attempt failed `unknown`: reconciling,
    its reconciliation claimed from `<queue>-recon`."""
    job = client.submit(
        queue, payload={"card": "4242"}, on_unknown="reconcile", reconcile_queue=f"{queue}-recon"
    )
    (lease,) = client.claim("browser-w", [queue], max_jobs=1, wait_s=5)
    assert lease["job_id"] == job["id"]
    client.start(lease["job_id"], lease["fencing_token"])
    failed = client.fail(lease["job_id"], lease["fencing_token"], kind="unknown", message="timeout")
    assert failed["status"] == "reconciling"
    return str(job["id"])


def test_reconciliation_page_shows_the_report_and_its_windows(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    assert wait_for(lambda: client.cluster().get("cluster_version", 0) >= 5, 30)
    queue = "browser-pay"
    done = unknown_outcome(client, queue)
    (ask,) = client.claim("browser-rec", [f"{queue}-recon"], max_jobs=1, wait_s=5)
    client.reconcile(done, ask["fencing_token"], "happened", reason="provider lists ch_9")
    waiting = unknown_outcome(client, queue)

    login(page, follower_url(cluster) + "/", cluster.admin_token)
    page.locator("header nav a[data-nav=reconciliation]").click()
    page.locator("main[data-view=reconciliation] #reconciling").wait_for()
    row = page.locator("#reconciling tr", has_text=waiting)
    row.wait_for()
    assert f"{queue}-recon" in row.inner_text() and "waiting for a reconciler" in row.inner_text()
    completed = page.locator("#completed tr", has_text=done)
    assert "browser-rec" in completed.inner_text()
    assert "provider lists ch_9" in completed.inner_text()
    decided = page.locator("#decisions tr", has_text=queue).locator("td")
    assert decided.all_inner_texts() == [queue, "1", "0", "0", "0"]
    unknown = page.locator("#unknown-outcomes tr", has_text=queue)
    assert unknown.locator("td").nth(1).inner_text() == "2"
    assert unknown.locator("svg.bars rect").count() == 24  # an hour each, the last one now
    assert unknown.locator("svg.bars rect").last.get_attribute("height") != "0"
    shot(page, "reconciliation")
    # Another window: the page asks the API again and says which one it shows.
    page.locator("#reconciliation").get_by_role("link", name="7 days").click()
    page.locator("#reconciliation b", has_text="7 days").wait_for()
    week = page.locator("#unknown-outcomes tr", has_text=queue).locator("svg.bars rect")
    assert week.count() == 168
    # The job link leads to the job, where the decision is in the timeline.
    page.locator("#completed").get_by_role("link", name=done).click()
    page.locator("#history li[data-event=complete]").wait_for()


def _request(method: str, url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_cross_origin_rules_and_bad_input(cluster: LocalCluster, client: Client) -> None:
    """No browser needed: CORS only for the cluster's own origins; strict input."""
    leader_url = cluster.nodes[cluster.wait_for_leader()].http_url
    own = follower_url(cluster)
    bearer = {"Authorization": f"Bearer {cluster.admin_token}"}
    preflight = {"Origin": own, "Access-Control-Request-Method": "POST"}
    status, headers, _ = _request("OPTIONS", leader_url + "/v1/jobs/x/cancel", preflight)
    assert status == 204 and "Raftsched-Actor" in headers["Access-Control-Allow-Headers"]
    assert "Authorization" in headers["Access-Control-Allow-Headers"]
    status, headers, _ = _request("GET", leader_url + "/v1/overview", {"Origin": own, **bearer})
    assert headers.get("Access-Control-Allow-Origin") == own
    evil = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
    status, headers, _ = _request("OPTIONS", leader_url + "/v1/jobs/x/cancel", evil)
    assert status == 403 and "Access-Control-Allow-Origin" not in headers
    status, headers, _ = _request(
        "GET", leader_url + "/v1/overview", {"Origin": evil["Origin"], **bearer}
    )
    assert status == 200 and "Access-Control-Allow-Origin" not in headers

    status, body, _ = http_json("GET", leader_url + "/v1/overview?errors=many")
    assert status == 400 and body["error"]["details"]["field"] == "errors"
    status, body, _ = http_json("GET", leader_url + "/v1/overview?bogus=1")
    assert status == 400 and body["error"]["details"]["field"] == "bogus"
    for name in ("..%2Fopenapi.json", "nope.js", "openapi.json"):
        status, _, _ = _request("GET", leader_url + "/static/" + name, {})
        assert status == 404, name
    status, headers, text = _request("GET", leader_url + "/static/app.js", {})
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    status, body, _ = http_json("GET", leader_url + "/v1/jobs?idempotency_key=never-used")
    assert (status, body["jobs"]) == (200, [])
    status, body, _ = http_json("GET", leader_url + "/v1/time")
    assert status == 200 and abs(body["wall_ms"] - time.time() * 1000) < 60_000


def test_every_answer_carries_the_security_headers(cluster: LocalCluster) -> None:
    """API answers, errors, redirects and the dashboard's files (api/headers.py)."""
    leader_url = cluster.nodes[cluster.wait_for_leader()].http_url
    follower = follower_url(cluster)
    answers = {
        "api": http_json("GET", leader_url + "/v1/jobs?limit=1")[2],
        "error": http_json("GET", leader_url + "/v1/jobs/no-such-job")[2],
        "redirect": http_json("POST", follower + "/v1/jobs", {"queue": "q"})[2],
        "health": http_json("GET", leader_url + "/healthz")[2],
        "script": _request("GET", leader_url + "/static/app.js", {})[1],
        "page": _request("GET", leader_url + "/", {})[1],
    }
    for name, headers in answers.items():
        assert headers["X-Content-Type-Options"] == "nosniff", name
        assert headers["Referrer-Policy"] == "no-referrer", name
        assert headers["X-Frame-Options"] == "DENY", name
        assert "Strict-Transport-Security" not in headers, name  # plain HTTP
    for name in ("api", "error", "redirect", "health"):
        assert answers[name]["Cache-Control"] == "no-store", name
        assert answers[name]["Content-Security-Policy"].startswith("default-src 'none'"), name
    assert answers["script"]["Cache-Control"] == "no-cache"
    page_policy = answers["page"]["Content-Security-Policy"]
    assert "script-src 'self'" in page_policy and "form-action 'none'" in page_policy
    for url in cluster.urls:  # the page may talk to whichever node leads
        assert url in page_policy


def test_workflow_page_draws_the_step_graph_and_cancels(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    leader_url = cluster.nodes[cluster.wait_for_leader()].http_url
    steps = [
        {"name": "reserve", "queue": "wf-inventory", "payload": {}},
        {"name": "charge", "queue": "wf-payments", "payload": {}, "depends_on": ["reserve"]},
    ]
    status, body, _ = http_json("POST", leader_url + "/v1/workflows", {"steps": steps})
    if status == 404:
        pytest.skip("this build has no workflows API")
    assert status in (200, 201), body
    workflow_id = body["workflow"]["id"]
    login(page, follower_url(cluster) + f"/#/workflows/{workflow_id}", cluster.admin_token)
    page.locator("svg.graph g[data-step=reserve]").wait_for()
    page.locator("svg.graph g[data-step=charge]").wait_for()
    shot(page, "workflow")
    page.get_by_role("button", name="Cancel workflow").click()
    confirm(page, "order withdrawn")
    cancelled = wait_for(
        lambda: (
            http_json("GET", leader_url + f"/v1/workflows/{workflow_id}")[1]["workflow"]["status"]
            == "cancelled"
        )
    )
    assert cancelled


def test_the_page_runs_under_its_policy_and_a_violation_would_be_caught(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    """The page gets the strict policy; an inline script is refused, and the
    fixture's check (which every other test passes) sees the refusal."""
    base = follower_url(cluster)
    with page.expect_response(lambda answer: answer.url == base + "/") as answered:
        login(page, base + "/", cluster.admin_token)
    response = answered.value
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert response.headers["x-frame-options"] == "DENY"
    page.locator("#nodes tbody tr").first.wait_for()
    assert csp_violations(page) == []  # the page itself needs nothing refused

    page.evaluate(
        """() => {
          const script = document.createElement("script");
          script.textContent = "window.inlineRan = true";
          document.body.appendChild(script);
          document.body.insertAdjacentHTML("beforeend", '<p style="color: red">x</p>');
        }"""
    )
    wait_for(lambda: len(csp_violations(page)) >= 2, 5)
    assert page.evaluate("window.inlineRan === undefined")
    found = csp_violations(page)
    assert any("script-src" in line for line in found), found
    # Expected here: clear them so that the fixture's check passes.
    page.csp_console.clear()
    page.evaluate("window.__cspViolations = []")
