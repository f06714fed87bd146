"""Which jobs a claim takes: queue gates, the reserved high-priority share,
and weighted fair sharing among tenants.

For each job a claim grants, every queue it names offers one candidate and
the best (highest priority, then oldest) wins, as before flow control. A
queue offers nothing while it is paused, at its concurrency limit, out of
tokens, or while its circuit is open and the next probe is not yet due. Its
candidate is chosen so:

1. Reserved share: every other claim from a queue belongs to high-priority
   work (priority above 0) when there is any: the highest-priority, oldest
   such job of any tenant under its concurrency limit. So high-priority jobs
   get at least half of a queue's claims however long the backlog of
   low-priority jobs is, and low-priority work still gets the other half.
2. Otherwise weighted round robin (deficit round robin with unit cost): the
   tenants with claimable jobs in the queue are a ring sorted by name; the
   tenant whose turn it is gets up to `weight` claims in a row, then the
   turn passes to the next tenant. Within a tenant, highest priority first,
   then submission order. A tenant at its concurrency limit is skipped.

So a tenant's next job starts within the sum of the other active tenants'
weights (in claims from that queue), however many jobs they have queued.
Each pick visits at most `RING_VISITS_MAX` tenants (those at their limit are
skipped), and blocked ordering-key jobs are parked off the heaps, so a
claim's cost does not grow with the backlog.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from typing import Final, NamedTuple

from raftsched.core.jobs import reconcile_book
from raftsched.core.jobs.flow import (
    MICRO,
    Flow,
    QueueFlow,
    drop_if_idle,
    flow_of,
    guard_queue,
    tenant_flow,
)
from raftsched.core.kernel.model import PENDING, Job
from raftsched.core.kernel.runnable_index import Lanes
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.state import State

RING_VISITS_MAX: Final = 1_000
_UNLIMITED: Final = 1 << 62


class Pick(NamedTuple):
    job: Job
    tenant: str | None  # None: the reserved high-priority share
    left: int  # claims left in the tenant's turn, this one included
    # Nothing to record: one tenant only and no bucket or circuit to settle,
    # so the queue's record is left alone (the common case stays cheap).
    stateless: bool = False


def _at_limit(state: State, flow: Flow, tenant: str) -> bool:
    settings = flow.tenants.get(tenant)
    if settings is None or settings.concurrency_limit is None:
        return False
    return state.runnable.tenants[tenant][1] >= settings.concurrency_limit


def _high_top(lanes: Lanes) -> Job | None:
    heap = lanes.high
    while heap and heap[0][2].status != PENDING:
        heapq.heappop(heap)
    return heap[0][2] if heap else None


def pick(state: State, lanes: Lanes, record: QueueFlow | None) -> Pick | None:
    """The queue's next job by the share rules (no change but stale heap entries)."""
    flow = flow_of(state)
    if record is not None and record.high_turn:
        job = _high_top(lanes)
        if job is not None and not _at_limit(state, flow, job.tenant):
            return Pick(job, None, 0)
    ring = lanes.ring
    if len(ring) == 1 and (
        record is None or (record.rate_milli is None and not record.circuit_open)
    ):
        tenant = ring[0]
        if _at_limit(state, flow, tenant):
            return None
        return Pick(lanes.top(tenant), tenant, 0, stateless=True)
    cursor = None if record is None else record.cursor
    left = 0 if record is None else record.left
    if cursor is None:
        index = 0
    elif left > 0:
        index = bisect_left(ring, cursor)
        if index == len(ring) or ring[index] != cursor:
            left = 0  # that tenant has nothing left: the turn moves on
    else:
        index = bisect_right(ring, cursor)
    for _ in range(min(len(ring), RING_VISITS_MAX)):
        if index >= len(ring):
            index = 0
        tenant = ring[index]
        if not _at_limit(state, flow, tenant):
            if left <= 0:
                left = tenant_flow(flow, tenant).weight
            return Pick(lanes.top(tenant), tenant, left)
        index += 1
        left = 0
    return None


