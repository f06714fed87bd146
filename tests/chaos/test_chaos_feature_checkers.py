"""Checkers 9-12 (schedules, workflows, outbox and webhooks, flow limits) on
hand-made final states and histories: clean ones pass, and each anomaly the
checkers exist for is flagged."""

from __future__ import annotations

import copy
from typing import Any

import chaos_support as s

from chaos import checkers

# -- 9: one job per schedule occurrence -------------------------------------------


def _schedule_final(records: list[Any], jobs: list[Any], **calendar: Any) -> dict[str, Any]:
    final = s.final(*jobs)
    final["schedules"] = {"every": s.schedule_view(records, **calendar)}
    return final


def _clean_schedule() -> tuple[list[Any], list[Any]]:
    jobs = [s.schedule_job(f"j{i}", "every", i * 3000) for i in (0, 2, 3)]
    records = [
        s.occurrence(0, "fired", "j0"),
        s.occurrence(3000, "missed", None),
        s.occurrence(6000, "buffered", None),
        s.occurrence(9000, "fired", "j3"),
        s.occurrence(6000, "fired", "j2", decided_ms=9500),  # released from the buffer
    ]
    return records, jobs


def test_schedule_occurrences_clean() -> None:
    records, jobs = _clean_schedule()
    check = checkers.schedule_occurrences(_schedule_final(records, jobs, interval_s=3))
    assert check.anomalies == 0, check.examples


def test_two_jobs_for_one_occurrence_are_flagged() -> None:
    records, jobs = _clean_schedule()
    twin = s.schedule_job("j0b", "every", 0)
    twin["idempotency_key"] = "schedule:every:0"
    check = checkers.schedule_occurrences(_schedule_final(records, [*jobs, twin], interval_s=3))
    problems = {e["problem"] for e in check.examples}
    assert "two jobs for one occurrence" in problems


def test_occurrence_decided_twice_is_flagged() -> None:
    records, jobs = _clean_schedule()
    records.append(s.occurrence(9000, "fired", "j3", decided_ms=9900))
    check = checkers.schedule_occurrences(_schedule_final(records, jobs, interval_s=3))
    assert [e["problem"] for e in check.examples] == ["occurrence decided more than once"]


def test_occurrence_never_decided_is_flagged() -> None:
    records, jobs = _clean_schedule()
    del records[1]  # 3000 was neither fired, skipped nor missed
    check = checkers.schedule_occurrences(_schedule_final(records, jobs, interval_s=3))
    assert check.examples[0]["problem"] == "occurrences missing between two decided ones"
    cron = checkers.schedule_occurrences(_schedule_final(records, jobs, cron="*/3 * * * * *"))
    assert cron.anomalies == 1


def test_job_without_record_or_other_than_recorded_is_flagged() -> None:
    records, jobs = _clean_schedule()
    stray = s.schedule_job("j9", "every", 30_000)
    check = checkers.schedule_occurrences(_schedule_final(records, [*jobs, stray], interval_s=3))
    assert check.examples[0]["problem"] == "job for an occurrence that was never recorded"
    records[0] = s.occurrence(0, "fired", "j-other")
    check = checkers.schedule_occurrences(_schedule_final(records, jobs, interval_s=3))
    assert (
        check.examples[0]["problem"] == "occurrence's recorded job differs from the final state's"
    )


def test_buffered_occurrence_must_be_released_or_still_buffered() -> None:
    records, jobs = _clean_schedule()
    records.pop()  # 6000 buffered, never released
    jobs = [job for job in jobs if job["id"] != "j2"]
    still = _schedule_final(records, jobs, interval_s=3)
    still["schedules"]["every"]["schedule"]["buffered"] = [s.iso(6000)]
    assert checkers.schedule_occurrences(still).anomalies == 0
    gone = _schedule_final(records, jobs, interval_s=3)
    assert checkers.schedule_occurrences(gone).anomalies == 1


# -- 10: workflow steps created once and advanced once ----------------------------

