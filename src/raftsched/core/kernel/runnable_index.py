"""The runnable index: which pending jobs a claim may take, by queue and tenant.

Everything here is derived from the jobs and rebuilt on snapshot decode; the
replicated flow-control settings and counters (weights, limits, token
buckets, circuits, fair-share cursors) live in the `flow` section.

Structure
---------
- `queues[queue]` is a `Lanes`: one heap per tenant, `(-priority, seq, job)`,
  holding the queue's *claimable* pending jobs of that tenant that have no
  kind, an exact count of them per tenant, the sorted `ring` of tenants whose
  count is positive (the fair-share rotation walks it), and `high`, a heap of
  the claimable jobs with priority above 0 across tenants (the reserved
  high-priority share).
- `kinds[queue][kind]` is the `Lanes` of the queue's claimable jobs of that
  kind (cluster version 8). A claim takes from the lanes of the kinds it
  names (`lanes_left`), or from all of the queue's (`lanes_of`); its choice over
  several lanes is the one it would make were their jobs in one lane
  (`flow_claim`), so how jobs are split into lanes never changes an outcome.
  A lane exists only while it holds a claimable job.
- `tenants[tenant]` is `[queued, leased]`: jobs scheduled, pending or waiting
  to retry, and jobs claimed or running (the tenant's concurrency).
- `keys[(tenant, ordering_key)]` is a deque of the key's jobs that still hold
  the key, in submission order: every job of the key that is not succeeded
  or cancelled (a dead-lettered job keeps holding it). Only the head may be
  claimed; a pending job behind it is *parked*: it is in no heap at all, so
  that a long chain of jobs waiting for one key costs nothing per claim.
  `blocked` maps the keys whose head is dead-lettered to that job.

Heap entries are valid while their job is pending; a job in a lane is
always the head of its key (or has none), and stays so until it is final, so
that one test suffices. Stale entries are dropped when they reach the top.
Counts, the ring and the key deques are exact, so a replica that applied the
log and one that decoded a snapshot make the same choices.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Collection, Iterator, Mapping
from itertools import compress
from operator import neg
from typing import Final

from raftsched.core.kernel.model import (
    CANCELLED,
    DEAD_LETTER,
    LEASED_STATUSES,
    PENDING,
    QUEUED_STATUSES,
    SUCCEEDED,
    Job,
    JobColumns,
    count_pairs,
    uniform,
)
from raftsched.core.kernel.validate import OTHER_KINDS

RunnableEntry = tuple[int, int, Job]
OrderingKey = tuple[str, str]

# Jobs with a priority above this get the reserved share (see flow_claim).
HIGH_PRIORITY_ABOVE: Final = 0
_RELEASED: Final = frozenset({SUCCEEDED, CANCELLED})


class Lanes:
    """The claimable pending jobs of one queue."""

    __slots__ = ("heaps", "counts", "ring", "high")

    def __init__(self) -> None:
        self.heaps: dict[str, list[RunnableEntry]] = {}
        self.counts: dict[str, int] = {}
        self.ring: list[str] = []
        self.high: list[RunnableEntry] = []

    def top(self, tenant: str) -> Job:
        """The tenant's next job (its count is positive, so one is valid)."""
        heap = self.heaps[tenant]
        while heap[0][2].status != PENDING:
            heapq.heappop(heap)
        return heap[0][2]

    def claimable(self) -> int:
        return sum(self.counts.values())


class RunnableIndex:
    __slots__ = ("queues", "kinds", "tenants", "keys", "blocked")

    def __init__(self) -> None:
        self.queues: dict[str, Lanes] = {}
        self.kinds: dict[str, dict[str, Lanes]] = {}
        self.tenants: dict[str, list[int]] = {}
        self.keys: dict[OrderingKey, deque[Job]] = {}
        self.blocked: dict[OrderingKey, Job] = {}


def lanes_of(index: RunnableIndex, queue: str) -> list[Lanes]:
    """Every lane of `queue`: what a claim without kinds takes from."""
    plain = index.queues.get(queue)
    found = [] if plain is None else [plain]
    by_kind = index.kinds.get(queue)
    if by_kind is not None:
        found += by_kind.values()
    return found


def lane_of(index: RunnableIndex, queue: str, kind: str | None) -> Lanes | None:
    """The lane of `queue`'s jobs of `kind` (None: without a kind), if any."""
    if kind is None:
        return index.queues.get(queue)
    by_kind = index.kinds.get(queue)
    return None if by_kind is None else by_kind.get(kind)