def gate_budget(state: State, queue: str, record: QueueFlow | None, now_ms: int) -> int:
    """How many jobs the queue's own limits let one claim at `now_ms` take."""
    if record is None:
        return _UNLIMITED
    if record.paused:
        return 0
    budget = _UNLIMITED
    if record.concurrency_limit is not None:
        counts = state.queue_counts.get(queue)
        leased = 0 if counts is None else counts[1]
        budget = min(budget, record.concurrency_limit - leased)
    if record.rate_milli is not None:
        budget = min(budget, record.tokens_at(now_ms) // MICRO)
    if record.circuit_open:
        budget = min(budget, 1 if now_ms >= record.probe_at_ms else 0)
    return max(0, budget)


class _Source:
    __slots__ = ("queue", "budget", "granted", "guarded")

    def __init__(self, queue: str, budget: int) -> None:
        self.queue = queue
        self.budget = budget
        self.granted = 0
        self.guarded: QueueFlow | None = None


class Selector:
    """The jobs of one ClaimJobs, one at a time; `finish` settles the buckets."""

    __slots__ = ("state", "savepoint", "sources")

    def __init__(self, state: State, queues: tuple[str, ...], savepoint: Savepoint) -> None:
        self.state = state
        self.savepoint = savepoint
        records = flow_of(state).queues
        self.sources = [
            _Source(queue, gate_budget(state, queue, records.get(queue), state.now_ms))
            for queue in (queues if len(queues) == 1 else dict.fromkeys(queues))
        ]

    def pop(self) -> Job | None:
        """Take the best candidate across the claimed queues out of its heap."""
        records = flow_of(self.state).queues
        index_queues = self.state.runnable.queues
        if len(self.sources) == 1:  # the common case, without comparisons
            source = self.sources[0]
            lanes = index_queues.get(source.queue)
            if source.budget <= 0 or lanes is None:
                return None
            found = pick(self.state, lanes, records.get(source.queue))
            if found is None:
                return None
            self._take(source, lanes, found)
            return found.job
        best: tuple[_Source, Lanes, Pick] | None = None
        for source in self.sources:
            lanes = index_queues.get(source.queue)
            if source.budget <= 0 or lanes is None:
                continue
            found = pick(self.state, lanes, records.get(source.queue))
            if found is None:
                continue
            job = found.job
            if best is None or (-job.priority, job.seq) < (-best[2].job.priority, best[2].job.seq):
                best = (source, lanes, found)
        if best is None:
            return None
        source, lanes, found = best
        self._take(source, lanes, found)
        return found.job

    def _take(self, source: _Source, lanes: Lanes, found: Pick) -> None:
        source.budget -= 1
        source.granted += 1
        if found.stateless:
            assert found.tenant is not None
            heapq.heappop(lanes.heaps[found.tenant])
            return
        record = source.guarded
        if record is None:
            record = source.guarded = guard_queue(self.state, source.queue, self.savepoint)
        if found.tenant is None:
            heapq.heappop(lanes.high)  # `pick` left the job on top
            record.high_turn = False
        else:
            heapq.heappop(lanes.heaps[found.tenant])
            record.cursor = found.tenant
            record.left = found.left - 1
            record.high_turn = True

    def finish(self) -> None:
        now_ms = self.state.now_ms
        for source in self.sources:
            record = source.guarded
            if record is None:
                continue
            if record.rate_milli is not None:
                record.tokens_micro = record.tokens_at(now_ms) - source.granted * MICRO
                record.refilled_at_ms = now_ms
            if record.circuit_open:
                record.probe_at_ms = now_ms + record.circuit_probe_ms
            drop_if_idle(self.state, source.queue)


def claimable_at_ms(state: State, queues: tuple[str, ...], now_ms: int) -> int | None:
    """When a claim of `queues` could next be granted something: `now_ms` if
    now, a later instant if only time stands in the way (tokens refilling,
    the circuit's next probe), None if only another command can change it."""
    records = flow_of(state).queues
    # Open reconciliations (jobs.reconcile) bypass the queue's limits.
    soonest = reconcile_book.claimable_at_ms(state, queues)
    if soonest is not None and soonest <= now_ms:
        return now_ms
    for queue in dict.fromkeys(queues):
        lanes = state.runnable.queues.get(queue)
        if lanes is None:
            continue
        record = records.get(queue)
        at_ms = _gates_open_at_ms(state, queue, record, now_ms)
        if at_ms is None or pick(state, lanes, record) is None:
            continue
        if at_ms <= now_ms:
            return now_ms
        soonest = at_ms if soonest is None else min(soonest, at_ms)
    return soonest


def _gates_open_at_ms(
    state: State, queue: str, record: QueueFlow | None, now_ms: int
) -> int | None:
    if record is None:
        return now_ms
    if record.paused:
        return None
    if record.concurrency_limit is not None:
        counts = state.queue_counts.get(queue)
        if counts is not None and counts[1] >= record.concurrency_limit:
            return None
    at_ms = now_ms
    if record.rate_milli is not None:
        missing = MICRO - record.tokens_at(now_ms)
        if missing > 0:
            at_ms = now_ms + -(-missing // record.rate_milli)
    if record.circuit_open and record.probe_at_ms > at_ms:
        at_ms = record.probe_at_ms
    return at_ms
