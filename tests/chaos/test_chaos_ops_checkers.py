"""Checkers 13 (membership converges) and 14 (node exits expected), fed
hand-made histories: a clean run with an add, a removal of the leader and a
replacement passes; each anomaly they exist for is flagged. And the
schedule's operations faults: size bounds, the families CI needs, upgrades
early."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import chaos_support as s
from chaos.checkers import (
    FSYNC_FAULT_LOG_ERROR,
    check_all,
    expected_log_errors_by_node,
    node_logs_clean,
)
from chaos.cluster import NsCluster
from chaos.net import Network
from chaos.ops_checkers import FSYNC_NOT_STOPPED, membership_converged, node_exits_expected

from chaos import nemesis
from raftsched.testing import LogError, process_running, wait_for


def note(f: str, t: float, **value: Any) -> dict[str, Any]:
    return {"t": t, "process": "nemesis", "type": "note", "f": f, "id": "x", "value": value}


def member_op(
    op_id: str, f: str, t0: float, t1: float, node_id: str, kind: str = "ok", status: str = ""
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if kind == "ok":
        result = {
            "status": 202,
            "body": {"change": {"id": node_id, "status": status or "configured"}},
        }
    elif kind == "fail":
        result = {"status": 409, "reason": "change_in_progress"}
    return s.op(op_id, f, kind, t0, t1, {"id": node_id}, result)


def view(node_id: str, members: list[str], **extra: Any) -> dict[str, Any]:
    statuses = extra.pop("statuses", {})
    return {
        "node_id": node_id,
        "term": extra.pop("term", 7),
        "nodes": [{"id": m, "status": statuses.get(m, "member")} for m in members],
        "membership": {"change": extra.pop("change", None), "removed": extra.pop("removed", False)},
    }


END = ["n1", "n3", "n5", "n6"]


def clean() -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """n4 added; n4 removed while it led (handed over); n2 replaced by n5;
    n6 added with a lost answer, resolved as added."""
    ops = [
        member_op("nemesis:1", "member_add", 10, 11, "n4"),
        member_op("nemesis:2", "member_remove", 30, 31, "n4", status="handed_over"),
        member_op("nemesis:3", "member_remove", 50, 51, "n2"),
        member_op("nemesis:4", "member_add", 52, 53, "n5"),
        member_op("nemesis:5", "member_add", 70, 80, "n6", kind="info"),
    ]
    notes = [
        note("members_initial", 0, ids=["n1", "n2", "n3"]),
        note("leader", 5, node="n1", term=2),
        note("leader", 20, node="n4", term=3),
        note("leader", 31.5, node="n3", term=4),  # n4 handed over to n3
        note("retired", 40, node="n4", answered=True, removed=True, term=4, members_term=4),
        note("member_outcome", 81, id="n6", member=True, request="add"),
        note("node_exit", 50, node="n2", code=-9, expected=True),
        note("node_exit", 60, node="n3", code=74, expected=True, injected_fault_exit=74),
        note("fault_end", 61, kind="fsync_fail", target="n3", outcome="exited", exit_code=74),
    ]
    final = {
        "jobs": [],
        "membership": {"views": {node_id: view(node_id, END) for node_id in END}},
        "nodes": {node_id: {"digest": "d", "applied_index": 9, "jobs": []} for node_id in END},
    }
    return ops, final, notes


def problems(check: Any) -> set[str]:
    return {example["problem"] for example in check.examples}


def test_a_clean_history_passes() -> None:
    ops, final, notes = clean()
    assert membership_converged(ops, final, notes).anomalies == 0
    assert node_exits_expected(notes).anomalies == 0
    names = [check.name for check in check_all(ops, final, [], [], notes)]
    assert names[-4:-2] == ["13_membership_converged", "14_node_exits_expected"]


def test_a_run_without_membership_notes_is_not_judged() -> None:
    assert membership_converged([], {"jobs": []}, []).anomalies == 0


def test_a_member_that_lists_other_members_is_flagged() -> None:
    ops, final, notes = clean()
    final["membership"]["views"]["n5"] = view("n5", ["n1", "n2", "n3", "n5", "n6"])
    assert problems(membership_converged(ops, final, notes)) == {
        "member lists other members than the history's",
        "members disagree on the members",
    }


def test_a_removed_member_still_listed_everywhere_is_flagged() -> None:
    ops, final, notes = clean()
    listed = [*END, "n4"]
    final["membership"]["views"] = {n: view(n, listed) for n in END}
    assert problems(membership_converged(ops, final, notes)) == {
        "member lists other members than the history's"
    }


def test_a_change_in_progress_at_the_end_is_flagged() -> None:
    ops, final, notes = clean()
    final["membership"]["views"]["n1"] = view(
        "n1", END, statuses={"n6": "joining"}, change={"kind": "add", "id": "n6"}
    )
    assert problems(membership_converged(ops, final, notes)) == {"change not finished"}


def test_a_member_that_does_not_answer_is_flagged() -> None:
    ops, final, notes = clean()
    final["membership"]["views"]["n3"] = None
    assert problems(membership_converged(ops, final, notes)) == {"member did not answer at the end"}


def test_a_lost_answer_resolved_as_not_added_expects_no_member() -> None:
    ops, final, notes = clean()
    notes[5] = note("member_outcome", 81, id="n6", member=False, request="add")
    assert problems(membership_converged(ops, final, notes)) == {
        "member lists other members than the history's",
        "digests not from exactly the members",
    }


def unknown_removal_of_n1() -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """clean(), then n1's removal whose answer was lost and never learned:
    no leader answered, nor the repeated request (`member: None`)."""
    ops, final, notes = clean()
    ops.append(member_op("nemesis:6", "member_remove", 90, 94, "n1", kind="info"))
    notes.append(note("member_outcome", 200, id="n1", member=None, request="remove", view=None))
    return ops, final, notes


def test_an_unknown_outcome_is_judged_by_neither_side() -> None:
    ops, final, notes = unknown_removal_of_n1()
    # The removal did not commit: n1 is still everyone's member (and dead or not).
    assert membership_converged(ops, final, notes).anomalies == 0
    # It did: nobody lists n1, and it has no digest.
    rest = [n for n in END if n != "n1"]
    final["membership"]["views"] = {n: view(n, rest) for n in END}
    del final["nodes"]["n1"]
    assert membership_converged(ops, final, notes).anomalies == 0


def test_members_that_disagree_on_an_unknown_node_are_flagged() -> None:
    ops, final, notes = unknown_removal_of_n1()
    final["membership"]["views"]["n5"] = view("n5", [n for n in END if n != "n1"])
    assert problems(membership_converged(ops, final, notes)) == {"members disagree on the members"}


def test_a_removed_node_that_led_after_its_removal_is_flagged() -> None:
    ops, final, notes = clean()
    notes.append(note("leader", 45, node="n4", term=5))
    assert problems(membership_converged(ops, final, notes)) == {
        "removed node led after its removal"
    }


def test_a_removal_answered_configuring_is_not_judged_by_its_time() -> None:
    ops, final, notes = clean()
    ops[1] = member_op("nemesis:2", "member_remove", 30, 31, "n4", status="configuring")
    notes.append(note("leader", 33, node="n4", term=3))
    assert membership_converged(ops, final, notes).anomalies == 0


def test_a_retired_node_that_raised_its_term_or_forgot_its_removal_is_flagged() -> None:
    ops, final, notes = clean()
    notes[4] = note("retired", 40, node="n4", answered=True, removed=True, term=9, members_term=4)
    assert problems(membership_converged(ops, final, notes)) == {
        "removed node raised its term above the members'"
    }
    notes[4] = note("retired", 40, node="n4", answered=True, removed=False, term=4, members_term=4)
    assert problems(membership_converged(ops, final, notes)) == {
        "removed node does not know it was removed"
    }


def test_a_member_without_a_digest_is_flagged() -> None:
    ops, final, notes = clean()
    del final["nodes"]["n6"]
    assert problems(membership_converged(ops, final, notes)) == {
        "digests not from exactly the members"
    }


def test_an_unexpected_exit_and_a_fault_not_hit_are_flagged() -> None:
    notes = [
        note("node_exit", 10, node="n2", code=1, expected=False),
        note("node_exit", 20, node="n3", code=0, expected=False, injected_fault_exit=74),
        note("fault_end", 30, kind="fsync_fail", target="n1", outcome=FSYNC_NOT_STOPPED),
        note("fault_end", 40, kind="fsync_fail", target="n2", outcome="not hit: no journal sync"),
    ]
    check = node_exits_expected(notes)
    assert check.anomalies == 3
    assert problems(check) == {"unexpected exit", "fsync failed but the node kept running"}


def test_the_fail_stop_line_is_expected_only_in_the_armed_nodes_logs() -> None:
    line = (
        "raftsched.raft_journal: storage failure: fdatasync of /r/n3/raft/raft.journal "
        "failed: EIO (Input/output error); stopping the node at once (exit status 74)"
    )
    errors = {
        "n3": [LogError(s.REPO_ROOT / "n3.log", 1, line)],
        "n1-v0.4.0": [LogError(s.REPO_ROOT / "n1.log", 1, line.replace("n3", "n1"))],
    }
    expected = expected_log_errors_by_node(clean()[2])
    assert expected == {"n3": [FSYNC_FAULT_LOG_ERROR]}
    check = node_logs_clean(errors, expected_by_node=expected)
    assert [example["node"] for example in check.examples] == ["n1-v0.4.0"]


def test_the_previous_releases_error_lines_are_flagged_like_todays() -> None:
    """0.3.0's one known error line (a leadership lost mid-acknowledgement,
    a warning since 0.4.0) was expected while a node ran 0.3.0; the previous
    release is 0.4.0 now, which has none: its error lines count like any."""
    line = (
        "raftsched.webhooks: webhook delivery failed\nTraceback (most recent call last):\n"
        '  File "webhooks.py", line 241, in _deliver_batch\n'
        "raftsched.node.proposer.NotLeader"
    )
    errors = {
        "n2-v0.4.0": [LogError(s.REPO_ROOT / "n2-v0.4.0.log", 17, line)],
        "n2": [LogError(s.REPO_ROOT / "n2.log", 5, line)],
    }
    check = node_logs_clean(errors)
    assert sorted(example["node"] for example in check.examples) == ["n2", "n2-v0.4.0"]


# -- the schedule ----------------------------------------------------------------


def test_membership_changes_keep_the_planned_size_within_nodes_and_one_more() -> None:
    for seed in range(30):
        size = 3
        for fault in nemesis.schedule(seed, 900, 3, 4, 2.0):
            if fault.kind == "add_node":
                assert size == 3
                size += 1
            elif fault.kind == "remove_node":
                assert size == 4
                size -= 1
            if fault.kind in nemesis.MEMBERSHIP_KINDS:
                assert fault.hold_s >= nemesis.MEMBERSHIP_HOLD_MIN_S


def test_every_schedule_long_enough_has_a_membership_change_and_an_fsync_fault() -> None:
    for seed in (*range(40), 20251129):
        faults = nemesis.schedule(seed, 150, 3, 4, 2.0)
        assert len(faults) >= nemesis.FAMILY_MIN_FAULTS
        kinds = {f.kind for f in faults}
        assert kinds & set(nemesis.MEMBERSHIP_KINDS), seed
        assert "fsync_fail" in kinds, seed


def test_upgrades_come_first_one_per_old_node() -> None:
    faults = nemesis.schedule(7, 900, 5, 4, 2.0, upgrades=3)
    upgrades = [f.at_s for f in faults if f.kind == "upgrade"]
    assert len(upgrades) == 3
    assert all(at <= 900 * (nemesis.UPGRADE_WINDOW[1] + 0.05) for at in upgrades)
    assert nemesis.schedule(7, 900, 5, 4, 2.0, upgrades=3) == faults


# -- the cluster's command lines (no root: nothing is started) ------------------


def test_node_command_lines_follow_membership_release_and_faults(tmp_path: Any) -> None:
    from pathlib import Path

    from chaos.cluster import NsCluster
    from chaos.net import Network

    net = Network(index=200, size=6)
    cluster = NsCluster(tmp_path, 3, net, "/lib/faketime.so", fsync_shim=Path("/x/fsync.so"))
    assert [n.id for n in cluster.members()] == ["n1", "n2", "n3"]
    assert len(cluster.slot_urls()) == 6
    n4 = cluster.new_node()
    assert (n4.id, n4.index, n4.ip) == ("n4", 4, net.node_ip(4))
    n4.join_url = cluster.node(1).http_url
    cluster.mark_removed("n2")
    n1 = " ".join(cluster.command(cluster.node(1)))
    assert "--peer n3=" in n1 and "--peer n2=" not in n1 and "--peer n4=" not in n1
    assert "LD_PRELOAD=/x/fsync.so /lib/faketime.so" in n1
    assert f"RAFTSCHED_FAULT_FSYNC_TRIGGER={cluster.node(1).fsync_trigger}" in n1
    joined = " ".join(cluster.command(n4))
    assert f"--join {cluster.node(1).http_url}" in joined and "--peer" not in joined
    old = cluster.node(3)
    old.python, old.source_dir = "/old/venv/bin/python", Path("/old/tree/src")
    line = cluster.command(old)
    assert "/old/venv/bin/python" in line
    assert any(arg.startswith("PYTHONPATH=") and "/old/tree/src" in arg for arg in line)
    assert cluster.free_slot() == 5


def test_a_killed_node_restarted_while_another_thread_reaps_is_reported_once(
    tmp_path: Any,
) -> None:
    """The harness's restart of a node it killed races the monitor's reaping:
    the old exit is reported once, as expected, however the reap falls."""
    import sys
    import threading

    from chaos.cluster import NsCluster
    from chaos.net import Network

    cluster = NsCluster(tmp_path, 3, Network(index=201, size=3), None)
    reapers: list[threading.Thread] = []

    def command(node: Any) -> list[str]:
        # While the new process is being started, the monitor reaps.
        reaper = threading.Thread(target=cluster.reap_exits)
        reaper.start()
        reaper.join(timeout=0.3)
        reapers.append(reaper)
        return [sys.executable, "-c", "import time; time.sleep(30)"]

    cluster.command = command  # type: ignore[method-assign]
    try:
        cluster.start("n1")
        cluster.kill("n1")
        cluster.start("n1")
        for reaper in reapers:
            reaper.join(timeout=5)
        cluster.kill("n1")
        exits = cluster.drain_exits()
        assert [(x["node"], x["code"], x["expected"]) for x in exits] == [
            ("n1", -9, True),
            ("n1", -9, True),
        ]
    finally:
        cluster.stop()


# -- a sharded cluster (docs/shards.md section 5) --------------------------------


def shard_view(node_id: str, members: list[str], **extra: Any) -> dict[str, Any]:
    """One group's GET /v1/cluster (Raftsched-Shard: k), as `view`."""
    return view(node_id, members, **extra)


