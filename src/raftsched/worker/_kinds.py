"""Handlers by kind: which one runs a lease, what the worker claims, and how
many jobs of each kind it runs at once.

A worker has a handler for each of some kinds (`Worker.handler(kind)`), and
maybe a default handler for jobs without a kind. One pool of slots
(`WorkerConfig.concurrency`) serves them all; a kind may also have its own
limit (`max_concurrency`), which its jobs count against as well.

What it claims. On a cluster of version 8 or later a claim names the kinds
the worker has handlers for (`kinds`, null for jobs without a kind when it
has a default handler) and, for a kind with a limit, how many more of it
may run now (`kind_max_jobs`): the cluster then never leases it a job it
cannot run, nor more of a kind than the kind's limit allows. A kind at its
limit is left out of the claim until one of its jobs ends.

Before that (a cluster below version 8 answers 409 `cluster_version`; a node
of release 0.7.0 or earlier, 400 naming `kinds`) the worker falls back: no
job can have a kind yet, so a worker with a default handler claims as
before, without kinds, and one without has nothing it could run and claims
nothing. It tries its kinds again every `PROBE_S`, and at once when a lease
with a kind arrives (proof that the version was raised).

A job of a kind no running worker has a handler for waits, pending: while
new workers roll out, the old ones leave the new kinds alone. A pool that
is the only one serving its queues can ask for the opposite
(`WorkerConfig.dead_letter_unknown_kinds`): it then also claims every job
its kinds do not name (the claim's kind "*") and dead-letters those, so a
mistyped or retired kind fails at once instead of waiting unseen; falling
back, it claims everything.

A lease that the worker has no handler for (so claimed, or leased while
falling back, in the moment the version is raised) is failed as permanent,
without starting it, with the stable message prefix `no_handler_for_kind:`
that names the kind and this worker's kinds: a clear dead letter, which
`raftsched dlq replay` sends back once a worker that has the handler runs.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from raftsched.worker._context import PermanentError
from raftsched.worker._job import Handler

log = logging.getLogger("raftsched.worker")

KIND_PATTERN: Final = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
"""A job kind, as the cluster checks it (core.kernel.validate)."""
NO_HANDLER_FOR_KIND: Final = "no_handler_for_kind"
OTHER_KINDS: Final = "*"
"""In a claim's kinds: every job that no other entry names."""
# How long a worker that fell back claims without kinds before trying them again.
PROBE_S: Final = 10.0


def check_kind(kind: object) -> str:
    if not isinstance(kind, str) or KIND_PATTERN.fullmatch(kind) is None:
        raise ValueError(f"a kind is 1 to 128 characters of A-Z a-z 0-9 _ . : -, not {kind!r}")
    return kind


class NoHandlerForKind(PermanentError):
    """The worker has no handler for a leased job's kind: the job is failed
    permanently (dead-lettered) with the message `no_handler_for_kind: ...`."""

    code: Final = NO_HANDLER_FOR_KIND

    def __init__(self, kind: str | None, worker_id: str, kinds: list[str], default: bool) -> None:
        wanted = (
            f"kind {kind!r}" if kind is not None else "jobs without a kind (no default handler)"
        )
        served = ", ".join(repr(each) for each in kinds) or "none"
        default_text = "and a default handler" if default else "and no default handler"
        super().__init__(
            f"worker {worker_id} has no handler for {wanted}; "
            f"it has handlers for the kinds {served} {default_text}"
        )
        self.kind = kind


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """What one claim asks for: `kinds` None is any job (no kinds sent)."""

    max_jobs: int
    kinds: tuple[str | None, ...] | None
    caps: Mapping[str, int]


