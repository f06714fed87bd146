"""The leader's clock.

A leader stamps every entry with `now_ms`: its wall clock sampled when it
became leader plus the monotonic time elapsed since. A wall-clock jump during
its term therefore neither shortens nor lengthens leases; the core keeps
replicated time from running backwards across leaders whose clocks disagree.
Identifiers and random draws are made in `node.draws`.
"""

from __future__ import annotations

import time


class LeaderClock:
    def __init__(self) -> None:
        self._base_wall_ms = time.time_ns() // 1_000_000
        self._base_monotonic_ns = time.monotonic_ns()

    def restart(self) -> None:
        """Resample the wall clock: called when this node becomes leader."""
        self._base_wall_ms = time.time_ns() // 1_000_000
        self._base_monotonic_ns = time.monotonic_ns()

    def now_ms(self) -> int:
        elapsed_ms = (time.monotonic_ns() - self._base_monotonic_ns) // 1_000_000
        return self._base_wall_ms + elapsed_ms
