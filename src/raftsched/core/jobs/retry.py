"""Retry delays and the per-job randomness a Tick derives from its seed."""

from __future__ import annotations

from hashlib import blake2b

from raftsched.core.kernel.model import BackoffMs


def retry_delay_ms(backoff: BackoffMs, retry_index: int, random_u32: int) -> int:
    """`min(max_ms, initial_ms * 2**retry_index) + jitter_ms * random_u32 // 2**32`.

    `retry_index` is the number of attempts made so far minus one, so the
    first retry waits `initial_ms` (plus jitter).
    """
    initial_ms, max_ms, jitter_ms = backoff
    if initial_ms == 0:
        base_ms = 0
    elif retry_index >= 62:
        # Beyond 2**62 the product exceeds any max_ms the validator accepts.
        base_ms = max_ms
    else:
        base_ms = min(max_ms, initial_ms << max(retry_index, 0))
    return base_ms + (jitter_ms * random_u32 >> 32)


def seeded_u32(seed: int, job_id: str) -> int:
    """A uniform draw in [0, 2**32) for one job, from a Tick's seed.

    Hashing (seed, job id) gives every job its own draw without an ordered
    random stream, so the draw does not depend on which other jobs the tick
    happened to process.
    """
    digest = blake2b(job_id.encode(), digest_size=4, key=seed.to_bytes(8, "big"))
    return int.from_bytes(digest.digest(), "big")