class Routes:
    """A worker's handlers by kind (None: the default handler), their limits,
    and how many slots of each kind are busy: running jobs, plus what claims
    in flight may bring, minus what reports carrying a next claim free."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, *, take_unknown: bool = False
    ) -> None:
        self.handlers: dict[str | None, Handler] = {}
        self.limits: dict[str, int] = {}
        self._busy: Counter[str | None] = Counter()
        self._running: dict[str, str | None] = {}  # job id -> its kind
        self._clock = clock
        # When the cluster last refused kinds (None: it takes them), and how
        # long until they are tried again.
        self._refused_at: float | None = None
        self.probe_s = PROBE_S
        # Claim every job the kinds do not name too, to dead-letter it.
        self.take_unknown = take_unknown

    def add(self, kind: str | None, handler: Handler, max_concurrency: int | None) -> None:
        if kind is not None:
            check_kind(kind)
        if not callable(handler):
            raise ValueError(f"the handler of {kind!r} is not callable")
        if max_concurrency is not None:
            if kind is None:
                raise ValueError("the default handler's concurrency is the worker's")
            if type(max_concurrency) is not int or max_concurrency < 1:
                raise ValueError(f"max_concurrency of {kind!r} must be at least 1")
            self.limits[kind] = max_concurrency
        self.handlers[kind] = handler

    def limit(self, kind: str, max_concurrency: int) -> None:
        """A kind's limit, set apart from its handler (`WorkerConfig.kind_concurrency`)."""
        if type(max_concurrency) is not int or max_concurrency < 1:
            raise ValueError(f"max_concurrency of {kind!r} must be at least 1")
        self.limits[check_kind(kind)] = max_concurrency

    @property
    def kinds(self) -> list[str]:
        return sorted(kind for kind in self.handlers if kind is not None)

    @property
    def has_default(self) -> bool:
        return None in self.handlers

    def handler_for(self, kind: str | None) -> Handler | None:
        return self.handlers.get(kind)

    def unrouted(self, kind: str | None, worker_id: str) -> NoHandlerForKind:
        return NoHandlerForKind(kind, worker_id, self.kinds, self.has_default)

    # -- the cluster's answer to kinds ------------------------------------------

    @property
    def falling_back(self) -> bool:
        return self._refused_at is not None

    def refused(self) -> bool:
        """The cluster does not take kinds yet; True when that is news."""
        news = self._refused_at is None
        self._refused_at = self._clock()
        return news

    def taken(self) -> bool:
        """The cluster takes kinds now; True when that is news."""
        news = self._refused_at is not None
        self._refused_at = None
        return news

    def probe_due(self) -> bool:
        """Whether a claim should try kinds again while falling back."""
        return self._refused_at is not None and self._clock() - self._refused_at >= self.probe_s

    # -- what to claim ------------------------------------------------------------

    def plan(self, max_jobs: int, *, probe: bool = False, parts: int = 1) -> ClaimPlan | None:
        """The claim for `max_jobs` free slots, or None when nothing the
        worker could run may be claimed now (every kind at its limit, or
        falling back without a default handler). `probe`: with kinds even
        while falling back. `parts`: how many claims share a kind's room
        (one per shard, `_slots`): each asks for at most its part, so a
        limited kind is claimed from every shard, not from the first only."""
        if max_jobs <= 0:
            return None
        if self.falling_back and not probe:
            # No job has a kind before version 8: only a default handler has
            # work, or a worker that dead-letters what it cannot run.
            wanted = self.has_default or self.take_unknown
            return ClaimPlan(max_jobs, None, {}) if wanted else None
        kinds: list[str | None] = []
        caps: dict[str, int] = {}
        bounded = 0
        unbounded = False
        for kind in (*self.kinds, None):
            if kind not in self.handlers:
                continue
            limit = None if kind is None else self.limits.get(kind)
            if limit is None:
                kinds.append(kind)
                unbounded = True
                continue
            assert kind is not None
            room = limit - self._busy[kind]
            if room > 0:
                kinds.append(kind)
                caps[kind] = min(-(-room // parts), max_jobs)
                bounded += caps[kind]
            elif self.take_unknown:  # named with 0, or "*" would take it
                kinds.append(kind)
                caps[kind] = 0
        if self.take_unknown:
            kinds.append(OTHER_KINDS)
            unbounded = True
        if not kinds:
            return None
        return ClaimPlan(max_jobs if unbounded else min(max_jobs, bounded), tuple(kinds), caps)

    def hold(self, plan: ClaimPlan) -> None:
        """A claim of `plan` is in flight: its caps are taken."""
        self._busy.update(plan.caps)

    def release(self, plan: ClaimPlan) -> None:
        self._busy.subtract(plan.caps)

    def started(self, job_id: str, kind: str | None) -> None:
        self._running[job_id] = kind
        self._busy[kind] += 1

    def ended(self, job_id: str) -> None:
        if job_id in self._running:
            self._busy[self._running.pop(job_id)] -= 1

    def finishing(self, job_ids: list[str], sign: int = 1) -> None:
        """Reports of these jobs carry a next claim: their slots are its to
        fill (`sign` -1: the claim came back; they count as running again
        until their runs end)."""
        for job_id in job_ids:
            if job_id in self._running:
                self._busy[self._running[job_id]] -= sign
