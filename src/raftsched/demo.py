"""The demo handler the development cluster's worker runs (`raftsched dev`).

Payload knobs, for the tour:
- `{"sleep_s": 2}`: work that long (default 0.2 s), checking for cancellation.
- `{"fail": "permanent"}`: fail without retry (the job is dead-lettered).
- `{"fail": "transient"}`: fail this attempt (the job is retried with backoff).
- `{"amount": 1200}`: "charge" that amount once, through the effects ledger,
  so a retried attempt finds the first charge instead of charging again.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from raftsched.worker import JobContext, PermanentError

STEP_S = 0.05


def handle(ctx: JobContext) -> dict[str, Any]:
    payload = ctx.payload if isinstance(ctx.payload, dict) else {}
    _work(ctx, float(payload.get("sleep_s", 0.2)))
    failure = payload.get("fail")
    if failure == "permanent":
        raise PermanentError("the demo was asked to fail permanently")
    if failure == "transient":
        raise RuntimeError(f"the demo was asked to fail (attempt {ctx.attempt})")
    result: dict[str, Any] = {"job_id": ctx.job_id, "attempt": ctx.attempt}
    if "amount" in payload:
        key = f"demo-charge:{ctx.idempotency_key or ctx.job_id}"
        result["charge"] = ctx.effect(key, lambda: _charge(payload["amount"]))
    return result


def _work(ctx: JobContext, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ctx.check_cancelled()
        ctx.progress({"remaining_s": round(deadline - time.monotonic(), 2)})
        time.sleep(min(STEP_S, max(0.0, deadline - time.monotonic())))


def _charge(amount: object) -> dict[str, Any]:
    """Stands in for a payment provider call."""
    return {"charge_id": f"ch_{uuid.uuid4().hex[:12]}", "amount": amount}
