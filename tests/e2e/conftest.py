"""End-to-end fixtures: a real 3-node cluster of `raftsched node` processes.

Every cluster a test makes (with the fixture or by itself) has its node logs
checked after the test: an error-level line or a traceback fails it, unless
the test declares the line with `@pytest.mark.expect_log_errors(pattern,
reason=...)`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import cluster_env, started_cluster

from raftsched.client import Client
from raftsched.node.auth import new_secret
from raftsched.testing import ExpectedLogError, LocalCluster, watch_clusters


@pytest.fixture(autouse=True, scope="session")
def admin_token() -> Iterator[str]:
    """One admin secret for the session's clusters, in `$RAFTSCHED_TOKEN`:
    every `LocalCluster` writes it to its admin.token file, and clients,
    worker processes and `http_json` send it by default, so every test runs
    with authentication on."""
    before = os.environ.get("RAFTSCHED_TOKEN")
    secret = new_secret()
    os.environ["RAFTSCHED_TOKEN"] = secret
    yield secret
    if before is None:
        os.environ.pop("RAFTSCHED_TOKEN", None)
    else:
        os.environ["RAFTSCHED_TOKEN"] = before


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "expect_log_errors(pattern, reason=...): an error-level node log line that the "
        "test causes on purpose (a regular expression, and why)",
    )


@pytest.fixture(autouse=True)
def node_logs_without_errors(request: pytest.FixtureRequest) -> Iterator[None]:
    # Autouse, so set up before and torn down after the cluster fixture:
    # the nodes have stopped and their logs are complete when this reads them.
    with watch_clusters() as clusters:
        yield
    expected = [
        ExpectedLogError(mark.args[0], reason=mark.kwargs["reason"])
        for mark in request.node.iter_markers("expect_log_errors")
    ]
    found = [error for cluster in clusters for error in cluster.unexpected_log_errors(expected)]
    if found:
        pytest.fail(
            "error-level lines in node logs:\n" + "\n".join(e.describe() for e in found),
            pytrace=False,
        )


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path / "cluster", size=3, env=cluster_env())
    local.start()
    try:
        local.wait_for_leader(timeout_s=30)
        local.wait_for_auth(timeout_s=30)
        yield local
    finally:
        local.stop()
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(local.logs()[-20000:])


@pytest.fixture
def relay_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A 3-node cluster with the relay scenarios' short delivery timings."""
    from relay_scenarios import RELAY_ENV

    with started_cluster(tmp_path / "cluster", RELAY_ENV) as local:
        yield local


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as api:
        yield api


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
