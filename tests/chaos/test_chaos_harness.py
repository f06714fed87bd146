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


def test_sharded_schedule_has_shard_faults_and_no_membership_change() -> None:
    """--shards 3: the shard-process faults join (each aimed at a shard
    1..2), membership changes leave (refused on a sharded cluster), and a
    short run still holds a node kill, a node pause and each shard fault."""
    long = nemesis.schedule(1, 3600, 3, 4, 2.0, shards=3)
    kinds = {f.kind for f in long}
    assert kinds == (set(nemesis.KINDS) - set(nemesis.MEMBERSHIP_KINDS)) | set(nemesis.SHARD_KINDS)
    assert {f.params["shard"] for f in long if f.kind in nemesis.SHARD_KINDS} == {1, 2}
    for seed in range(10):
        short = {f.kind for f in nemesis.schedule(seed, 150, 3, 4, 2.0, shards=3)}
        assert {"kill_leader", "pause_leader", *nemesis.SHARD_KINDS} <= short
        assert not short & set(nemesis.MEMBERSHIP_KINDS)
    # One shard: as before (the same draw, no shard fault).
    assert nemesis.schedule(7, 180, 3, 4, 2.0, shards=1) == nemesis.schedule(7, 180, 3, 4, 2.0)


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
