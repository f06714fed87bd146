"""Schedules against a real 3-node cluster: the API, firing, and leader failure."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from raftsched.client import Client
from raftsched.testing import LocalCluster, http_json
from raftsched.timefmt import parse_ms


def leader_url(cluster: LocalCluster) -> str:
    return cluster.nodes[cluster.wait_for_leader()].http_url


def create(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, answer, _ = http_json("POST", url + "/v1/schedules", body)
    return status, answer


def wait_for(predicate: Any, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cron": "99 * * * *"}, "cron"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"cron": None, "interval_s": 0}, "interval_s"),
        ({"start_at": "2030-01-02T00:00:00Z", "end_at": "2030-01-01T00:00:00Z"}, "end_at"),
        ({"interval_s": 5}, "cron"),
        ({"cron": None}, "cron"),
        ({"overlap": "maybe"}, "overlap"),
        ({"catchup": {"policy": "some"}}, "catchup.policy"),
        ({"catchup": {"window": 3}}, "catchup.window"),
        ({"jobs": {}}, "jobs"),
        ({"job": {"queue": "q", "idempotency_key": "k"}}, "job.idempotency_key"),
    ],
)
def test_bad_schedules_are_400_naming_the_field(
    cluster: LocalCluster, change: dict[str, Any], field: str
) -> None:
    url = leader_url(cluster)
    body = {"id": "bad", "cron": "* * * * *", "job": {"queue": "q"}, **change}
    status, answer = create(url, body)
    assert status == 400, answer
    assert answer["error"]["code"] == "invalid_request"
    assert answer["error"]["details"]["field"] == field
    assert http_json("GET", url + "/v1/schedules/bad")[0] == 404


def test_schedule_api_round_trip(cluster: LocalCluster, client: Client) -> None:
    url = leader_url(cluster)
    body = {
        "id": "every-second",
        "cron": "* * * * * *",
        "timezone": "Europe/London",
        "overlap": "allow_all",
        "job": {"queue": "sched", "payload": {"n": 1}},
    }
    status, answer = create(url, body)
    assert status == 201, answer
    assert answer["schedule"]["next_fire_at"] is not None
    assert create(url, body)[0] == 200
    conflict, answer = create(url, {**body, "overlap": "skip"})
    assert conflict == 409 and answer["error"]["code"] == "idempotency_conflict"

    fired = wait_for(lambda: len(client.schedule_occurrences("every-second")) >= 3)
    assert fired
    records = client.schedule_occurrences("every-second")
    assert {record["decision"] for record in records} == {"fired"}
    jobs = client.list_jobs(schedule_id="every-second", limit=100)["jobs"]
    assert len({job["idempotency_key"] for job in jobs}) == len(jobs) >= 3

    paused = client.pause_schedule("every-second")
    assert paused["paused"] is True and paused["next_fire_at"] is None
    triggered = client.trigger_schedule("every-second")
    assert triggered["decision"] == "triggered" and triggered["job_id"]
    resumed = client.resume_schedule("every-second")
    assert resumed["paused"] is False

    edited = client.update_schedule("every-second", {**body, "cron": "0 0 * * *"})
    assert edited["cron"] == "0 0 * * *"
    assert client.get_schedule("every-second")["cron"] == "0 0 * * *"
    listed = client.list_schedules()["schedules"]
    assert [schedule["id"] for schedule in listed] == ["every-second"]

    start = records[-1]["nominal_time"]
    backfilled = client.backfill_schedule("every-second", start, start, overlap="allow_all")
    assert len(backfilled) == 0  # "0 0 * * *" has no occurrence at that second

    client.delete_schedule("every-second")
    assert http_json("GET", url + "/v1/schedules/every-second")[0] == 404


@pytest.mark.slow
def test_leader_killed_while_occurrences_are_due(cluster: LocalCluster, client: Client) -> None:
    """Every occurrence fires exactly once (one job per occurrence key), none lost."""
    client.create_schedule(
        {
            "id": "tick",
            "cron": "* * * * * *",
            "overlap": "allow_all",
            "catchup": {"policy": "all", "window_s": 600, "max_runs": 1000, "grace_s": 60},
            "job": {"queue": "sched"},
        }
    )
    wait_for(lambda: len(client.schedule_occurrences("tick")) >= 2)
    cluster.kill(cluster.wait_for_leader())
    cluster.wait_for_leader(timeout_s=30)
    time.sleep(4)
    client.pause_schedule("tick")
    time.sleep(1.5)  # let paced catch-up drain before pausing took effect
    records = client.schedule_occurrences("tick", limit=1000)
    nominal = sorted(parse_ms(record["nominal_time"]) for record in records)
    decisions = Counter(record["decision"] for record in records)
    assert set(decisions) == {"fired"}, decisions
    # No second was lost and none was decided twice.
    assert nominal == list(range(nominal[0], nominal[-1] + 1000, 1000))
    jobs = list(client.iter_jobs(schedule_id="tick"))
    keys = Counter(job["idempotency_key"] for job in jobs)
    assert all(count == 1 for count in keys.values())
    assert sorted(int(key.rsplit(":", 1)[1]) for key in keys) == nominal
    cluster.wait_converged()


def test_cli_schedules(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    from raftsched.cli import main

    url = ["--url", ",".join(cluster.urls)]
    create_args = ["schedules", "create", "nightly", "--cron", "0 2 * * *", "--queue", "q"]
    assert main([*url, *create_args, "--timezone", "America/New_York"]) == 0
    assert "America/New_York" in capsys.readouterr().out
    assert main([*url, "schedules", "list"]) == 0
    assert "nightly" in capsys.readouterr().out
    assert main([*url, "--json", "schedules", "trigger", "nightly"]) == 0
    assert '"triggered"' in capsys.readouterr().out
    assert main([*url, "schedules", "occurrences", "nightly"]) == 0
    assert "triggered" in capsys.readouterr().out
    edit_args = ["schedules", "edit", "nightly", "--interval-s", "60", "--queue", "q"]
    assert main([*url, *edit_args]) == 0
    assert main([*url, "schedules", "pause", "nightly"]) == 0
    assert main([*url, "schedules", "resume", "nightly"]) == 0
    assert main([*url, *create_args[:2], "bad", "--cron", "0 2 * *", "--queue", "q"]) == 1
    assert "field: cron" in capsys.readouterr().err
    backfill = ["--from", "2020-01-01T00:00:00Z", "--to", "2020-01-01T00:00:00Z"]
    assert main([*url, "schedules", "backfill", "nightly", *backfill]) == 0
    assert main([*url, "schedules", "delete", "nightly"]) == 0
    assert main([*url, "schedules", "get", "nightly"]) == 1
