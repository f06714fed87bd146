"""Fixtures for the Raft adapter tests (helpers live in raft_support)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from raft_support import Cluster

from raftsched.testing import ExpectedLogError, log_errors


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "expect_log_errors(pattern, reason=...): an error-level node log line that the "
        "test causes on purpose (a regular expression, and why)",
    )


def expected_log_errors(item: pytest.Item) -> list[ExpectedLogError]:
    """The `expect_log_errors` marks of a test, each with its reason."""
    expected = []
    for mark in item.iter_markers("expect_log_errors"):
        (pattern,) = mark.args
        expected.append(ExpectedLogError(pattern, reason=mark.kwargs["reason"]))
    return expected


@pytest.fixture
def make_cluster(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Cluster]]:
    clusters: list[Cluster] = []

    def factory(size: int = 3, **options: Any) -> Cluster:
        cluster = Cluster(tmp_path / f"cluster{len(clusters)}", size, **options)
        for node in cluster.nodes.values():
            node.data_dir.mkdir(parents=True, exist_ok=True)
        clusters.append(cluster)
        return cluster

    yield factory
    for cluster in clusters:
        cluster.kill_all()
    # Any error a node logged fails the test, unless the test expects it.
    expected = expected_log_errors(request.node)
    found = [
        error
        for cluster in clusters
        for node in cluster.nodes.values()
        for error in log_errors(node.log_path, expected)
    ]
    if found:
        pytest.fail(
            "error-level lines in node logs:\n" + "\n".join(e.describe() for e in found),
            pytrace=False,
        )
