"""Group commit: one Raft entry in flight, everything that arrives meanwhile in the next.

pysyncobj commits a lone entry in about a millisecond with batching off, but
with many entries in flight its followers truncate already-applied entries
and some callbacks never fire. Keeping exactly one proposal in flight avoids
pipelining altogether, and batching what queues up behind it gives
throughput: under load each entry carries many commands, at idle each command
is its own entry and is acknowledged in milliseconds.

Every entry is stamped with this leader's term (the epoch) and clock. The
proposer runs on the asyncio loop; the Raft adapter calls back on its own
thread, so completions cross over with `call_soon_threadsafe`.

The queue behind the entry in flight is bounded, in commands and in request
bytes (`PROPOSAL_QUEUE_COMMANDS_MAX`, `PROPOSAL_QUEUE_BYTES_MAX` in
raftsched.config): a request whose commands would not fit is refused with
`QueueFull` before any of them is queued, so nothing of it commits. A request
that finds the queue empty is always taken, however big. The leader's own
duties (`TakeOver`, `Tick`, webhook acknowledgements) and read barriers pass
`bounded=False`: each of those loops has at most one command queued at a time
(reads share one barrier), so they cannot grow the queue, and refusing them
would stall the leader rather than shed load.

Outcomes a waiter can see:
- a `Result` from the core (which may be a `Rejected`);
- `NotLeader`: this node is not the leader; nothing was committed;
- `NotCommitted`: Raft refused or discarded the entry (busy, queue full,
  overwritten by a new leader), or the proposer's own queue was full
  (`QueueFull`, raised by `submit` itself); nothing was committed, retry
  shortly;
- `OutcomeUnknown`: the entry was handed to Raft and we do not know whether
  it committed (leadership lost mid-flight, or no answer by the deadline).
  Retrying is safe only for commands that are idempotent in the core.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from raftsched.core import encode_entry
from raftsched.core.jobs.commands import ClaimJobs, LeaseBatch, SubmitJobs
from raftsched.core.jobs.lease_batch import batch_size
from raftsched.core.kernel.commands import Barrier, Command, Entry, Tick
from raftsched.core.kernel.results import Result
from raftsched.limits import PROPOSAL_QUEUE_BYTES_MAX, PROPOSAL_QUEUE_COMMANDS_MAX

log = logging.getLogger("raftsched.proposer")

# Adapter errors after which the entry certainly did not commit.
NOT_LEADER_ERRORS = frozenset({"not_leader"})
NOT_COMMITTED_ERRORS = frozenset({"busy", "queue_full", "discarded", "disk_full"})


# Job changes one entry may carry. Every replica applies an entry in one go
# and every command queued behind it waits for all of it: a 5,000-job Tick
# and a few 1,000-job claims in one entry make an unrelated heartbeat wait
# for ten thousand job changes. Counting commands alone would not see that.
# Measured with bench/hot_minute.py --jobs 300000: 4,000 gave 16,890 leases/s
# and unrelated p99 197 ms; 2,000 gave 20,322/s and 150 ms; 1,000 gave
# 16,238/s and 154 ms (too many entries, each with its fixed Raft cost).
ENTRY_WORK_MAX = 2000


# Commands that change at most this many jobs (a heartbeat, a start, a
# complete, a one-job claim, a read barrier) go first into the next entry,
# and an entry that carries any holds at most EXPRESS_WORK_MAX of bigger work
# beside them. An unrelated heartbeat then waits for the entry in flight and
# one short entry, not for every 1,000-job claim and Tick queued before it.
SMALL_WORK_MAX = 16
EXPRESS_WORK_MAX = 1000


def work_units(command: Command) -> int:
    """About how many jobs a command changes when applied."""
    if isinstance(command, ClaimJobs):
        return max(1, command.max_jobs)
    if isinstance(command, Tick):
        return max(1, command.max_items)
    if isinstance(command, SubmitJobs):
        return max(1, len(command.specs))
    if isinstance(command, LeaseBatch):  # its ops, and the jobs its claim may grant
        return max(1, batch_size(command))
    return 1


class NotLeader(Exception):
    """This node cannot propose; nothing was committed."""


class NotCommitted(Exception):
    """Raft refused or discarded the entry; nothing was committed."""


class QueueFull(NotCommitted):
    """The proposer's queue had no room for the request; none of its
    commands was queued, nothing was committed."""

    def __init__(self, commands_max: int, bytes_max: int) -> None:
        super().__init__(
            f"the leader's proposal queue is full (at most {commands_max} commands "
            f"and {bytes_max} request bytes wait for the next entries)"
        )
        self.commands_max = commands_max
        self.bytes_max = bytes_max


class OutcomeUnknown(Exception):
    """The command may or may not have committed."""


class RaftProposer(Protocol):
    def propose(
        self, data: bytes, callback: Callable[[object | None, str | None], None]
    ) -> None: ...


@dataclass(slots=True)
class _Waiting:
    command: Command
    future: asyncio.Future[Result]
    size_bytes: int


@dataclass(slots=True)
class _InFlight:
    batch_id: int
    items: list[_Waiting]
    watchdog: asyncio.TimerHandle | None = None
    metrics: dict[str, float] = field(default_factory=dict)


class Proposer:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        raft: RaftProposer,
        now_ms: Callable[[], int],
        *,
        commands_per_entry_max: int = 4000,
        entry_bytes_max: int = 8 * 1024 * 1024,
        entry_work_max: int = ENTRY_WORK_MAX,
        commit_timeout_s: float = 10.0,
        queue_commands_max: int = PROPOSAL_QUEUE_COMMANDS_MAX,
        queue_bytes_max: int = PROPOSAL_QUEUE_BYTES_MAX,
        on_entry: Callable[[int, float], None] | None = None,
        on_results: Callable[[list[Command], list[object]], None] | None = None,
        from_raft: Callable[..., None] | None = None,
    ) -> None:
        self._loop = loop
        # How the Raft thread's answer reaches the loop: the node's one
        # hand-over per wake-up (Node.from_raft), else call_soon_threadsafe.
        self._from_raft = from_raft or loop.call_soon_threadsafe
        self._raft = raft
        self._now_ms = now_ms
        self._commands_per_entry_max = commands_per_entry_max
        self._entry_bytes_max = entry_bytes_max
        self._entry_work_max = entry_work_max
        self._commit_timeout_s = commit_timeout_s
        self._on_entry = on_entry
        # Told every committed entry's commands and results (metrics, logs).
        self._on_results = on_results
        self._queue: deque[_Waiting] = deque()
        self._queued_bytes = 0
        self._queue_commands_max = queue_commands_max
        self._queue_bytes_max = queue_bytes_max
        self.refused_commands = 0  # refused with QueueFull, for /metrics
        self._in_flight: _InFlight | None = None
        self._batch_ids = itertools.count(1)
        self._queued_barrier: asyncio.Future[Result] | None = None
        self.term: int | None = None

    # -- leadership -----------------------------------------------------------

    def become_leader(self, term: int) -> None:
        self.term = term
        self._pump()

    def step_down(self) -> None:
        """Stop at once: nothing queued will be proposed under the old term."""
        self.term = None
        while self._queue:
            waiting = self._queue.popleft()
            if not waiting.future.done():
                waiting.future.set_exception(NotLeader())
        self._queued_bytes = 0
        self._queued_barrier = None

    # -- proposing ------------------------------------------------------------

    def submit(
        self, command: Command, size_bytes: int = 0, *, bounded: bool = True
    ) -> asyncio.Future[Result]:
        """Queue a command for the next entry and return its future (raises
        `QueueFull` when the queue has no room and `bounded`)."""
        if self.term is None:
            raise NotLeader()
        # Reads that arrive while a barrier is still queued share it: it will be
        # proposed after all of them arrived.
        queued = self._queued_barrier
        if isinstance(command, Barrier) and queued is not None and not queued.done():
            return queued
        if bounded:
            self._make_room(1, size_bytes)
        future = self._enqueue(command, size_bytes)
        self._pump()
        return future

    def submit_all(
        self, commands: Sequence[Command], size_bytes: int = 0
    ) -> list[asyncio.Future[Result]]:
        """Queue the commands of one request together, all or none: either
        every one gets a future or `QueueFull` is raised and none is queued.
        `size_bytes` is the request's, shared out among its commands."""
        if self.term is None:
            raise NotLeader()
        self._make_room(len(commands), size_bytes)
        share, extra = divmod(size_bytes, max(1, len(commands)))
        futures = [
            self._enqueue(command, share + (1 if index < extra else 0))
            for index, command in enumerate(commands)
        ]
        self._pump()
        return futures

    async def propose(
        self, command: Command, size_bytes: int = 0, *, bounded: bool = True
    ) -> Result:
        return await self.submit(command, size_bytes, bounded=bounded)

    @property
    def queued(self) -> int:
        """Commands waiting behind the entry in flight."""
        return len(self._queue)

    @property
    def queued_bytes(self) -> int:
        """Their request bytes."""
        return self._queued_bytes

    def _make_room(self, commands: int, size_bytes: int) -> None:
        if not self._queue:
            return  # an empty queue takes any request, or a big one could never pass
        if (
            len(self._queue) + commands > self._queue_commands_max
            or self._queued_bytes + size_bytes > self._queue_bytes_max
        ):
            self.refused_commands += commands
            raise QueueFull(self._queue_commands_max, self._queue_bytes_max)

    def _enqueue(self, command: Command, size_bytes: int) -> asyncio.Future[Result]:
        future: asyncio.Future[Result] = self._loop.create_future()
        self._queue.append(_Waiting(command, future, size_bytes))
        self._queued_bytes += size_bytes
        if isinstance(command, Barrier):
            self._queued_barrier = future
        return future

    def _take_batch(self) -> list[_Waiting]:
        """The next entry's commands: small ones first (see SMALL_WORK_MAX),
        then big ones in arrival order up to the work cap, which is lower
        when the entry carries small ones. The first big command is always
        taken, so big work is never starved by a stream of small commands."""
        taken: list[_Waiting] = []
        left: deque[_Waiting] = deque()
        total_bytes = 0
        total_work = 0
        small_taken = False
        for waiting in self._queue:
            if waiting.future.done():  # the waiter gave up before it was sent
                continue
            work = work_units(waiting.command)
            if (
                work > SMALL_WORK_MAX
                or len(taken) >= self._commands_per_entry_max
                or (taken and total_bytes + waiting.size_bytes > self._entry_bytes_max)
            ):
                left.append(waiting)
                continue
            taken.append(waiting)
            total_bytes += waiting.size_bytes
            total_work += work
            small_taken = True
        work_max = EXPRESS_WORK_MAX if small_taken else self._entry_work_max
        queue, self._queue = left, deque()
        big_taken = full = False
        for waiting in queue:
            work = work_units(waiting.command)
            if work <= SMALL_WORK_MAX or full:
                self._queue.append(waiting)
                continue
            if big_taken and (
                total_work + work > work_max
                or total_bytes + waiting.size_bytes > self._entry_bytes_max
                or len(taken) >= self._commands_per_entry_max
            ):
                full = True  # later big commands must not overtake this one
                self._queue.append(waiting)
                continue
            taken.append(waiting)
            total_bytes += waiting.size_bytes
            total_work += work
            big_taken = True
        self._queued_bytes = sum(waiting.size_bytes for waiting in self._queue)
        self._queued_barrier = None
        return taken

    def _pump(self) -> None:
        if self._in_flight is not None or not self._queue or self.term is None:
            return
        batch = self._take_batch()
        if not batch:
            return
        entry = Entry(self.term, self._now_ms(), tuple(w.command for w in batch))
        try:
            data = encode_entry(entry)
        except Exception:  # a bug in the codec must fail these requests, not the loop
            log.exception("cannot encode entry")
            for waiting in batch:
                waiting.future.set_exception(OutcomeUnknown("entry could not be encoded"))
            self._loop.call_soon(self._pump)
            return
        in_flight = _InFlight(next(self._batch_ids), batch)
        in_flight.metrics["sent"] = self._loop.time()
        in_flight.watchdog = self._loop.call_later(
            self._commit_timeout_s, self._expire, in_flight.batch_id
        )
        self._in_flight = in_flight
        batch_id = in_flight.batch_id

        def callback(result: object | None, error: str | None) -> None:
            # Runs on the Raft thread.
            self._from_raft(self._finish, batch_id, result, error)

        try:
            self._raft.propose(data, callback)
        except Exception:
            log.exception("raft refused the proposal")
            self._finish(batch_id, None, "not_leader")

    def _finish(self, batch_id: int, result: object | None, error: str | None) -> None:
        in_flight = self._in_flight
        if in_flight is None or in_flight.batch_id != batch_id:
            return  # answered after its deadline; its waiters were already told
        self._in_flight = None
        if in_flight.watchdog is not None:
            in_flight.watchdog.cancel()
        if self._on_entry is not None:
            elapsed = self._loop.time() - in_flight.metrics["sent"]
            self._on_entry(len(in_flight.items), elapsed)
        self._resolve(in_flight.items, result, error)
        self._pump()

    def _resolve(self, items: list[_Waiting], result: object | None, error: str | None) -> None:
        if error is None and isinstance(result, list) and len(result) == len(items):
            if self._on_results is not None:
                self._on_results([w.command for w in items], result)
            for waiting, outcome in zip(items, result, strict=True):
                if not waiting.future.done():
                    waiting.future.set_result(outcome)
            return
        if error is None:
            log.error("entry result does not match its commands: %r", result)
            failure: Exception = OutcomeUnknown("malformed apply result")
        elif error in NOT_LEADER_ERRORS:
            failure = NotLeader()
        elif error in NOT_COMMITTED_ERRORS:
            failure = NotCommitted(error)
        else:
            failure = OutcomeUnknown(error)
        for waiting in items:
            if not waiting.future.done():
                waiting.future.set_exception(failure)

    def _expire(self, batch_id: int) -> None:
        """Tell the waiters of an unanswered entry that its outcome is unknown.

        The entry stays in flight until Raft answers (the adapter promises one
        answer per proposal): sending another now would pipeline, which is
        what this class exists to avoid. Commands queue meanwhile.
        """
        in_flight = self._in_flight
        if in_flight is None or in_flight.batch_id != batch_id:
            return
        log.warning("entry %d not answered in %.1fs", batch_id, self._commit_timeout_s)
        self._resolve(in_flight.items, None, "timeout")
