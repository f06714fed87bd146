"""The dashboard's charts and a job's effects, in a real chromium against a
real 3-node cluster (the page opened on a follower, as in
test_dashboard_browser.py).

The charts are uPlot's (vendored), drawn from `GET /v1/stats/series`: each
test waits for the figures of jobs it ran to appear in a chart, and for the
chart to follow new jobs without a reload and without being made again.
Screenshots are kept in artifacts/screenshots/.
"""

from __future__ import annotations

from typing import Any

import pytest
from browser_support import login, shot

from raftsched.client import Client
from raftsched.testing import LocalCluster

pytestmark = pytest.mark.e2e

# A bucket is 5 s and is shown once complete: counts show within about 10 s.
CHART_TIMEOUT_MS = 30_000


def follower_url(cluster: LocalCluster) -> str:
    leader = cluster.wait_for_leader()
    return next(node.http_url for node_id, node in cluster.nodes.items() if node_id != leader)


def run_jobs(client: Client, queue: str, succeed: int, fail: int = 0, dead: int = 0) -> None:
    total = succeed + fail + dead
    for i in range(total):
        client.submit(queue, payload={"n": i}, max_attempts=5)
    leases = client.claim("charts-w", [queue], max_jobs=total, wait_s=5)
    assert len(leases) == total
    for lease in leases[:succeed]:
        client.complete(lease["job_id"], lease["fencing_token"], result={"ok": True})
    for lease in leases[succeed : succeed + fail]:
        client.fail(lease["job_id"], lease["fencing_token"], kind="transient", message="busy")
    for lease in leases[succeed + fail :]:
        client.fail(lease["job_id"], lease["fencing_token"], kind="permanent", message="no")


def chart_number(page: Any, key: str, name: str) -> float:
    return float(page.locator(f'[data-chart="{key}"]').get_attribute(f"data-{name}") or 0)


def wait_for_chart(page: Any, key: str, at_least: float) -> None:
    """Until the chart's values add up to `at_least` (rates x 5 s = counts)."""
    page.wait_for_function(
        "([key, atLeast]) => {"
        "  const holder = document.querySelector(`[data-chart='${key}']`);"
        "  const sum = Number(holder?.dataset.sum);"
        "  return holder?.querySelector('canvas') && sum >= atLeast - 1e-9;"
        "}",
        arg=[key, at_least],
        timeout=CHART_TIMEOUT_MS,
    )


def test_charts_of_the_cluster_and_of_a_queue_follow_the_jobs_live(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    queue = "charts-browser"
    run_jobs(client, queue, succeed=6, fail=2, dead=1)
    login(page, follower_url(cluster) + "/#/charts", cluster.admin_token)
    page.locator("main[data-view=charts] #charts").wait_for()
    # succeeded 6 + failed 3 + dead-lettered 1, as rates per 5 s bucket.
    wait_for_chart(page, "charts-rates", 10 / 5)
    for key in ("charts-rates", "charts-depth", "charts-age", "charts-lag"):
        page.locator(f'[data-chart="{key}"] canvas').wait_for()
    legend = page.locator('[data-chart="charts-rates"] .u-legend').inner_text()
    for label in ("succeeded/s", "failed/s", "dead-lettered/s"):
        assert label in legend
    assert chart_number(page, "charts-lag", "points") >= 1  # a claim's lag
    assert chart_number(page, "charts-depth", "points") >= 1  # sampled
    shot(page, "charts-cluster")

    page.locator("#chart-picker").get_by_role("link", name=queue).click()
    page.locator("#charts h2", has_text=f"queue {queue}").wait_for()
    wait_for_chart(page, "charts-rates", 10 / 5)
    # Live: the same chart takes new data at the next poll, without a reload
    # and without being made again (a mark on its root stays).
    page.evaluate(
        "window.notReloaded = true;"
        "document.querySelector(\"[data-chart='charts-rates'] .uplot\").dataset.mark = 'kept'"
    )
    before = chart_number(page, "charts-rates", "sum")
    run_jobs(client, queue, succeed=5)
    wait_for_chart(page, "charts-rates", before + 5 / 5)
    assert page.evaluate("window.notReloaded") is True
    kept = page.locator("[data-chart='charts-rates'] .uplot").get_attribute("data-mark")
    assert kept == "kept"
    shot(page, "charts-queue")

    page.locator("#charts").get_by_role("link", name="15 min").click()
    page.locator("#charts b", has_text="15 min").wait_for()
    wait_for_chart(page, "charts-rates", before + 5 / 5)
    assert chart_number(page, "charts-rates", "points") <= 3 * 180

    # The on-call view shows the cluster's last hour too.
    page.goto(follower_url(cluster) + "/#/")
    page.locator('#last-hour [data-chart="oncall-rates"] canvas').wait_for()
    wait_for_chart(page, "oncall-rates", 15 / 5)
    page.locator("#queues").get_by_role("link", name="chart").first.wait_for()
    shot(page, "oncall-last-hour")


def test_a_tenant_viewer_is_told_the_charts_need_every_tenant(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    made = client.create_token("acme-charts-viewer", "viewer", tenants=["acme"])
    login(page, follower_url(cluster) + "/#/charts", str(made["secret"]))
    note = page.locator("#charts [data-denied]")
    note.wait_for()
    assert "tenants" in note.inner_text()
    assert page.locator("[data-chart] canvas").count() == 0
    shot(page, "charts-scoped-viewer")


def test_job_page_shows_the_effects_it_recorded_found_by_key_or_correlation(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    job = client.submit(
        "payments-fx",
        payload={"payment": 88},
        idempotency_key="pay:88",
        correlation_id="req-fx-88",
        tenant="acme",
    )
    (lease,) = client.claim("fx-w", ["payments-fx"], max_jobs=1, wait_s=5)
    client.start(lease["job_id"], lease["fencing_token"])
    client.record_effect("charge:88", job["id"], lease["fencing_token"], {"charge": "ch_88"})
    client.record_effect("receipt:88", job["id"], lease["fencing_token"], {"mail": "sent"})
    client.complete(lease["job_id"], lease["fencing_token"], {"done": True})

    base = follower_url(cluster)
    login(page, base + "/#/jobs", cluster.admin_token)
    # By idempotency key (a key is unique within its tenant) ...
    page.fill("input[name=idempotency_key]", "pay:88")
    page.fill("input[name=tenant]", "acme")
    page.click("#job-search button[type=submit]")
    page.locator(f"#job-results >> text={job['id']}").wait_for()
    # ... and by correlation id.
    page.goto(base + "/#/jobs?correlation_id=req-fx-88")
    page.locator(f"#job-results >> text={job['id']}").click()
    effects = page.locator("#effects tbody tr")
    effects.nth(1).wait_for()
    assert effects.count() == 2
    first, second = effects.nth(0).inner_text(), effects.nth(1).inner_text()
    assert "charge:88" in first and "ch_88" in first
    assert str(lease["fencing_token"]) in first
    assert "receipt:88" in second
    shot(page, "job-effects")

    other = client.submit("payments-fx", tenant="acme")
    page.goto(base + f"/#/jobs/{other['id']}")
    page.locator("#effects", has_text="none recorded").wait_for()
