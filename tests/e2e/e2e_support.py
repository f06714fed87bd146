"""Shared by the end-to-end tests and their fixtures."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from raftsched.testing import ExpectedLogError, LocalCluster

REPO_ROOT = Path(__file__).resolve().parents[2]


def cluster_env() -> dict[str, str]:
    """Environment for node and worker processes: tests' handler modules importable."""
    paths = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


@contextmanager
def started_cluster(root: Path, env: Mapping[str, str]) -> Iterator[LocalCluster]:
    """A running 3-node cluster whose processes get `env` too (tests'
    delivery timings...), led; stopped afterwards."""
    cluster = LocalCluster(root, size=3, env={**cluster_env(), **env})
    cluster.start()
    try:
        cluster.wait_for_leader(timeout_s=30)
        yield cluster
    finally:
        cluster.stop()


@contextmanager
def sharded_cluster(
    root: Path,
    shards: int,
    env: Mapping[str, str] | None = None,
    expected: Iterable[ExpectedLogError] = (),
) -> Iterator[LocalCluster]:
    """A running 3-node cluster of `shards` data shards (docs/shards.md),
    every shard led and recorded, authentication on; stopped afterwards,
    and then its logs must hold no error line a test did not expect
    (`expected`: the lines it causes on purpose).
    `root` must be short: each shard's Unix socket path fits in 107 bytes."""
    cluster = LocalCluster(root, size=3, env={**cluster_env(), **(env or {})}, shards=shards)
    cluster.start()
    try:
        cluster.wait_for_leader(timeout_s=90)
        cluster.wait_for_auth(timeout_s=60)
        cluster.wait_for_shards(timeout_s=90)
        yield cluster
    finally:
        cluster.stop()
    errors = cluster.unexpected_log_errors(expected)
    assert not errors, "\n".join(error.describe() for error in errors)


_SHIFT_CLOCK = """\
import os
import time

_offset_s = float(os.environ.get("RAFTSCHED_TEST_WALL_OFFSET_S", "0"))
if _offset_s:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _offset_s
    time.time_ns = lambda: _time_ns() + int(_offset_s * 1e9)
"""


def shift_wall_clock(cluster: LocalCluster, offset_s: float, into: Path) -> None:
    """Make the (stopped) cluster's nodes read a wall clock `offset_s` ahead
    when they next start: a `sitecustomize` module in `into`, put first on
    their PYTHONPATH, moves `time.time` and `time.time_ns`; monotonic time
    is left alone."""
    into.mkdir()
    (into / "sitecustomize.py").write_text(_SHIFT_CLOCK)
    cluster.env["PYTHONPATH"] = os.pathsep.join([str(into), cluster.env["PYTHONPATH"]])
    cluster.env["RAFTSCHED_TEST_WALL_OFFSET_S"] = str(offset_s)


def lead_on(cluster: LocalCluster, node_ids: set[str]) -> None:
    """Restart leaders (on the code they run) until one of `node_ids` leads."""
    for _ in range(10):
        leader = cluster.wait_for_leader(timeout_s=60)
        if leader in node_ids:
            return
        cluster.kill(leader, signal.SIGTERM)
        cluster.wait_for_leader(timeout_s=60, exclude=leader)
        cluster.start(leader)
        cluster.wait_converged(timeout_s=60)
    raise AssertionError(f"none of {sorted(node_ids)} became leader")


def release_tree(tag: str, commit: str, into: Path) -> Path:
    """The tree of release `tag`, extracted from this repository into `into`.

    A clone made without tags still has the commit, so the tag is only
    checked when present (it must name `commit`); a clone without the
    commit (a shallow one) skips the test."""

    def resolve(revision: str) -> str | None:
        found = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--verify", "--quiet",
             f"{revision}^{{commit}}"],
            capture_output=True, text=True,
        )  # fmt: skip
        return found.stdout.strip() if found.returncode == 0 else None

    tagged = resolve(tag)
    assert tagged in (None, commit), f"{tag} moved to {tagged}"
    if (tagged or resolve(commit)) is None:
        pytest.skip(f"neither {tag} nor its commit is in {REPO_ROOT} (a shallow clone?)")
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", commit], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


# What a receiver answers a delivery (the event, its attempt: 1 the first
# time that id arrives): an HTTP status, perhaps after a while.
Answer = Callable[[dict[str, Any], int], Awaitable[int]]


async def _accept(event: dict[str, Any], attempt: int) -> int:
    return 204


class WebhookReceiver:
    """A loopback webhook endpoint on a thread of its own. Each delivery's
    signature is checked with `secret` (a bad one is counted and answered
    400); while `refusing` is a status, every delivery is answered that and
    its id counted in `refused`; else it is kept (`arrivals`, its
    `Raftsched-Event-Id` in `ids`) and answered what `answer` says (204)."""

    def __init__(self, secret: str, answer: Answer = _accept) -> None:
        self.secret = secret
        self.answer = answer
        self.refusing: int | None = None
        self.arrivals: list[dict[str, Any]] = []
        self.ids: list[str] = []
        self.refused: Counter[str] = Counter()
        self.attempts: Counter[str] = Counter()
        self.bad_signatures = 0
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the webhook receiver did not start"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        runner = self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self.loop.run_forever()

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        expected = "sha256=" + hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
        if request.headers.get("Raftsched-Signature") != expected:
            self.bad_signatures += 1
            return web.Response(status=400)
        event_id = request.headers.get("Raftsched-Event-Id", "")
        if self.refusing is not None:
            self.refused[event_id] += 1
            return web.Response(status=self.refusing)
        self.attempts[event_id] += 1
        event = json.loads(body)
        self.arrivals.append(event)
        self.ids.append(event_id)
        return web.Response(status=await self.answer(event, self.attempts[event_id]))

    def stop(self) -> None:
        async def cleanup() -> None:
            await self._runner.cleanup()
            # Handlers still waiting (a slow answer) end here, not as tasks
            # destroyed while pending, which asyncio logs as errors.
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cleanup(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


@contextmanager
def webhook_receiver(secret: str, answer: Answer = _accept) -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(secret, answer)
    try:
        yield receiver
    finally:
        receiver.stop()
