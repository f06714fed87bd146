"""The chaos checkers on hand-made histories: clean ones pass, and each kind
of anomaly the checkers exist for is flagged."""

from __future__ import annotations

import chaos_support as s

from chaos import checkers

A1 = s.attempt(1, 5, 1, 1_000, 3_000)
A2 = s.attempt(2, 7, 2, 3_500, None)


def test_clean_history_passes_every_checker() -> None:
    jobs = [s.job("j1", attempts=[A1, A2])]
    ops = [
        s.submit("c1:1", 0.0, 0.1, "k1", "j1"),
        s.read("c1:2", 0.2, 0.3, "j1", {"status": "pending", "attempts": []}),
        s.claim("w1:1", 0.4, 0.5, "j1", 5),
        s.claim("w2:1", 3.0, 3.1, "j1", 7, attempt=2),
        s.lease_op("w1:2", "complete", 3.5, 3.6, "j1", 5, kind="fail"),
        s.lease_op("w2:2", "complete", 3.5, 3.6, "j1", 7),
        s.read("c1:3", 4.0, 4.1, "j1", {"status": "succeeded", "attempts": [A1, A2]}),
    ]
    digest = {"digest": "d", "applied_index": 9, "jobs": jobs}
    result = checkers.check_all(ops, s.final(*jobs, nodes={"n1": digest, "n2": digest}), [])
    assert {c.name: c.anomalies for c in result} == {c.name: 0 for c in result}


def test_lost_acknowledged_submit_is_flagged() -> None:
    ops = [s.submit("c1:1", 0.0, 0.1, "k1", "j1"), s.submit("c1:2", 0.2, 0.3, "k2", "j2")]
    check = checkers.acknowledged_not_lost(ops, s.final(s.job("j1")))
    assert check.anomalies == 1
    assert check.examples[0]["job_id"] == "j2"


def test_unacknowledged_submit_may_be_lost() -> None:
    ops = [s.submit("c1:1", 0.0, 0.1, "k1", "j1", kind="info")]
    assert checkers.acknowledged_not_lost(ops, s.final()).anomalies == 0


def test_acknowledged_job_not_final_is_flagged() -> None:
    ops = [s.submit("c1:1", 0.0, 0.1, "k1", "j1")]
    check = checkers.acknowledged_not_lost(ops, s.final(s.job("j1", status="pending")))
    assert check.anomalies == 1


def test_job_final_only_after_the_recovery_bound_is_flagged() -> None:
    ops = [s.submit("c1:1", 0.0, 0.1, "k1", "j1")]
    late = s.final(s.job("j1"))
    late["unfinished_after_bound"] = ["j1"]
    assert checkers.acknowledged_not_lost(ops, late).anomalies == 1


def test_two_jobs_for_one_key_are_flagged() -> None:
    final = s.final(s.job("j1", key="k"), s.job("j2", key="k"))
    assert checkers.one_job_per_key([], final).anomalies == 1
    ops = [s.submit("c1:1", 0, 1, "k", "j1"), s.submit("c1:2", 2, 3, "k", "j9")]
    assert checkers.one_job_per_key(ops, s.final(s.job("j1", key="k"))).anomalies == 1


def test_duplicate_token_and_falling_epoch_are_flagged() -> None:
    twice = s.final(
        s.job("j1", attempts=[s.attempt(1, 5, 1, 1_000, 2_000)]),
        s.job("j2", attempts=[s.attempt(1, 5, 1, 1_500, 2_000)]),
    )
    assert checkers.fencing_tokens([], twice).anomalies >= 1
    falling = s.final(
        s.job("j1", attempts=[s.attempt(1, 5, 3, 1_000, 2_000)]),
        s.job("j2", attempts=[s.attempt(1, 6, 2, 1_500, 2_000)]),
    )
    check = checkers.fencing_tokens([], falling)
    assert any(e["problem"] == "epoch decreased in grant order" for e in check.examples)


def test_observed_lease_missing_from_final_state_is_flagged() -> None:
    final = s.final(s.job("j1", attempts=[A1]))
    ops = [s.claim("w1:1", 0, 1, "j1", 6)]
    check = checkers.fencing_tokens(ops, final)
    assert check.examples[0]["problem"] == "observed lease missing from final state"


def test_sink_accepting_a_lower_token_is_flagged() -> None:
    sink = [
        {"t": 1.0, "job_id": "j1", "fencing_token": 7, "accepted": True},
        {"t": 2.0, "job_id": "j1", "fencing_token": 5, "accepted": True},
    ]
    assert checkers.fenced_effects([], s.final(), sink).anomalies == 1
    sink[1]["accepted"] = False
    assert checkers.fenced_effects([], s.final(), sink).anomalies == 0


