"""The checkers on hand-made histories of a sharded cluster (docs/shards.md,
chaos --shards): fencing tokens in grant order per shard, the outbox gapless
per shard, every group's replicas converged, and the node's log line for a
shard process the nemesis killed expected for that fault only."""

from __future__ import annotations

from typing import Any

import chaos_support as s
from chaos.checkers import expected_log_errors_by_node, node_logs_clean

from chaos import checkers
from raftsched.testing import LogError

# Tokens are counter x S + k with S = 3: shard 0 grants 3, 6, ...; shard 1
# grants 4, 7, ...; shard 2 grants 5, 8, ...


def _sharded(*jobs: Any) -> dict[str, Any]:
    final = s.final(*jobs)
    final["shards"] = 3
    return final


def test_grant_order_is_checked_within_each_shard_only() -> None:
    # Shard 1's group is at epoch 1 and its clock reads earlier than shard
    # 0's (epoch 4): in one token order across shards epochs and grant
    # times would go back; per shard they do not.
    final = _sharded(
        s.job(
            "job_A", attempts=[s.attempt(1, 3, 4, 5_000, 6_000), s.attempt(2, 9, 4, 7_000, None)]
        ),
        s.job("job1_B", attempts=[s.attempt(1, 4, 1, 1_000, 2_000)]),
        s.job("job1_C", attempts=[s.attempt(1, 7, 1, 2_000, None)]),
        s.job("job2_D", attempts=[s.attempt(1, 5, 2, 500, None)]),
    )
    check = checkers.fencing_tokens([], final)
    assert check.anomalies == 0, check.examples


def test_falling_epoch_within_a_shard_is_flagged() -> None:
    final = _sharded(
        s.job("job1_B", attempts=[s.attempt(1, 4, 3, 1_000, 2_000)]),
        s.job("job1_C", attempts=[s.attempt(1, 7, 2, 1_500, None)]),
        s.job("job_A", attempts=[s.attempt(1, 3, 1, 900, None)]),
    )
    check = checkers.fencing_tokens([], final)
    assert [e["problem"] for e in check.examples] == ["epoch decreased in grant order"]
    assert check.examples[0]["earlier"][0] == "job1_B"


def test_token_not_increasing_per_job_is_flagged_in_a_shard() -> None:
    final = _sharded(
        s.job("job2_D", attempts=[s.attempt(1, 8, 1, 1_000, 2_000), s.attempt(2, 5, 1, 900, None)])
    )
    problems = {e["problem"] for e in checkers.fencing_tokens([], final).examples}
    assert "token not increasing per job" in problems


def _event(shard: int, seq: int, job_id: str) -> dict[str, Any]:
    event_id = f"evt_{seq}" if shard == 0 else f"evt{shard}_{seq}"
    data = {"job_id": job_id}
    return {"seq": seq, "shard": shard, "id": event_id, "type": "job.succeeded", "data": data}


