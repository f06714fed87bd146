"""Savepoints: the last line of defence that keeps a bug from corrupting state.

Handlers validate first and then mutate with code that should not fail. If
one raises anyway, `apply` rolls back with the savepoint: scalars are
restored, every job the handler touched gets its fields back, created jobs
are removed and purged jobs re-inserted, and then the derived indexes are
rebuilt from the jobs. The rebuild is O(jobs) but runs only on that bug path;
the hot path pays one small field capture per touched job.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter

from raftsched.core.kernel.model import JOB_FIELDS, Attempt, Job
from raftsched.core.kernel.state import State, rebuild_indexes

_job_fields = attrgetter(*JOB_FIELDS)
_ATTEMPT_FIELDS = ("started_at_ms", "ended_at_ms", "outcome", "error")
_attempt_fields = attrgetter(*_ATTEMPT_FIELDS)

_Capture = tuple[tuple[object, ...], int | None, tuple[object, ...] | None, int, int]


class Savepoint:
    __slots__ = ("state", "scalars", "touched", "created", "purged", "undo", "memo")

    def __init__(self, state: State) -> None:
        self.state = state
        self.scalars: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
        self.touched: dict[int, tuple[Job, _Capture]] = {}
        self.created: list[str] = []
        self.purged: list[Job] = []
        # Undo actions for records outside the jobs (state sections), run in
        # reverse order on rollback.
        self.undo: list[Callable[[], None]] = []
        # What a section noted for the command being applied (e.g. that its
        # undo is registered already); cleared with the rest.
        self.memo: dict[str, object] = {}

    def reset(self) -> None:
        state = self.state
        self.scalars = (
            state.now_ms,
            state.epoch,
            state.last_fencing_token,
            state.retention_ms,
            state.next_seq,
        )
        if self.touched:
            self.touched = {}
        if self.created:
            self.created = []
        if self.purged:
            self.purged = []
        if self.undo:
            self.undo = []
        if self.memo:
            self.memo = {}

    def on_rollback(self, action: Callable[[], None]) -> None:
        """Register how to undo a change to a section record, before making it."""
        self.undo.append(action)

    def touch(self, job: Job) -> None:
        """Call before the first mutation of an existing job."""
        if id(job) in self.touched:
            return
        lease_expires_ms = None if job.lease is None else job.lease.expires_at_ms
        last_attempt = _attempt_fields(job.attempts[-1]) if job.attempts else None
        self.touched[id(job)] = (
            job,
            (
                _job_fields(job),
                lease_expires_ms,
                last_attempt,
                0 if job.history is None else len(job.history),
                0 if job.effects is None else len(job.effects),
            ),
        )

    def rollback(self) -> None:
        state = self.state
        (
            state.now_ms,
            state.epoch,
            state.last_fencing_token,
            state.retention_ms,
            state.next_seq,
        ) = self.scalars
        for action in reversed(self.undo):
            action()
        for job, capture in self.touched.values():
            _restore(job, capture)
        for job_id in self.created:
            state.jobs.pop(job_id, None)
        if self.purged:
            for job in self.purged:
                state.jobs[job.id] = job
            # Jobs are stored in submission order; the encoding depends on it.
            state.jobs = dict(sorted(state.jobs.items(), key=lambda item: item[1].seq))
        rebuild_indexes(state)


def _restore(job: Job, capture: _Capture) -> None:
    fields, lease_expires_ms, last_attempt, history_len, effects_len = capture
    for name, value in zip(JOB_FIELDS, fields, strict=True):
        setattr(job, name, value)
    if job.lease is not None and lease_expires_ms is not None:
        job.lease.expires_at_ms = lease_expires_ms
    if last_attempt is not None:
        attempt: Attempt = job.attempts[-1]
        for name, value in zip(_ATTEMPT_FIELDS, last_attempt, strict=True):
            setattr(attempt, name, value)
    if job.history is not None:
        del job.history[history_len:]
    if job.effects is not None:
        del job.effects[effects_len:]
