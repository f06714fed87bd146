"""Job handlers that worker processes in the end-to-end tests run.

Each records its side effect in a sink file (one JSON line per execution of
the side effect), so a test can count how often an effect really happened.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from typing import Any

from raftsched.worker import Decision, DidNotHappen, Happened, JobContext, ReconcileContext


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


_running = 0
_running_lock = threading.Lock()


def counted(ctx: JobContext) -> dict[str, Any]:
    """Note how many of this process's handlers run at once (this one
    included) and when, pause `RAFTSCHED_TEST_PAUSE_S`, and complete: a
    worker's slot pool is never exceeded if no line says more than its
    concurrency (test_shard_polls)."""
    global _running
    with _running_lock:
        _running += 1
        running = _running
    try:
        _sink({"job_id": ctx.job_id, "running": running, "at": time.time()})
        time.sleep(float(os.environ.get("RAFTSCHED_TEST_PAUSE_S", "0.05")))
    finally:
        with _running_lock:
            _running -= 1
    return {"ran": ctx.job_id}


# -- a payment provider that cannot deduplicate (test_reconcile_faults) -------


def _provider(method: str, path: str) -> dict[str, Any]:
    url = os.environ["RAFTSCHED_TEST_PROVIDER"] + path
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def charge_provider(ctx: JobContext) -> dict[str, Any]:
    """Charge the provider, then record the charge: the test kills or stops
    the worker in between (the sink line says when the charge happened)."""
    payment = ctx.payload["payment"]
    charge = _provider("POST", f"/charge/{payment}")["charge"]
    _sink({"charged": payment, "job_id": ctx.job_id, "pid": os.getpid()})
    time.sleep(float(os.environ.get("RAFTSCHED_TEST_CHARGE_PAUSE_S", "0")))
    ctx.effect(f"charge:{payment}", lambda: charge)
    return {"charge": charge}


def provider_reconciler(ctx: ReconcileContext) -> Decision:
    """Look the payment up at the provider."""
    payment = ctx.payload["payment"]
    found = _provider("GET", f"/charges/{payment}")["charges"]
    if not found:
        return DidNotHappen(f"no charge for {payment}")
    return Happened(
        {"charge": found[0]},
        effects={f"charge:{payment}": found[0]},
        reason=f"the provider lists {found[0]}",
    )


def found_it(ctx: ReconcileContext) -> Decision:
    """The effect happened (test_tracing: the reconciliation's span)."""
    return Happened({"reconciled": ctx.job_id}, reason="found it")


def echo(ctx: JobContext) -> Any:
    """Complete with the payload; no side effect."""
    return ctx.payload


# -- handlers by kind (test_kinds) ---------------------------------------------


def _timed(handled_by: str, ctx: JobContext, pause_s: float) -> dict[str, Any]:
    """Record when the handler ran (one sink line), so a test can tell how
    many jobs of a kind ran at once in the worker process."""
    started = time.time()
    time.sleep(pause_s)
    _sink({"handled_by": handled_by, "job_id": ctx.job_id, "kind": ctx.kind,
           "start": started, "end": time.time(), "pid": os.getpid()})  # fmt: skip
    return {"handled_by": handled_by, "kind": ctx.kind, "payload": ctx.payload}


def charge_kind(ctx: JobContext) -> dict[str, Any]:
    return _timed("charge", ctx, 0.3)


def email_kind(ctx: JobContext) -> dict[str, Any]:
    return _timed("email", ctx, 0.4)


def default_kind(ctx: JobContext) -> dict[str, Any]:
    return _timed("default", ctx, 0.05)
