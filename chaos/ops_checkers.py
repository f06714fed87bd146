"""Checkers 13 and 14: the operations faults (membership changes, disk
faults, upgrades). Pure functions of the history, its notes and the final
state, like the others (chaos/checkers.py); `check_all` runs them.

Inputs besides `ops` and `final` (see chaos/checkers.py):
- `notes`: the history's `note` events: `members_initial` {ids},
  `member_outcome` {id, member, request, view} (a membership request whose answer was lost,
  resolved by asking the leader, or by repeating it; `member` None: never
  learned, `unknown_members`), `retired` {node, answered, removed, term,
  members_term} (a removed node, asked just before it was stopped),
  `leader` {node, term} (the monitor), `node_exit` {node, code, expected,
  injected_fault_exit?}, `fault_end` {kind, target, outcome, ...}.
- `final["membership"]`: {"views": {node id: GET /v1/cluster of every node
  that still ran at the end, or None}, "members", "removed"} (the last two
  are the harness's bookkeeping, kept for the record; the checker derives
  the expected members from the history).
- Sharded (`final["shards"]` S > 1, docs/shards.md section 5): each view
  has `membership.shards_behind`; `final["membership"]["shard_views"]`
  {node id: {shard k (str, 1..S-1): that node's GET /v1/cluster with
  `Raftsched-Shard: k`, or None}}; `final["shard_digests"]` {shard: {node
  id: [applied index, digest]}}; and the notes `shard_processes_gone`
  {node, pids, left} (a node that left the cluster: its shard processes,
  and those still running after it stopped).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from chaos.checkers import Check

Op = dict[str, Any]
Note = dict[str, Any]
MEMBER_OPS: Final = ("member_add", "member_remove")
# A monitor note is written just after its view was read: a leader seen this
# long after a removal was acknowledged was seen after it.
LEADER_NOTE_GRACE_S: Final = 1.0
# The outcome of an fsync fault whose shim failed a call while the node ran on.
FSYNC_NOT_STOPPED: Final = "sync failed, node kept running"


def _of(notes: Iterable[Note], f: str) -> list[Note]:
    return [note for note in notes if note.get("f") == f]


def membership_history(
    ops: list[Op], notes: list[Note]
) -> tuple[set[str], dict[str, float]] | None:
    """(the members the history says the cluster must end with, removed id ->
    when its removal was acknowledged finished, `inf` when that is not
    known), or None for a run without membership
    notes (no `members_initial`)."""
    initial = _of(notes, "members_initial")
    if not initial:
        return None
    members = set(initial[0]["value"]["ids"])
    removed_at: dict[str, float] = {}
    steps: list[tuple[float, str, str, bool]] = []
    for op in ops:
        if op["f"] in MEMBER_OPS and op["type"] == "ok":
            # A removal answered "configuring" was not finished when answered
            # (a leader removing itself had not handed over yet): when it
            # finished is unknown, so nothing is judged by its time.
            change = (op["result"].get("body") or {}).get("change") or {}
            done = change.get("status") != "configuring"
            steps.append((op["complete_t"], op["f"], op["args"]["id"], done))
    for note in _of(notes, "member_outcome"):
        value = note["value"]
        if value["member"] is None:  # never learned: judged by no side (`unknown_members`)
            continue
        kind = "outcome" if value.get("request") != "add" or value["member"] else "not_added"
        steps.append((note["t"], kind, value["id"], bool(value["member"])))
    for at, kind, node_id, flag in sorted(steps):
        if kind == "member_add" or (kind == "outcome" and flag):
            members.add(node_id)
            removed_at.pop(node_id, None)
            continue
        members.discard(node_id)
        if kind == "not_added":
            continue
        removed_at[node_id] = at if kind == "member_remove" and flag else float("inf")
    return members, removed_at


def unknown_members(notes: list[Note]) -> set[str]:
    """The nodes a lost membership answer left unknown (`member_outcome`
    with `member: None`: no leader answered, nor a repeat of the request):
    whether they end as members is not judged, only that every member
    agrees on them."""
    return {
        note["value"]["id"]
        for note in _of(notes, "member_outcome")
        if note["value"]["member"] is None
    }


def _listed(view: dict[str, Any]) -> dict[str, str]:
    return {n["id"]: n.get("status", "") for n in view.get("nodes", [])}


# -- 13 --------------------------------------------------------------------------


def membership_converged(ops: list[Op], final: dict[str, Any], notes: list[Note]) -> Check:
    """Every member lists the same members, all plain members, no change in
    progress; they are exactly the history's (initial + acknowledged adds -
    acknowledged removes, lost answers resolved); a removed node is no
    member, says it was removed when asked, never led after its removal
    and never stood above the members' term; every member has a digest."""
    check = Check("13_membership_converged")
    found = membership_history(ops, notes)
    if found is None or "membership" not in final:
        return check
    expected, removed_at = found
    unknown = unknown_members(notes)
    expected -= unknown
    views: dict[str, Any] = final["membership"].get("views", {})
    agreed: dict[str, list[str]] = {}
    for node_id in sorted(expected):
        view = views.get(node_id)
        if view is None:
            check.flag(problem="member did not answer at the end", node=node_id)
            continue
        listed = _listed(view)
        members = {i for i, status in listed.items() if status != "removed"}
        agreed[node_id] = sorted(members)
        members -= unknown
        if members != expected:
            check.flag(
                problem="member lists other members than the history's",
                node=node_id, listed=sorted(members), expected=sorted(expected),
            )  # fmt: skip
        unsettled = {i: s for i, s in listed.items() if i in members and s != "member"}
        change = (view.get("membership") or {}).get("change")
        if unsettled or change is not None:
            check.flag(
                problem="change not finished", node=node_id, statuses=unsettled, change=change
            )
    if len({tuple(each) for each in agreed.values()}) > 1:
        check.flag(problem="members disagree on the members", listed=agreed)
    for node_id in sorted(removed_at):
        view = views.get(node_id)
        if view is not None and not (view.get("membership") or {}).get("removed"):
            check.flag(problem="removed node does not know it was removed", node=node_id)
    _retired(notes, check)
    _no_leader_after_removal(notes, removed_at, check)
    digests = set(final.get("nodes", {})) - unknown
    if digests != expected:
        check.flag(
            problem="digests not from exactly the members",
            with_digest=sorted(digests), expected=sorted(expected),
        )  # fmt: skip
    if int(final.get("shards", 1)) > 1:
        _shards_converged(final, notes, expected, unknown, check)
    return check