STEPS = {"reserve": [], "charge": ["reserve"], "notify": ["reserve"], "ship": ["charge", "notify"]}
# step -> (token, claimed, succeeded-or-ended at); charge and notify run in parallel.
RUNS = {
    "reserve": (1, 1100, 2000),
    "charge": (2, 2100, 3000),
    "notify": (3, 2200, 3500),
    "ship": (4, 3600, 4000),
}


def _result(token: int) -> dict[str, Any]:
    return {"worker_id": "w1", "token": token}


def _workflow(failing: bool) -> tuple[dict[str, Any], list[Any]]:
    """A consistent final state of the diamond, and the workers' claims."""
    wf = "wf_1"
    jobs: list[Any] = []
    steps: dict[str, Any] = {}
    history: list[Any] = []
    claims: list[Any] = []
    for name, deps in STEPS.items():
        token, claimed, ended = RUNS[name]
        created = max((RUNS[d][2] for d in deps), default=1000)
        fails = failing and name == "ship"
        outcome = "failed" if fails else "succeeded"
        job_id = f"job_1_s{list(STEPS).index(name)}"
        jobs.append(
            s.step_job(
                job_id, wf, name, created, [s.done(1, token, claimed, ended, outcome)],
                status="dead_letter" if fails else "succeeded",
                payload={"fail": True} if fails else {},
            )
        )  # fmt: skip
        steps[name] = {
            "status": "failed" if fails else "succeeded",
            "depends_on": deps,
            "job_id": job_id,
            "result": None if fails else _result(token),
            "compensation": {"status": None, "job_id": None, "result": None},
        }
        inputs = {dep: _result(RUNS[dep][0]) for dep in deps}
        claims.append(_claim(f"w1:{token}", job_id, token, wf, name, inputs))
        history += [
            {"at": s.iso(created), "event": "step_started", "detail": name},
            {"at": s.iso(ended), "event": f"step_{steps[name]['status']}", "detail": name},
        ]
    order: list[str] = []
    status = "succeeded"
    if failing:
        status = "failed"
        order = ["notify", "charge", "reserve"]
        history.append({"at": s.iso(4000), "event": "stopping", "detail": "failed: ship"})
        for index, name in enumerate(order):
            token, created = 10 + index, 4000 + 500 * index
            job_id = f"job_1_c{list(STEPS).index(name)}"
            jobs.append(
                s.step_job(
                    job_id, wf, name, created, [s.done(1, token, created + 100, created + 500)]
                )
            )  # fmt: skip
            steps[name]["compensation"] = {
                "status": "succeeded",
                "job_id": job_id,
                "result": _result(token),
            }
            claims.append(
                _claim(f"w2:{token}", job_id, token, wf, name, {name: steps[name]["result"]})
            )
            history += [
                {"at": s.iso(created), "event": "compensation_started", "detail": name},
                {"at": s.iso(created + 500), "event": "compensation_succeeded", "detail": name},
            ]
    history.append({"at": s.iso(6000), "event": "finished", "detail": status})
    workflow = {
        "id": wf,
        "idempotency_key": "wf-1",
        "status": status,
        "created_at": s.iso(1000),
        "steps": steps,
        "compensation_order": order,
    }
    final = s.final(*jobs)
    final["workflows"] = {wf: workflow}
    final["workflow_histories"] = {wf: history}
    submit = s.op("f:1", "submit_workflow", "ok", 0.0, 0.1, {"body": {"idempotency_key": "wf-1"}})
    submit["result"] = {"body": {"workflow": {"id": wf, "idempotency_key": "wf-1"}}}
    return final, [submit, *claims]


def _claim(op_id: str, job_id: str, token: int, wf: str, step: str, inputs: Any) -> Any:
    lease = {"job_id": job_id, "fencing_token": token, "attempt": 1, "epoch": 1}
    lease |= {"workflow_id": wf, "step": step, "inputs": inputs}
    return s.op(op_id, "claim", "ok", 0, 1, {"path": "/v1/leases"}, {"body": {"leases": [lease]}})


