"""The workload both systems carry, and the control file of a phase.

The control file is a small memory-mapped array of 64-bit integers shared by
the benchmark process and the load processes of one phase:

- slot 0: the phase's state (WAIT, GO, STOP), written by the benchmark only;
- for load process i: slot 1 + 2i, its readiness (1 once connected), and
  slot 2 + 2i, its counter (jobs submitted by a submitter, jobs completed by
  a worker), each written by that process only.

Aligned 8-byte stores are atomic on the machines this runs on, so no lock is
needed: readers see an old or a new value, never a torn one.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path

# About 200 bytes of JSON, the same for every system and every job.
PAYLOAD = {
    "order": "ord_000000000001",
    "amount": 1200,
    "currency": "EUR",
    "customer": "cus_0000000042",
    "merchant": "mch_00017",
    "method": "card",
    "description": "Monthly subscription, plan Pro, invoice inv_000000000001",
}
RESULT = {"ok": True}
BATCH = 100  # jobs per submit and per claim in the batched variant

WAIT, GO, STOP = 0, 1, 2
_SLOT = struct.Struct("<q")


def payload_bytes() -> int:
    return len(json.dumps(PAYLOAD, separators=(",", ":")))


class Control:
    """The shared counters of one phase (see the module doc)."""

    def __init__(self, path: Path, agents: int, *, create: bool = False) -> None:
        size = _SLOT.size * (1 + 2 * agents)
        if create:
            path.write_bytes(b"\0" * size)
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, size)
        self.agents = agents

    def _get(self, slot: int) -> int:
        value: int = _SLOT.unpack_from(self._map, slot * _SLOT.size)[0]
        return value

    def _set(self, slot: int, value: int) -> None:
        _SLOT.pack_into(self._map, slot * _SLOT.size, value)

    @property
    def state(self) -> int:
        return self._get(0)

    def set_state(self, state: int) -> None:
        self._set(0, state)

    def set_ready(self, agent: int) -> None:
        self._set(1 + 2 * agent, 1)

    def ready(self, agent: int) -> bool:
        return self._get(1 + 2 * agent) == 1

    def count(self, agent: int) -> int:
        return self._get(2 + 2 * agent)

    def set_count(self, agent: int, value: int) -> None:
        self._set(2 + 2 * agent, value)

    def total(self, agents: list[int]) -> int:
        return sum(self._get(2 + 2 * agent) for agent in agents)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)