def _shards_converged(
    final: dict[str, Any], notes: list[Note], expected: set[str], unknown: set[str], check: Check
) -> None:
    """Sharded: every shard's group ends with group 0's members (the
    history's), as every member's replica of it sees them, all plain
    members, no change in progress, no shard behind as group 0's view
    says; every group has a digest from exactly those members; and a node
    that left took its shard processes with it."""
    membership = final["membership"]
    views: dict[str, Any] = membership.get("views", {})
    shard_views: dict[str, dict[str, Any]] = membership.get("shard_views", {})
    shards = range(1, int(final["shards"]))
    for node_id in sorted(expected):
        view = views.get(node_id)
        behind = None if view is None else (view.get("membership") or {}).get("shards_behind")
        if view is not None and behind != []:
            check.flag(problem="shards behind group 0 at the end", node=node_id, behind=behind)
        for shard in shards:
            one = (shard_views.get(node_id) or {}).get(str(shard))
            if one is None:
                if view is not None:  # one that did not answer at all is flagged above
                    check.flag(problem="shard replica did not answer", node=node_id, shard=shard)
                continue
            listed = _listed(one)
            members = {i for i, status in listed.items() if status != "removed"}
            # An unknown node is judged against group 0's own list (as this node sees it).
            group0 = {i for i, s in _listed(view or {}).items() if s != "removed"}
            if members - unknown != expected or members & unknown != group0 & unknown:
                check.flag(
                    problem="shard lists other members than group 0's", node=node_id,
                    shard=shard, listed=sorted(members), expected=sorted(expected),
                )  # fmt: skip
            unsettled = {i: s for i, s in listed.items() if i in members and s != "member"}
            change = (one.get("membership") or {}).get("change")
            if unsettled or change is not None:
                check.flag(
                    problem="shard change not finished", node=node_id, shard=shard,
                    statuses=unsettled, change=change,
                )  # fmt: skip
    groups: dict[str, dict[str, Any]] = final.get("shard_digests", {})
    for shard in shards:
        with_digest = set(groups.get(str(shard), {})) - unknown
        if with_digest != expected:
            check.flag(
                problem="shard digests not from exactly the members", shard=shard,
                with_digest=sorted(with_digest), expected=sorted(expected),
            )  # fmt: skip
    for note in _of(notes, "shard_processes_gone"):
        if note["value"].get("left"):
            check.flag(problem="shard processes outlived their node", **note["value"])


def _retired(notes: list[Note], check: Check) -> None:
    for note in _of(notes, "retired"):
        value = note["value"]
        if not value.get("answered"):
            continue
        if not value.get("removed"):
            check.flag(problem="removed node does not know it was removed", **value)
        term, members_term = value.get("term"), value.get("members_term")
        if term is not None and members_term is not None and term > members_term:
            check.flag(problem="removed node raised its term above the members'", **value)


def _no_leader_after_removal(notes: list[Note], removed_at: dict[str, float], check: Check) -> None:
    for note in _of(notes, "leader"):
        node_id = note["value"]["node"]
        at = removed_at.get(node_id)
        if at is not None and note["t"] > at + LEADER_NOTE_GRACE_S:
            check.flag(
                problem="removed node led after its removal",
                node=node_id, term=note["value"]["term"], removed_at=at, seen_at=note["t"],
            )  # fmt: skip


# -- 14 --------------------------------------------------------------------------


def node_exits_expected(notes: list[Note]) -> Check:
    """No node exited unless the harness stopped it, or an injected fsync
    fault made it exit 74 (fail-stop, the documented behaviour); and a node
    whose journal sync the shim failed did exit (it must not carry on after
    a failed fsync). A node that did not sync its journal while armed (it
    got no entries) was not hit: nothing to judge."""
    check = Check("14_node_exits_expected")
    for note in _of(notes, "node_exit"):
        value = note["value"]
        if not value.get("expected"):
            check.flag(problem="unexpected exit", **value)
    for note in _of(notes, "fault_end"):
        value = note["value"]
        if value.get("kind") == "fsync_fail" and value.get("outcome") == FSYNC_NOT_STOPPED:
            check.flag(problem="fsync failed but the node kept running", **value)
    return check


def ops_checks(ops: list[Op], final: dict[str, Any], notes: list[Note] | None) -> list[Check]:
    notes = notes or []
    return [membership_converged(ops, final, notes), node_exits_expected(notes)]
