"""The dashboard's login, roles and tenant scopes in a real chromium against a
real 3-node cluster that requires tokens (docs/security.md, "Dashboard").

Each test makes its own tokens through the API with the admin token, opens
the page on a follower (so the page also reaches the leader with its token,
across origins) and checks through the API what the page did.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from browser_support import login, shot

from raftsched.client import Client
from raftsched.testing import LocalCluster, http_json, metrics_text

pytestmark = pytest.mark.e2e

DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
# RAFTSCHED_DOCS_SCREENSHOTS=1 refreshes the pictures docs/security.md shows.
DOCS_SCREENSHOTS = os.environ.get("RAFTSCHED_DOCS_SCREENSHOTS") == "1"


def follower_url(cluster: LocalCluster) -> str:
    leader = cluster.wait_for_leader()
    return next(node.http_url for node_id, node in cluster.nodes.items() if node_id != leader)


def wait_for(predicate: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def new_token(client: Client, name: str, role: str, **scope: Any) -> tuple[str, str]:
    """(token id, secret), once every node knows the token."""
    made = client.create_token(name, role, **scope)
    return made["token"]["id"], made["secret"]


def dead_letter_one(client: Client, queue: str, tenant: str | None = None) -> str:
    job = client.submit(queue, payload={"card": "4242"}, tenant=tenant)
    (lease,) = client.claim("login-w", [queue], max_jobs=1, wait_s=5)
    client.fail(lease["job_id"], lease["fencing_token"], kind="permanent", message="card declined")
    return str(job["id"])


def auth_failures(url: str) -> float:
    """raftsched_http_auth_failures_total at one node, every reason."""
    total = 0.0
    for line in metrics_text(url).splitlines():
        if line.startswith("raftsched_http_auth_failures_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def console_of(page: Any) -> list[str]:
    lines: list[str] = []
    page.on("console", lambda message: lines.append(message.text))
    return lines


def secret_anywhere(page: Any, secret: str) -> list[str]:
    """Where in the page the secret shows: markup, text, or any input's value."""
    found = []
    if secret in page.content():
        found.append("markup")
    if secret in page.locator("body").inner_text():
        found.append("text")
    values = page.evaluate("[...document.querySelectorAll('input')].map((i) => i.value)")
    if any(secret in value for value in values):
        found.append("an input's value")
    return found


def storage(page: Any) -> dict[str, Any]:
    return dict(
        page.evaluate(
            """() => ({session: sessionStorage.getItem("raftsched.token"),
                       local: localStorage.length, cookie: document.cookie})"""
        )
    )


