"""The whole cluster stopped for a simulated six hours, then restarted.

Real time cannot be moved, so the restarted node processes run with their
wall clock six hours ahead: a `sitecustomize` module put first on their
PYTHONPATH adds a fixed offset to `time.time` and `time.time_ns` (monotonic
time stays real, so leases and Raft timeouts are unaffected). The leader
stamps entries with that wall clock, so to the replicated state six hours
have passed while nothing ran, exactly as after a real outage. Catch-up must
then follow each schedule's policy.

libfaketime was tried first and rejected: on this machine it makes Python's
`time.sleep` fail with EINVAL (FAKETIME_DONT_FAKE_MONOTONIC=1) or hangs timed
`threading.Event.wait` calls (monotonic faked), both of which the node uses.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import cluster_env, shift_wall_clock

from raftsched.client import Client
from raftsched.testing import LocalCluster
from raftsched.timefmt import parse_ms

HALF_HOUR_MS = 30 * 60 * 1000

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path / "cluster", size=3, env=cluster_env())
    local.start()
    try:
        local.wait_for_leader(timeout_s=30)
        yield local
    finally:
        local.stop()


def schedule(schedule_id: str, policy: str) -> dict[str, Any]:
    return {
        "id": schedule_id,
        "interval_s": 1800,
        "overlap": "allow_all",
        "catchup": {"policy": policy, "window_s": 7200, "max_runs": 2, "grace_s": 120},
        "job": {"queue": "downtime"},
    }


def decisions(client: Client, schedule_id: str, created_ms: int) -> list[tuple[int, str, str]]:
    """(occurrence number, decision, reason) oldest first; occurrence k is at
    creation + k * 30 min."""
    records = client.schedule_occurrences(schedule_id, limit=100)
    found = []
    for record in reversed(records):
        offset_ms = parse_ms(record["nominal_time"]) - created_ms
        assert offset_ms % HALF_HOUR_MS == 0
        found.append((offset_ms // HALF_HOUR_MS, record["decision"], record["reason"] or ""))
    return found


def test_six_hours_of_downtime_catch_up_follows_the_policy(cluster: LocalCluster) -> None:
    with Client(cluster.urls, timeout_s=10, retry_budget_s=60) as client:
        created = {
            name: parse_ms(client.create_schedule(schedule(name, name))["created_at"])
            for name in ("all", "latest", "skip")
        }
        cluster.stop()
        shift_wall_clock(cluster, 6 * 3600, cluster.root / "shift_clock")
        cluster.start()
        cluster.wait_for_leader(timeout_s=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(len(decisions(client, n, created[n])) >= 12 for n in created):
                break
            time.sleep(0.5)
        time.sleep(1)  # paced catch-up of `all` finishes within a few ticks
        outside = [(k, "missed", "outside_catchup_window") for k in range(1, 9)]
        # Occurrences 9-11 are inside the two-hour window but late; 12 is on time.
        assert decisions(client, "all", created["all"]) == outside + [
            (9, "fired", "catch-up"),
            (10, "fired", "catch-up"),
            (11, "missed", "catchup_max_runs"),
            (12, "fired", ""),
        ]
        assert decisions(client, "latest", created["latest"]) == outside + [
            (9, "missed", "superseded"),
            (10, "missed", "superseded"),
            (11, "missed", "superseded"),
            (12, "fired", ""),
        ]
        assert decisions(client, "skip", created["skip"]) == outside + [
            (9, "missed", "catchup_skip"),
            (10, "missed", "catchup_skip"),
            (11, "missed", "catchup_skip"),
            (12, "fired", ""),
        ]
        # Catch-up was paced: the two catch-up firings are at least 100 ms apart.
        records = client.schedule_occurrences("all", limit=100)
        caught_up = sorted(parse_ms(r["decided_at"]) for r in records if r["reason"] == "catch-up")
        assert caught_up[1] - caught_up[0] >= 100
        jobs = list(client.iter_jobs(queue="downtime"))
        assert len(jobs) == 3 + 1 + 1
        events = client.request("GET", "/v1/events", query={"types": "schedule.missed"}).json()
        assert len(events["events"]) == 9 + 11 + 11
        cluster.wait_converged()
