"""The reconciliation report: what operations asks about unknown outcomes.

For a window of whole hours ending with the current one (replicated time,
so every replica at the same applied index answers alike):

- the jobs `reconciling` now, oldest first: the unknown attempt, since when,
  how many reconciliation leases expired unanswered, the reconcile queue
  and the current reconciliation lease;
- unknown outcomes per queue and hour (every job's, whatever its policy:
  a queue that retries them blindly shows here too);
- how the reconciliations that ended in the window ended, per queue: the
  three decisions, and `unanswered` (every lease expired);
- the jobs completed by reconciliation (`happened`), newest first, with the
  reconciling worker, its token and its evidence.

The two lists are capped at `limit` items, with their totals. Everything
but the `reconciling` list comes from the reconciliation log
(`reconcile_log`), so a report costs the records of its window plus the
open reconciliations, not a pass over the jobs. Nothing here changes the
encoded state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from raftsched.core.jobs.reconcile_book import book_of
from raftsched.core.jobs.reconcile_log import (
    ENDINGS,
    HAPPENED,
    HOUR_MS,
    UNKNOWN,
    WINDOW_HOURS_MAX,
    evidence,
    log_of,
)
from raftsched.core.kernel.model import RECONCILING, Job
from raftsched.core.kernel.state import State

Visible = Callable[[Job], bool]


@dataclass(frozen=True, slots=True)
class ReconcilingJob:
    job_id: str
    queue: str
    tenant: str
    attempt: int  # the attempt whose outcome is unknown
    since_ms: int  # when the job became reconciling
    tries: int  # reconciliation leases that expired unanswered
    reconcile_queue: str
    available_at_ms: int  # when its reconciliation may be claimed (again)
    lease: tuple[str, int, int] | None  # (worker_id, fencing_token, expires_at_ms)


@dataclass(frozen=True, slots=True)
class CompletedJob:
    job_id: str
    queue: str
    tenant: str
    completed_at_ms: int
    worker_id: str  # the reconciling worker
    fencing_token: int | None  # its reconciliation's token
    evidence: str | None  # the reason it gave


@dataclass(frozen=True, slots=True)
class Report:
    now_ms: int
    since_ms: int  # the start of the first hour
    hours: int
    reconciling: tuple[ReconcilingJob, ...]
    reconciling_total: int
    # Per queue, unknown outcomes in each hour of the window, oldest first.
    unknown_outcomes: dict[str, tuple[int, ...]]
    # Per queue, ended reconciliations by `reconcile_log.ENDINGS`.
    endings: dict[str, dict[str, int]]
    completed: tuple[CompletedJob, ...]  # newest first
    completed_total: int


def window_start_ms(now_ms: int, hours: int) -> int:
    """The start of the first of `hours` whole hours ending with the current one."""
    return (now_ms // HOUR_MS - (hours - 1)) * HOUR_MS


def reconciliation_report(
    state: State, hours: int, limit: int, visible: Visible | None = None
) -> Report:
    """The report over the last `hours` (1 to `WINDOW_HOURS_MAX`) with at most
    `limit` items per list, of the jobs `visible` lets through (None: all)."""
    if not 1 <= hours <= WINDOW_HOURS_MAX or limit < 1:
        raise ValueError(f"hours {hours} or limit {limit} out of range")
    now_ms = state.now_ms
    since_ms = window_start_ms(now_ms, hours)
    jobs = state.jobs
    unknown: dict[str, list[int]] = {}
    endings: dict[str, dict[str, int]] = {}
    completed: list[tuple[int, int, CompletedJob]] = []
    for at_ms, kind, job, actor, token, detail in log_of(state).since(since_ms):
        if jobs.get(job.id) is not job or (visible is not None and not visible(job)):
            continue  # purged, or not the caller's
        if kind == UNKNOWN:
            counts = unknown.get(job.queue)
            if counts is None:
                counts = unknown[job.queue] = [0] * hours
            counts[(at_ms - since_ms) // HOUR_MS] += 1
            continue
        per_queue = endings.get(job.queue)
        if per_queue is None:
            per_queue = endings[job.queue] = dict.fromkeys(ENDINGS, 0)
        per_queue[kind] += 1
        if kind == HAPPENED:
            reason = evidence(detail)
            item = CompletedJob(job.id, job.queue, job.tenant, at_ms, actor, token, reason)
            completed.append((at_ms, job.seq, item))
    # Newest first; decisions of one entry (one instant) in submission order
    # reversed: the log's own order within an instant is the order the
    # decisions were applied, which a replica that built it does not know.
    completed.sort(key=lambda entry: entry[:2], reverse=True)
    reconciling = _reconciling(state, visible)
    return Report(
        now_ms,
        since_ms,
        hours,
        tuple(reconciling[:limit]),
        len(reconciling),
        {queue: tuple(counts) for queue, counts in sorted(unknown.items())},
        dict(sorted(endings.items())),
        tuple(item for _, _, item in completed[:limit]),
        len(completed),
    )


def reconciling_per_queue(state: State) -> dict[str, int]:
    """Jobs `reconciling` now, per job queue (the gauge behind the alert on
    unknown outcomes piling up): O(open reconciliations)."""
    counts: dict[str, int] = {}
    jobs = state.jobs
    for job_id in book_of(state).tasks:
        queue = jobs[job_id].queue
        counts[queue] = counts.get(queue, 0) + 1
    return counts


def _reconciling(state: State, visible: Visible | None) -> list[ReconcilingJob]:
    """The open reconciliations, oldest first (since when, then submission)."""
    found: list[tuple[int, int, ReconcilingJob]] = []
    for job_id, task in book_of(state).tasks.items():
        job = state.jobs[job_id]
        if visible is not None and not visible(job):
            continue
        since_ms = _reconciling_since(job)
        lease = None if task.lease is None else (task.lease[0], task.lease[2], task.lease[3])
        item = ReconcilingJob(
            job.id,
            job.queue,
            job.tenant,
            task.attempt,
            since_ms,
            task.tries,
            task.queue,
            task.available_at_ms,
            lease,
        )
        found.append((since_ms, job.seq, item))
    found.sort(key=lambda entry: entry[:2])
    return [item for _, _, item in found]


def _reconciling_since(job: Job) -> int:
    """When the job last moved into `reconciling` (its unknown outcome, or
    an operator sending it back to its reconcilers)."""
    for at_ms, _, from_status, to_status, *_ in reversed(job.history or ()):
        if to_status == RECONCILING and from_status != RECONCILING:
            return at_ms
    return job.updated_at_ms  # unreachable: the move is always recorded