def lanes_left(index: RunnableIndex, queue: str, quotas: Mapping[str | None, int]) -> list[Lanes]:
    """The lanes of the kinds a claim of kinds may still take from (`quotas`:
    how many more of each; "*" for every kind it does not name)."""
    found = []
    for kind, left in quotas.items():
        if left > 0 and kind != OTHER_KINDS:
            lanes = lane_of(index, queue, kind)
            if lanes is not None:
                found.append(lanes)
    by_kind = index.kinds.get(queue)
    if quotas.get(OTHER_KINDS, 0) > 0:
        plain = index.queues.get(queue)
        if plain is not None and None not in quotas:
            found.append(plain)
        if by_kind is not None:
            found += (lanes for kind, lanes in by_kind.items() if kind not in quotas)
    return found


def claim_key(quotas: Collection[str | None], kind: str | None) -> str | None:
    """Which of a claim's kinds a job of `kind` counts against."""
    return kind if kind in quotas else OTHER_KINDS


def all_lanes(index: RunnableIndex) -> Iterator[tuple[str, Lanes]]:
    """Every lane with its queue's name."""
    yield from index.queues.items()
    for queue, by_kind in index.kinds.items():
        for lanes in by_kind.values():
            yield queue, lanes


def has_lanes(index: RunnableIndex, queue: str) -> bool:
    """Whether the queue has a claimable job (of any kind)."""
    return queue in index.queues or queue in index.kinds


def claimable_count(index: RunnableIndex, queue: str) -> int:
    return sum(lanes.claimable() for lanes in lanes_of(index, queue))


def _lanes_for(index: RunnableIndex, job: Job) -> Lanes:
    """The lane of a claimable job, made if missing."""
    kind = job.kind
    if kind is None:
        lanes = index.queues.get(job.queue)
        if lanes is None:
            lanes = index.queues[job.queue] = Lanes()
        return lanes
    by_kind = index.kinds.get(job.queue)
    if by_kind is None:
        by_kind = index.kinds[job.queue] = {}
    lanes = by_kind.get(kind)
    if lanes is None:
        lanes = by_kind[kind] = Lanes()
    return lanes


def _drop_lanes(index: RunnableIndex, job: Job) -> None:
    """The job's lane holds nothing claimable any more."""
    if job.kind is None:
        del index.queues[job.queue]
        return
    by_kind = index.kinds[job.queue]
    del by_kind[job.kind]
    if not by_kind:
        del index.kinds[job.queue]


def is_head(index: RunnableIndex, job: Job) -> bool:
    key = job.ordering_key
    if key is None:
        return True
    chain = index.keys.get((job.tenant, key))
    return chain is not None and chain[0] is job


def push(index: RunnableIndex, job: Job) -> None:
    """`job` just became pending: into its lane, or parked behind its key."""
    if job.ordering_key is not None:
        chain = index.keys[job.tenant, job.ordering_key]
        if chain[0] is not job:
            return
        index.blocked.pop((job.tenant, job.ordering_key), None)
    _into_lane(index, job)


def _into_lane(index: RunnableIndex, job: Job) -> None:
    lanes = _lanes_for(index, job)
    tenant = job.tenant
    entry = (-job.priority, job.seq, job)
    heap = lanes.heaps.get(tenant)
    if heap is None:
        lanes.heaps[tenant] = [entry]
    else:
        heapq.heappush(heap, entry)
    if job.priority > HIGH_PRIORITY_ABOVE:
        heapq.heappush(lanes.high, entry)
    count = lanes.counts.get(tenant, 0)
    if count == 0:
        insort(lanes.ring, tenant)
    lanes.counts[tenant] = count + 1


def _out_of_lane(index: RunnableIndex, job: Job) -> None:
    lanes = index.queues[job.queue] if job.kind is None else index.kinds[job.queue][job.kind]
    tenant = job.tenant
    count = lanes.counts[tenant] - 1
    if count:
        lanes.counts[tenant] = count
        return
    del lanes.counts[tenant]
    del lanes.heaps[tenant]  # only stale entries are left in it
    ring = lanes.ring
    del ring[bisect_left(ring, tenant)]
    if not ring:
        _drop_lanes(index, job)


