"""Read-only questions the API asks of the state. None of them mutates it."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from heapq import merge
from operator import attrgetter
from typing import NamedTuple

from raftsched.core.jobs.operator_commands import public_effect
from raftsched.core.jobs.trace_book import TraceContext, trace_of
from raftsched.core.kernel import runnable_index, wheel
from raftsched.core.kernel.model import INITIAL_STATUSES, SCHEDULED, SUBMIT, Job
from raftsched.core.kernel.results import Effect
from raftsched.core.kernel.state import NO_KEYS, State

LIST_LIMIT_MAX = 1_000
SUBMIT_ACTOR = "client"


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    at_ms: int
    event: str
    from_status: str | None
    to_status: str
    actor: str
    epoch: int
    fencing_token: int | None
    detail: str | None


class QueueStats(NamedTuple):
    depth: int  # pending jobs
    running: int  # claimed or running jobs
    oldest_runnable_at_ms: int | None


def get_job(state: State, job_id: str) -> Job | None:
    """A live job, or a transient copy of a packed one (`kernel.wheel`)."""
    job = state.jobs.get(job_id)
    if job is None and type(job_id) is str:
        return wheel.find_packed(state, job_id)
    return job


def find_by_idempotency_key(state: State, tenant: str, idempotency_key: str) -> Job | None:
    job = state.idempotency.by_tenant.get(tenant, NO_KEYS).get(idempotency_key)
    if job is None:
        return wheel.find_packed_key(state, tenant, idempotency_key)
    return job


def list_jobs(
    state: State,
    queue: str | None = None,
    status: str | None = None,
    tenant: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    schedule_id: str | None = None,
    workflow_id: str | None = None,
    correlation_id: str | None = None,
    *,
    kind: str | None = None,
    tenants: frozenset[str] | None = None,
    queues: frozenset[str] | None = None,
) -> tuple[list[Job], str | None]:
    """Jobs newest first, filtered; `next_cursor` continues after the last one.

    The cursor is the submission sequence number of the last job returned (as
    a string). Cost grows with the jobs skipped by the filters. `tenants` and
    `queues` bound the jobs a caller may see (None: all); they merge with the
    `tenant` and `queue` filters, so a scope costs no more per job than a filter.
    """
    limit = max(1, min(limit, LIST_LIMIT_MAX))
    tenant_in, queue_in = within(tenant, tenants), within(queue, queues)
    if tenant_in == frozenset() or queue_in == frozenset():
        return [], None
    order = state.order
    position = len(order)
    if cursor is not None:
        if not cursor.isdigit():
            return [], None
        position = bisect_left(order, int(cursor), key=lambda job: job.seq)
    jobs = state.jobs
    found: list[Job] = []

    def excluded(job: Job) -> bool:
        return (
            (queue_in is not None and job.queue not in queue_in)
            or (status is not None and job.status != status)
            or (tenant_in is not None and job.tenant not in tenant_in)
            or (schedule_id is not None and job.schedule_id != schedule_id)
            or (workflow_id is not None and job.workflow_id != workflow_id)
            or (correlation_id is not None and job.correlation_id != correlation_id)
            or (kind is not None and job.kind != kind)
        )

    record = wheel.wheel_of(state)
    packed = record.size > 0 and _packed_may_match(
        record, queue_in, tenant_in, status, schedule_id, workflow_id
    )
    if packed or record.runs:
        below = None if cursor is None else int(cursor)
        candidates = _merged_newest_first(state, order, position, record.runs, below, packed)
        matches = (job for job in candidates if not excluded(job))
        for job in matches:
            found.append(job)
            if len(found) == limit:
                more = next(candidates, None) is not None
                return found, str(job.seq) if more else None
        return found, None
    for index in range(position - 1, -1, -1):
        job = order[index]
        if jobs.get(job.id) is not job:
            continue  # purged
        if excluded(job):
            continue
        found.append(job)
        if len(found) == limit:
            return found, str(job.seq) if index > 0 else None
    return found, None


def _packed_may_match(
    record: wheel.Wheel,
    queue_in: frozenset[str] | None,
    tenant_in: frozenset[str] | None,
    status: str | None,
    schedule_id: str | None,
    workflow_id: str | None,
) -> bool:
    """Whether a packed job can pass the filters, from the wheel's per
    (queue, tenant) counts alone: packed jobs are all scheduled, none is a
    schedule's occurrence or a workflow's step (`wheel.check`), so such a
    listing, or one for a queue or tenant with nothing packed, does not
    visit the wheel at all."""
    if (status is not None and status != SCHEDULED) or schedule_id is not None:
        return False
    if workflow_id is not None:
        return False
    if queue_in is None and tenant_in is None:
        return True
    return any(
        (queue_in is None or queue in queue_in) and (tenant_in is None or tenant in tenant_in)
        for queue, tenant in record.counts
    )


def _merged_newest_first(
    state: State,
    order: list[Job],
    position: int,
    runs: list[list[Job]],
    below: int | None,
    packed: bool,
) -> Iterator[Job]:
    """Live jobs (the submission-ordered `order` and the hydrated runs, both
    skipping purged ones) and, with `packed`, packed jobs, newest first, seq
    below `below`."""
    jobs = state.jobs
    streams = [_backwards(order, position)]
    for run in runs:
        end = len(run) if below is None else bisect_left(run, below, key=_seq)
        streams.append(_backwards(run, end))
    live = (job for job in merge(*streams, key=_seq, reverse=True) if jobs.get(job.id) is job)
    if not packed:
        return live
    return merge(live, wheel.packed_newest_first(state, below), key=_seq, reverse=True)


_seq = attrgetter("seq")


def _backwards(jobs: list[Job], end: int) -> Iterator[Job]:
    return (jobs[index] for index in range(end - 1, -1, -1))


def within(asked: str | None, allowed: frozenset[str] | None) -> frozenset[str] | None:
    """One filter value within a set of allowed values, as a set: None is no
    filter at all, an empty set matches nothing."""
    if asked is None:
        return allowed
    if allowed is None or asked in allowed:
        return frozenset((asked,))
    return frozenset()


def queue_stats(state: State) -> dict[str, QueueStats]:
    """Per queue: pending depth, leased count, and when its longest-waiting
    claimable job next in line became runnable (the oldest over its tenants)."""
    stats: dict[str, QueueStats] = {}
    for queue in sorted(state.queue_counts):
        pending, leased, _ = state.queue_counts[queue]
        stats[queue] = QueueStats(pending, leased, _oldest_runnable_ms(state, queue))
    return stats


def _oldest_runnable_ms(state: State, queue: str) -> int | None:
    # The job next in line of each tenant (runnable_index): O(tenants), not O(jobs).
    return runnable_index.oldest_runnable_ms(state.runnable, queue)


def packed_count(state: State) -> int:
    """How many jobs the time wheel holds packed (`kernel.wheel`)."""
    return wheel.wheel_of(state).size


def status_counts(state: State) -> dict[str, int]:
    return dict(state.status_counts)


def get_effect(state: State, key: str) -> Effect | None:
    found = state.effects.get(key)
    return None if found is None else public_effect(*found)


def job_effects(state: State, job_id: str) -> list[Effect] | None:
    """The effects the job recorded, in the order it recorded them; None for
    no such job. A packed job (kernel.wheel) has never run, so it has none."""
    job = get_job(state, job_id)
    if job is None:
        return None
    return [public_effect(job, effect) for effect in job.effects or ()]


def job_trace(state: State, job_id: str) -> TraceContext | None:
    """The W3C (traceparent, tracestate) the job was submitted with, if its
    submission carried one (cluster version 8, `trace_book`)."""
    return trace_of(state, job_id)


def job_history(state: State, job_id: str) -> list[HistoryEvent] | None:
    """Every transition of the job, oldest first, starting with its submission."""
    job = get_job(state, job_id)
    if job is None:
        return None
    initial = SCHEDULED if job.run_at_ms > job.created_at_ms else INITIAL_STATUSES[1]
    events = [
        HistoryEvent(
            job.created_at_ms, SUBMIT, None, initial, SUBMIT_ACTOR, job.created_epoch, None, None
        )
    ]
    events.extend(HistoryEvent(*record) for record in job.history or ())
    return events
