"""The leader's clock and identifier source.

A leader stamps every entry with `now_ms`: its wall clock sampled when it
became leader plus the monotonic time elapsed since. A wall-clock jump during
its term therefore neither shortens nor lengthens leases; the core keeps
replicated time from running backwards across leaders whose clocks disagree.

Identifiers are `<prefix>_` + 48 bits of milliseconds + 80 random bits in
Crockford base32 (26 characters, like a ULID): sortable by creation time,
unique without coordination.
"""

from __future__ import annotations

import os
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


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


def _base32(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


class IdSource:
    """Monotonic within a process: ids made in the same millisecond increase."""

    def __init__(self) -> None:
        self._last_ms = -1
        self._last_random = 0

    def new(self, prefix: str, now_ms: int) -> str:
        if now_ms <= self._last_ms:
            now_ms = self._last_ms
            self._last_random += 1
            random_bits = self._last_random
        else:
            random_bits = int.from_bytes(os.urandom(10), "big") >> 1
            self._last_ms = now_ms
            self._last_random = random_bits
        return f"{prefix}_{_base32(now_ms, 10)}{_base32(random_bits & ((1 << 80) - 1), 16)}"


def random_u32() -> int:
    return int.from_bytes(os.urandom(4), "big")


def random_u64() -> int:
    return int.from_bytes(os.urandom(8), "big")
