"""The dashboard of a cluster of several shards (docs/shards.md, section 3),
in a real headless chromium against 3 nodes x 3 shards: the on-call view's
dead letters and the job search list every shard's jobs, each id marked
with its shard, and the outbox line names each shard's last seq."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import login, shot

from raftsched.client import Client
from raftsched.shards import shard_of_id
from raftsched.testing import LocalCluster

pytestmark = pytest.mark.e2e

SHARDS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # A short root: each shard's Unix socket path must fit in 107 bytes.
    root: Path = tmp_path_factory.mktemp("bsh") / "c"
    local = LocalCluster(root, size=3, shards=SHARDS)
    local.start()
    try:
        local.wait_for_leader(timeout_s=90)
        local.wait_for_auth(timeout_s=60)
        local.wait_for_shards(timeout_s=90)
        yield local
    finally:
        local.stop()
    errors = local.unexpected_log_errors()
    assert not errors, "\n".join(error.describe() for error in errors)


def test_the_dashboard_lists_the_jobs_of_every_shard(
    cluster: LocalCluster, client: Client, page: Any
) -> None:
    queue = "sharded-page"
    ids = [client.submit(queue, {"n": index})["id"] for index in range(9)]
    assert {shard_of_id(job_id) for job_id in ids} == set(range(SHARDS))
    dead: list[str] = []
    for shard in range(SHARDS):  # a dead letter in each shard
        with Client(cluster.urls, shard=shard, timeout_s=10, retry_budget_s=30) as worker:
            (lease,) = worker.claim(f"w{shard}", [queue], max_jobs=1, wait_s=5)
            worker.fail(lease["job_id"], lease["fencing_token"], kind="permanent", message="no")
            dead.append(lease["job_id"])
    assert {shard_of_id(job_id) for job_id in dead} == set(range(SHARDS))

    login(page, cluster.urls[1] + "/", cluster.admin_token)
    for job_id in dead:
        row = page.locator("#dlq tr", has_text=job_id)
        row.wait_for()
        shard = shard_of_id(job_id)
        assert row.locator(".shard").count() == (1 if shard else 0)
        if shard:
            assert row.locator(".shard").inner_text() == f"s{shard}"
    page.locator("section", has_text="shard 2:").first.wait_for()
    page.locator("section", has_text="evt2_").first.wait_for()  # event ids name their shard
    shot(page, "shards-oncall")

    page.goto(cluster.urls[1] + f"/#/jobs?queue={queue}")
    for job_id in ids:
        page.locator(f"#job-results >> text={job_id}").wait_for()
    assert page.locator("#job-results .shard", has_text="s1").count() >= 1
    assert page.locator("#job-results .shard", has_text="s2").count() >= 1
    shot(page, "shards-job-search")