def add_new(index: RunnableIndex, job: Job) -> None:
    """A job was created (before it is pushed, if pending)."""
    counts = index.tenants.get(job.tenant)
    if counts is None:
        counts = index.tenants[job.tenant] = [0, 0]
    status = job.status
    if status in QUEUED_STATUSES:
        counts[0] += 1
    elif status in LEASED_STATUSES:
        counts[1] += 1
    key = job.ordering_key
    if key is not None and status not in _RELEASED:
        chain = index.keys.get((job.tenant, key))
        if chain is None:
            index.keys[job.tenant, key] = deque((job,))
            if status == DEAD_LETTER:
                index.blocked[job.tenant, key] = job
        else:
            chain.append(job)


def add_queued(index: RunnableIndex, tenant: str, count: int) -> None:
    """`count` queued jobs of `tenant` that have no job object (`kernel.wheel`)."""
    counts = index.tenants.get(tenant)
    if counts is None:
        counts = index.tenants[tenant] = [0, 0]
    counts[0] += count


def status_changed(index: RunnableIndex, job: Job, old_status: str, new_status: str) -> None:
    if old_status == DEAD_LETTER and job.ordering_key is not None:
        # Reconciled again (jobs.reconcile): the head holds its key while it
        # waits, as a running job does, no longer as a blocked dead letter.
        key = (job.tenant, job.ordering_key)
        if index.blocked.get(key) is job:
            del index.blocked[key]
    counts = index.tenants[job.tenant]
    if old_status in QUEUED_STATUSES:
        counts[0] -= 1
    elif old_status in LEASED_STATUSES:
        counts[1] -= 1
    if new_status in QUEUED_STATUSES:
        counts[0] += 1
    elif new_status in LEASED_STATUSES:
        counts[1] += 1
    if old_status == PENDING and (job.ordering_key is None or is_head(index, job)):
        _out_of_lane(index, job)


def finished(index: RunnableIndex, job: Job, jobs: dict[str, Job]) -> None:
    """`job` reached a final status: a succeeded or cancelled head releases its
    key; a dead-lettered head keeps holding it, visibly, until replay or cancel."""
    key = job.ordering_key
    if key is None:
        return
    chain = index.keys.get((job.tenant, key))
    if chain is None or chain[0] is not job:
        return  # not the head: it is skipped when it reaches the front
    if job.status == DEAD_LETTER:
        index.blocked[job.tenant, key] = job
        return
    _settle(index, (job.tenant, key), chain, jobs)


def purged(index: RunnableIndex, job: Job, jobs: dict[str, Job]) -> None:
    """A finished job left the state (retention): a dead-lettered head releases its key."""
    key = job.ordering_key
    if key is None:
        return
    chain = index.keys.get((job.tenant, key))
    if chain is not None and chain[0] is job:
        _settle(index, (job.tenant, key), chain, jobs)


def _settle(
    index: RunnableIndex, key: OrderingKey, chain: deque[Job], jobs: dict[str, Job]
) -> None:
    """Drop released jobs from the front; the new head becomes claimable."""
    index.blocked.pop(key, None)
    while chain and (chain[0].status in _RELEASED or jobs.get(chain[0].id) is not chain[0]):
        chain.popleft()
    if not chain:
        del index.keys[key]
        return
    head = chain[0]
    if head.status == PENDING:
        _into_lane(index, head)
    elif head.status == DEAD_LETTER:
        index.blocked[key] = head


def chain_head(chain: deque[Job], jobs: dict[str, Job]) -> Job | None:
    """The job that holds the key: the first that is neither released nor purged."""
    for job in chain:
        if job.status not in _RELEASED and jobs.get(job.id) is job:
            return job
    return None


def rebuild(index: RunnableIndex, pending: list[Job]) -> None:
    """After `add_new` of every job in submission order: fill the lanes with the
    pending jobs that are claimable, unordered, then heapify once."""
    for job in pending:
        if job.ordering_key is not None and not is_head(index, job):
            continue
        lanes = _lanes_for(index, job)
        entry = (-job.priority, job.seq, job)
        heap = lanes.heaps.get(job.tenant)
        if heap is None:
            lanes.heaps[job.tenant] = [entry]
        else:
            heap.append(entry)
        if job.priority > HIGH_PRIORITY_ABOVE:
            lanes.high.append(entry)
        lanes.counts[job.tenant] = lanes.counts.get(job.tenant, 0) + 1
    for _, lanes in all_lanes(index):
        lanes.ring = sorted(lanes.counts)
        heapq.heapify(lanes.high)
        for heap in lanes.heaps.values():
            heapq.heapify(heap)


