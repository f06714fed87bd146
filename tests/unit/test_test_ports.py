"""The test ports of one pytest-xdist run: each worker process draws from a
share of its own (`raftsched.testing`), so that two workers never hand out
the same port, and a run without xdist draws from them all."""

from __future__ import annotations

import pytest

from raftsched import testing


def shares(monkeypatch: pytest.MonkeyPatch, workers: int) -> list[range]:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    found = []
    for index in range(workers):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        found.append(testing._share_of_ports())
    return found


def test_the_workers_shares_are_disjoint_and_below_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    three = shares(monkeypatch, 3)
    assert [len(share) for share in three] == [4_000] * 3
    assert all(a.stop <= b.start for a, b in zip(three, three[1:], strict=False))
    assert three[0].start == 20_000 and three[-1].stop <= 32_000 < 32_768


def test_without_xdist_every_test_port_is_drawn_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert testing._share_of_ports() == range(20_000, 32_000)
