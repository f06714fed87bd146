"""The nemesis: a seeded schedule of faults, and the code that applies them.

The schedule is a pure function of (seed, duration, nodes, workers, and
whether the mixed-version phase runs): the same seed replays the same faults
at the same offsets with the same parameters. Targets named by role ("the
leader") are resolved when the fault starts, because who leads depends on
the run, as in Jepsen; a target named by number is a *position* among the
members at that moment (`node: 2` is the second member in slot order), since
membership changes replace nodes by new ones. Faults run one at a time:
quiet for 1-3 s, then a fault held for 3-8 s (pauses: longer than a lease;
membership changes: at least 8 s), then healed.

Operations faults besides kills, pauses, partitions and clocks:

- `add_node`, `remove_node` (the leader in 40% of them), `replace_node`
  (kill a member, remove it, add a fresh node with a new id on a new data
  directory, start it with `--join`). The cluster stays between NODES and
  NODES+1 members: the schedule alternates adds and removes, and at run
  time an add finding NODES+1 members removes instead, and the other way
  round (noted `adapted`).
- `fsync_fail`: the journal's fsync fails with EIO (an `LD_PRELOAD` shim),
  in a running node or in one restarted into the fault; the node must exit
  74 at once (fail-stop, docs/operations.md "Failed fsync"); after the hold
  it is started again without the fault and must rejoin.
- `disk_full`: the node's data directory (its own tmpfs) is filled; the node
  must carry on (503 disk_full, no exit), and write again once the filler
  is removed.
- `upgrade` (only with the mixed-version phase): the next member still on
  the previous release is stopped with SIGTERM and started on today's code
  on the same data directory.

Every schedule of at least `FAMILY_MIN_FAULTS` faults holds at least one
membership change and one fsync fault (a seeded fault is turned into one if
the draw had none), so a short CI campaign covers both.

On a sharded cluster (`shards` > 1, docs/shards.md) every kind above is
drawn, plus the faults of one shard process (SHARD_KINDS). A membership
change is made in group 0 and every shard's group follows it: the nemesis
waits, bounded, until the leader's `membership.shards_behind` is empty and
no shard has a change in progress before the next fault; a new node starts
with the same `--shards` and port stride; a removed node's shard processes
stop with it.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos.cluster import NsCluster, NsNode, fill_disk
from chaos.history import Recorder
from chaos.membership import (
    MEMBERSHIP_VERSION,
    Changes,
    cluster_version,
    unsettled_detail,
    wait_settled,
)
from chaos.ops_checkers import FSYNC_NOT_STOPPED

KINDS: dict[str, int] = {
    "isolate_one": 2,
    "isolate_leader": 3,
    "split_majority": 2,
    "bridge": 2,
    "one_way": 2,
    "kill_one": 2,
    "kill_leader": 3,
    "kill_minority": 1,
    "pause_leader": 2,
    "pause_worker": 3,
    "clock_jump": 2,
    "clock_drift": 1,
    "add_node": 1,
    "remove_node": 1,
    "replace_node": 1,
    "fsync_fail": 2,
    "disk_full": 2,
}
MEMBERSHIP_KINDS = ("add_node", "remove_node", "replace_node")
# Faults on one shard process alone (a sharded cluster, docs/shards.md): the
# process leading shard k >= 1 is SIGKILLed (its node starts it again) or
# SIGSTOPped for the hold.
SHARD_KINDS: dict[str, int] = {"kill_shard_leader": 3, "pause_shard_leader": 2}
QUIET_S = (1.0, 3.0)
HOLD_S = (3.0, 8.0)
MEMBERSHIP_HOLD_MIN_S = 8.0
UPGRADE_HOLD_S = 5.0
# The mixed-version phase's upgrades fall in this part of the run.
UPGRADE_WINDOW = (0.1, 0.4)
FAMILY_MIN_FAULTS = 6
CLOCK_JUMP_S = (2.0, 20.0)
CLOCK_DRIFT_S_PER_S = (0.05, 0.3)
DRIFT_STEP_S = 0.25
REMOVE_LEADER_P = 0.4
# How long a node armed with an fsync fault may take to hit it and exit.
FSYNC_EXIT_WAIT_S = 15.0
READY_WAIT_S = 30.0
MEMBERS_READY_WAIT_S = 20.0


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    hold_s: float
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        params = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"t+{self.at_s:6.1f}s {self.kind:<15} hold {self.hold_s:4.1f}s {params}"


def schedule(
    seed: int,
    duration_s: float,
    nodes: int,
    workers: int,
    lease_s: float,
    upgrades: int = 0,
    shards: int = 1,
) -> list[Fault]:
    """`upgrades`: members that start on the previous release (0: no
    mixed-version phase); each gets an `upgrade` fault in UPGRADE_WINDOW.
    `shards` > 1: the shard faults join the draw (every other kind, the
    membership changes included, stays). With one shard the schedule is
    the one-shard campaign's, fault for fault."""
    rng = random.Random(f"chaos-schedule-{seed}")
    table = dict(KINDS)
    if shards > 1:
        table |= SHARD_KINDS
    kinds = sorted(table)
    weights = [table[k] for k in kinds]
    faults: list[Fault] = []
    planned_size = nodes
    upgrade_at = [duration_s * (UPGRADE_WINDOW[0] + (UPGRADE_WINDOW[1] - UPGRADE_WINDOW[0])
                                * i / max(1, upgrades)) for i in range(upgrades)]  # fmt: skip
    at_s = rng.uniform(*QUIET_S) + 2.0
    while True:
        kind = rng.choices(kinds, weights)[0]
        hold_s = round(rng.uniform(*HOLD_S), 1)
        if upgrade_at and at_s >= upgrade_at[0]:
            upgrade_at.pop(0)
            kind, hold_s = "upgrade", UPGRADE_HOLD_S
        if kind in ("add_node", "remove_node"):
            kind = "add_node" if planned_size <= nodes else "remove_node"
            planned_size += 1 if kind == "add_node" else -1
        if kind.startswith("pause"):
            hold_s = round(max(hold_s, lease_s * 2 + rng.uniform(0.5, 2.0)), 1)
        if kind in MEMBERSHIP_KINDS:
            hold_s = max(hold_s, MEMBERSHIP_HOLD_MIN_S)
        if at_s + hold_s > duration_s:
            break
        params = _params(rng, kind, nodes, workers, shards)
        faults.append(Fault(round(at_s, 1), kind, hold_s, params))
        at_s += hold_s + rng.uniform(*QUIET_S)
    return _with_every_family(rng, faults, nodes, workers, shards)


