"""The reconciliation log: unknown outcomes and ended reconciliations, by time.

The reconciliation report (`reconcile_report`) answers, for a window of up
to a week: how many unknown outcomes each queue had hour by hour, what the
reconcilers decided, and which jobs reconciliation completed. Every fact it
needs is already replicated. An unknown outcome is an attempt (its outcome,
start, error and end); the end of a reconciliation is a history record of a
job leaving `reconciling`, with the reconciling worker, its token and its
evidence (`reconciled <decision>: <reason>`). Finding them by looking at
every job would cost a pass over a million objects per report, so this
module keeps a derived index of them in time order, as `kernel.state` keeps
heaps of jobs by due time:

- It is not encoded (the state's bytes and digest stay as they are) and is
  a function of the jobs alone: `build` finds the records in the jobs'
  attempts and histories, and the two hooks below append, as the core
  records an attempt's end or a move out of `reconciling`, exactly what
  `build` would find there. So a replica that applied the log and one that
  decoded a snapshot answer alike; `check` compares the two in every test.
- It is built on first use (a report), not when a snapshot is decoded: a
  node that never serves a report pays nothing, one that does pays one pass
  over the jobs once. Until then the hooks do nothing.
- A record older than the longest window (`WINDOW_MS_MAX`) is dropped when
  a new one arrives, and a record of a purged job is skipped when read (lazy
  deletion, as the heaps do). It holds one small tuple per unknown outcome
  and ended reconciliation of the last week, which the jobs' own attempts
  and histories outweigh: its memory is bounded by the state's.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import itemgetter
from typing import Final

from raftsched.core.jobs.reconcile_book import book_of, outcome_unknown
from raftsched.core.kernel.model import (
    COMPLETE,
    DEAD_LETTER_EVENT,
    RECONCILING,
    REQUEUE,
    RETRY,
    Attempt,
    HistoryRecord,
    Job,
)
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.state import State

UNKNOWN: Final = "unknown"
HAPPENED: Final = "happened"
DID_NOT_HAPPEN: Final = "did_not_happen"
CANNOT_TELL: Final = "cannot_tell"
DECISIONS: Final = (HAPPENED, DID_NOT_HAPPEN, CANNOT_TELL)
UNANSWERED: Final = "unanswered"
"""A reconciliation whose leases all expired unanswered (dead-lettered
`unreconciled` by Tick): not a decision, but how a reconciliation ended."""
ENDINGS: Final = (*DECISIONS, UNANSWERED)

DECIDED_PREFIX: Final = "reconciled "
"""A decision's history detail: `reconciled <decision>` or `reconciled <decision>: <reason>`."""
UNANSWERED_SUFFIX: Final = "reconciliation leases expired unanswered"
"""The end of a dead letter's history detail when its reconciliations expired."""
ENDING_EVENTS: Final = frozenset({COMPLETE, RETRY, REQUEUE, DEAD_LETTER_EVENT})

HOUR_MS: Final = 3_600_000
WINDOW_HOURS_MAX: Final = 168
WINDOW_MS_MAX: Final = WINDOW_HOURS_MAX * HOUR_MS
"""The longest window a report covers (a week, the default retention)."""
_COMPACT_AFTER: Final = 1024

Record = tuple[int, str, Job, str, int | None, str | None]
"""(at_ms, kind, job, actor, fencing_token, detail): an unknown outcome (kind
`unknown`: when the attempt ended, its worker and token), or a
reconciliation's end (a decision or `unanswered`: when, the reconciling
worker or `system`, its token, and the history record's detail)."""

_at = itemgetter(0)


class Log:
    """The records, oldest first: `records[head:]`."""

    __slots__ = ("records", "head")

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.head = 0

    def since(self, since_ms: int) -> list[Record]:
        """The records at or after `since_ms`, purged jobs' included."""
        start = bisect_left(self.records, since_ms, lo=self.head, key=_at)
        return self.records[start:]

    def append(self, record: Record, now_ms: int, savepoint: Savepoint) -> None:
        records = self.records
        cutoff_ms = now_ms - WINDOW_MS_MAX
        while self.head < len(records) and records[self.head][0] < cutoff_ms:
            self.head += 1
        if self.head > _COMPACT_AFTER and self.head * 2 > len(records):
            del records[: self.head]
            self.head = 0
        records.append(record)
        # Undone by the command's rollback: the record is the last one then.
        # Records dropped above stay dropped: they are older than any window
        # (time does not run back within an entry).
        savepoint.on_rollback(lambda: _drop_last(records))


