"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def promtool() -> str:
    """Debian's `promtool` (package `prometheus`; .ci/run installs it when it is
    missing). Tests that need it skip, with the reason in the summary, only
    when it cannot be found; CI says so loudly."""
    configured = os.environ.get("RAFTSCHED_PROMTOOL")
    found = configured if configured and Path(configured).exists() else shutil.which("promtool")
    if found is None:
        pytest.skip(
            "promtool tests SKIPPED: no promtool found "
            "(apt-get install -y prometheus, or set RAFTSCHED_PROMTOOL)"
        )
    return found


@pytest.fixture(scope="session")
def redis_server_binary() -> str:
    """Debian's `redis-server` (.ci/run installs it when it is missing), for
    the relay tests (docs/relays.md). They skip, with the reason in the
    summary, only when it cannot be found; CI says so loudly."""
    found = shutil.which("redis-server")
    if found is None:
        pytest.skip(
            "Redis relay tests SKIPPED: no redis-server found (apt-get install -y redis-server)"
        )
    return found


@pytest.fixture(scope="session")
def nats_server_binary() -> str:
    """Debian's `nats-server` (.ci/run installs it when it is missing), for the
    NATS JetStream relay tests (docs/relays.md). They skip, with the reason in
    the summary, only when it cannot be found; CI says so loudly. Debian
    installs it in /usr/sbin, which is not on every user's PATH."""
    found = shutil.which("nats-server") or next(
        (path for path in ("/usr/sbin/nats-server",) if Path(path).exists()), None
    )
    if found is None:
        pytest.skip(
            "NATS relay tests SKIPPED: no nats-server found (apt-get install -y nats-server)"
        )
    return found


@pytest.fixture(scope="session")
def rabbitmq_server_binary() -> str:
    """Debian's `rabbitmq-server` (.ci/run installs it when it is missing;
    /usr/sbin is searched too, as it is not on every user's PATH) and the
    `epmd` of its Erlang, for the relay tests (docs/relays.md). They skip,
    with the reason in the summary, only when either cannot be found."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/lib/rabbitmq/bin"])
    found = shutil.which("rabbitmq-server", path=path)
    if found is None or shutil.which("epmd") is None:
        pytest.skip(
            "RabbitMQ relay tests SKIPPED: no rabbitmq-server (or no epmd) found "
            "(apt-get install -y rabbitmq-server)"
        )
    return found


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files that hold a `slow` test run first (in their order, then the
    rest in theirs). `make test` spreads whole files over pytest-xdist
    workers in this order, so the long files start at once rather than
    last, when they would keep one worker busy while the others idle. The
    order is the same in every worker, as xdist requires."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