def sharded(final: dict[str, Any], members: list[str] = END) -> dict[str, Any]:
    """The clean run's final state on 3 shards: every group with the
    history's members, nothing behind, every group's digests from them."""
    final["shards"] = 3
    for node_id in END:
        final["membership"]["views"][node_id]["membership"]["shards_behind"] = []
    final["membership"]["shard_views"] = {
        node_id: {str(k): shard_view(node_id, members) for k in (1, 2)} for node_id in END
    }
    final["shard_digests"] = {str(k): {n: [9, f"d{k}"] for n in END} for k in (0, 1, 2)}
    return final


def gone(node_id: str, left: list[int]) -> dict[str, Any]:
    return note("shard_processes_gone", 41, node=node_id, pids=[101, 102], left=left)


def test_a_clean_sharded_history_passes() -> None:
    ops, final, notes = clean()
    notes += [gone("n4", []), gone("n2", [])]
    assert membership_converged(ops, sharded(final), notes).anomalies == 0


def test_a_shard_that_kept_a_removed_member_or_lacks_a_new_one_is_flagged() -> None:
    ops, final, notes = clean()
    final = sharded(final)
    final["membership"]["shard_views"]["n1"]["2"] = shard_view("n1", [*END, "n2"])
    final["membership"]["shard_views"]["n3"]["1"] = shard_view("n3", END[:-1])
    check = membership_converged(ops, final, notes)
    found = sorted((e["node"], e["shard"]) for e in check.examples)
    assert problems(check) == {"shard lists other members than group 0's"}
    assert found == [("n1", 2), ("n3", 1)]


