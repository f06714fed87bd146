"""The harness pieces that need no root: the seeded schedule, the history
pairing, the fenced sink, and the campaign's summary JSON contract."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import chaos_support  # noqa: F401  (puts the repo root on sys.path)
from chaos.checkers import Check
from chaos.history import Recorder, operations, read_events
from chaos.httpops import send
from chaos.sink import FencedSink, read_sink_log
from chaos.summary import summarize
from chaos.workload import job_request

from chaos import nemesis, wheel


def test_same_seed_same_schedule_and_different_seed_differs() -> None:
    first = nemesis.schedule(42, 180, 3, 4, 2.0)
    assert first == nemesis.schedule(42, 180, 3, 4, 2.0)
    assert first != nemesis.schedule(43, 180, 3, 4, 2.0)
    assert all(f.at_s + f.hold_s <= 180 for f in first)
    pauses = [f for f in first if f.kind.startswith("pause")]
    assert all(f.hold_s > 2 * 2.0 for f in pauses), "a pause must outlast the lease"


def test_schedule_covers_every_fault_kind_over_a_long_run() -> None:
    kinds = {f.kind for f in nemesis.schedule(1, 3600, 5, 4, 2.0)}
    assert kinds == set(nemesis.KINDS)


def test_sharded_schedule_has_shard_faults_and_every_other_kind() -> None:
    """--shards 3: the shard-process faults join (each aimed at a shard
    1..2) and every other kind stays, membership changes included; a short
    run holds a node kill, a node pause, each shard fault and a membership
    change in its first half (its last faults may not start at all)."""
    long = nemesis.schedule(1, 3600, 3, 4, 2.0, shards=3)
    kinds = {f.kind for f in long}
    assert kinds == set(nemesis.KINDS) | set(nemesis.SHARD_KINDS)
    assert {f.params["shard"] for f in long if f.kind in nemesis.SHARD_KINDS} == {1, 2}
    for seed in (*range(30), 20251129):
        short = nemesis.schedule(seed, 150, 3, 4, 2.0, shards=3)
        early = {f.kind for f in short[: len(short) // 2]}
        assert {"kill_leader", "pause_leader", *nemesis.SHARD_KINDS} <= early, seed
        assert early & set(nemesis.MEMBERSHIP_KINDS), seed
        assert "fsync_fail" in {f.kind for f in short}, seed
        size = 3  # between NODES and NODES + 1 members, as unsharded
        for fault in short:
            if fault.kind in ("add_node", "remove_node"):
                assert size == (3 if fault.kind == "add_node" else 4), seed
                size += 1 if fault.kind == "add_node" else -1
            if fault.kind in nemesis.MEMBERSHIP_KINDS:
                assert fault.hold_s >= nemesis.MEMBERSHIP_HOLD_MIN_S
    # One shard: as before (the same draw, no shard fault).
    assert nemesis.schedule(7, 180, 3, 4, 2.0, shards=1) == nemesis.schedule(7, 180, 3, 4, 2.0)


# CI's campaign (`make chaos SEED=20251129 DURATION=150 NODES=3`): its faults,
# as drawn before the sharded campaign took the membership changes in. A
# change to the sharded draw must leave the one-shard draw as it is.
CI_SCHEDULE = [
    (3.3, "bridge", 6.1, {"middle": 1, "side_a": [2], "side_b": [3]}),
    (12.2, "add_node", 8.0, {"via": 2}),
    (22.4, "disk_full", 7.9, {"leader": True, "node": 1}),
    (32.4, "kill_leader", 7.1, {}),
    (40.8, "clock_drift", 3.6, {"node": 3, "rate_s_per_s": -0.211}),
    (45.9, "fsync_fail", 3.3, {"leader": True, "node": 3, "phase": "restart"}),
    (51.1, "replace_node", 8.0, {"node": 3}),
    (61.4, "kill_one", 7.8, {"node": 3}),
    (72.1, "kill_minority", 4.3, {"nodes": [2]}),
    (78.3, "replace_node", 8.0, {"node": 2}),
    (87.5, "pause_leader", 7.8, {}),
    (97.1, "bridge", 4.0, {"middle": 1, "side_a": [2], "side_b": [3]}),
    (102.5, "isolate_leader", 6.2, {}),
    (110.7, "one_way", 3.2, {"direction": "from_leader"}),
    (115.3, "disk_full", 5.7, {"leader": False, "node": 2}),
    (123.7, "one_way", 6.0, {"direction": "from_leader"}),
    (132.1, "fsync_fail", 6.0, {"leader": False, "node": 2, "phase": "restart"}),
    (139.1, "bridge", 6.8, {"middle": 1, "side_a": [2], "side_b": [3]}),
]


def test_ci_seed_draws_the_same_faults_without_shards() -> None:
    drawn = nemesis.schedule(20251129, 150, 3, 4, 2.0)
    assert [(f.at_s, f.kind, f.hold_s, f.params) for f in drawn] == CI_SCHEDULE
    assert nemesis.schedule(20251129, 150, 3, 4, 2.0, shards=1) == drawn


def test_bridge_keeps_one_node_in_both_halves() -> None:
    for seed in range(20):
        for fault in nemesis.schedule(seed, 300, 5, 4, 2.0):
            if fault.kind == "bridge":
                p = fault.params
                sides = set(p["side_a"]) | set(p["side_b"])
                assert p["middle"] not in sides and len(sides) == 4


def test_history_pairs_invokes_with_completions(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path / "history-c1.jsonl", "c1")
    first = recorder.invoke("submit", {"key": "k"})
    recorder.invoke("read", {"job": "j"})
    recorder.complete(first, "ok", "submit", {"job": "j"})
    recorder.close()
    ops = operations(read_events([tmp_path / "history-c1.jsonl"]))
    assert [(op["f"], op["type"]) for op in ops] == [("submit", "ok"), ("read", "info")]
    assert ops[1]["complete_t"] is None


def test_sink_rejects_lower_tokens_and_logs_every_decision(tmp_path: Path) -> None:
    sink = FencedSink(tmp_path / "sink.jsonl").start()
    try:
        answers = [
            send("POST", sink.url + "/write", {"job_id": "j", "fencing_token": t})[0]
            for t in (5, 7, 5, 7)
        ]
    finally:
        sink.stop()
    assert answers == [200, 200, 409, 200]
    log = read_sink_log(tmp_path / "sink.jsonl")
    assert [r["accepted"] for r in log] == [True, True, False, True]


def test_summary_json_has_the_documented_keys(tmp_path: Path) -> None:
    args = argparse.Namespace(
        seed=3, nodes=3, workers=2, clients=2, unsafe_ignore_fencing=False,
        recovery_bound_s=60.0, out=tmp_path,
    )  # fmt: skip
    checks = [Check("1_x"), Check("2_y", anomalies=1)]
    summary = summarize(args, [], [], {"jobs": []}, checks, [], [], 1.0, [], 10.0)
    json.dumps(summary)
    required = {"seed", "duration_s", "ops", "faults", "leader_changes"}
    required |= {"stale_token_rejections", "anomalies", "valid"}
    assert required <= set(summary)
    assert summary["anomalies"] == {"1_x": 0, "2_y": 1}
    assert summary["valid"] is False


def test_far_jobs_and_the_wheel_in_the_summary(tmp_path: Path) -> None:
    """A far submit carries `delay_s`; the summary counts the acknowledged
    ones, whether the wheel was configured and the most packed jobs noted."""
    far = job_request("c0-1", 1, delay_s=12.5)
    near = job_request("c0-2", 2)
    assert far["delay_s"] == 12.5 and "delay_s" not in near
    history = Recorder(tmp_path / "history-wheel.jsonl", "wheel")
    client = Recorder(tmp_path / "history-c0.jsonl", "c0")
    for request in (far, near):
        op = client.invoke("submit", {"path": "/v1/jobs", "body": request})
        client.complete(op, "ok", "submit", {"status": 201, "body": {"job": {"id": "j"}}})
    op = history.invoke("configure_wheel", {"path": "/v1/wheel", "body": {}})
    history.complete(op, "ok", "configure_wheel", {"status": 200, "body": {}})
    history.note("packed", {"url": "u", "packed_jobs": 3, "t": 0})
    history.note("packed", {"url": "u", "packed_jobs": 7, "t": 1})
    client.close()
    history.close()
    events = read_events(sorted(tmp_path.glob("history-*.jsonl")))
    assert wheel.summary(operations(events), events) == {
        "configured": True,
        "far_jobs_acked": 1,
        "packed_jobs_max": 7,
    }
