"""The replicated state of one shard, and the indexes derived from it.

Rules
-----
1. The core does no I/O and reads no clock or random source. Time (`now_ms`),
   the leader's term (`epoch`), random draws and new identifiers arrive inside
   the applied `Entry` and its commands.
2. The same entries applied in the same order to `new_state()` give a state
   whose `encode_state` bytes are identical on every replica, whether it was
   built by applying the log or by decoding a snapshot and applying the rest.
3. A command either takes effect completely or is rejected and leaves the
   state byte-for-byte unchanged. Handlers validate everything first, then
   mutate with code that cannot fail; a bug that raises anyway is rolled back
   by a savepoint and answered `Rejected(internal_error)`.
4. Replicated time never runs backwards: `now_ms = max(now_ms, entry.now_ms)`.
   Fencing tokens and epochs only ever increase.
5. Job statuses change only through `model.TRANSITIONS`.

Theory of operation
-------------------
The authoritative data is `jobs` (in submission order, except jobs hydrated
from the time wheel, which join after the jobs already live), the scalar
counters below, each job's own attempts, history and effects, and the jobs
that the `wheel` section holds packed (far-future jobs, `kernel.wheel`): they
have no `Job` object, yet every counter below counts them. Everything else is
an index derived from the jobs and rebuilt by `rebuild_indexes` when a
snapshot is decoded: status and per-queue counters, the idempotency map, the
effects-ledger map, and five heaps that keep time-driven and claim work
proportional to the work due rather than to the number of stored jobs:

- `runnable`: the claimable pending jobs per queue and tenant, the tenants'
  queued and leased counts, and the ordering-key chains (see `runnable_index`).
- `due`: (next_run_at_ms, seq, job) for scheduled and retry_wait jobs.
- `leases`: (expires_at_ms, fencing_token, job) for leased jobs. Heartbeats
  and takeovers extend a lease without touching the heap: when an entry comes
  due for a lease that was extended, it is pushed again at the real expiry.
  So a heap key is never later than the lease's expiry.
- `deadlines`: (deadline_at_ms, seq, job) for jobs with a deadline.
- `retention`: (updated_at_ms, seq, job) for finished jobs; a finished job is
  purged when updated_at_ms + retention_ms has passed.

Heaps use lazy deletion: an entry is valid only while the job still matches
it (status, due time, token), and invalid entries are dropped when they reach
the top. Work is counted only for valid entries and processed in key order,
so stale entries, which differ between a replica that applied the log and one
that decoded a snapshot, never change what a command does.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from itertools import compress, islice
from operator import attrgetter, gt
from typing import TYPE_CHECKING, Any, Final, TypeVar

from raftsched.core.kernel import runnable_index
from raftsched.core.kernel.model import (
    FINAL_STATUSES,
    JOB_STATUSES,
    LEASED_STATUSES,
    PENDING,
    SCHEDULED,
    WAITING_STATUSES,
    HistoryRecord,
    Job,
    JobColumns,
    StoredEffect,
    count_pairs,
    count_values,
)
from raftsched.core.kernel.runnable_index import RunnableEntry as RunnableEntry
from raftsched.core.kernel.runnable_index import RunnableIndex

if TYPE_CHECKING:
    from raftsched.core.kernel.feature import Hooks, Registry

DEFAULT_RETENTION_MS: Final = 7 * 24 * 3600 * 1000

T = TypeVar("T")

TimedEntry = tuple[int, int, Job]


# The keys of a tenant without any: a default for `by_tenant.get`, never written.
NO_KEYS: Final[Mapping[str, Job]] = {}


class KeyIndex:
    """The live jobs by tenant and idempotency key: tenant -> {key -> job}.

    It exists for memory: a million live jobs with keys are a million
    entries. A flat map keyed by (tenant, key) paid a 56-byte tuple per job on
    top of the map's entry (108 bytes a job, measured with tracemalloc). Here
    a job costs one entry of its tenant's map, keyed by the key string the job
    already holds; the tenant name, interned, is shared by all its jobs (21
    bytes a job, 50,000 jobs over 10 tenants). A
    tenant's map is dropped with its last key, so the live index equals the
    one `rebuild_indexes` makes.

    Submit and lookup use `by_tenant` directly: a method call there would
    cost more than the tuple did. They read with
    `by_tenant.get(tenant, NO_KEYS).get(key)`; `index_job` adds as `add` does
    (measured: both a little faster than the flat map's tuple).
    """

    __slots__ = ("by_tenant",)

    def __init__(self) -> None:
        self.by_tenant: dict[str, dict[str, Job]] = {}

    def get(self, tenant: str, key: str) -> Job | None:
        return self.by_tenant.get(tenant, NO_KEYS).get(key)

    def add(self, job: Job) -> None:
        """Index `job` under its tenant and key (it must have a key)."""
        key = job.idempotency_key
        assert key is not None
        try:
            self.by_tenant[job.tenant][key] = job
        except KeyError:  # the tenant's first key
            self.by_tenant[job.tenant] = {key: job}

    def discard(self, job: Job) -> None:
        """Forget `job`'s key, if the key still names this very job."""
        key = job.idempotency_key
        if key is None:
            return
        keys = self.by_tenant.get(job.tenant)
        if keys is not None and keys.get(key) is job:
            del keys[key]
            if not keys:
                del self.by_tenant[job.tenant]

    def __len__(self) -> int:
        return sum(map(len, self.by_tenant.values()))

    def __iter__(self) -> Iterator[tuple[str, str]]:
        """The (tenant, key) pairs."""
        for tenant, keys in self.by_tenant.items():
            for key in keys:
                yield tenant, key

    def items(self) -> Iterator[tuple[tuple[str, str], Job]]:
        for tenant, keys in self.by_tenant.items():
            for key, job in keys.items():
                yield (tenant, key), job


class State:
    """One shard's replicated state. Mutated only by `apply_entry`."""

    __slots__ = (
        # Authoritative scalars (encoded).
        "now_ms",
        "epoch",
        "last_fencing_token",
        "retention_ms",
        "next_seq",
        # Authoritative records (encoded), in submission order.
        "jobs",
        # Records beside the jobs (schedules, workflows, ...), see `sections`.
        "sections",
        # Derived indexes (rebuilt on decode).
        "status_counts",
        "queue_counts",
        "idempotency",
        "effects",
        "runnable",
        "due",
        "leases",
        "deadlines",
        "retention",
        "order",
        "order_purged",
        "interned",
        # The features' life-cycle hooks (not replicated; from the registry).
        "hooks",
    )

    def __init__(self, registry: Registry) -> None:
        self.now_ms = 0
        self.epoch = 0
        self.last_fencing_token = 0
        self.retention_ms = DEFAULT_RETENTION_MS
        self.next_seq = 1
        self.jobs: dict[str, Job] = {}
        self.sections: dict[str, Any] = registry.create_sections()
        self.status_counts: dict[str, int] = dict.fromkeys(JOB_STATUSES, 0)
        # queue -> [pending, leased, stored]; a queue with no stored job is
        # dropped, so that the live map equals the one rebuilt on decode.
        self.queue_counts: dict[str, list[int]] = {}
        self.idempotency = KeyIndex()
        self.effects: dict[str, tuple[Job, StoredEffect]] = {}
        self.runnable = RunnableIndex()
        self.due: list[TimedEntry] = []
        self.leases: list[TimedEntry] = []
        self.deadlines: list[TimedEntry] = []
        self.retention: list[TimedEntry] = []
        # Every job in submission order, for newest-first listing; purged
        # jobs are skipped and compacted away now and then.
        self.order: list[Job] = []
        self.order_purged = 0
        # Interned queue/tenant names and backoff objects: a million jobs
        # share a handful of them.
        self.interned: dict[object, object] = {}
        self.hooks: Hooks = registry.hooks


def new_state(registry: Registry) -> State:
    return State(registry)


def intern(state: State, value: T) -> T:
    interned = state.interned
    found = interned.get(value)
    if found is None:
        if len(interned) >= 100_000:
            interned.clear()  # only a memory optimisation; never unbounded
        interned[value] = value
        return value
    return found  # type: ignore[return-value]


def set_status(state: State, job: Job, new_status: str) -> None:
    """Change a job's status, keeping the counters in step."""
    old_status = job.status
    counts = state.status_counts
    counts[old_status] -= 1
    counts[new_status] += 1
    job.status = new_status
    queue_counts = state.queue_counts[job.queue]
    if old_status == PENDING:
        queue_counts[0] -= 1
    elif old_status in LEASED_STATUSES:
        queue_counts[1] -= 1
    if new_status == PENDING:
        queue_counts[0] += 1
    elif new_status in LEASED_STATUSES:
        queue_counts[1] += 1
    runnable_index.status_changed(state.runnable, job, old_status, new_status)


def count_new_job(state: State, job: Job) -> None:
    state.status_counts[job.status] += 1
    queue_counts = state.queue_counts.get(job.queue)
    if queue_counts is None:
        queue_counts = state.queue_counts[job.queue] = [0, 0, 0]
    queue_counts[2] += 1
    if job.status == PENDING:
        queue_counts[0] += 1
    elif job.status in LEASED_STATUSES:
        queue_counts[1] += 1
    runnable_index.add_new(state.runnable, job)


def count_packed(state: State, queue: str, tenant: str, count: int) -> None:
    """`count` scheduled jobs of `queue` and `tenant` that the time wheel
    holds packed (`kernel.wheel`): counted as `count_new_job` counts live ones."""
    state.status_counts[SCHEDULED] += count
    queue_counts = state.queue_counts.get(queue)
    if queue_counts is None:
        queue_counts = state.queue_counts[queue] = [0, 0, 0]
    queue_counts[2] += count
    runnable_index.add_queued(state.runnable, tenant, count)


def add_history(job: Job, record: HistoryRecord) -> None:
    history = job.history
    if history is None:
        job.history = [record]
    else:
        history.append(record)


def push_runnable(state: State, job: Job) -> None:
    """`job` just became pending: claimable, or parked behind its ordering key."""
    runnable_index.push(state.runnable, job)


def push_due(state: State, job: Job, due_ms: int) -> None:
    heapq.heappush(state.due, (due_ms, job.seq, job))


def push_lease(state: State, job: Job, expires_at_ms: int, fencing_token: int) -> None:
    heapq.heappush(state.leases, (expires_at_ms, fencing_token, job))


def push_deadline(state: State, job: Job, deadline_at_ms: int) -> None:
    heapq.heappush(state.deadlines, (deadline_at_ms, job.seq, job))


def push_retention(state: State, job: Job) -> None:
    heapq.heappush(state.retention, (job.updated_at_ms, job.seq, job))


def index_job(state: State, job: Job) -> None:
    """Add one job to every index (used when a job is created or rebuilt)."""
    status = job.status
    if status == PENDING:
        push_runnable(state, job)
    elif status in WAITING_STATUSES:
        assert job.next_run_at_ms is not None
        push_due(state, job, job.next_run_at_ms)
    elif status in LEASED_STATUSES:
        assert job.lease is not None
        push_lease(state, job, job.lease.expires_at_ms, job.lease.fencing_token)
    elif status in FINAL_STATUSES:
        push_retention(state, job)
    if job.deadline_at_ms is not None and status not in FINAL_STATUSES:
        push_deadline(state, job, job.deadline_at_ms)
    key = job.idempotency_key
    if key is not None:  # KeyIndex.add, inlined: this runs for every new job
        try:
            state.idempotency.by_tenant[job.tenant][key] = job
        except KeyError:  # the tenant's first key
            state.idempotency.by_tenant[job.tenant] = {key: job}
    if job.effects is not None:
        for effect in job.effects:
            state.effects[effect.key] = (job, effect)


def rebuild_indexes(state: State, decoded: JobColumns | None = None) -> None:
    """Recompute every derived index from the jobs (snapshot decode, rollback).

    With `decoded` (a snapshot's jobs and their columns), the jobs also become
    `state.jobs`. At a million jobs every Python operation per job costs a
    measurable fraction of a second, so the work is done a column at a time
    by C loops (`map`, `Counter`, `compress`); only jobs that are not pending,
    or that carry keys, deadlines or effects, get Python code of their own.
    Heaps are filled unordered and heapified once at the end.
    `flow.check_flow` compares the result with a job-by-job rebuild.
    """
    if decoded is None:
        columns = JobColumns.from_jobs(list(state.jobs.values()))
    else:
        columns = decoded
        state.jobs = dict(zip(columns.ids, columns.jobs, strict=True))
    jobs, statuses = columns.jobs, columns.statuses
    seqs = columns.seqs
    if any(map(gt, seqs, islice(seqs, 1, None))):
        # Jobs hydrated from the time wheel joined the dict after later ones.
        columns = JobColumns.from_jobs(sorted(jobs, key=attrgetter("seq")))
        jobs, statuses = columns.jobs, columns.statuses
    state.order, state.order_purged = jobs, 0
    status_counts = state.status_counts = dict.fromkeys(JOB_STATUSES, 0)
    for status, count in count_values(statuses).items():
        status_counts[status] += count
    queue_counts: dict[str, list[int]] = {}
    for (queue, status), count in count_pairs(columns.queues, statuses).items():
        counts = queue_counts.get(queue)
        if counts is None:
            counts = queue_counts[queue] = [0, 0, 0]
        counts[2] += count
        if status == PENDING:
            counts[0] += count
        elif status in LEASED_STATUSES:
            counts[1] += count
    state.queue_counts = queue_counts
    state.idempotency, state.effects = KeyIndex(), {}
    state.due, state.leases, state.deadlines, state.retention = [], [], [], []
    if status_counts[PENDING] != len(jobs):
        for job in compress(jobs, map(PENDING.__ne__, statuses)):
            _index_unsorted(state, job)
    for job in columns.marked:
        _index_keys_unsorted(state, job)
    for timed in (state.due, state.leases, state.deadlines, state.retention):
        heapq.heapify(timed)
    state.runnable = runnable_index.rebuild_from_jobs(columns)
    wheel = state.sections.get("wheel")
    if wheel is not None:
        # The jobs the time wheel holds packed (`kernel.wheel.restore_counts`).
        wheel.runs = []
        for (queue, tenant), count in wheel.counts.items():
            count_packed(state, queue, tenant, count)


def _index_unsorted(state: State, job: Job) -> None:
    """A job that is not pending: its time index, unordered."""
    status = job.status
    if status in WAITING_STATUSES:
        assert job.next_run_at_ms is not None
        state.due.append((job.next_run_at_ms, job.seq, job))
    elif status in LEASED_STATUSES:
        assert job.lease is not None
        state.leases.append((job.lease.expires_at_ms, job.lease.fencing_token, job))
    elif status in FINAL_STATUSES:
        state.retention.append((job.updated_at_ms, job.seq, job))
    # A reconciling job is in no time index: its reconciliation task is
    # (the `reconcile` section of jobs.reconcile_book).


def _index_keys_unsorted(state: State, job: Job) -> None:
    """Deadline, idempotency key and effects of one job."""
    if job.deadline_at_ms is not None and job.status not in FINAL_STATUSES:
        state.deadlines.append((job.deadline_at_ms, job.seq, job))
    if job.idempotency_key is not None:
        state.idempotency.add(job)
    if job.effects is not None:
        for effect in job.effects:
            state.effects[effect.key] = (job, effect)


def remove_job(state: State, job: Job) -> None:
    """Purge a finished job with its idempotency key and effects."""
    del state.jobs[job.id]
    state.status_counts[job.status] -= 1
    queue_counts = state.queue_counts[job.queue]
    queue_counts[2] -= 1
    if queue_counts[2] == 0:
        del state.queue_counts[job.queue]
    runnable_index.purged(state.runnable, job, state.jobs)
    state.idempotency.discard(job)
    if job.effects is not None:
        for effect in job.effects:
            owner = state.effects.get(effect.key)
            if owner is not None and owner[0] is job:
                del state.effects[effect.key]
    state.order_purged += 1
    if state.order_purged > 1024 and state.order_purged * 2 > len(state.order):
        jobs = state.jobs
        state.order = [each for each in state.order if jobs.get(each.id) is each]
        state.order_purged = 0
