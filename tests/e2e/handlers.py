"""Job handlers that worker processes in the end-to-end tests run.

Each records its side effect in a sink file (one JSON line per execution of
the side effect), so a test can count how often an effect really happened.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from raftsched.worker import JobContext


def _sink(record: dict[str, Any]) -> None:
    path = os.environ["RAFTSCHED_TEST_SINK"]
    line = (json.dumps(record) + "\n").encode()
    # One write(2) with O_APPEND: lines from concurrent workers never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def effect_once(ctx: JobContext) -> dict[str, Any]:
    """Perform one side effect through the effects ledger, then complete."""

    def side_effect() -> dict[str, Any]:
        _sink({"job_id": ctx.job_id, "token": ctx.fencing_token, "epoch": ctx.epoch})
        return {"token": ctx.fencing_token}

    recorded = ctx.effect(f"effect:{ctx.job_id}", side_effect)
    time.sleep(0.01)
    return {"effect_token": recorded["token"]}
