"""The nemesis: a seeded schedule of faults, and the code that applies them.

The schedule is a pure function of (seed, duration, nodes, workers): the same
seed replays the same faults at the same offsets with the same parameters.
Targets named by role ("the leader") are resolved when the fault starts,
because who leads depends on the run, as in Jepsen. Faults run one at a time:
quiet for 1-3 s, then a fault held for 3-8 s (pauses: longer than a lease),
then healed.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos.cluster import NsCluster
from chaos.history import Recorder

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
}
QUIET_S = (1.0, 3.0)
HOLD_S = (3.0, 8.0)
CLOCK_JUMP_S = (2.0, 20.0)
CLOCK_DRIFT_S_PER_S = (0.05, 0.3)
DRIFT_STEP_S = 0.25


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    hold_s: float
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        params = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"t+{self.at_s:6.1f}s {self.kind:<15} hold {self.hold_s:4.1f}s {params}"


def schedule(seed: int, duration_s: float, nodes: int, workers: int, lease_s: float) -> list[Fault]:
    rng = random.Random(f"chaos-schedule-{seed}")
    kinds = sorted(KINDS)
    weights = [KINDS[k] for k in kinds]
    faults: list[Fault] = []
    at_s = rng.uniform(*QUIET_S) + 2.0
    while True:
        kind = rng.choices(kinds, weights)[0]
        hold_s = round(rng.uniform(*HOLD_S), 1)
        if kind.startswith("pause"):
            hold_s = round(max(hold_s, lease_s * 2 + rng.uniform(0.5, 2.0)), 1)
        if at_s + hold_s > duration_s:
            break
        faults.append(Fault(round(at_s, 1), kind, hold_s, _params(rng, kind, nodes, workers)))
        at_s += hold_s + rng.uniform(*QUIET_S)
    return faults


def _params(rng: random.Random, kind: str, nodes: int, workers: int) -> dict[str, Any]:
    members = list(range(1, nodes + 1))
    if kind in ("isolate_one", "kill_one"):
        return {"node": rng.choice(members)}
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


class Nemesis(threading.Thread):
    def __init__(
        self,
        cluster: NsCluster,
        faults: list[Fault],
        history: Recorder,
        pause_worker: Callable[[int, bool], None],
        started_at: float,
    ) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.cluster = cluster
        self.net = cluster.net
        self.faults = faults
        self.history = history
        self.pause_worker = pause_worker
        self.started_at = started_at
        self.stop_event = threading.Event()
        self.applied: list[dict[str, Any]] = []
        self.errors: list[str] = []

    def run(self) -> None:
        for fault in self.faults:
            if self._wait_until(self.started_at + fault.at_s):
                return
            try:
                self._apply(fault)
            except Exception as error:  # keep going: one failed fault is not a failed run
                self.errors.append(f"{fault.describe()}: {error!r}")
                self.heal_all()

    def _wait_until(self, when: float) -> bool:
        return self.stop_event.wait(max(0.0, when - time.time()))

    def _leader(self) -> int:
        leader = self.cluster.leader_id()
        return int(leader[1:]) if leader else 1

    def _apply(self, fault: Fault) -> None:
        kind, p = fault.kind, fault.params
        targets: dict[str, Any] = {}
        undo: Callable[[], None]
        if kind in ("isolate_one", "isolate_leader"):
            node = p["node"] if kind == "isolate_one" else self._leader()
            targets["node"] = node
            self._isolate([node])
            undo = self.net.heal
        elif kind == "split_majority":
            self._isolate(p["minority"])
            undo = self.net.heal
        elif kind == "bridge":
            for a in p["side_a"]:
                for b in p["side_b"]:
                    self.net.cut(a, b)
            undo = self.net.heal
        elif kind == "one_way":
            leader = targets["node"] = self._leader()
            for other in self._others(leader):
                if p["direction"] == "from_leader":
                    self.net.drop(leader, other)
                else:
                    self.net.drop(other, leader)
            undo = self.net.heal
        elif kind in ("kill_one", "kill_leader", "kill_minority"):
            nodes: list[int] = (
                [p["node"]]
                if kind == "kill_one"
                else list(p["nodes"])
                if kind == "kill_minority"
                else [self._leader()]
            )
            targets["nodes"] = nodes
            for node in nodes:
                self.cluster.kill(f"n{node}")

            def undo() -> None:
                for node in nodes:
                    self.cluster.start(f"n{node}")

        elif kind == "pause_leader":
            node = targets["node"] = self._leader()
            self.cluster.pause(f"n{node}")

            def undo() -> None:
                self.cluster.resume(f"n{node}")

        elif kind == "pause_worker":
            self.pause_worker(p["worker"], True)

            def undo() -> None:
                self.pause_worker(p["worker"], False)

        elif kind == "clock_jump":
            self.cluster.set_clock_offset(p["node"], p["offset_s"])

            def undo() -> None:
                self.cluster.set_clock_offset(p["node"], 0.0)

        elif kind == "clock_drift":
            self._drift(p["node"], p["rate_s_per_s"], fault.hold_s)

            def undo() -> None:
                self.cluster.set_clock_offset(p["node"], 0.0)

        else:
            raise ValueError(f"unknown fault {kind}")
        started = time.time()
        self.history.note("fault_start", {"kind": kind, **p, **targets})
        if kind != "clock_drift":
            self.stop_event.wait(fault.hold_s)
        undo()
        held_s = time.time() - started
        self.history.note("fault_end", {"kind": kind, "held_s": round(held_s, 2)})
        self.applied.append({"kind": kind, "held_s": held_s, **p, **targets})

    def _drift(self, node: int, rate: float, hold_s: float) -> None:
        """Drift as small steps of the offset: libfaketime's own rate option
        would also speed up every timeout in the process."""
        started = time.monotonic()
        while not self.stop_event.is_set():
            elapsed = time.monotonic() - started
            if elapsed >= hold_s:
                return
            self.cluster.set_clock_offset(node, rate * elapsed)
            self.stop_event.wait(DRIFT_STEP_S)

    def _others(self, node: int) -> list[int]:
        return [n for n in range(1, self.cluster.size + 1) if n != node]

    def _isolate(self, group: list[int]) -> None:
        for inside in group:
            for outside in self._others(inside):
                if outside not in group:
                    self.net.cut(inside, outside)

    def heal_all(self) -> None:
        """Undo everything: partitions, pauses, kills, clocks."""
        self.net.heal()
        for node in self.cluster.nodes.values():
            if node.paused:
                self.cluster.resume(node.id)
        for index in range(1, self.cluster.size + 1):
            self.cluster.set_clock_offset(index, 0.0)
        self.cluster.start()


def schedule_json(faults: list[Fault]) -> list[dict[str, Any]]:
    return [asdict(fault) for fault in faults]