def rebuild_from_jobs(columns: JobColumns) -> RunnableIndex:
    """The whole index from every job: what `add_new` for each job in
    submission order and then `rebuild` give, computed a column at a time
    for snapshots of a million jobs (see `state.rebuild_indexes`)."""
    index = RunnableIndex()
    jobs, statuses = columns.jobs, columns.statuses
    tenants = index.tenants
    for (tenant, status), count in count_pairs(columns.tenants, statuses).items():
        counts = tenants.get(tenant)
        if counts is None:
            counts = tenants[tenant] = [0, 0]
        if status in QUEUED_STATUSES:
            counts[0] += count
        elif status in LEASED_STATUSES:
            counts[1] += count
    keys, blocked = index.keys, index.blocked
    for job in columns.ordered:
        status = job.status
        if status in _RELEASED:
            continue
        key: OrderingKey = (job.tenant, job.ordering_key)  # type: ignore[assignment]
        chain = keys.get(key)
        if chain is None:
            keys[key] = deque((job,))
            if status == DEAD_LETTER:
                blocked[key] = job
        else:
            chain.append(job)
    queues_of, tenants_of = columns.queues, columns.tenants
    priorities, seqs, claimable = columns.priorities, columns.seqs, jobs
    if statuses.count(PENDING) != len(jobs) or keys:
        mask = list(map(PENDING.__eq__, statuses))
        if keys:
            mask = [
                pending and (job.ordering_key is None or is_head(index, job))
                for job, pending in zip(jobs, mask, strict=True)
            ]
        claimable = list(compress(jobs, mask))
        queues_of = list(compress(queues_of, mask))
        tenants_of = list(compress(tenants_of, mask))
        priorities = list(compress(priorities, mask))
        seqs = list(compress(seqs, mask))
    entries = list(zip(map(neg, priorities), seqs, claimable, strict=True))
    groups: dict[tuple[str, str], list[RunnableEntry]] = {}
    kinded: list[RunnableEntry] = []
    if columns.kinded:  # jobs of a kind go to their kind's lanes (below)
        plain = [entry[2].kind is None for entry in entries]
        kinded = [entry for entry, no_kind in zip(entries, plain, strict=True) if not no_kind]
        if kinded:
            entries = list(compress(entries, plain))
            queues_of = list(compress(queues_of, plain))
            tenants_of = list(compress(tenants_of, plain))
    if entries and uniform(queues_of) and uniform(tenants_of):
        groups[queues_of[0], tenants_of[0]] = entries
    else:
        for queue, tenant, entry in zip(queues_of, tenants_of, entries, strict=True):
            groups.setdefault((queue, tenant), []).append(entry)
    queues = index.queues
    for (queue, tenant), heap in groups.items():
        lanes = queues.get(queue)
        if lanes is None:
            lanes = queues[queue] = Lanes()
        lanes.heaps[tenant] = heap
        lanes.counts[tenant] = len(heap)
    for entry in kinded:
        job = entry[2]
        lanes = _lanes_for(index, job)
        lanes.heaps.setdefault(job.tenant, []).append(entry)
        lanes.counts[job.tenant] = lanes.counts.get(job.tenant, 0) + 1
    if max(columns.priorities, default=0) > HIGH_PRIORITY_ABOVE:
        for entry in (*entries, *kinded):
            if entry[0] < -HIGH_PRIORITY_ABOVE:
                _lanes_for(index, entry[2]).high.append(entry)
    for _, lanes in all_lanes(index):
        lanes.ring = sorted(lanes.counts)
        heapq.heapify(lanes.high)
        for heap in lanes.heaps.values():
            heapq.heapify(heap)
    return index


def oldest_runnable_ms(index: RunnableIndex, queue: str) -> int | None:
    """When the longest-waiting job next in line of any tenant (and kind)
    became runnable."""
    oldest: int | None = None
    for lanes in lanes_of(index, queue):
        for tenant in lanes.ring:
            runnable_ms = lanes.top(tenant).next_run_at_ms
            if runnable_ms is not None and (oldest is None or runnable_ms < oldest):
                oldest = runnable_ms
    return oldest