def _with_every_family(
    rng: random.Random, faults: list[Fault], nodes: int, workers: int, shards: int = 1
) -> list[Fault]:
    """At least one membership change and one fsync fault in a schedule of
    FAMILY_MIN_FAULTS or more (a seeded plain fault of the second half
    becomes one, keeping its time), and sharded one node kill, one node
    pause, one of each shard fault and one membership change in the first
    half (a plain fault of the first half becomes one)."""
    if len(faults) < FAMILY_MIN_FAULTS:
        return faults
    early = {f.kind for f in faults[: len(faults) // 2]}
    wanted = []
    # Sharded, a membership change of the first half: in the second one it
    # may not start at all (below), and it is what the sharded campaign
    # must show (every shard's group follows group 0's change).
    drawn = early if shards > 1 else {f.kind for f in faults}
    if not drawn & set(MEMBERSHIP_KINDS):
        wanted.append("replace_node")  # keeps the planned size
    if not any(f.kind == "fsync_fail" for f in faults):
        wanted.append("fsync_fail")
    kept: tuple[str, ...] = (*MEMBERSHIP_KINDS, "upgrade", "fsync_fail")
    if shards > 1:
        # A node's SIGKILL and SIGSTOP must take its shard processes with it,
        # and each shard-process fault must run: one of each at least.
        # In the first half: a run's last faults may not start at all when
        # earlier ones overran (fsync faults wait for the exit).
        required = ("kill_leader", "pause_leader", *SHARD_KINDS)
        wanted += [k for k in required if k not in early]
        kept += required
    half = faults[len(faults) // 2].at_s
    for kind in wanted:
        first = shards > 1 and kind != "fsync_fail"
        candidates = [
            i for i, f in enumerate(faults)
            if (f.at_s < half if first else f.at_s >= half) and f.kind not in kept
        ]  # fmt: skip
        if not candidates:
            continue
        index = rng.choice(candidates)
        old = faults[index]
        hold_s = max(old.hold_s, MEMBERSHIP_HOLD_MIN_S) if kind in MEMBERSHIP_KINDS else old.hold_s
        faults[index] = Fault(old.at_s, kind, hold_s, _params(rng, kind, nodes, workers, shards))
    return faults


def _params(
    rng: random.Random, kind: str, nodes: int, workers: int, shards: int = 1
) -> dict[str, Any]:
    members = list(range(1, nodes + 1))
    if kind in SHARD_KINDS:
        return {"shard": rng.randrange(1, shards)}
    if kind in ("isolate_one", "kill_one", "replace_node"):
        return {"node": rng.choice(members)}
    if kind == "add_node":
        return {"via": rng.choice(members)}
    if kind in ("remove_node", "disk_full"):
        leader = rng.random() < REMOVE_LEADER_P
        return {"leader": leader, "node": rng.choice(members)}
    if kind == "fsync_fail":
        return {
            "leader": rng.random() < REMOVE_LEADER_P,
            "node": rng.choice(members),
            "phase": rng.choice(["running", "restart"]),
        }
    if kind == "split_majority":
        minority = sorted(rng.sample(members, (nodes - 1) // 2))
        return {"minority": minority}
    if kind == "kill_minority":
        return {"nodes": sorted(rng.sample(members, (nodes - 1) // 2))}
    if kind == "bridge":
        rng.shuffle(members)
        middle, rest = members[0], members[1:]
        half = len(rest) // 2
        return {"middle": middle, "side_a": sorted(rest[:half]), "side_b": sorted(rest[half:])}
    if kind == "one_way":
        return {"direction": rng.choice(["from_leader", "to_leader"])}
    if kind == "pause_worker":
        return {"worker": rng.randrange(workers)}
    if kind == "clock_jump":
        sign = rng.choice([-1, 1])
        return {
            "node": rng.choice(members),
            "offset_s": round(sign * rng.uniform(*CLOCK_JUMP_S), 2),
        }
    if kind == "clock_drift":
        sign = rng.choice([-1, 1])
        rate = round(sign * rng.uniform(*CLOCK_DRIFT_S_PER_S), 3)
        return {"node": rng.choice(members), "rate_s_per_s": rate}
    return {}


def note_exits(cluster: NsCluster, history: Recorder) -> None:
    """Every node exit not noted yet (chaos.cluster.NsCluster.reap_exits)."""
    for record in cluster.drain_exits():
        history.note("node_exit", record)


class Nemesis(threading.Thread):
    def __init__(
        self,
        cluster: NsCluster,
        faults: list[Fault],
        history: Recorder,
        pause_worker: Callable[[int, bool], None],
        started_at: float,
        upgrade: Callable[[NsNode], None] | None = None,
    ) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.cluster = cluster
        self.net = cluster.net
        self.faults = faults
        self.history = history
        self.pause_worker = pause_worker
        self.started_at = started_at
        self.upgrade_node = upgrade
        self.stop_event = threading.Event()
        self.changes = Changes(cluster, history, self.stop_event)
        self.size_min = len(cluster.members())
        self.applied: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.stopped_pids: set[int] = set()  # shard processes paused alone

    def run(self) -> None:
        self.history.note("members_initial", {"ids": [n.id for n in self.cluster.members()]})
        for fault in self.faults:
            if self._wait_until(self.started_at + fault.at_s):
                return
            note_exits(self.cluster, self.history)
            try:
                self._apply(fault)
            except Exception as error:  # keep going: one failed fault is not a failed run
                self.errors.append(f"{fault.describe()}: {error!r}")
                self.heal_all()
            note_exits(self.cluster, self.history)

    def _wait_until(self, when: float) -> bool:
        return self.stop_event.wait(max(0.0, when - time.time()))

    # -- targets ----------------------------------------------------------------

    def _members(self) -> list[NsNode]:
        return self.cluster.members()

    def _member(self, position: int) -> NsNode:
        """The member at `position` (1-based, wrapping) in slot order."""
        members = self._members()
        return members[(position - 1) % len(members)]

    def _leader(self) -> NsNode:
        leader = self.cluster.leader_id()
        if leader is not None and not self.cluster.nodes[leader].removed:
            return self.cluster.ns_node(leader)
        return self._members()[0]

    def _others(self, node: NsNode) -> list[NsNode]:
        return [n for n in self._members() if n.id != node.id]

    def _isolate(self, group: list[NsNode]) -> None:
        inside_ids = {n.id for n in group}
        for inside in group:
            for outside in self._others(inside):
                if outside.id not in inside_ids:
                    self.net.cut(inside.index, outside.index)

    def _unique(self, positions: list[int]) -> list[NsNode]:
        found: dict[str, NsNode] = {}
        for position in positions:
            node = self._member(position)
            found.setdefault(node.id, node)
        return list(found.values())

    # -- faults -----------------------------------------------------------------

    def _apply(self, fault: Fault) -> None:
        kind, p = fault.kind, fault.params
        started = time.time()
        targets: dict[str, Any] = {}
        undo: Callable[[], None]
        if kind in ("isolate_one", "isolate_leader"):
            node = self._member(p["node"]) if kind == "isolate_one" else self._leader()
            targets["target"] = node.id
            self._isolate([node])
            undo = self.net.heal
        elif kind == "split_majority":
            minority = self._unique(p["minority"])
            targets["targets"] = [n.id for n in minority]
            self._isolate(minority)
            undo = self.net.heal
        elif kind == "bridge":
            side_a, side_b = self._unique(p["side_a"]), self._unique(p["side_b"])
            middle = self._member(p["middle"])
            targets["middle_id"] = middle.id
            for a in side_a:
                for b in side_b:
                    if a.id != b.id and middle.id not in (a.id, b.id):
                        self.net.cut(a.index, b.index)
            undo = self.net.heal
        elif kind == "one_way":
            leader = self._leader()
            targets["target"] = leader.id
            for other in self._others(leader):
                if p["direction"] == "from_leader":
                    self.net.drop(leader.index, other.index)
                else:
                    self.net.drop(other.index, leader.index)
            undo = self.net.heal
        elif kind in ("kill_one", "kill_leader", "kill_minority"):
            nodes: list[NsNode] = (
                [self._member(p["node"])]
                if kind == "kill_one"
                else self._unique(p["nodes"])
                if kind == "kill_minority"
                else [self._leader()]
            )
            targets["targets"] = [n.id for n in nodes]
            for node in nodes:
                self.cluster.kill(node.id)

            def undo() -> None:
                for node in nodes:
                    self._restart(node)

        elif kind == "pause_leader":
            node = self._leader()
            targets["target"] = node.id
            self.cluster.pause(node.id)

            def undo() -> None:
                self.cluster.resume(node.id)

        elif kind in SHARD_KINDS:
            undo = self._shard_fault(fault, targets)
        elif kind == "pause_worker":
            self.pause_worker(p["worker"], True)

            def undo() -> None:
                self.pause_worker(p["worker"], False)

        elif kind == "clock_jump":
            node = self._member(p["node"])
            targets["target"] = node.id
            self.cluster.set_clock_offset(node.index, p["offset_s"])

            def undo() -> None:
                self.cluster.set_clock_offset(node.index, 0.0)

        elif kind == "clock_drift":
            node = self._member(p["node"])
            targets["target"] = node.id
            self.history.note("fault_start", {"kind": kind, **p, **targets})
            self._drift(node.index, p["rate_s_per_s"], fault.hold_s)

            def undo() -> None:
                self.cluster.set_clock_offset(node.index, 0.0)

        elif kind in ("add_node", "remove_node", "replace_node", "upgrade", "fsync_fail"):
            self._run_operation(fault, targets)
            return
        elif kind == "disk_full":
            node = self._leader() if p["leader"] else self._member(p["node"])
            targets["target"] = node.id
            if not node.tmpfs:
                self._skip(fault, "the data directory is not on a tmpfs of its own")
                return
            filler = fill_disk(node.data_dir)

            def undo() -> None:
                filler.unlink(missing_ok=True)
                targets["alive_after"] = node.alive

        else:
            raise ValueError(f"unknown fault {kind}")
        if kind != "clock_drift":
            self.history.note("fault_start", {"kind": kind, **p, **targets})
            self.stop_event.wait(fault.hold_s)
        undo()
        self._ended(fault, targets, started)

    def _shard_fault(self, fault: Fault, targets: dict[str, Any]) -> Callable[[], None]:
        """SIGKILL or SIGSTOP the process leading shard k (as the nodes agree
        on it; else shard k's process on the group 0 leader's node). A
        killed one is started again by its node, which logs its exit at
        error level (expected for this node and pid only: checker 8)."""
        shard = int(fault.params["shard"])
        leader = self.cluster.shard_leader(shard)
        node = self.cluster.ns_node(leader) if leader is not None else self._leader()
        pid = self.cluster.shard_pids(node.id).get(shard)
        targets.update(target=node.id, shard=shard, pid=pid, was_leader=leader is not None)
        if pid is None:
            targets["outcome"] = "no shard process found"
            return lambda: None
        if fault.kind == "kill_shard_leader":
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

            def restarted() -> None:
                new = self.cluster.shard_pids(node.id).get(shard)
                targets["restarted_pid"] = new
                targets["outcome"] = "restarted" if new not in (None, pid) else "not restarted yet"

            return restarted
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        self.stopped_pids.add(pid)

        def resume() -> None:
            self.stopped_pids.discard(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

        return resume

    def _ended(self, fault: Fault, targets: dict[str, Any], started: float) -> None:
        held_s = time.time() - started
        self.history.note("fault_end", {"kind": fault.kind, "held_s": round(held_s, 2), **targets})
        self.applied.append({"kind": fault.kind, "held_s": held_s, **fault.params, **targets})

    def _skip(self, fault: Fault, why: str) -> None:
        self.history.note("fault_skipped", {"kind": fault.kind, "why": why})
        self.applied.append({"kind": fault.kind, "held_s": 0.0, "skipped": why})

    def _restart(self, node: NsNode) -> None:
        """Start a killed member again; a joined one joins through a member
        that runs (its first --join member may be gone)."""
        if node.removed:
            return
        if node.join_url is not None:
            others = [n for n in self._others(node) if n.alive]
            if others:
                node.join_url = others[0].http_url
        self.cluster.start(node.id)

    def _run_operation(self, fault: Fault, targets: dict[str, Any]) -> None:
        """Membership changes, upgrades and fsync faults: each runs its own
        course (requests, waits) rather than a fault held and undone."""
        started = time.time()
        self.history.note("fault_start", {"kind": fault.kind, **fault.params})
        kind = fault.kind
        if kind in MEMBERSHIP_KINDS:
            # The runbook's first step: every member up and ready (a node
            # restarted by the previous fault may still be starting).
            targets["members_ready"] = self._members_ready(MEMBERS_READY_WAIT_S)
        if kind in ("add_node", "remove_node"):
            size = len(self._members())
            wanted = "add_node" if size <= self.size_min else "remove_node"
            if wanted != kind:
                targets["adapted"] = wanted
            kind = wanted
        if kind == "add_node":
            self._add(fault, targets)
        elif kind == "remove_node":
            self._remove(fault, targets)
        elif kind == "replace_node":
            self._replace(fault, targets)
        elif kind == "upgrade":
            self._upgrade(fault, targets)
        elif kind == "fsync_fail":
            self._fsync_fail(fault, targets)
        self._ended(fault, targets, started)

    def _members_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for node in self._members():
            if not self.changes.ready(node, max(0.0, deadline - time.monotonic())):
                return False
        return True

    def _settle(self, targets: dict[str, Any]) -> None:
        """Wait, bounded, until the change is done (sharded: in every
        shard's group too) before the next fault; what was still pending
        if it was not."""
        targets["settled"] = wait_settled(self.cluster, self.stop_event)
        if not targets["settled"]:
            targets["unsettled"] = unsettled_detail(self.cluster)

    def _version_ok(self, targets: dict[str, Any]) -> bool:
        version = cluster_version(self.cluster)
        targets["cluster_version"] = version
        return version is None or version >= MEMBERSHIP_VERSION

    def _add(self, fault: Fault, targets: dict[str, Any]) -> None:
        below = not self._version_ok(targets)
        if self.cluster.free_slot() is None:
            targets["outcome"] = "no free slot"
            return
        node = self.cluster.new_node()
        targets["target"] = node.id
        if not self.changes.add(node):
            # Below version 4 the refusal is expected ("upgrade every node first").
            targets["outcome"] = "refused (cluster version below 4)" if below else "refused"
            self.cluster.forget(node.id)
            return
        via = self._member(fault.params.get("via", 1))
        if via.id == node.id or not via.alive:
            via = next(n for n in self._others(node) if n.alive)
        self.cluster.start_joining(node.id, via.http_url)
        self.stop_event.wait(fault.hold_s)
        self._settle(targets)
        targets["ready"] = self.changes.ready(node, READY_WAIT_S)
        targets["outcome"] = "added"

    def _remove(self, fault: Fault, targets: dict[str, Any]) -> None:
        below = not self._version_ok(targets)
        # An add adapted into a removal has no target of its own: a follower
        # at its `via` position.
        position = fault.params.get("node", fault.params.get("via", 1))
        node = self._leader() if fault.params.get("leader") else self._member(position)
        targets["target"] = node.id
        targets["was_leader"] = node.id == self.cluster.leader_id()
        if not self.changes.remove(node.id):
            targets["outcome"] = "refused (cluster version below 4)" if below else "refused"
            return
        self.cluster.mark_removed(node.id)
        # It keeps running while held: a removed node must not disturb anyone.
        self.stop_event.wait(fault.hold_s)
        self._settle(targets)
        self.changes.retire(node)
        targets["outcome"] = "removed"

    def _replace(self, fault: Fault, targets: dict[str, Any]) -> None:
        victim = self._member(fault.params["node"])
        targets["target"] = victim.id
        if not self._version_ok(targets):
            # Expected to be refused; the victim is not killed for it.
            removed = self.changes.remove(victim.id)
            targets["outcome"] = "refused (cluster version below 4)"
            if removed:  # not expected: go on as a removal
                self.cluster.mark_removed(victim.id)
                self.changes.retire(victim)
                targets["outcome"] = "removed below cluster version 4"
            return
        self.changes.stop_with_shards(victim, signal.SIGKILL)
        if not self.changes.remove(victim.id):
            targets["outcome"] = "remove refused; victim restarted"
            self._restart(victim)
            return
        self.cluster.mark_removed(victim.id)
        if self.cluster.free_slot() is None:
            targets["outcome"] = "removed; no free slot for the new node"
            return
        node = self.cluster.new_node()
        targets["new"] = node.id
        if not self.changes.add(node):
            self.cluster.forget(node.id)
            targets["outcome"] = "removed; add refused"
            return
        via = next(n for n in self._others(node) if n.alive)
        self.cluster.start_joining(node.id, via.http_url)
        self.stop_event.wait(fault.hold_s)
        self._settle(targets)
        targets["ready"] = self.changes.ready(node, READY_WAIT_S)
        targets["outcome"] = "replaced"

    def _upgrade(self, fault: Fault, targets: dict[str, Any]) -> None:
        old = [n for n in self._members() if n.release != "current"]
        if not old or self.upgrade_node is None:
            targets["outcome"] = "nothing to upgrade"
            return
        node = old[0]
        targets["target"] = node.id
        targets["from"] = node.release
        self.upgrade_node(node)
        targets["ready"] = self.changes.ready(node, READY_WAIT_S)
        self.stop_event.wait(fault.hold_s)
        targets["outcome"] = "upgraded"

    def _fsync_fail(self, fault: Fault, targets: dict[str, Any]) -> None:
        """Arm the shim (in the running node, or kill it and start it into
        the fault); it must exit 74; after the hold it starts without it."""
        if self.cluster.fsync_shim is None:
            targets["outcome"] = "skipped: no C compiler for the fsync shim"
            return
        p = fault.params
        node = self._leader() if p["leader"] else self._member(p["node"])
        targets["target"] = node.id
        if p["phase"] == "restart":
            self.cluster.kill(node.id)
            self.cluster.fsync_fault(node.id, True)
            self._restart(node)
        else:
            self.cluster.fsync_fault(node.id, True)
        process = node.process
        deadline = time.monotonic() + FSYNC_EXIT_WAIT_S
        while process is not None and process.poll() is None and time.monotonic() < deadline:
            if self.stop_event.wait(0.1):
                break
        code = None if process is None else process.poll()
        targets["exit_code"] = code
        self.cluster.fsync_fault(node.id, False)
        # Whether the shim failed a call: a node that never synced its
        # journal while armed was not hit; one that was hit must have exited.
        targets["failed_calls"] = self.cluster.fsync_fault_hits(node.id)
        if code is None and targets["failed_calls"]:
            time.sleep(1.0)  # the exit follows the failed call at once
            code = targets["exit_code"] = None if process is None else process.poll()
        note_exits(self.cluster, self.history)
        node.expected_exit_code = None
        if code is not None:
            targets["outcome"] = "exited"
        elif targets["failed_calls"]:
            targets["outcome"] = FSYNC_NOT_STOPPED
        else:
            targets["outcome"] = "not hit: no journal sync while armed"
        self.stop_event.wait(fault.hold_s)
        self._restart(node)

    def _drift(self, index: int, rate: float, hold_s: float) -> None:
        """Drift as small steps of the offset: libfaketime's own rate option
        would also speed up every timeout in the process."""
        started = time.monotonic()
        while not self.stop_event.is_set():
            elapsed = time.monotonic() - started
            if elapsed >= hold_s:
                return
            self.cluster.set_clock_offset(index, rate * elapsed)
            self.stop_event.wait(DRIFT_STEP_S)

    def heal_all(self) -> None:
        """Undo everything: partitions, pauses, kills, clocks, disk faults."""
        self.net.heal()
        for pid in list(self.stopped_pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.stopped_pids.discard(pid)
        for node in self.cluster.ns_nodes():
            if node.paused:
                self.cluster.resume(node.id)
            self.cluster.set_clock_offset(node.index, 0.0)
            self.cluster.fsync_fault(node.id, False)
            (node.data_dir / "chaos-filler").unlink(missing_ok=True)
        note_exits(self.cluster, self.history)
        for node in self.cluster.ns_nodes():
            node.expected_exit_code = None
        for node in self._members():
            if not node.alive:
                self._restart(node)


def schedule_json(faults: list[Fault]) -> list[dict[str, Any]]:
    return [asdict(fault) for fault in faults]
