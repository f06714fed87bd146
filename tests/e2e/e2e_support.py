"""Shared by the end-to-end tests and their fixtures."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from raftsched.testing import LocalCluster

REPO_ROOT = Path(__file__).resolve().parents[2]


def cluster_env() -> dict[str, str]:
    """Environment for node and worker processes: tests' handler modules importable."""
    paths = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


@contextmanager
def sharded_cluster(
    root: Path, shards: int, env: Mapping[str, str] | None = None
) -> Iterator[LocalCluster]:
    """A running 3-node cluster of `shards` data shards (docs/shards.md),
    every shard led and recorded, authentication on; stopped afterwards,
    and then its logs must hold no error line a test did not expect.
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
    errors = cluster.unexpected_log_errors()
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
