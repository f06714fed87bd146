"""Finding and launching Debian's chromium for the dashboard tests.

No browser is downloaded: Playwright (its Python package ships its driver)
drives the system's `/usr/bin/chromium`, which `.ci/run` installs with apt
when it is missing. The tests skip, with the reason, only when no chromium
can be found; CI prints that reason loudly (see .ci/run).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO_ROOT / "artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    configured = os.environ.get("RAFTSCHED_CHROMIUM")
    if configured:
        return configured if Path(configured).exists() else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def missing_reason() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    if chromium_path() is None:
        return "no chromium found (apt-get install -y chromium, or set RAFTSCHED_CHROMIUM)"
    return None


def login(page: Any, url: str, secret: str) -> None:
    """Open the dashboard at `url` and log in through its form."""
    page.goto(url)
    page.locator("#login-secret").fill(secret)
    page.locator("#login-submit").click()
    page.locator("#who-name").wait_for()
    page.locator("main[data-view] section").first.wait_for()


def shot(page: Any, name: str) -> Path:
    """Keep a full-page screenshot as a test artifact (artifacts/ is gitignored)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


# Runs before the page's own scripts, from the browser's side (not subject to
# the page's policy): records every violation the page reports.
RECORD_CSP_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(`${event.effectiveDirective} refused ${event.blockedURI}`);
});
"""


def csp_violations(page: Any) -> list[str]:
    """Violations the page reported: its console lines and recorded events."""
    found: list[str] = list(page.csp_console)
    if not page.is_closed():
        found += page.evaluate("window.__cspViolations || []")
    return found
