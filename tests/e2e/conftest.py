"""End-to-end fixtures: a real 3-node cluster of `raftsched node` processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import cluster_env

from raftsched.client import Client
from raftsched.testing import LocalCluster


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path / "cluster", size=3, env=cluster_env())
    local.start()
    try:
        local.wait_for_leader(timeout_s=30)
        yield local
    finally:
        local.stop()
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(local.logs()[-20000:])


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