def test_two_completions_with_different_tokens_are_flagged() -> None:
    ops = [
        s.lease_op("w1:1", "complete", 1, 2, "j1", 5),
        s.lease_op("w2:1", "complete", 3, 4, "j1", 7, replayed=True),
    ]
    assert checkers.fenced_effects(ops, s.final(), []).anomalies == 1


def test_replayed_completion_with_same_token_is_fine() -> None:
    ops = [
        s.lease_op("w1:1", "complete", 1, 2, "j1", 5),
        s.lease_op("w1:2", "complete", 3, 4, "j1", 5, replayed=True),
    ]
    assert checkers.fenced_effects(ops, s.final(), []).anomalies == 0


def test_effect_recorded_twice_or_under_a_foreign_token_is_flagged() -> None:
    ops = [
        s.effect("w1:1", 1, 2, "e:j1", "j1", 5),
        s.effect("w2:1", 3, 4, "e:j1", "j1", 7),
    ]
    assert checkers.fenced_effects(ops, s.final(), []).anomalies == 1
    foreign = {"e:j1": {"fencing_token": 7, "result": {"token": 5}}}
    assert checkers.fenced_effects([], s.final(effects=foreign), []).anomalies == 1


def test_overlapping_attempts_are_flagged() -> None:
    overlap = [s.attempt(1, 5, 1, 1_000, 4_000), s.attempt(2, 6, 1, 3_000, None)]
    check = checkers.no_overlapping_leases([], s.final(s.job("j1", attempts=overlap)))
    assert check.anomalies == 1
    assert check.examples[0]["same_epoch"] is True


def test_stale_token_accepted_after_newer_grant_is_flagged() -> None:
    # The negative control's signature: w1 paused past its lease, w2 was
    # granted token 7 and told so, then w1's token-5 completion was accepted.
    ops = [
        s.claim("w1:1", 0.0, 0.1, "j1", 5),
        s.claim("w2:1", 3.0, 3.1, "j1", 7, attempt=2),
        s.lease_op("w1:2", "complete", 4.0, 4.1, "j1", 5),
    ]
    check = checkers.no_overlapping_leases(ops, s.final())
    assert check.anomalies == 1
    assert check.examples[0]["newer_token"] == 7


def test_stale_token_concurrent_with_grant_is_not_flagged() -> None:
    ops = [
        s.claim("w2:1", 3.0, 3.5, "j1", 7, attempt=2),
        s.lease_op("w1:2", "complete", 3.2, 3.3, "j1", 5),
    ]
    assert checkers.no_overlapping_leases(ops, s.final()).anomalies == 0


def test_read_missing_an_acknowledged_write_is_flagged() -> None:
    ops = [s.submit("c1:1", 0.0, 1.0, "k1", "j1"), s.read("c2:1", 1.5, 1.6, "j1", None)]
    assert checkers.linearizable_reads(ops).anomalies == 1


def test_read_that_got_no_answer_observed_nothing() -> None:
    unavailable = s.op("c2:1", "read", "fail", 1.5, 9.0, {"path": "/v1/jobs/j1"}, {"status": None})
    ops = [s.submit("c1:1", 0.0, 1.0, "k1", "j1"), unavailable]
    assert checkers.linearizable_reads(ops).anomalies == 0


def test_read_concurrent_with_the_write_may_miss_it() -> None:
    ops = [s.submit("c1:1", 0.0, 1.0, "k1", "j1"), s.read("c2:1", 0.5, 0.6, "j1", None)]
    assert checkers.linearizable_reads(ops).anomalies == 0


def test_read_not_seeing_a_completion_or_going_back_is_flagged() -> None:
    done = {"status": "succeeded", "attempts": [A1]}
    ops = [
        s.lease_op("w1:1", "complete", 0, 1, "j1", 5),
        s.read("c1:1", 2, 3, "j1", {"status": "running", "attempts": [A1]}),
    ]
    assert checkers.linearizable_reads(ops).anomalies == 1
    back = [
        s.read("c1:1", 0, 1, "j1", done),
        s.read("c1:2", 2, 3, "j1", {"status": "pending", "attempts": []}),
    ]
    assert checkers.linearizable_reads(back).anomalies == 1


def test_diverging_replicas_are_flagged() -> None:
    jobs = [s.job("j1")]
    nodes = {
        "n1": {"digest": "a", "applied_index": 9, "jobs": jobs},
        "n2": {"digest": "b", "applied_index": 9, "jobs": jobs},
    }
    assert checkers.replicas_converged(s.final(*jobs, nodes=nodes)).anomalies == 1
    nodes["n2"] = {"digest": "a", "applied_index": 9, "jobs": []}
    assert checkers.replicas_converged(s.final(*jobs, nodes=nodes)).anomalies == 1
