"""Keep the garbage collector from pausing Raft.

A node holds its whole state in memory: a million jobs are several million
long-lived objects. CPython's full collection walks every tracked object,
holding the GIL, and at that size takes around a second: long enough for
followers to miss heartbeats and start an election. Job records never form
reference cycles (they are freed by reference counting), so there is
nothing for the collector to find among them.

Every `FREEZE_INTERVAL_S` (a few seconds, so that a bulk load of a million
jobs is frozen as it arrives, not half a minute later) the node collects the
young generations (so that fresh cyclic garbage is not frozen) and then moves
every surviving object to the permanent generation with `gc.freeze()`.
Automatic full collections are off (see GENERATION2_THRESHOLD). The cost is
that cyclic garbage created before a freeze and still alive at it is never
collected; it is bounded by what one interval produces, and young
collections run first.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

log = logging.getLogger("raftsched.gc")

FREEZE_INTERVAL_S = 5.0
# Young collections: frequent and small. Under load nearly every object
# survives (leases, attempts, history records), so each is walked once in
# generation 0 and once in generation 1 whatever the thresholds; low ones
# keep each pause short (a generation-1 threshold of 10 let 100,000 objects
# pile up: pauses of 75 ms on a follower in the hot minute).
GENERATION0_THRESHOLD = 5_000
GENERATION1_THRESHOLD = 2
# No automatic full collections. Whatever survives the young generations is
# frozen at the next interval anyway, so a full collection could only find
# garbage from the last few seconds, and it pays for that by walking every
# object allocated since the last freeze: during a hot minute that is about
# a million (lease, attempt and history records), a pause of 100 ms or more
# on every replica, every few seconds.
GENERATION2_THRESHOLD = 1_000_000


class Pauses:
    """Time spent in collections, per generation (for /metrics)."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self._started = 0.0

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = info.get("generation", 2)
        elapsed = time.perf_counter() - self._started
        self.count[generation] += 1
        self.seconds[generation] += elapsed
        self.longest[generation] = max(self.longest[generation], elapsed)


pauses = Pauses()


def configure() -> None:
    gc.set_threshold(GENERATION0_THRESHOLD, GENERATION1_THRESHOLD, GENERATION2_THRESHOLD)
    if pauses.callback not in gc.callbacks:
        gc.callbacks.append(pauses.callback)


async def freeze_periodically(interval_s: float = FREEZE_INTERVAL_S) -> None:
    while True:
        await asyncio.sleep(interval_s)
        started = time.perf_counter()
        gc.collect(1)
        gc.freeze()
        elapsed_ms = (time.perf_counter() - started) * 1000
        if elapsed_ms > 50:
            log.info("gc freeze took %.0f ms", elapsed_ms, extra={"frozen": gc.get_freeze_count()})