def _drop_last(records: list[Record]) -> None:
    records.pop()


def ending(record: HistoryRecord) -> str | None:
    """How a history record ended a reconciliation: its decision,
    `unanswered`, or None when it ended none (a claim or expiry of a
    reconciliation, a cancel, a deadline)."""
    _, event, from_status, _, _, _, _, detail = record
    if from_status != RECONCILING or detail is None or event not in ENDING_EVENTS:
        return None
    if detail.startswith(DECIDED_PREFIX):
        decision = detail[len(DECIDED_PREFIX) :].partition(":")[0]
        return decision if decision in DECISIONS else None
    if event == DEAD_LETTER_EVENT and detail.endswith(UNANSWERED_SUFFIX):
        return UNANSWERED
    return None


def evidence(detail: str | None) -> str | None:
    """The reason a reconciler gave with its decision, if any."""
    if detail is None or not detail.startswith(DECIDED_PREFIX):
        return None
    _, colon, reason = detail.partition(": ")
    return reason if colon else None


def _unknown_record(job: Job, attempt: Attempt) -> Record:
    assert attempt.ended_at_ms is not None
    return (attempt.ended_at_ms, UNKNOWN, job, attempt.worker_id, attempt.fencing_token, None)


def _ending_record(job: Job, record: HistoryRecord, kind: str) -> Record:
    at_ms, _, _, _, actor, _, token, detail = record
    return (at_ms, kind, job, actor, token, detail)


# -- the hooks: what `build` would find, as the core records it -----------------


def note_attempt_ended(
    state: State, job: Job, outcome: str, counted: bool, savepoint: Savepoint
) -> None:
    """`on_attempt_ended`: an attempt whose outcome is unknown."""
    log = book_of(state).log
    if log is None:
        return
    attempt = job.attempts[-1]
    if outcome_unknown(attempt):
        log.append(_unknown_record(job, attempt), state.now_ms, savepoint)


def note_left_reconciling(state: State, job: Job, savepoint: Savepoint) -> None:
    """`lifecycle.transition`, after recording a move out of `reconciling`."""
    log = book_of(state).log
    if log is None or not job.history:
        return
    record = job.history[-1]
    kind = ending(record)
    if kind is not None:
        log.append(_ending_record(job, record, kind), state.now_ms, savepoint)


# -- building it from the jobs --------------------------------------------------


def log_of(state: State) -> Log:
    """The state's log, built now if it was not yet (a read may build it:
    it is derived data, and a build between entries changes nothing else)."""
    book = book_of(state)
    if book.log is None:
        book.log = Log(build(state))
    return book.log


def build(state: State) -> list[Record]:
    """Every record of the last `WINDOW_MS_MAX`, from the jobs, in time order.

    One pass over the jobs. A job not updated within the window has no
    record in it, and only a job with an unknown attempt (at any time) can
    have been reconciling, so most jobs cost two attribute reads."""
    cutoff_ms = state.now_ms - WINDOW_MS_MAX
    found: list[Record] = []
    for job in state.jobs.values():
        if job.updated_at_ms < cutoff_ms:
            continue
        unknown = False
        for attempt in job.attempts:
            if attempt.ended_at_ms is None or not outcome_unknown(attempt):
                continue
            unknown = True
            if attempt.ended_at_ms >= cutoff_ms:
                found.append(_unknown_record(job, attempt))
        if not unknown:
            continue
        for record in job.history or ():
            if record[0] >= cutoff_ms:
                kind = ending(record)
                if kind is not None:
                    found.append(_ending_record(job, record, kind))
    found.sort(key=_order)
    return found


def _order(record: Record) -> tuple[int, int, int, str, str]:
    at_ms, kind, job, actor, token, _ = record
    return (at_ms, job.seq, -1 if token is None else token, kind, actor)


def check(state: State) -> list[str]:
    """A built log holds exactly what a build from the jobs finds."""
    log = book_of(state).log
    if log is None:
        return []
    jobs = state.jobs
    live = [
        record
        for record in log.since(state.now_ms - WINDOW_MS_MAX)
        if jobs.get(record[2].id) is record[2]
    ]
    if sorted(live, key=_order) != build(state):
        return ["the reconciliation log differs from the jobs' attempts and histories"]
    if any(a[0] > b[0] for a, b in zip(live, live[1:], strict=False)):
        return ["the reconciliation log is out of time order"]
    return []
