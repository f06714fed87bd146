"""Fixtures for the dashboard tests: one real 3-node cluster and one headless
chromium for the module, a fresh page per test, screenshots kept.

A test fails on any JavaScript error and on any Content-Security-Policy
violation the page reports (chromium logs each refused script, style,
handler or connection to the console, and fires `securitypolicyviolation`):
the dashboard must work under its strict policy (api/headers.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import (
    CHROMIUM_ARGS,
    RECORD_CSP_VIOLATIONS,
    chromium_path,
    csp_violations,
    missing_reason,
)

from raftsched.client import Client
from raftsched.node.auth import new_secret
from raftsched.testing import LocalCluster

STUCK_AFTER_S = "2"


@pytest.fixture(autouse=True, scope="session")
def admin_token() -> Iterator[str]:
    """The clusters' admin secret, in `$RAFTSCHED_TOKEN` as in tests/e2e: the
    test's own client and `http_json` carry it; the page logs in with it."""
    before = os.environ.get("RAFTSCHED_TOKEN")
    secret = new_secret()
    os.environ["RAFTSCHED_TOKEN"] = secret
    yield secret
    if before is None:
        os.environ.pop("RAFTSCHED_TOKEN", None)
    else:
        os.environ["RAFTSCHED_TOKEN"] = before


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("browser") / "cluster"
    # Authentication on, as every cluster from its first admin token: the
    # page logs in (browser_support.login).
    local = LocalCluster(root, size=3, env={"RAFTSCHED_STUCK_AFTER_S": STUCK_AFTER_S})
    local.start()
    try:
        local.wait_for_leader(timeout_s=30)
        local.wait_for_auth(timeout_s=30)
        yield local
    finally:
        local.stop()


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as api:
        yield api


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    reason = missing_reason()
    if reason is not None:
        pytest.skip(f"browser tests skipped: {reason}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_init_script(RECORD_CSP_VIOLATIONS)
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    errors: list[str] = []
    opened.csp_console = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.on(
        "console",
        lambda message: (
            opened.csp_console.append(message.text)
            if "Content Security Policy" in message.text
            else None
        ),
    )
    try:
        yield opened
        assert errors == [], f"JavaScript errors on the page: {errors}"
        violations = csp_violations(opened)
        assert violations == [], f"Content-Security-Policy violations: {violations}"
    finally:
        context.close()
