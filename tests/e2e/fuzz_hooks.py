"""Hooks the schema fuzzer loads (test_fuzz_api.py names this module in its config).

Some operations long-poll: `GET /v1/events` and `POST /v1/leases` wait up to
`wait_s` (at most 60 s) for something to answer, and so does the claim that
complete, fail and the lease batch may carry (`next.wait_s`). A fuzzer that
picks valid waits at random would spend its whole time budget waiting, so a
valid wait is shortened to `LONG_POLL_S_MAX` before the request is sent.
Values outside the documented range, and values of the wrong type, are sent
as generated: those must still be rejected at once. Query values arrive as
numbers or, in the coverage phase, as the strings that will be sent.
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis

LONG_POLL_S_MAX = 0.2
WAIT_S_MAX = 60


def _seconds(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _shortened(container: Any) -> None:
    if not isinstance(container, dict) or "wait_s" not in container:
        return
    wait_s = _seconds(container["wait_s"])
    if wait_s is not None and LONG_POLL_S_MAX < wait_s <= WAIT_S_MAX:
        shorter = LONG_POLL_S_MAX
        container["wait_s"] = str(shorter) if isinstance(container["wait_s"], str) else shorter


@schemathesis.hook
def before_call(context: schemathesis.HookContext, case: schemathesis.Case, kwargs: Any) -> None:
    _shortened(case.query)
    _shortened(case.body)
    if isinstance(case.body, dict):
        _shortened(case.body.get("next"))
    # The cluster requires a token: the session's admin secret (tests/e2e/conftest.py).
    token = os.environ.get("RAFTSCHED_TOKEN", "").strip()
    if token:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}