def test_login_shows_who_and_keeps_the_secret_out_of_the_page(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    console = console_of(page)
    secret = cluster.admin_token
    dead_id = dead_letter_one(client, "payments")
    client.submit("emails", payload={"to": "a@example.com"})
    page.goto(follower_url(cluster) + "/")
    field = page.locator("#login-secret")
    field.wait_for()
    assert field.get_attribute("type") == "password"
    assert field.get_attribute("autocomplete") == "off"
    assert page.locator("#login-form").get_attribute("autocomplete") == "off"
    assert page.locator("main#view").is_hidden() and page.locator("#nav").is_hidden()
    field.fill("rsk_not-a-valid-token-at-all-0000000000000000000")
    page.locator("#login-submit").click()
    page.locator("#login-message", has_text="refused").wait_for()
    assert page.locator("#login").is_visible()
    shot(page, "login")
    if DOCS_SCREENSHOTS:
        page.screenshot(path=str(DOCS_IMAGES / "dashboard-login.png"))

    leader_url = cluster.nodes[cluster.wait_for_leader()].http_url
    failures_before = auth_failures(leader_url)
    field.fill(secret)
    page.locator("#login-submit").click()
    page.locator("#nodes tbody tr").first.wait_for()
    me = client.whoami()["token"]
    assert page.locator("#who-name").inner_text() == me["name"]
    assert page.locator("#who-role").inner_text() == "admin"
    assert page.locator("#who-scope").inner_text() == "all tenants"
    assert page.locator("#login").is_hidden()
    page.locator("#dlq tr", has_text=dead_id).wait_for()
    page.locator("#queues").get_by_text("emails").wait_for()
    shot(page, "logged-in")
    if DOCS_SCREENSHOTS:
        page.screenshot(path=str(DOCS_IMAGES / "dashboard-overview.png"))

    # The page found the leader from the overview before asking it anything
    # else: no request reached it through a redirect, without its token.
    assert auth_failures(leader_url) == failures_before

    # Kept in this tab's sessionStorage only; nowhere in the page or console.
    assert storage(page) == {"session": secret, "local": 0, "cookie": ""}
    assert secret_anywhere(page, secret) == []
    page.goto(follower_url(cluster) + "/#/jobs")  # still logged in: same tab
    page.locator("main[data-view=jobs] #job-results").wait_for()
    assert secret_anywhere(page, secret) == []
    assert not [line for line in console if secret in line]

    page.locator("#logout").click()
    page.locator("#login-message", has_text="Logged out").wait_for()
    assert storage(page)["session"] is None
    assert page.locator("main#view").is_hidden()
    assert page.locator("#view section").count() == 0


def test_a_viewer_sees_no_actions_and_cannot_act(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    dead_id = dead_letter_one(client, "viewer-dlq")
    client.submit("viewer-later", delay_s=3600)
    _, secret = new_token(client, "dash-viewer", "viewer")
    login(page, follower_url(cluster) + "/", secret)
    assert page.locator("#who-role").inner_text() == "viewer"
    row = page.locator("#dlq tr", has_text=dead_id)
    row.wait_for()
    page.locator("#queues tr", has_text="viewer-later").wait_for()
    # Hidden, not disabled: no replay, cancel or queue buttons at all; the
    # subscriptions (an operator's) are a note, not an error.
    assert page.locator("#view button[data-action]").count() == 0
    assert "not for the viewer role" in page.locator("#subscriptions").inner_text()
    page.goto(follower_url(cluster) + f"/#/jobs/{dead_id}")
    page.locator("#history li[data-event=submit]").wait_for()
    assert page.locator("#job .actions button").count() == 0
    shot(page, "viewer-job")

    # And the server refuses what the page does not offer: the page's own
    # token, used from the page, gets 403 from the leader.
    leader_url = cluster.nodes[cluster.wait_for_leader()].http_url
    status = page.evaluate(
        """async ([url, id]) => (await fetch(`${url}/v1/jobs/${id}/replay`, {
             method: "POST",
             headers: {Authorization: `Bearer ${sessionStorage.getItem("raftsched.token")}`,
                       "Content-Type": "application/json"},
             body: JSON.stringify({reason: "viewer tries"})})).status""",
        [leader_url, dead_id],
    )
    assert status == 403
    assert client.get_job(dead_id)["status"] == "dead_letter"


def test_an_operator_replays_from_the_dead_letter_queue_as_its_token(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    dead_id = dead_letter_one(client, "operator-dlq")
    token_id, secret = new_token(client, "ops-alice", "operator")
    login(page, follower_url(cluster) + "/", secret)
    assert page.locator("#who-role").inner_text() == "operator"
    row = page.locator("#dlq tr", has_text=dead_id)
    row.get_by_role("button", name="Replay").click()
    page.wait_for_selector("#confirm[open]")
    page.fill("#confirm-reason", "card updated")
    page.click("#confirm-yes")
    page.locator("#toast", has_text="done").wait_for()
    assert wait_for(lambda: client.get_job(dead_id)["status"] == "pending")
    replay = next(e for e in client.job_history(dead_id) if e["event"] == "replay")
    assert replay["actor"] == f"ops-alice ({token_id})"
    assert replay["detail"] == "card updated"
    page.goto(follower_url(cluster) + f"/#/jobs/{dead_id}")
    page.locator("#history li[data-event=replay]", has_text=f"ops-alice ({token_id})").wait_for()


def test_a_tenant_viewer_sees_its_jobs_and_a_note_on_cluster_views(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    """The server scopes (lists filtered, other tenants' jobs 404, 403 on
    views that mix tenants); the page shows what the token gets, and a note
    instead of an error where it gets 403."""
    ours = client.submit("tenant-q", tenant="acme", delay_s=3600)
    theirs = client.submit("tenant-q", tenant="globex", delay_s=3600)
    dead_ours = dead_letter_one(client, "tenant-dlq-acme", tenant="acme")
    _, secret = new_token(client, "acme-viewer", "viewer", tenants=["acme"])
    leader_url = cluster.nodes[cluster.wait_for_leader()].http_url
    status, listed, _ = http_json("GET", leader_url + "/v1/jobs?limit=100", token=secret)
    assert status == 200
    visible = {job["id"] for job in listed["jobs"]}
    assert http_json("GET", leader_url + "/v1/overview", token=secret)[0] == 403

    failures_before = auth_failures(leader_url)
    login(page, follower_url(cluster) + "/", secret)
    assert page.locator("#who-scope").inner_text() == "tenants: acme"
    note = page.locator("#scope [data-denied]")
    assert "only with a token for all tenants" in note.inner_text()
    page.locator("#recent-jobs", has_text=ours["id"]).wait_for()
    page.locator("#dlq", has_text=dead_ours).wait_for()
    text = page.locator("#view").inner_text()
    # Exactly what the server lets this token see: with tenant isolation
    # (api/scope.py, branch tenancy15) another tenant's job is not there.
    assert (theirs["id"] in text) == (theirs["id"] in visible)
    assert "forbidden" not in text  # a note, not an error
    assert page.locator("#toast.show").count() == 0
    assert page.locator("#view button[data-action]").count() == 0
    shot(page, "tenant-viewer")

    page.goto(follower_url(cluster) + "/#/jobs?queue=tenant-q")
    results = page.locator("main[data-view=jobs] #job-results")
    results.locator(f"text={ours['id']}").wait_for()
    assert (theirs["id"] in results.inner_text()) == (theirs["id"] in visible)
    # Without the overview the page learns the leader from one redirect,
    # which reaches the leader without the token (the browser drops it).
    assert auth_failures(leader_url) - failures_before <= 1
    status, _, _ = http_json("GET", leader_url + f"/v1/jobs/{theirs['id']}", token=secret)
    page.goto(follower_url(cluster) + f"/#/jobs/{theirs['id']}")
    if status == 404:
        page.locator("main[data-view=jobs] section", has_text="not_found").wait_for()
    else:
        page.locator("#job", has_text="globex").wait_for()


def test_a_revoked_token_goes_back_to_the_login_form(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    token_id, secret = new_token(client, "soon-revoked", "viewer")
    login(page, follower_url(cluster) + "/", secret)
    page.locator("#nodes tbody tr").first.wait_for()
    client.revoke_token(token_id)
    message = page.locator("#login-message")
    message.filter(has_text="revoked").wait_for(timeout=15_000)
    assert "session ended" in message.inner_text()
    assert page.locator("#login").is_visible() and page.locator("main#view").is_hidden()
    assert storage(page)["session"] is None
    assert page.locator("#view section").count() == 0
    shot(page, "revoked")


def test_without_tokens_the_page_works_without_asking(tmp_path: Path, browser: Any) -> None:
    """A cluster that has no tokens yet (auth off): no login form, every action."""
    local = LocalCluster(tmp_path / "cluster", size=1, auth=False)
    local.start()
    context = browser.new_context()
    try:
        local.wait_for_leader(timeout_s=30)
        with Client(local.urls, timeout_s=10, token="") as api:
            dead_id = dead_letter_one(api, "open-dlq")
        opened = context.new_page()
        opened.goto(local.urls[0] + "/")
        opened.locator("#dlq tr", has_text=dead_id).get_by_role("button", name="Replay").wait_for()
        assert opened.locator("#login").is_hidden()
        assert opened.locator("#who-name").inner_text() == "authentication off"
        assert opened.locator("#logout").is_hidden()
    finally:
        context.close()
        local.stop()
