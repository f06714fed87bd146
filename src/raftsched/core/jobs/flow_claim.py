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

Kinds (cluster version 8). A queue's jobs of each kind are in a lane of
their own (`runnable_index`). A claim that names kinds (`ClaimJobsOfKinds`,
a worker's handlers) picks among the lanes of those kinds, at most as many
jobs of each as the claim allows; any other claim among all of the queue's
lanes. Over several lanes a pick is exactly the one over one lane holding
their jobs: the ring is the union of theirs, the tenant's candidate the best
of its tops, the high-priority candidate the best of their high tops. The
rules above therefore hold among the jobs a claim may take, and a queue
whose jobs have no kind is picked from as before.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping
from typing import Final, NamedTuple

from raftsched.core.jobs import reconcile_book
from raftsched.core.jobs.flow import (
    FRESH_QUEUE,
    MICRO,
    Bucket,
    Flow,
    QueueFlow,
    bucket_tokens,
    drop_if_idle,
    flow_of,
    guard_queue,
    queue_gates,
    tenant_concurrency_limit,
    tenant_flow,
)
from raftsched.core.jobs.quota_book import QueueQuota, queue_quota
from raftsched.core.kernel.model import PENDING, Job
from raftsched.core.kernel.runnable_index import Lanes, claim_key, lanes_left, lanes_of
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.state import State

RING_VISITS_MAX: Final = 1_000
_UNLIMITED: Final = 1 << 62


class Pick(NamedTuple):
    job: Job
    tenant: str | None  # None: the reserved high-priority share
    left: int  # claims left in the tenant's turn, this one included
    # The lane whose heap (the tenant's, or `high`) has the job on top.
    lanes: Lanes
    # Nothing to record: one tenant only and no bucket or circuit to settle,
    # so the queue's record is left alone (the common case stays cheap).
    stateless: bool = False


def _at_limit(state: State, flow: Flow, tenant: str) -> bool:
    """Whether the tenant holds as many leases as this shard allows it."""
    limit = tenant_concurrency_limit(state, flow, tenant)
    if limit is None:
        return False
    return state.runnable.tenants[tenant][1] >= limit


def _high_top(lanes: Lanes) -> Job | None:
    heap = lanes.high
    while heap and heap[0][2].status != PENDING:
        heapq.heappop(heap)
    return heap[0][2] if heap else None


def pick(state: State, lanes_list: list[Lanes], record: QueueFlow | None) -> Pick | None:
    """The queue's next job by the share rules among the jobs of
    `lanes_list` (not empty), as if they were one lane (no change but stale
    heap entries)."""
    if len(lanes_list) > 1:
        return _pick_among(state, lanes_list, record)
    return _pick_in(state, lanes_list[0], record)


def _pick_in(state: State, lanes: Lanes, record: QueueFlow | None) -> Pick | None:
    """`pick` in one lane."""
    flow = flow_of(state)
    if record is not None and record.high_turn:
        job = _high_top(lanes)
        if job is not None and not _at_limit(state, flow, job.tenant):
            return Pick(job, None, 0, lanes)
    ring = lanes.ring
    if len(ring) == 1 and (
        record is None or (record.rate_milli is None and not record.circuit_open)
    ):
        tenant = ring[0]
        if _at_limit(state, flow, tenant):
            return None
        return Pick(lanes.top(tenant), tenant, 0, lanes, stateless=True)
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
            return Pick(lanes.top(tenant), tenant, left, lanes)
        index += 1
        left = 0
    return None


def _pick_among(state: State, lanes_list: list[Lanes], record: QueueFlow | None) -> Pick | None:
    """`pick` over several lanes: the same rules on the union of their rings
    (each ring sorted, so the union's next tenant after any name is the least
    of theirs), a tenant's job the best of its tops across the lanes."""
    flow = flow_of(state)
    if record is not None and record.high_turn:
        best: tuple[Job, Lanes] | None = None
        for lanes in lanes_list:
            job = _high_top(lanes)
            if job is not None and (best is None or _before(job, best[0])):
                best = (job, lanes)
        if best is not None and not _at_limit(state, flow, best[0].tenant):
            return Pick(best[0], None, 0, best[1])
    rings = [lanes.ring for lanes in lanes_list]
    first = min(ring[0] for ring in rings)
    if first == max(ring[-1] for ring in rings) and (
        record is None or (record.rate_milli is None and not record.circuit_open)
    ):
        if _at_limit(state, flow, first):
            return None
        job, lanes = _tenant_top(lanes_list, first)
        return Pick(job, first, 0, lanes, stateless=True)
    cursor = None if record is None else record.cursor
    left = 0 if record is None else record.left
    tenant: str | None
    if cursor is None:
        tenant = first
    elif left > 0:
        tenant = _next_tenant(rings, cursor, bisect_left)
        if tenant != cursor:
            left = 0  # that tenant has nothing left: the turn moves on
    else:
        tenant = _next_tenant(rings, cursor, bisect_right)
    start: str | None = None
    for _ in range(RING_VISITS_MAX):
        if tenant is None:
            tenant = first  # past the last name: round again
        if tenant == start:
            return None  # every tenant is at its limit
        if start is None:
            start = tenant
        if not _at_limit(state, flow, tenant):
            if left <= 0:
                left = tenant_flow(flow, tenant).weight
            job, lanes = _tenant_top(lanes_list, tenant)
            return Pick(job, tenant, left, lanes)
        tenant = _next_tenant(rings, tenant, bisect_right)
        left = 0
    return None


def _before(job: Job, other: Job) -> bool:
    return (-job.priority, job.seq) < (-other.priority, other.seq)


def _next_tenant(
    rings: list[list[str]], name: str, bisect: Callable[[list[str], str], int]
) -> str | None:
    """The least tenant at (`bisect_left`) or after (`bisect_right`) `name`
    in any of `rings`; None past the last."""
    found: str | None = None
    for ring in rings:
        at = bisect(ring, name)
        if at < len(ring) and (found is None or ring[at] < found):
            found = ring[at]
    return found


def _tenant_top(lanes_list: list[Lanes], tenant: str) -> tuple[Job, Lanes]:
    """The tenant's best job across the lanes that hold one of its jobs."""
    best: tuple[Job, Lanes] | None = None
    for lanes in lanes_list:
        if tenant in lanes.counts:
            job = lanes.top(tenant)
            if best is None or _before(job, best[0]):
                best = (job, lanes)
    assert best is not None, "a tenant of the rings has a job in one of the lanes"
    return best


def gate_budget(state: State, queue: str, record: QueueFlow | None, now_ms: int) -> int:
    """How many jobs the queue's own limits (in this shard: its quotas where
    it has them, `flow.queue_gates`) let one claim at `now_ms` take."""
    return _budget(state, queue, record, queue_quota(state, queue), now_ms)


def _budget(
    state: State, queue: str, record: QueueFlow | None, quota: QueueQuota | None, now_ms: int
) -> int:
    if quota is None:
        if record is None:
            return _UNLIMITED
    elif record is None:
        record = FRESH_QUEUE  # a rate quota keeps a record: only a count quota here
    if record.paused:
        return 0
    concurrency, bucket = queue_gates(record, quota)
    budget = _UNLIMITED
    if concurrency is not None:
        counts = state.queue_counts.get(queue)
        leased = 0 if counts is None else counts[1]
        budget = min(budget, concurrency - leased)
    if bucket is not None:
        budget = min(budget, bucket_tokens(record, now_ms, bucket) // MICRO)
    if record.circuit_open:
        budget = min(budget, 1 if now_ms >= record.probe_at_ms else 0)
    return max(0, budget)


class _Source:
    __slots__ = ("queue", "budget", "bucket", "granted", "guarded")

    def __init__(self, queue: str, budget: int, bucket: Bucket | None) -> None:
        self.queue = queue
        self.budget = budget
        # The bucket its grants are taken from (`flow.bucket_of`), if any.
        self.bucket = bucket
        self.granted = 0
        self.guarded: QueueFlow | None = None


class Selector:
    """The jobs of one claim, one at a time; `finish` settles the buckets.

    `kinds`: how many jobs of each kind (None: without a kind; "*": of every
    kind not named) the claim may still take, and none of another kind;
    None: any job, as a plain `ClaimJobs` takes."""

    __slots__ = ("state", "savepoint", "sources", "kinds")

    def __init__(
        self,
        state: State,
        queues: tuple[str, ...],
        savepoint: Savepoint,
        kinds: dict[str | None, int] | None = None,
    ) -> None:
        self.state = state
        self.savepoint = savepoint
        records = flow_of(state).queues
        now_ms = state.now_ms
        self.sources = []
        for queue in queues if len(queues) == 1 else dict.fromkeys(queues):
            record, quota = records.get(queue), queue_quota(state, queue)
            budget = _budget(state, queue, record, quota, now_ms)
            self.sources.append(_Source(queue, budget, queue_gates(record, quota)[1]))
        self.kinds = kinds

    def _pick(self, source: _Source, record: QueueFlow | None) -> Pick | None:
        """The source's candidate, from the lanes of the claim's kinds."""
        if source.budget <= 0:
            return None
        index = self.state.runnable
        if self.kinds is None and source.queue not in index.kinds:
            lanes = index.queues.get(source.queue)  # no kinds: the one lane, if any
            return None if lanes is None else _pick_in(self.state, lanes, record)
        if self.kinds is None:
            lanes_list = lanes_of(index, source.queue)
        else:
            lanes_list = lanes_left(index, source.queue, self.kinds)
        return pick(self.state, lanes_list, record) if lanes_list else None

    def pop(self) -> Job | None:
        """Take the best candidate across the claimed queues out of its heap."""
        records = flow_of(self.state).queues
        if len(self.sources) == 1:  # the common case, without comparisons
            source = self.sources[0]
            found = self._pick(source, records.get(source.queue))
            if found is None:
                return None
            self._take(source, found)
            return found.job
        best: tuple[_Source, Pick] | None = None
        for source in self.sources:
            found = self._pick(source, records.get(source.queue))
            if found is None:
                continue
            if best is None or _before(found.job, best[1].job):
                best = (source, found)
        if best is None:
            return None
        source, found = best
        self._take(source, found)
        return found.job

    def _take(self, source: _Source, found: Pick) -> None:
        source.budget -= 1
        source.granted += 1
        kinds = self.kinds
        if kinds is not None:
            kinds[claim_key(kinds, found.job.kind)] -= 1
        lanes = found.lanes
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
            bucket = source.bucket
            if bucket is not None and source.granted:
                # A pick with nothing to record (one tenant, the bucket a
                # quota's) left the record alone: it is guarded here.
                if record is None:
                    record = source.guarded = guard_queue(self.state, source.queue, self.savepoint)
                tokens = bucket_tokens(record, now_ms, bucket)
                record.tokens_micro = tokens - source.granted * MICRO
                record.refilled_at_ms = now_ms
            if record is None:
                continue
            if record.circuit_open:
                record.probe_at_ms = now_ms + record.circuit_probe_ms
            drop_if_idle(self.state, source.queue)


def claimable_at_ms(
    state: State,
    queues: tuple[str, ...],
    now_ms: int,
    kinds: Mapping[str | None, int] | None = None,
) -> int | None:
    """When a claim of `queues` (of jobs of `kinds` only, as many as each
    allows, as `ClaimJobsOfKinds` takes them; None: of any job) could next
    be granted something: `now_ms` if now, a later instant if only time
    stands in the way (tokens refilling, the circuit's next probe), None if
    only another command can change it."""
    records = flow_of(state).queues
    # Open reconciliations (jobs.reconcile) bypass the queue's limits.
    soonest = reconcile_book.claimable_at_ms(state, queues)
    if soonest is not None and soonest <= now_ms:
        return now_ms
    for queue in dict.fromkeys(queues):
        index = state.runnable
        lanes_list = lanes_of(index, queue) if kinds is None else lanes_left(index, queue, kinds)
        if not lanes_list:
            continue
        record = records.get(queue)
        at_ms = _gates_open_at_ms(state, queue, record, now_ms)
        if at_ms is None or pick(state, lanes_list, record) is None:
            continue
        if at_ms <= now_ms:
            return now_ms
        soonest = at_ms if soonest is None else min(soonest, at_ms)
    return soonest


def _gates_open_at_ms(
    state: State, queue: str, record: QueueFlow | None, now_ms: int
) -> int | None:
    quota = queue_quota(state, queue)
    if quota is None:
        if record is None:
            return now_ms
    elif record is None:
        record = FRESH_QUEUE  # as in `_budget`
    if record.paused:
        return None
    concurrency, bucket = queue_gates(record, quota)
    if concurrency is not None:
        counts = state.queue_counts.get(queue)
        if counts is not None and counts[1] >= concurrency:
            return None
    at_ms = now_ms
    if bucket is not None:
        missing = MICRO - bucket_tokens(record, now_ms, bucket)
        if missing > 0:
            rate_milli, burst = bucket
            if rate_milli == 0 or burst == 0:
                return None  # a quota of nothing: no token comes
            at_ms = now_ms + -(-missing // rate_milli)
    if record.circuit_open and record.probe_at_ms > at_ms:
        at_ms = record.probe_at_ms
    return at_ms