def test_a_shard_behind_or_with_a_change_in_progress_at_the_end_is_flagged() -> None:
    ops, final, notes = clean()
    final = sharded(final)
    final["membership"]["views"]["n5"]["membership"]["shards_behind"] = [2]
    final["membership"]["shard_views"]["n6"]["1"] = shard_view(
        "n6", END, statuses={"n6": "joining"}, change={"kind": "add", "id": "n6"}
    )
    assert problems(membership_converged(ops, final, notes)) == {
        "shards behind group 0 at the end",
        "shard change not finished",
    }


def test_a_shard_replica_that_did_not_answer_or_has_no_digest_is_flagged() -> None:
    ops, final, notes = clean()
    final = sharded(final)
    final["membership"]["shard_views"]["n3"]["2"] = None
    del final["shard_digests"]["1"]["n6"]
    assert problems(membership_converged(ops, final, notes)) == {
        "shard replica did not answer",
        "shard digests not from exactly the members",
    }


def test_shard_processes_that_outlived_their_node_are_flagged() -> None:
    ops, final, notes = clean()
    notes += [gone("n4", []), gone("n2", [102])]
    check = membership_converged(ops, sharded(final), notes)
    assert problems(check) == {"shard processes outlived their node"}
    assert check.examples[0]["node"] == "n2" and check.examples[0]["left"] == [102]