def _outbox(per_shard: dict[int, int]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    events = [
        _event(shard, seq, f"job{shard or '_'}{'' if shard == 0 else '_'}{seq}")
        for shard, count in per_shard.items()
        for seq in range(1, count + 1)
    ]
    jobs = [s.job(e["data"]["job_id"]) for e in events]
    final = _sharded(*jobs)
    last = ".".join(str(per_shard.get(k, 0)) for k in range(3))
    final["outbox"] = {"events": events, "first_seq": "v1.1.1.1", "last_seq": f"v1.{last}"}
    final["subscription"] = {"cursor_seq": per_shard.get(0, 0), "parked": []}
    final["subscription_start_seq"] = 0
    final["subscription_start_seqs"] = [0, 0, 0]
    deliveries = [
        {"seq": e["seq"], "shard": e["shard"], "type": e["type"], "data": e["data"],
         "event_id": e["id"], "body_id": e["id"], "signature_ok": True, "answered": 200}
        for e in events
    ]  # fmt: skip
    return final, deliveries


def test_sharded_outbox_is_gapless_per_shard() -> None:
    # The seqs repeat across shards (each counts its own from 1); every
    # shard's copy of the subscription delivers its own events.
    final, deliveries = _outbox({0: 2, 1: 3, 2: 1})
    check = checkers.outbox_and_webhooks(final, deliveries)
    assert check.anomalies == 0, check.examples


def test_a_gap_in_one_shard_is_flagged_with_its_shard() -> None:
    final, deliveries = _outbox({0: 2, 1: 3, 2: 1})
    events = final["outbox"]["events"]
    events.remove(next(e for e in events if e["shard"] == 1 and e["seq"] == 2))
    final["jobs"] = [j for j in final["jobs"] if j["id"] != "job1_2"]
    deliveries = [d for d in deliveries if (d["shard"], d["seq"]) != (1, 2)]
    check = checkers.outbox_and_webhooks(final, deliveries)
    assert [
        (e["problem"], e.get("shard"), e.get("missing", e.get("seq"))) for e in check.examples
    ] == [
        ("outbox sequence has gaps or repeats", 1, [2]),
        ("event not delivered within the recovery bound", 1, 2),
    ]


def test_a_shard_event_never_delivered_or_with_the_wrong_id_is_flagged() -> None:
    """Shards 1..S-1 deliver through their own copies: an event after the
    shard's start that never arrived is flagged with its shard, and a
    delivery must carry its shard's id (evt<k>_<seq>)."""
    final, deliveries = _outbox({0: 1, 1: 2, 2: 1})
    dropped = [d for d in deliveries if (d["shard"], d["seq"]) != (2, 1)]
    examples = checkers.outbox_and_webhooks(final, dropped).examples
    assert [(e["problem"], e.get("shard"), e.get("seq")) for e in examples] == [
        ("event not delivered within the recovery bound", 2, 1)
    ]
    final["subscription_start_seqs"] = [0, 0, 1]  # shard 2's event came before it
    assert checkers.outbox_and_webhooks(final, dropped).anomalies == 0
    wrong = [
        d | {"event_id": "evt_1"} if d["shard"] == 1 and d["seq"] == 1 else d for d in deliveries
    ]
    problems = {e["problem"] for e in checkers.outbox_and_webhooks(final, wrong).examples}
    assert problems == {"delivery's event id is not its shard and seq"}


def test_an_event_of_a_shard_beyond_the_last_seq_is_flagged() -> None:
    final, deliveries = _outbox({0: 1, 1: 1, 2: 1})
    final["outbox"]["last_seq"] = "v1.1.0.1"  # shard 1 says it holds none
    problems = {e["problem"] for e in checkers.outbox_and_webhooks(final, deliveries).examples}
    assert "outbox sequence has gaps or repeats" in problems


def _converged_final(groups: dict[str, dict[str, list[Any]]]) -> dict[str, Any]:
    final = _sharded()
    node = {"digest": "g0", "applied_index": 5, "jobs": []}
    final["nodes"] = {"n1": node, "n2": node, "n3": node}
    final["shard_digests"] = groups
    return final


def test_every_groups_replicas_converged() -> None:
    same = {n: [7, "d"] for n in ("n1", "n2", "n3")}
    groups = {"0": {n: [5, "g0"] for n in ("n1", "n2", "n3")}, "1": same, "2": same}
    assert checkers.replicas_converged(_converged_final(groups)).anomalies == 0


def test_a_shard_whose_replicas_differ_or_did_not_answer_is_flagged() -> None:
    same = {n: [7, "d"] for n in ("n1", "n2", "n3")}
    differing = {"n1": [7, "d"], "n2": [7, "x"], "n3": [7, "d"]}
    groups = {"0": same, "1": differing, "2": {"n1": [3, "e"], "n2": [3, "e"]}}
    check = checkers.replicas_converged(_converged_final(groups))
    found = [(e["problem"], e["shard"]) for e in check.examples]
    assert found == [("shard replicas differ", 1), ("shard replica did not answer", 2)]
    assert check.examples[1]["nodes"] == ["n3"]


def test_one_shard_final_state_has_no_group_check() -> None:
    final = s.final()
    node = {"digest": "d", "applied_index": 5, "jobs": []}
    final["nodes"] = {"n1": node, "n2": node}
    assert checkers.replicas_converged(final).anomalies == 0


def _note(f: str, **value: Any) -> dict[str, Any]:
    return {"type": "note", "f": f, "t": 1.0, "process": "nemesis", "value": value}


def test_a_killed_shard_process_exit_line_is_expected_only_for_its_fault() -> None:
    line = (
        "raftsched.shards: shard process 1 (pid {pid}) exited with status -9 (SIGKILL); "
        "starting it again in 0.5 s"
    )
    notes = [
        _note("fault_end", kind="kill_shard_leader", target="n2", shard=1, pid=4242),
        _note("fault_end", kind="pause_shard_leader", target="n3", shard=2, pid=5151),
    ]
    expected = expected_log_errors_by_node(notes)
    assert set(expected) == {"n2"}
    errors = {
        # The killed one, on its node: expected.
        "n2": [LogError(s.REPO_ROOT / "n2.log", 1, line.format(pid=4242)),
               # Another pid on the same node: nobody killed it.
               LogError(s.REPO_ROOT / "n2.log", 2, line.format(pid=4243))],
        # The same line on another node: not expected there.
        "n1": [LogError(s.REPO_ROOT / "n1.log", 1, line.format(pid=4242))],
    }  # fmt: skip
    check = node_logs_clean(errors, expected_by_node=expected)
    assert [(e["node"], "4243" in e["line"]) for e in check.examples] == [
        ("n1", False),
        ("n2", True),
    ]
