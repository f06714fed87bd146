"""Fixtures for the Raft adapter tests (helpers live in raft_support)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from raft_support import Cluster


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
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
