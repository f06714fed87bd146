"""What the tests that start an earlier release's data directories share
(tests/e2e/test_upgrade_datadir.py, test_upgrade_datadir_shards.py): the
archive's unpacking, stale reads of one replica, and what of an old object
must render as before (see docs/fixtures.md)."""

from __future__ import annotations

import sys
import tarfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import golden  # noqa: E402  (tests/fixtures is not a package)

from raftsched.testing import http_json  # noqa: E402

# What of each object must be as the old release left it. Other fields may
# be new, or depend on the wall clock (ages, queue statistics).
JOB_KEYS = (
    "id", "queue", "tenant", "status", "payload", "result", "priority", "max_attempts",
    "idempotency_key", "ordering_key", "correlation_id", "labels", "schedule_id",
    "workflow_id", "step", "created_at", "attempts",
)  # fmt: skip
SCHEDULE_KEYS = ("id", "cron", "interval_s", "timezone", "overlap", "paused", "job", "created_at")
WORKFLOW_KEYS = ("id", "status", "outcome", "tenant", "idempotency_key", "reason", "created_at")
TENANT_KEYS = ("name", "weight", "concurrency_limit", "max_queued")
QUEUE_KEYS = (
    "name", "paused", "rate_limit_per_s", "burst", "concurrency_limit", "circuit_window",
)  # fmt: skip
SUBSCRIPTION_KEYS = ("id", "url", "types", "created_at")
FINAL_JOB_STATUSES = frozenset({"succeeded", "dead_letter", "cancelled"})
FINAL_WORKFLOW_STATUSES = frozenset({"succeeded", "failed", "cancelled", "timed_out"})


def unpack(release: Path, expected: dict[str, Any], root: Path) -> None:
    path = release / expected["file"]
    assert golden.file_sha256(path) == expected["sha256"], (
        f"{path} is not the file {release.name} wrote.\n{golden.RULE}"
    )
    with tarfile.open(path) as archive:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
            archive.extractall(root, filter="data")
        else:  # our own archive of plain files
            archive.extractall(root)


def get(url: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """A read of this replica's state (stale: no read barrier, no leader)."""
    separator = "&" if "?" in path else "?"
    status, body, _ = http_json(
        "GET", f"{url}{path}{separator}consistency=stale", timeout_s=10, headers=headers
    )
    return status, body


def wait_for(what: str, predicate: Any, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def pick(rendered: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: rendered.get(key) for key in keys if key in rendered}


def as_before(new: Any, old: Any) -> Any:
    """`new` without the object fields a later release added, where they
    are null (a schedule template's `kind`, say, for a job that has none):
    what it must equal for an old object to render as before."""
    if isinstance(new, dict) and isinstance(old, dict):
        added = {key for key in new.keys() - old.keys() if new[key] is None}
        return {
            key: as_before(value, old.get(key)) for key, value in new.items() if key not in added
        }
    if isinstance(new, list) and isinstance(old, list) and len(new) == len(old):
        return [as_before(value, was) for value, was in zip(new, old, strict=True)]
    return new


def check_same(what: str, old: dict[str, Any], new: dict[str, Any], keys: tuple[str, ...]) -> None:
    assert as_before(pick(new, keys), pick(old, keys)) == pick(old, keys), (
        f"{what} is not as the old release left it in its data directory.\n{golden.RULE}"
    )


def purged_by_now(expected: dict[str, Any]) -> bool:
    """Whether retention may have purged the story's finished jobs by now: the
    restarted leader's clock is the real one, and finished jobs are kept
    `retention_ms` after they finished. An hour of margin either side."""
    now_ms = time.time() * 1000
    return bool(now_ms > expected["state_now_ms"] + expected["retention_ms"] - 3_600_000)


def check_recorded_objects(url: str, found: dict[str, Any]) -> None:
    """The recorded jobs, effects, schedules (and their occurrences),
    workflows, tenants and queues, each answered by `url` as the old
    release rendered it (the keys above; other fields may be new)."""
    for job_id, old in found["jobs"].items():
        status, body = get(url, f"/v1/jobs/{job_id}")
        assert status == 200, (job_id, body)
        check_same(f"job {job_id}", old, body["job"], JOB_KEYS)
    for key, old in found["effects"].items():
        status, body = get(url, f"/v1/effects/{key}")
        assert status == 200, (key, body)
        assert body["effect"] == old
    for schedule_id, old in found["schedules"].items():
        status, body = get(url, f"/v1/schedules/{schedule_id}")
        assert status == 200, (schedule_id, body)
        check_same(f"schedule {schedule_id}", old, body["schedule"], SCHEDULE_KEYS)
    for schedule_id, old in found["occurrences"].items():
        status, body = get(url, f"/v1/schedules/{schedule_id}/occurrences?limit=100")
        assert status == 200, (schedule_id, body)
        assert body["occurrences"] == old
    for workflow_id, old in found["workflows"].items():
        status, body = get(url, f"/v1/workflows/{workflow_id}")
        assert status == 200, (workflow_id, body)
        check_same(f"workflow {workflow_id}", old, body["workflow"], WORKFLOW_KEYS)
        assert as_before(body["workflow"]["steps"], old["steps"]) == old["steps"]
    for name, old in found["tenants"].items():
        status, body = get(url, f"/v1/tenants/{name}")
        assert status == 200, (name, body)
        check_same(f"tenant {name}", old, body["tenant"], TENANT_KEYS)
    for name, old in found["queues"].items():
        status, body = get(url, f"/v1/queues/{name}")
        assert status == 200, (name, body)
        check_same(f"queue {name}", old, body["queue"], QUEUE_KEYS)