def _problems(check: checkers.Check) -> set[str]:
    return {example["problem"] for example in check.examples}


def test_workflows_clean_succeeded_and_failed_with_compensation() -> None:
    for failing in (False, True):
        final, ops = _workflow(failing)
        check = checkers.workflow_steps(ops, final)
        assert check.anomalies == 0, (failing, check.examples)


def test_step_job_created_apart_from_its_release_is_flagged() -> None:
    final, ops = _workflow(False)
    ship = next(job for job in final["jobs"] if job["step"] == "ship")
    ship["created_at"] = s.iso(3700)  # a second command advanced the workflow
    assert _problems(checkers.workflow_steps(ops, final)) == {
        "step job not created in the command that released it"
    }


def test_second_job_for_a_step_is_flagged() -> None:
    final, ops = _workflow(False)
    extra = copy.deepcopy(final["jobs"][1])
    extra["id"] = "job_1_s1_again"
    final["jobs"].append(extra)
    assert "job of a workflow that no step names" in _problems(checkers.workflow_steps(ops, final))


def test_step_succeeding_twice_or_started_twice_is_flagged() -> None:
    final, ops = _workflow(False)
    charge = final["jobs"][1]
    charge["attempts"].append(s.done(2, 9, 3100, 3200))
    final["workflow_histories"]["wf_1"].append(
        {"at": s.iso(3300), "event": "step_started", "detail": "charge"}
    )
    problems = _problems(checkers.workflow_steps(ops, final))
    assert problems == {
        "step job succeeded more than once",
        "workflow history repeats a transition",
    }


def test_step_status_disagreeing_with_its_job_is_flagged() -> None:
    final, ops = _workflow(False)
    final["workflows"]["wf_1"]["steps"]["notify"]["status"] = "failed"
    assert "step status disagrees with its job" in _problems(checkers.workflow_steps(ops, final))


def test_compensations_out_of_order_or_overlapping_are_flagged() -> None:
    final, ops = _workflow(True)
    final["workflows"]["wf_1"]["compensation_order"] = ["charge", "notify", "reserve"]
    assert "compensations not in reverse order of completion" in _problems(
        checkers.workflow_steps(ops, final)
    )
    final, ops = _workflow(True)
    comp_charge = next(job for job in final["jobs"] if job["id"] == "job_1_c1")
    comp_charge["created_at"] = s.iso(4200)  # before notify's compensation ended (4500)
    assert "compensation started before the previous one ended" in _problems(
        checkers.workflow_steps(ops, final)
    )


def test_missing_compensation_and_unexpected_outcomes_are_flagged() -> None:
    final, ops = _workflow(True)
    final["workflows"]["wf_1"]["compensation_order"] = ["notify", "charge"]
    assert "compensated steps are not the steps that succeeded" in _problems(
        checkers.workflow_steps(ops, final)
    )
    final, ops = _workflow(False)
    final["jobs"][0]["payload"] = {"fail": True}  # meant to fail, yet all succeeded
    assert "workflow succeeded although a step had to fail" in _problems(
        checkers.workflow_steps(ops, final)
    )


def test_wrong_lease_inputs_are_flagged() -> None:
    final, ops = _workflow(False)
    ship_claim = ops[-1]["result"]["body"]["leases"][0]
    ship_claim["inputs"] = {"charge": _result(2)}  # notify's result missing
    assert _problems(checkers.workflow_steps(ops, final)) == {
        "lease inputs differ from the dependencies' results"
    }


def test_lost_duplicated_or_unfinished_workflows_are_flagged() -> None:
    final, ops = _workflow(False)
    lost = copy.deepcopy(ops[0])
    lost["result"]["body"]["workflow"] = {"id": "wf_2", "idempotency_key": "wf-2"}
    lost["args"]["body"]["idempotency_key"] = "wf-2"
    twin = copy.deepcopy(ops[0])
    twin["result"]["body"]["workflow"]["id"] = "wf_1b"
    final["workflows"]["wf_1"]["status"] = "running"
    problems = _problems(checkers.workflow_steps([*ops, lost, twin], final))
    assert {
        "acknowledged workflow lost",
        "two workflows for one idempotency key",
        "workflow not finished",
    } <= problems


