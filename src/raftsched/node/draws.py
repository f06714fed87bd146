"""Identifiers and random numbers for commands: the one place they are drawn.

The core never draws anything (design.md, Time): job, workflow,
subscription and schedule ids, a failure's retry jitter and a Tick's seed
arrive inside the command, drawn by the proposer. `Draws` is where the node
draws them, so a test or a simulation can replace them all in one place.

Identifiers are `<prefix>_` + 48 bits of milliseconds + 80 random bits in
Crockford base32 (26 characters, like a ULID): sortable by creation time,
unique without coordination. The process of data shard k >= 1 (docs/shards.md)
draws `<prefix><k>_...` (`job3_...`), so an id names its shard.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from raftsched.shards import id_prefix

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

# Every pair of Crockford characters, by the 10 bits they stand for: an id
# is 13 lookups. (Through base64.b32encode, which is Python on 3.11, and a
# translation it was 3.6 us an id; a 100-job batch makes 100 ids, every
# submit one.)
_PAIRS = tuple(first + second for first in _CROCKFORD for second in _CROCKFORD)
_PAIR_SHIFTS = tuple(range(120, -1, -10))


def _base32_id(now_ms: int, random_bits: int) -> str:
    """26 Crockford characters: the low 50 bits of `now_ms`, then 80 bits."""
    value = ((now_ms & ((1 << 50) - 1)) << 80) | (random_bits & ((1 << 80) - 1))
    pairs = _PAIRS
    return "".join([pairs[(value >> shift) & 1023] for shift in _PAIR_SHIFTS])


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
        return f"{prefix}_{_base32_id(now_ms, random_bits)}"


class Draws:
    """Every identifier and random number this node puts into a command.
    `now_ms` is the leader clock the identifiers take their time from;
    `shard`, the data shard this process runs (0: group 0, today's ids)."""

    def __init__(self, now_ms: Callable[[], int], shard: int = 0) -> None:
        self._now_ms = now_ms
        self._ids = IdSource()
        self._shard = shard

    def new_id(self, prefix: str) -> str:
        return self._ids.new(id_prefix(prefix, self._shard), self._now_ms())

    def new_ids(self, prefix: str, count: int) -> tuple[str, ...]:
        now_ms = self._now_ms()  # one clock read for a batch
        prefix = id_prefix(prefix, self._shard)
        return tuple(self._ids.new(prefix, now_ms) for _ in range(count))

    def u32(self) -> int:
        """Uniform in [0, 2**32): a failure's retry jitter (FailJob)."""
        return int.from_bytes(os.urandom(4), "big")

    def u64(self) -> int:
        """Uniform in [0, 2**64): a Tick's seed (the jitter of the retries it causes)."""
        return int.from_bytes(os.urandom(8), "big")
