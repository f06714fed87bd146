"""CPU time of process trees and of the whole machine (Linux /proc).

A role (the raftsched leader, the Postgres primary, the workers, ...) is a
list of root processes; its CPU time is the user + system time of every
live process in their trees plus the children's time those processes have
reaped (cutime + cstime). A Postgres backend that exits is reaped by the
postmaster, a raftsched snapshot writer by its node, so their time moves
into the parent's counters and is counted exactly once either way.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _process_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds of it and its reaped children)."""
    table: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = text.rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        table[int(entry.name)] = (int(fields[1]), ticks * TICK_S)
    return table


def _tree_cpu_s(
    table: dict[int, tuple[int, float]], children: dict[int, list[int]], roots: list[int]
) -> float:
    seen: set[int] = set()
    stack = [pid for pid in roots if pid in table]
    total = 0.0
    while stack and len(seen) < len(table):
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += table[pid][1]
        stack.extend(children.get(pid, ()))
    return total


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy since boot (all cores):
    user + nice + system + irq + softirq + steal from /proc/stat."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) * TICK_S


@dataclass(frozen=True)
class Snapshot:
    at: float  # time.monotonic()
    roles: dict[str, float]  # role -> CPU seconds so far
    machine: float


def snapshot(roles: dict[str, list[int]]) -> Snapshot:
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    cpu = {role: _tree_cpu_s(table, children, pids) for role, pids in roles.items()}
    return Snapshot(time.monotonic(), cpu, machine_busy_s())


def cpu_per_job(before: Snapshot, after: Snapshot, jobs: int) -> dict[str, float]:
    """CPU milliseconds per job by role, their total, the whole machine's,
    and `other` (the machine less our processes: other load, kernel threads)."""
    jobs = max(1, jobs)
    figures = {
        role: round((after.roles[role] - before.roles[role]) * 1000 / jobs, 3)
        for role in before.roles
    }
    ours = sum(after.roles[role] - before.roles[role] for role in before.roles)
    machine = after.machine - before.machine
    figures["total"] = round(ours * 1000 / jobs, 3)
    figures["machine"] = round(machine * 1000 / jobs, 3)
    figures["other"] = round((machine - ours) * 1000 / jobs, 3)
    return figures


def cores_busy(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """Our processes' and the machine's CPU time over the wall time between."""
    wall = max(1e-9, after.at - before.at)
    ours = sum(after.roles[role] - before.roles[role] for role in before.roles)
    return {
        "ours": round(ours / wall, 2),
        "machine": round((after.machine - before.machine) / wall, 2),
    }