# -- 11: outbox gapless, webhooks at least once ------------------------------------


def _event(seq: int, job_id: str) -> dict[str, Any]:
    return {"seq": seq, "type": "job.succeeded", "at": s.iso(seq), "data": {"job_id": job_id}}


def _delivery(event: dict[str, Any], answered: int = 200, **kw: Any) -> dict[str, Any]:
    found = {"seq": event["seq"], "type": event["type"], "data": event["data"]}
    found |= {"event_id": f"evt_{event['seq']}", "body_id": f"evt_{event['seq']}"}
    found |= {"signature_ok": True, "answered": answered, **kw}
    return found


def _outbox_final(count: int = 3, cursor: int = 3) -> tuple[dict[str, Any], list[Any]]:
    events = [_event(seq, f"j{seq}") for seq in range(1, count + 1)]
    final = s.final(*[s.job(f"j{seq}") for seq in range(1, count + 1)])
    final["outbox"] = {"events": events, "first_seq": 1, "last_seq": count}
    final["subscription"] = {"cursor_seq": cursor, "parked": []}
    final["subscription_start_seq"] = 0
    deliveries = [_delivery(events[0], 503), *(_delivery(e) for e in events), _delivery(events[1])]
    return final, deliveries


def test_outbox_and_webhooks_clean() -> None:
    final, deliveries = _outbox_final()
    check = checkers.outbox_and_webhooks(final, deliveries)
    assert check.anomalies == 0, check.examples


def test_outbox_gap_is_flagged() -> None:
    final, deliveries = _outbox_final()
    del final["outbox"]["events"][1]
    problems = _problems(checkers.outbox_and_webhooks(final, deliveries))
    assert "outbox sequence has gaps or repeats" in problems


def test_event_the_receiver_never_got_is_lost_or_pending() -> None:
    final, deliveries = _outbox_final()
    without_3 = [d for d in deliveries if d["seq"] != 3]
    lost = _problems(checkers.outbox_and_webhooks(final, without_3))
    assert lost == {"event lost: the cursor passed it, the receiver never got it"}
    final["subscription"]["cursor_seq"] = 2
    pending = _problems(checkers.outbox_and_webhooks(final, without_3))
    assert pending == {"event not delivered within the recovery bound"}
    refused_only = [d for d in deliveries if d["seq"] != 1]  # seq 1 got only a 503
    final["subscription"]["cursor_seq"] = 3
    refused = _problems(checkers.outbox_and_webhooks(final, refused_only))
    assert refused == {"event lost: the cursor passed it, the receiver never got it"}


def test_bad_deliveries_are_flagged() -> None:
    final, deliveries = _outbox_final()
    forged = _delivery(final["outbox"]["events"][0], signature_ok=False)
    changed = _delivery(final["outbox"]["events"][1])
    changed["data"] = {"job_id": "j-other"}
    phantom = _delivery(_event(9, "j9"))
    problems = _problems(
        checkers.outbox_and_webhooks(final, [*deliveries, forged, changed, phantom])
    )
    assert problems == {
        "delivery with a bad signature",
        "delivered event differs from the outbox's",
        "delivered an event the outbox does not hold",
    }


def test_events_disagreeing_with_transitions_are_flagged() -> None:
    final, deliveries = _outbox_final()
    final["jobs"].append(s.job("j4"))  # succeeded, yet no event
    final["jobs"][0]["status"] = "dead_letter"  # its event says succeeded
    problems = _problems(checkers.outbox_and_webhooks(final, deliveries))
    assert problems == {"job's events disagree with its status"}
    final, deliveries = _outbox_final()
    final["jobs"].pop()  # an event about a job that does not exist
    problems = _problems(checkers.outbox_and_webhooks(final, deliveries))
    assert problems == {"event about a job the final state lacks"}


# -- 12: tenant concurrency limits and ordering keys -------------------------------