def test_a_shard_follows_group_0_on_an_unknown_node() -> None:
    """n1's removal never learned: the shards must agree with group 0 on n1,
    whichever way it went."""
    ops, final, notes = unknown_removal_of_n1()
    assert membership_converged(ops, sharded(final), notes).anomalies == 0
    final["membership"]["shard_views"]["n3"]["2"] = shard_view("n3", END[1:])
    check = membership_converged(ops, final, notes)
    assert problems(check) == {"shard lists other members than group 0's"}
    assert [(e["node"], e["shard"]) for e in check.examples] == [("n3", 2)]


def test_the_shards_are_not_judged_on_one_shard() -> None:
    ops, final, notes = clean()
    final = sharded(final)
    final["shards"] = 1
    final["membership"]["shard_views"]["n1"]["2"] = shard_view("n1", ["n1"])
    assert membership_converged(ops, final, notes).anomalies == 0


def test_settled_waits_for_every_shard() -> None:
    """The nemesis's wait after a change: group 0 settled is not enough on
    a sharded cluster; every shard must list group 0's members (none
    behind) and have no change of its own in progress."""
    from chaos.membership import shards_unsettled, view_settled

    def leader(behind: list[int] | None, change: Any = None) -> dict[str, Any]:
        found = view("n1", ["n1", "n2", "n3"])
        found["membership"]["shards_behind"] = behind
        found["shards"] = [
            {"shard": 0, "status": "running"},
            {"shard": 1, "members": ["n1", "n2", "n3"], "membership_change": None},
            {"shard": 2, "members": ["n1", "n2", "n3"], "membership_change": change},
        ]
        return found

    assert view_settled(leader([]))
    assert not view_settled(leader([1, 2]))
    assert shards_unsettled(leader([1, 2])) == {"shards_behind": [1, 2]}
    # A shard still catching the new member up, though it lists it.
    adding = {"kind": "add", "id": "n3"}
    assert not view_settled(leader([], adding))
    assert shards_unsettled(leader([], adding)) == {"shard_changes": {"2": adding}}
    # No answer about the shards at all (an older node's view): not settled.
    assert not view_settled(leader(None))
    # One shard: group 0's view alone, as before.
    plain = view("n1", ["n1", "n2", "n3"])
    assert view_settled(plain) and shards_unsettled(plain) == {}
    assert not view_settled(view("n1", ["n1", "n2"], statuses={"n2": "joining"}))
    assert not view_settled(None)


