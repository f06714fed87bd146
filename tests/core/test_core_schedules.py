"""Schedule commands and Tick firing, with a controlled clock."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from core_support import Cluster, assert_rejected_unchanged

from raftsched.core import decode_state, encode_state, state_digest
from raftsched.core.jobs.commands import CancelJob, CompleteJob, FailJob, StartJob
from raftsched.core.kernel.commands import JobSpec, RaiseClusterVersion, Tick
from raftsched.core.kernel.outbox import decode_data, events_after
from raftsched.core.kernel.results import (
    OccurrenceDecided,
    ScheduleBackfilled,
    ScheduleSaved,
    Ticked,
)
from raftsched.core.schedules.commands import (
    BackfillSchedule,
    CreateSchedule,
    DeleteSchedule,
    PauseSchedule,
    ResumeSchedule,
    ScheduleSpec,
    TriggerSchedule,
    UpdateSchedule,
)
from raftsched.core.schedules.fire import FIRINGS_PER_TICK_MAX, jitter_ms
from raftsched.core.schedules.queries import get_schedule

T0 = 1_800_000_000_000  # 2027-01-15T08:00:00Z, a whole minute
S = 1000


def make(cluster: Cluster, schedule_id: str = "s1", **fields: Any) -> ScheduleSpec:
    spec = ScheduleSpec(**{"id": schedule_id, "job": JobSpec("q"), "interval_ms": 10 * S, **fields})
    assert cluster.one(CreateSchedule(spec)) == ScheduleSaved(schedule_id, created=True)
    return spec


def decisions(cluster: Cluster, schedule_id: str = "s1") -> list[tuple[int, str]]:
    schedule = get_schedule(cluster.state, schedule_id)
    assert schedule is not None
    return [(record[0] - T0, record[2]) for record in schedule.records]


def tick(cluster: Cluster, at_offset_ms: int) -> Ticked:
    result = cluster.one(Tick(), at=T0 + at_offset_ms)
    assert isinstance(result, Ticked)
    return result


def jobs_of(cluster: Cluster, schedule_id: str = "s1") -> list[Any]:
    return [job for job in cluster.state.jobs.values() if job.schedule_id == schedule_id]


def finish_all(cluster: Cluster) -> None:
    for job in jobs_of(cluster):
        if job.status in ("pending", "scheduled"):
            cluster.one(CancelJob(job.id))


@pytest.fixture
def cluster() -> Cluster:
    return Cluster(now_ms=T0)


# -- create / idempotency / validation ------------------------------------------------


def test_create_is_idempotent_by_id_and_conflicts_on_a_different_body(cluster: Cluster) -> None:
    spec = make(cluster)
    assert cluster.one(CreateSchedule(spec)) == ScheduleSaved("s1", created=False)
    changed = replace(spec, interval_ms=20 * S)
    result = assert_rejected_unchanged(cluster, CreateSchedule(changed), "idempotency_conflict")
    assert result.details["field"] == "id"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"cron": "not cron", "interval_ms": None}, "cron"),
        ({"cron": "* * * * *", "interval_ms": None, "timezone": "Mars/Base"}, "timezone"),
        ({"interval_ms": 0}, "interval_s"),
        ({"cron": "* * * * *"}, "cron"),
        ({"interval_ms": None}, "cron"),
        ({"start_at_ms": T0, "end_at_ms": T0 - 1}, "end_at"),
        ({"overlap": "sometimes"}, "overlap"),
        ({"catchup_policy": "most"}, "catchup.policy"),
        ({"catchup_max_runs": 0}, "catchup.max_runs"),
        ({"jitter_ms": -1}, "jitter_s"),
        ({"job": JobSpec("q", idempotency_key="k")}, "job.idempotency_key"),
        ({"job": JobSpec("")}, "job.queue"),
    ],
)
def test_bad_specs_are_rejected_naming_the_field(
    cluster: Cluster, fields: dict[str, Any], field: str
) -> None:
    spec = ScheduleSpec(**{"id": "bad", "job": JobSpec("q"), "interval_ms": 10 * S, **fields})
    result = assert_rejected_unchanged(cluster, CreateSchedule(spec), "invalid_request")
    assert result.details["field"] == field


def test_unknown_schedule_is_not_found(cluster: Cluster) -> None:
    for command in (
        DeleteSchedule("nope"),
        PauseSchedule("nope"),
        ResumeSchedule("nope"),
        TriggerSchedule("nope"),
        BackfillSchedule("nope", 0, T0),
    ):
        assert_rejected_unchanged(cluster, command, "not_found")


# -- firing ------------------------------------------------------------------------------


def test_fires_each_occurrence_once_with_a_derived_key(cluster: Cluster) -> None:
    make(cluster, overlap="allow_all")
    assert tick(cluster, 9_999).more is False
    assert decisions(cluster) == []
    tick(cluster, 10 * S)
    tick(cluster, 10 * S)  # the same instant again decides nothing new
    tick(cluster, 20 * S)
    assert decisions(cluster) == [(10 * S, "fired"), (20 * S, "fired")]
    keys = sorted(job.idempotency_key for job in jobs_of(cluster))
    assert keys == [f"schedule:s1:{T0 + 10 * S}", f"schedule:s1:{T0 + 20 * S}"]
    # Job ids are derived from the occurrence, not drawn at random.
    other = Cluster(now_ms=T0)
    make(other, overlap="allow_all")
    tick(other, 10 * S)
    tick(other, 20 * S)
    assert {job.id for job in jobs_of(other)} == {job.id for job in jobs_of(cluster)}


def test_next_due_includes_the_earliest_schedule(cluster: Cluster) -> None:
    from raftsched.core import next_due_ms

    make(cluster, "a", interval_ms=30 * S)
    make(cluster, "b", interval_ms=7 * S)
    assert next_due_ms(cluster.state) == T0 + 7 * S


def test_start_and_end_bound_the_calendar(cluster: Cluster) -> None:
    make(cluster, start_at_ms=T0 + 60 * S, end_at_ms=T0 + 80 * S, overlap="allow_all")
    schedule = get_schedule(cluster.state, "s1")
    assert schedule is not None and schedule.next_nominal_ms == T0 + 60 * S
    for offset in (60, 70, 80, 90, 100):
        tick(cluster, offset * S)
    assert [d for _, d in decisions(cluster)] == ["fired"] * 3
    assert schedule.next_nominal_ms is None and schedule.due_ms is None


def test_jitter_is_deterministic_and_before_the_next_occurrence(cluster: Cluster) -> None:
    make(cluster, jitter_ms=60 * S)  # larger than the 10 s interval
    schedule = get_schedule(cluster.state, "s1")
    assert schedule is not None
    values = {jitter_ms(schedule, T0 + k * 10 * S) for k in range(1, 50)}
    assert all(0 <= value < 10 * S for value in values) and len(values) > 10
    assert schedule.next_fire_ms == T0 + 10 * S + jitter_ms(schedule, T0 + 10 * S)


def test_cron_schedule_fires_at_its_instants(cluster: Cluster) -> None:
    make(cluster, cron="*/20 * * * * *", interval_ms=None, overlap="allow_all")
    for offset in (20, 40, 60):
        tick(cluster, offset * S)
    assert decisions(cluster) == [(20 * S, "fired"), (40 * S, "fired"), (60 * S, "fired")]


# -- overlap -------------------------------------------------------------------------------


def run_first(cluster: Cluster) -> Any:
    """Fire the first occurrence and start its job on a worker."""
    tick(cluster, 10 * S)
    lease = cluster.claim_one()
    cluster.one(StartJob(lease.job_id, lease.fencing_token))
    return lease


def test_overlap_skip(cluster: Cluster) -> None:
    make(cluster, overlap="skip")
    run_first(cluster)
    tick(cluster, 20 * S)
    assert decisions(cluster) == [(10 * S, "fired"), (20 * S, "skipped_overlap")]


def test_overlap_allow_all(cluster: Cluster) -> None:
    make(cluster, overlap="allow_all")
    run_first(cluster)
    tick(cluster, 20 * S)
    assert decisions(cluster)[-1] == (20 * S, "fired")
    assert len(jobs_of(cluster)) == 2


def test_overlap_buffer_one_starts_when_the_run_ends(cluster: Cluster) -> None:
    make(cluster, overlap="buffer_one")
    lease = run_first(cluster)
    tick(cluster, 20 * S)
    tick(cluster, 30 * S)
    assert decisions(cluster)[1:] == [(20 * S, "buffered"), (30 * S, "skipped_overlap")]
    cluster.one(CompleteJob(lease.job_id, lease.fencing_token), at=T0 + 31 * S)
    tick(cluster, 31 * S)
    assert decisions(cluster)[-1] == (20 * S, "fired")
    assert len(jobs_of(cluster)) == 2


def test_overlap_buffer_all_runs_one_after_another(cluster: Cluster) -> None:
    make(cluster, overlap="buffer_all")
    lease = run_first(cluster)
    tick(cluster, 20 * S)
    tick(cluster, 30 * S)
    cluster.one(CompleteJob(lease.job_id, lease.fencing_token), at=T0 + 35 * S)
    tick(cluster, 35 * S)
    assert decisions(cluster)[-1] == (20 * S, "fired")
    second = cluster.claim_one()
    cluster.one(FailJob(second.job_id, second.fencing_token, "permanent"))
    tick(cluster, 36 * S)
    assert decisions(cluster)[-1] == (30 * S, "fired")


def test_expired_lease_that_retries_still_blocks_but_final_status_releases(
    cluster: Cluster,
) -> None:
    make(cluster, overlap="buffer_one", job=JobSpec("q", max_attempts=1, lease_ms=5 * S))
    run_first(cluster)
    tick(cluster, 20 * S)  # buffered; the running lease expired at 15 s -> dead letter (final)
    assert decisions(cluster)[-1] == (20 * S, "buffered") or decisions(cluster)[-1][1] == "fired"
    tick(cluster, 20 * S)
    assert decisions(cluster)[-1] == (20 * S, "fired")


def test_overlap_cancel_other_cancels_then_starts(cluster: Cluster) -> None:
    make(cluster, overlap="cancel_other")
    lease = run_first(cluster)
    tick(cluster, 20 * S)
    first = cluster.job(lease.job_id)
    assert first.cancel_requested and decisions(cluster)[-1] == (20 * S, "buffered")
    cluster.one(FailJob(lease.job_id, lease.fencing_token, "cancelled"), at=T0 + 21 * S)
    tick(cluster, 21 * S)
    assert first.status == "cancelled"
    assert decisions(cluster)[-1] == (20 * S, "fired")


def test_cancel_other_with_a_queued_run_starts_at_once(cluster: Cluster) -> None:
    make(cluster, overlap="cancel_other")
    tick(cluster, 10 * S)  # pending, not claimed
    tick(cluster, 20 * S)
    assert decisions(cluster) == [(10 * S, "fired"), (20 * S, "fired")]
    statuses = sorted(job.status for job in jobs_of(cluster))
    assert statuses == ["cancelled", "pending"]


# -- manual trigger and backfill ----------------------------------------------------------


def test_trigger_obeys_overlap_and_keeps_the_next_occurrence(cluster: Cluster) -> None:
    make(cluster, overlap="skip")
    result = cluster.one(TriggerSchedule("s1"), at=T0 + 3 * S)
    assert isinstance(result, OccurrenceDecided) and result.decision == "triggered"
    schedule = get_schedule(cluster.state, "s1")
    assert schedule is not None and schedule.next_nominal_ms == T0 + 10 * S
    second = cluster.one(TriggerSchedule("s1"), at=T0 + 4 * S)
    assert second.decision == "skipped_overlap"


def test_backfill_with_its_own_overlap_policy(cluster: Cluster) -> None:
    make(cluster, overlap="skip")
    tick(cluster, 60 * S)  # 10..60 s: the newest fires (catch-up latest), older missed
    finish_all(cluster)
    result = cluster.one(BackfillSchedule("s1", T0, T0 + 30 * S, "buffer_all"), at=T0 + 61 * S)
    assert isinstance(result, ScheduleBackfilled)
    assert [d.decision for d in result.decisions] == ["backfilled"] + ["buffered"] * 3


def test_backfill_never_duplicates_a_fired_occurrence(cluster: Cluster) -> None:
    make(cluster, overlap="allow_all")
    tick(cluster, 10 * S)
    (fired,) = jobs_of(cluster)
    result = cluster.one(BackfillSchedule("s1", T0 + 10 * S, T0 + 10 * S, "allow_all"))
    assert result.decisions[0].job_id == fired.id
    assert len(jobs_of(cluster)) == 1


def test_backfill_bounds(cluster: Cluster) -> None:
    make(cluster)
    cluster.one(PauseSchedule("s1"), at=T0 + 20_000 * S)
    too_many = BackfillSchedule("s1", T0, T0 + 20_000 * S)
    far = assert_rejected_unchanged(cluster, too_many, "invalid_request")
    assert far.details["field"] == "from"
    future = assert_rejected_unchanged(
        cluster, BackfillSchedule("s1", T0, T0 + 30_000 * S), "invalid_request"
    )
    assert future.details["field"] == "to"


# -- missed runs ---------------------------------------------------------------------------


def outage(cluster: Cluster, policy: str, **fields: Any) -> list[tuple[int, str]]:
    """Interval 10 s; nothing ticks for 100 s, then ticks come back."""
    make(cluster, overlap="allow_all", catchup_policy=policy, **fields)
    for offset_ms in range(100 * S, 102 * S, 50):
        tick(cluster, offset_ms)
    return decisions(cluster)


def test_catchup_skip(cluster: Cluster) -> None:
    assert outage(cluster, "skip") == [(k * 10 * S, "missed") for k in range(1, 10)] + [
        (100 * S, "fired")
    ]
    schedule = get_schedule(cluster.state, "s1")
    assert schedule is not None and schedule.counts["missed:catchup_skip"] == 9


def test_catchup_skip_misses_a_late_lone_occurrence(cluster: Cluster) -> None:
    make(cluster, interval_ms=3600 * S, catchup_policy="skip", catchup_grace_ms=30 * S)
    tick(cluster, 3600 * S + 31 * S)
    assert decisions(cluster) == [(3600 * S, "missed")]
    (event,) = [e for e in events_after(cluster.state, 0, None, 100) if e.type == "schedule.missed"]
    # Before cluster version 3 the event names no tenant (as the previous
    # release's replicas record it).
    assert "tenant" not in decode_data(event)


def test_from_cluster_version_3_a_missed_occurrence_names_its_tenant(cluster: Cluster) -> None:
    cluster.one(RaiseClusterVersion(3))
    make(cluster, interval_ms=3600 * S, catchup_policy="skip", catchup_grace_ms=30 * S)
    tick(cluster, 3600 * S + 31 * S)
    (event,) = [e for e in events_after(cluster.state, 0, None, 100) if e.type == "schedule.missed"]
    assert decode_data(event)["tenant"] == "default"


def test_catchup_latest(cluster: Cluster) -> None:
    assert outage(cluster, "latest") == [(k * 10 * S, "missed") for k in range(1, 10)] + [
        (100 * S, "fired")
    ]


def test_catchup_all_is_paced_and_bounded(cluster: Cluster) -> None:
    make(cluster, overlap="allow_all", catchup_policy="all", catchup_max_runs=3)
    first = tick(cluster, 100 * S)
    assert first.more is False  # paced: the next catch-up waits
    assert decisions(cluster) == [(10 * S, "fired")]
    for offset_ms in range(100 * S + 100, 101 * S, 100):
        tick(cluster, offset_ms)
    assert decisions(cluster) == (
        [(10 * S, "fired"), (20 * S, "fired"), (30 * S, "fired")]
        + [(k * 10 * S, "missed") for k in range(4, 10)]
        + [(100 * S, "fired")]
    )
    fired_at = [r[1] - T0 for r in get_schedule(cluster.state, "s1").records][:3]  # type: ignore[union-attr]
    assert fired_at == [100 * S, 100 * S + 100, 100 * S + 200]


def test_catchup_window_bounds_what_is_considered(cluster: Cluster) -> None:
    outage(cluster, "all", catchup_window_ms=25 * S, catchup_max_runs=10)
    found = decisions(cluster)
    assert found[:7] == [(k * 10 * S, "missed") for k in range(1, 8)]  # older than 75 s
    assert found[7:] == [(80 * S, "fired"), (90 * S, "fired"), (100 * S, "fired")]


def test_long_backlog_is_summarised_not_walked_forever(cluster: Cluster) -> None:
    make(cluster, interval_ms=1 * S, catchup_policy="skip", catchup_window_ms=10 * S)
    tick(cluster, 6 * 3600 * S)  # six hours of one-second occurrences
    schedule = get_schedule(cluster.state, "s1")
    assert schedule is not None
    assert len(schedule.records) <= 1000
    assert schedule.records[-1][2] == "fired" and schedule.records[-1][0] == T0 + 6 * 3600 * S


# -- pause, resume, update, delete -----------------------------------------------------------


def test_pause_and_resume(cluster: Cluster) -> None:
    make(cluster, overlap="allow_all")
    cluster.one(PauseSchedule("s1"))
    tick(cluster, 50 * S)
    assert decisions(cluster) == []
    cluster.one(ResumeSchedule("s1"), at=T0 + 55 * S)
    tick(cluster, 60 * S)
    assert decisions(cluster) == [(60 * S, "fired")]


def test_update_recomputes_and_keeps_records(cluster: Cluster) -> None:
    spec = make(cluster, overlap="allow_all")
    tick(cluster, 10 * S)
    cluster.one(UpdateSchedule(replace(spec, interval_ms=30 * S)), at=T0 + 15 * S)
    schedule = get_schedule(cluster.state, "s1")
    assert schedule is not None and schedule.next_nominal_ms == T0 + 45 * S
    assert decisions(cluster) == [(10 * S, "fired")]


def test_delete(cluster: Cluster) -> None:
    make(cluster)
    cluster.one(DeleteSchedule("s1"))
    assert get_schedule(cluster.state, "s1") is None
    assert tick(cluster, 100 * S).more is False


# -- scale and determinism ----------------------------------------------------------------------


def test_hot_minute_is_spread_over_bounded_ticks() -> None:
    cluster = Cluster(now_ms=T0)
    count = FIRINGS_PER_TICK_MAX + 500
    commands = [
        CreateSchedule(ScheduleSpec(f"s{i}", JobSpec("q"), cron="* * * * *")) for i in range(count)
    ]
    cluster.run(*commands)
    first = tick(cluster, 60 * S)
    assert first.more is True
    fired = sum(len(get_schedule(cluster.state, f"s{i}").records) for i in range(count))  # type: ignore[union-attr]
    assert fired == FIRINGS_PER_TICK_MAX
    assert tick(cluster, 60 * S).more is False
    assert len(cluster.state.jobs) == count


def test_snapshot_round_trip_is_identical_and_keeps_working(cluster: Cluster) -> None:
    make(cluster, overlap="buffer_all", jitter_ms=3 * S)
    make(cluster, "c", cron="*/5 * * * * *", interval_ms=None, timezone="Europe/London")
    lease = run_first(cluster)
    tick(cluster, 30 * S)
    cluster.one(CompleteJob(lease.job_id, lease.fencing_token))
    copy = Cluster(now_ms=T0)
    copy.state = decode_state(encode_state(cluster.state))
    assert state_digest(copy.state) == cluster.digest()
    for each in (cluster, copy):
        each.now_ms = cluster.now_ms
        tick(each, 45 * S)
    assert state_digest(copy.state) == cluster.digest()
