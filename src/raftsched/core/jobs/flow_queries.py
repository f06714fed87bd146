"""Read-only views of flow control for the API and metrics. Nothing here
changes the encoded state (stale heap entries may be dropped, as reads do)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from raftsched.core.jobs.flow import (
    MICRO,
    QueueFlow,
    bucket_of,
    bucket_tokens,
    flow_of,
    tenant_concurrency_limit,
    tenant_flow,
)
from raftsched.core.jobs.flow_claim import gate_budget
from raftsched.core.jobs.quota_book import (
    QueueQuota,
    TenantQuota,
    queue_quota,
    quotas_of,
    tenant_quota,
)
from raftsched.core.jobs.reconcile_book import book_of
from raftsched.core.kernel.runnable_index import all_lanes, claimable_count, oldest_runnable_ms
from raftsched.core.kernel.state import State

BLOCKED_LISTED_MAX: Final = 100


@dataclass(frozen=True, slots=True)
class QueueView:
    name: str
    depth: int  # pending jobs, parked ones included
    running: int  # claimed or running
    oldest_runnable_at_ms: int | None
    paused: bool
    rate_limit_milli_per_s: int | None
    burst: int | None
    tokens: float | None
    concurrency_limit: int | None
    circuit_window: int | None
    circuit_probe_ms: int
    circuit_open: bool
    circuit_failures: int
    circuit_outcomes: int
    throttled: int  # pending jobs held back by this queue's own gates now
    blocked_keys: int  # ordering keys held by a dead-lettered job
    blocked: tuple[tuple[str, str, str], ...]  # (tenant, key, job id), bounded
    on_unknown: str = "retry"  # the default for its jobs (jobs.reconcile)
    reconciling: int = 0  # open reconciliations claimed from this queue
    # This shard's quotas of the limits above (jobs.quota_book), which it
    # enforces where set; None: none (the settings apply, or no shards).
    quota: QueueQuota | None = None


@dataclass(frozen=True, slots=True)
class TenantView:
    name: str
    weight: int
    concurrency_limit: int | None
    max_queued: int | None
    queued: int
    running: int
    throttled: int  # claimable jobs held back by the concurrency limit now
    on_unknown: str = "retry"  # the default for its jobs (jobs.reconcile)
    quota: TenantQuota | None = None  # this shard's quotas, as a queue's


def queue_names(state: State) -> list[str]:
    names = set(state.queue_counts) | set(flow_of(state).queues) | set(book_of(state).queues)
    return sorted(names | set(quotas_of(state).queues))


def queue_view(state: State, name: str, now_ms: int, with_blocked: bool = False) -> QueueView:
    record = flow_of(state).queues.get(name) or QueueFlow()
    counts = state.queue_counts.get(name, [0, 0, 0])
    claimable = claimable_count(state.runnable, name)
    blocked = [
        (tenant, key, job.id)
        for (tenant, key), job in sorted(state.runnable.blocked.items())
        if job.queue == name
    ]
    quota = queue_quota(state, name)
    bucket = bucket_of(record, quota)  # the quota's where it has one
    tokens = None if bucket is None else bucket_tokens(record, now_ms, bucket) / MICRO
    held_back = gate_budget(state, name, record, now_ms) == 0
    book = book_of(state)
    return QueueView(
        name,
        counts[0],
        counts[1],
        oldest_runnable_ms(state.runnable, name),
        record.paused,
        record.rate_milli,
        record.burst,
        tokens,
        record.concurrency_limit,
        record.circuit_window,
        record.circuit_probe_ms,
        record.circuit_open,
        record.outcomes.bit_count(),
        record.outcome_count,
        claimable if held_back else 0,
        len(blocked),
        tuple(blocked[:BLOCKED_LISTED_MAX]) if with_blocked else (),
        book.queues.get(name, "retry"),
        sum(task.queue == name for task in book.tasks.values()),
        quota,
    )


def tenant_names(state: State) -> list[str]:
    counts = state.runnable.tenants
    names = {name for name, pair in counts.items() if any(pair)}
    names |= set(quotas_of(state).tenants)
    return sorted(names | set(flow_of(state).tenants) | set(book_of(state).tenants))


def tenant_view(state: State, name: str) -> TenantView:
    flow = flow_of(state)
    record = tenant_flow(flow, name)
    queued, running = state.runnable.tenants.get(name, [0, 0])
    throttled = 0
    limit = tenant_concurrency_limit(state, flow, name)  # the quota's where it has one
    if limit is not None and running >= limit:
        throttled = sum(lanes.counts.get(name, 0) for _, lanes in all_lanes(state.runnable))
    return TenantView(
        name,
        record.weight,
        record.concurrency_limit,
        record.max_queued,
        queued,
        running,
        throttled,
        book_of(state).tenants.get(name, "retry"),
        tenant_quota(state, name),
    )