def _flow_job(job_id: str, attempts: list[Any], key: str | None = None, **kw: Any) -> Any:
    found = s.job(job_id, attempts=attempts, key=kw.get("idem", f"k-{job_id}"))
    found |= {"tenant": "lim", "ordering_key": key}
    return found


def _flow_final(*jobs: Any) -> dict[str, Any]:
    final = s.final(*jobs)
    final["tenants"] = {"lim": {"concurrency_limit": 2}}
    return final


def test_flow_limits_clean_including_back_to_back_slots() -> None:
    final = _flow_final(
        _flow_job("a", [s.done(1, 1, 1000, 3000)], key="k0"),
        _flow_job("b", [s.done(1, 2, 1500, 2000, "lease_expired"), s.done(2, 4, 2500, 4000)]),
        _flow_job("c", [s.done(1, 3, 3000, 5000)], key="k0"),  # starts as a ends
    )
    check = checkers.flow_limits([], final)
    assert check.anomalies == 0, check.examples


def test_tenant_over_its_limit_is_flagged() -> None:
    final = _flow_final(
        _flow_job("a", [s.done(1, 1, 1000, 3000)]),
        _flow_job("b", [s.done(1, 2, 1500, 3500)]),
        _flow_job("c", [s.done(1, 3, 2000, 2500)]),
    )
    check = checkers.flow_limits([], final)
    assert check.anomalies == 1
    assert check.examples[0]["problem"] == "tenant over its concurrency limit"


def test_ordering_key_overlap_is_flagged() -> None:
    final = _flow_final(
        _flow_job("a", [s.done(1, 1, 1000, 1500, "failed"), s.done(2, 3, 2500, 3000)], key="k0"),
        _flow_job("b", [s.done(1, 2, 2000, 2200)], key="k0"),  # while a waited to retry
    )
    assert _problems(checkers.flow_limits([], final)) == {"two jobs of one ordering key at once"}


def test_ordering_key_out_of_submission_order_is_flagged() -> None:
    final = _flow_final(
        _flow_job("a", [s.done(1, 2, 3000, 4000)], key="k0", idem="c1-1"),
        _flow_job("b", [s.done(1, 1, 1000, 2000)], key="k0", idem="c1-2"),
    )
    ops = [s.submit("c1:1", 0.0, 0.1, "c1-1", "a"), s.submit("c1:2", 0.2, 0.3, "c1-2", "b")]
    assert _problems(checkers.flow_limits(ops, final)) == {
        "ordering key ran a later job before an earlier one ended"
    }
    concurrent = [s.submit("c1:1", 0.0, 0.5, "c1-1", "a"), s.submit("c2:1", 0.2, 0.3, "c1-2", "b")]
    assert checkers.flow_limits(concurrent, final).anomalies == 0


def test_real_time_windows_over_the_limit_are_flagged() -> None:
    # The replicated attempts are clean; the workers' own history is not:
    # three completions accepted whose leases were all held at t=2.
    final = _flow_final(
        *(
            _flow_job(j, [s.done(1, t, 1000 * t, 1000 * t + 500)])
            for j, t in (("a", 1), ("b", 2), ("c", 3))
        )
    )
    ops = []
    for job_id, token in (("a", 1), ("b", 2), ("c", 3)):
        ops.append(s.claim(f"w{token}:1", 0.0, 1.0 + token / 10, job_id, token))
        ops.append(s.lease_op(f"w{token}:2", "complete", 3.0, 3.1, job_id, token))
    assert _problems(checkers.flow_limits(ops, final)) == {"tenant over its limit (real time)"}


def test_feature_checkers_ignore_a_final_state_without_features() -> None:
    names = [check.name for check in checkers.check_all([], s.final(), [], [])]
    assert names[7:11] == [
        "9_one_job_per_schedule_occurrence",
        "10_workflow_steps_once",
        "11_outbox_gapless_webhooks_delivered",
        "12_tenant_limits_and_ordering_keys",
    ]
    assert all(check.anomalies == 0 for check in checkers.check_all([], s.final(), [], []))
