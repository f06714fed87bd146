from __future__ import annotations

from collections.abc import Iterator

import pytest
from fakecluster import FakeCluster


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    fake = FakeCluster(3)
    fake.start()
    yield fake
    fake.stop()
