from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The CLI's tests talk to the same scripted fake nodes as the client's.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))

from fakecluster import FakeCluster  # noqa: E402


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    cluster = FakeCluster(1)
    cluster.start()
    yield cluster
    cluster.stop()