def test_a_leaving_nodes_shard_processes_are_seen_to_go_or_stay(tmp_path: Any) -> None:
    """`kill_with_shards`: a node whose shard processes die with it (the
    kernel's parent-death signal, as `raftsched node` starts them) leaves
    none; one whose child outlives it is reported. Real processes."""
    cluster = NsCluster(tmp_path, 2, Network(index=202, size=2), None, shards=3)
    tied = (
        "from raftsched import child_processes; child_processes.die_with_parent(); "
        "import time; time.sleep(60)"
    )
    loose = "import time; time.sleep(60)"
    parent = (
        "import subprocess, sys, time; from raftsched import child_processes; "
        f"tied = sys.argv[1] == 'tied'; child = {tied!r} if tied else {loose!r}; "
        "start = child_processes.popen if tied else subprocess.Popen; "
        "[start([sys.executable, '-c', child], start_new_session=True) for _ in (1, 2)]; "
        "time.sleep(60)"
    )
    modes = {"n1": "tied", "n2": "loose"}

    def command(node: Any) -> list[str]:
        return [sys.executable, "-c", parent, modes[node.id]]

    cluster.command = command  # type: ignore[method-assign]
    cluster.shard_views = lambda node_id: None  # type: ignore[method-assign]
    left: list[int] = []
    try:
        cluster.start()
        for node_id in ("n1", "n2"):
            assert wait_for(lambda n=node_id: len(cluster.shard_pids(n)) == 2, 10)
        gone_too = cluster.kill_with_shards("n1")
        assert len(gone_too["pids"]) == 2 and gone_too["left"] == []
        loose = cluster.kill_with_shards("n2")
        left = loose["left"]
        assert len(loose["pids"]) == 2 and sorted(left) == loose["pids"]
        assert all(process_running(pid) for pid in left)
    finally:
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        cluster.stop()
