"""How one worker's slots are shared by its claim loops, one per shard.

A worker of a cluster of several shards (docs/shards.md, section 4) runs a
long-poll claim loop per shard, and all of them draw on its one pool of
slots (`WorkerConfig.concurrency`): a lease from any shard takes a slot.
The worker counts the slots (free = concurrency - running - reserved by
claims in flight); this module only decides which loop may claim how many
of them, with no I/O and no clock, so that it can be tested step by step.

Theory of operation. A loop is in one of three states: **waiting** (it would
claim if it had slots), **polling** (its claim is in flight, holding the
slots it asked for) or **resting** (backing off after a failed claim, its
shard without a leader, or nothing it could claim now: every kind at its
limit). Each shard **holds** its running jobs and the slots its claims in
flight (its loop's, and next claims carried by its lease batches) may fill.
A waiting loop whose shard holds nothing is **starved**.

- **Who claims.** The free slots go to the waiting loops, starved ones
  first, then in the order they started waiting (a loop whose poll ended
  goes to the back): each of the first `min(free, waiting)` gets an equal
  part (the earlier ones one more when it does not divide), the others get
  nothing until slots come back. So four slots and three idle shards poll
  with 2, 1 and 1, and no shard waits behind another's backlog.
- **No slot, no poll.** With every slot running a job or held by a poll, no
  loop claims; a loop wakes when a job ends or a poll comes back.
- **Short polls when crowded.** A poll that takes the last free slot while
  a starved loop still waits ends after at most `CROWDED_POLL_WAIT_S`, so
  that a worker with fewer slots than shards polls them in turn instead of
  holding its slots in one shard's long poll while another's jobs wait.
- **Next claims give way.** A lease batch's next claim (which goes to the
  batch's shard) leaves one slot for each starved loop of another shard: a
  shard whose jobs keep coming would otherwise refill every slot it frees
  and never let the others' loops claim.

With one shard there is one loop, which is never crowded, and every rule
above gives it what it had before: every free slot, polled for as long as
configured, and next claims of every slot their jobs free.
"""

from __future__ import annotations

import enum
import itertools
from collections import Counter
from collections.abc import Iterable
from typing import Final

# How long a poll waits at most while another shard's loop is starved (see
# the module doc): the longest a job of that shard waits for a free slot to
# come round to its loop, per loop ahead of it.
CROWDED_POLL_WAIT_S: Final = 1.0


class LoopState(enum.Enum):
    WAITING = "waiting"
    POLLING = "polling"
    RESTING = "resting"


class ShardSlots:
    """The claim loops' states and what each shard holds (module doc)."""

    def __init__(self, shards: Iterable[int] = ()) -> None:
        self._states: dict[int, LoopState] = {}
        # When each waiting loop started waiting (a turn number; lower: earlier).
        self._turns: dict[int, int] = {}
        self._clock = itertools.count()
        # Per shard: running jobs plus slots its claims in flight may fill.
        self._held: Counter[int] = Counter()
        for shard in shards:
            self.add(shard)

    def add(self, shard: int) -> None:
        """A loop for `shard`, waiting (nothing if it has one)."""
        if shard not in self._states:
            self._states[shard] = LoopState.RESTING
            self.wait(shard)

    @property
    def shards(self) -> list[int]:
        return list(self._states)

    def state(self, shard: int) -> LoopState:
        return self._states[shard]

    def held(self, shard: int) -> int:
        return self._held[shard]

    # -- the loops' states ------------------------------------------------------

    def wait(self, shard: int) -> None:
        """Loop `shard` would claim now; one that already waits keeps its turn."""
        if self._states[shard] is not LoopState.WAITING:
            self._states[shard] = LoopState.WAITING
            self._turns[shard] = next(self._clock)

    def poll(self, shard: int, slots: int) -> None:
        """Loop `shard` claims `slots` slots: they are its shard's until `polled`."""
        assert self._states[shard] is LoopState.WAITING and slots > 0
        self._states[shard] = LoopState.POLLING
        self._turns.pop(shard, None)
        self._held[shard] += slots

    def polled(self, shard: int, slots: int) -> None:
        """Loop `shard`'s claim of `slots` came back (its leases are counted
        by `started`); the loop waits again, behind the others."""
        assert self._states[shard] is LoopState.POLLING
        self._held[shard] -= slots
        self.wait(shard)

    def rest(self, shard: int) -> None:
        """Loop `shard` will not claim for a while (back-off, or nothing it
        could claim now); it no longer counts as waiting."""
        self._states[shard] = LoopState.RESTING
        self._turns.pop(shard, None)

    # -- what each shard holds -----------------------------------------------------

    def reserve(self, shard: int, slots: int) -> None:
        """A next claim of `shard` may fill `slots` slots."""
        self._held[shard] += slots

    def unreserve(self, shard: int, slots: int) -> None:
        self._held[shard] -= slots

    def started(self, shard: int) -> None:
        """A job leased from `shard` runs: it holds a slot until `ended`."""
        self._held[shard] += 1

    def ended(self, shard: int) -> None:
        self._held[shard] -= 1

    # -- decisions -------------------------------------------------------------------

    def _starved(self, shard: int) -> bool:
        return self._states[shard] is LoopState.WAITING and self._held[shard] <= 0

    def _queue(self) -> list[int]:
        """The waiting loops in the order they get slots: starved first."""
        waiting = [shard for shard, state in self._states.items() if state is LoopState.WAITING]
        return sorted(waiting, key=lambda shard: (not self._starved(shard), self._turns[shard]))

    def share(self, shard: int, free: int) -> int:
        """How many of the `free` slots loop `shard` may claim now (0: none
        yet, it waits for slots to come back)."""
        if free <= 0 or self._states.get(shard) is not LoopState.WAITING:
            return 0
        queue = self._queue()
        served = min(free, len(queue))
        rank = queue.index(shard)
        if rank >= served:
            return 0
        return free // served + (1 if rank < free % served else 0)

    def crowded(self, shard: int, free_after: int) -> bool:
        """Whether a poll of `shard` that leaves `free_after` slots free
        must be short: another shard's loop is starved and no slot is left
        for it."""
        if free_after > 0:
            return False
        return any(self._starved(other) for other in self._states if other != shard)

    def others_wait(self, shard: int) -> bool:
        """Whether another shard's loop waits to claim (and may be next in
        line once `shard` rests)."""
        return any(
            state is LoopState.WAITING for other, state in self._states.items() if other != shard
        )

    def owed(self, shard: int) -> int:
        """The slots a next claim of `shard` leaves to starved loops of other shards."""
        return sum(1 for other in self._states if other != shard and self._starved(other))
