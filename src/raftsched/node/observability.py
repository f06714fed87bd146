"""What the node tells people: job metrics, audit and incident log lines,
recent errors, leader history, stuck jobs and clock skew.

Theory of operation. The core is pure and says what happened only in the
results of the commands it applies. The proposer hands every committed
(command, result) pair of this node's entries to `Observer.observe`, on the
asyncio loop, right after apply. So job counters (`_total`) count the work
*this node proposed as leader*: summed over the nodes of a cluster they are
the cluster's totals, and a leader change does not double count. Latencies
are read from the job's own replicated records (history, attempts), so they
are replicated time, not this node's clock.

Some facts live only in memory and only where they are seen:
- heartbeat progress (the core keeps the lease expiry, not when progress last
  changed): the leader tracks it per running job, so the stuck-job gauge is
  exported by the leader only;
- leader history: every node samples its Raft status once a second and keeps
  the last `LEADER_HISTORY_MAX` changes it saw;
- clock skew: the leader asks each peer for its wall clock (`GET /v1/time`)
  every `SKEW_PERIOD_S` and takes skew = peer_clock - midpoint of the round
  trip, with half the round trip as its uncertainty.
Everything kept is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from typing import Any

from raftsched import core
from raftsched.core.jobs.commands import (
    CancelJob,
    CompleteJob,
    FailJob,
    HeartbeatJob,
    LeaseBatch,
    ReconcileJob,
    ReplayJob,
    StartJob,
    SubmitJobs,
)
from raftsched.core.jobs.reconcile_book import book_of, outcome_unknown
from raftsched.core.kernel.commands import Audited, Tick
from raftsched.core.kernel.results import (
    BatchApplied,
    CancelAccepted,
    Claimed,
    Completed,
    Failed,
    HeartbeatAccepted,
    Lease,
    Reconciled,
    Rejected,
    Replayed,
    Started,
    SubmitItem,
    Submitted,
    Ticked,
)
from raftsched.node import metrics as families
from raftsched.node.metrics import NodeMetrics, Samples
from raftsched.raft import RaftStatus

log = logging.getLogger("raftsched.observe")

RECENT_ERRORS_MAX = 200
LEADER_HISTORY_MAX = 100
TRACKED_JOBS_MAX = 100_000
STUCK_LIST_MAX = 100
SAMPLE_PERIOD_S = 1.0
SKEW_PERIOD_S = 5.0
SKEW_TIMEOUT_S = 1.0
DEFAULT_STUCK_AFTER_S = 600.0

SkewFetch = Callable[[str], Awaitable[float]]


def stuck_after_s_from_env() -> float:
    """`RAFTSCHED_STUCK_AFTER_S`: how long a running job may go without
    heartbeat progress before it counts as stuck (default 600 s)."""
    text = os.environ.get("RAFTSCHED_STUCK_AFTER_S", "")
    try:
        value = float(text)
    except ValueError:
        return DEFAULT_STUCK_AFTER_S
    return value if value > 0 else DEFAULT_STUCK_AFTER_S


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class RecentError:
    at_ms: int
    source: str  # "attempt", "lease_expired", "dead_letter", "http"
    kind: str
    message: str
    job_id: str | None = None
    queue: str | None = None


@dataclass(frozen=True, slots=True)
class LeaderChange:
    at_ms: int
    term: int
    leader_id: str | None
    previous_id: str | None


@dataclass(frozen=True, slots=True)
class ClockSkew:
    node_id: str
    skew_ms: float
    round_trip_ms: float
    measured_at_ms: int


@dataclass(slots=True)
class _Progress:
    started_ms: int  # this node's wall clock when it first saw the job run
    last_progress: bytes | None
    changed_ms: int


def _job_fields(job: core.Job | None, token: int | None = None) -> dict[str, Any]:
    """The log fields that name a job: ids a person can search for."""
    if job is None:
        return {}
    fields: dict[str, Any] = {"job_id": job.id, "queue": job.queue}
    for name in ("correlation_id", "workflow_id", "schedule_id", "tenant"):
        value = getattr(job, name)
        if value is not None:
            fields[name] = value
    if token is not None:
        fields["fencing_token"] = token
    return fields


def _attempt_by_token(job: core.Job, token: int) -> core.Attempt | None:
    for attempt in reversed(job.attempts):
        if attempt.fencing_token == token:
            return attempt
    return None


class Observer:
    """Metrics and log lines from command results; in-memory views for the
    dashboard. Runs on the node's asyncio loop."""

    def __init__(
        self,
        node_id: str,
        metrics: NodeMetrics,
        reading: Callable[[], AbstractContextManager[core.State]],
        status: Callable[[], RaftStatus],
        *,
        stuck_after_s: float | None = None,
    ) -> None:
        self.node_id = node_id
        self._reading = reading
        self._status = status
        self.stuck_after_ms = int(1000 * (stuck_after_s or stuck_after_s_from_env()))
        self.recent_errors: deque[RecentError] = deque(maxlen=RECENT_ERRORS_MAX)
        self.leader_history: deque[LeaderChange] = deque(maxlen=LEADER_HISTORY_MAX)
        self.clock_skew: dict[str, ClockSkew] = {}
        self._progress: dict[str, _Progress] = {}
        self._leased: dict[str, int] = {}  # job id -> token, leases this leader granted
        # Jobs that were reconciling at the last tick this node proposed: a
        # tick that ends one because its reconciliation budget is spent
        # says so only in the job (Ticked has no count for it).
        self._reconciling: set[str] = set()
        self._last_leader: tuple[str | None, int] | None = None
        self.is_leader: Callable[[], bool] = lambda: False
        self.metrics = metrics  # per-job series through metrics.series (made once)
        self._init_metrics(metrics)

    # -- metrics families -----------------------------------------------------

    def _init_metrics(self, metrics: NodeMetrics) -> None:
        """Bind the families read from what this node observed."""
        sample = metrics.sample
        sample(families.JOBS_STUCK, self._m_stuck)
        sample(families.STUCK_THRESHOLD, lambda: [((), self.stuck_after_ms / 1000)])
        sample(families.OUTBOX_LAG, self._m_outbox_lag)
        sample(families.FOLLOWER_LAG, self._m_follower_lag)
        sample(
            families.CLOCK_SKEW,
            lambda: [((s.node_id,), s.skew_ms / 1000) for s in self.clock_skew.values()],
        )
        sample(
            families.CLOCK_SKEW_UNCERTAINTY,
            lambda: [((s.node_id,), s.round_trip_ms / 2000) for s in self.clock_skew.values()],
        )

    def outbox_lag(self) -> dict[str, int] | None:
        """Per webhook subscription: outbox events not yet delivered (None on
        a build without the outbox)."""
        try:
            from raftsched.core.events import subscriptions
            from raftsched.core.kernel import outbox
        except ImportError:
            return None
        try:
            with self._reading() as state:
                last = outbox.last_seq(state)
                table = subscriptions.subscriptions(state)
                return {name: max(0, last - sub.cursor) for name, sub in sorted(table.items())}
        except Exception:  # a section still being built must not break /metrics
            log.debug("outbox lag unavailable", exc_info=True)
            return None

    def _m_outbox_lag(self) -> Samples:
        lag = self.outbox_lag() or {}
        return [((name,), float(events)) for name, events in lag.items()]

    def _m_stuck(self) -> Samples:
        if not self.is_leader():
            return []
        return [((), float(len(self.stuck_jobs(limit=TRACKED_JOBS_MAX))))]

    def _m_follower_lag(self) -> Samples:
        status = self._status()
        if status.role != "leader":
            return []
        return [
            ((peer.id,), float(max(0, status.commit_index - peer.match_index)))
            for peer in status.peers
            if peer.match_index is not None
        ]

    # -- command results ------------------------------------------------------

    def observe(self, commands: Sequence[object], results: Sequence[object]) -> None:
        """Called with each committed entry of this node's, in order."""
        try:
            rest = []
            for command, result in _one_by_one(commands, results):
                if isinstance(result, Claimed):
                    # Claims need no state: the lease says all. A 1,000-job
                    # claim must not hold the state lock the applier waits for.
                    self._on_claimed(result.leases)
                else:
                    rest.append((command, result))
            if rest:
                with self._reading() as state:
                    for command, result in rest:
                        self._observe_one(state, command, result)
        except Exception:  # observation must never break proposing
            log.exception("observing results failed")

    def _observe_one(self, state: core.State, command: object, result: object) -> None:
        if isinstance(command, Audited):  # an operator command and its actor
            command = command.command
        match command, result:
            case SubmitJobs(specs=specs), Submitted(items=items):
                created: dict[str, int] = {}  # one increment per queue, not per job
                # The spec names the queue: a far-future job has no live
                # object to ask (it is packed in the time wheel).
                for spec, item in zip(specs, items, strict=False):
                    if isinstance(item, SubmitItem) and item.created:
                        queue = spec.queue
                        created[queue] = created.get(queue, 0) + 1
                for queue, count in created.items():
                    self.metrics.series(self.metrics.jobs_submitted, queue).inc(count)
            case StartJob(job_id=job_id), Started():
                self._progress.setdefault(job_id, _Progress(wall_ms(), None, wall_ms()))
            case HeartbeatJob(job_id=job_id, progress=progress), HeartbeatAccepted():
                self.metrics.lease_renewals.inc()
                self._on_progress(job_id, progress)
            case CompleteJob(job_id=job_id, fencing_token=token), Completed(replayed=False):
                self._on_outcome(state, job_id, token, "succeeded")
            case FailJob(fencing_token=token) as fail, Failed(status=status):
                self._on_failed(state, fail, token, status)
            case Tick(), Ticked() as ticked:
                self._on_tick(state, ticked)
            case ReconcileJob(fencing_token=token, reason=reason), Reconciled(
                replayed=False
            ) as done:
                self._on_reconciled(state, done, token, reason)
            case ReplayJob(job_id=job_id, reason=reason, actor=actor), Replayed():
                self.metrics.replays.inc()
                fields = _job_fields(state.jobs.get(job_id))
                log.info(
                    "audit: job replayed from the dead-letter queue",
                    extra={
                        **fields,
                        "job_id": job_id,
                        "actor": actor,
                        "reason": reason,
                        "epoch": state.epoch,
                    },
                )
            case CancelJob(job_id=job_id, reason=reason, actor=actor), CancelAccepted(
                status=status
            ):
                self.metrics.cancels.inc()
                fields = _job_fields(state.jobs.get(job_id))
                log.info(
                    "audit: job cancel accepted",
                    extra={
                        **fields,
                        "job_id": job_id,
                        "actor": actor,
                        "reason": reason,
                        "status": status,
                        "epoch": state.epoch,
                    },
                )
            case _, Rejected(code="internal_error", message=message):
                self.record_error("internal", "internal_error", message)
            case _:
                pass

    def _on_claimed(self, leases: Sequence[Lease]) -> None:
        family = self.metrics.claim_latency
        granted: dict[str, int] = {}
        for lease in leases:
            granted[lease.queue] = granted.get(lease.queue, 0) + 1
            if lease.runnable_since_ms is not None:
                claimed_ms = lease.expires_at_ms - lease.lease_ms
                series = self.metrics.series(family, lease.queue)
                series.observe(max(0, claimed_ms - lease.runnable_since_ms) / 1000)
        for queue, count in granted.items():
            self.metrics.series(self.metrics.job_attempts, queue).inc(count)
        leased = self._leased
        for lease in leases[: max(0, TRACKED_JOBS_MAX - len(leased))]:
            leased[lease.job_id] = lease.fencing_token

    def _on_progress(self, job_id: str, progress: bytes | None) -> None:
        now = wall_ms()
        tracked = self._progress.get(job_id)
        if tracked is None:
            if len(self._progress) < TRACKED_JOBS_MAX:
                self._progress[job_id] = _Progress(now, progress, now)
            return
        if progress is not None and progress != tracked.last_progress:
            tracked.last_progress = progress
            tracked.changed_ms = now

    def _on_outcome(self, state: core.State, job_id: str, token: int, outcome: str) -> None:
        self._progress.pop(job_id, None)
        self._leased.pop(job_id, None)
        job = state.jobs.get(job_id)
        if job is None:
            return
        attempt = _attempt_by_token(job, token)
        if attempt is not None and attempt.ended_at_ms is not None:
            began_ms = attempt.started_at_ms or attempt.claimed_at_ms
            self.metrics.series(self.metrics.execution_seconds, job.queue, outcome).observe(
                max(0, attempt.ended_at_ms - began_ms) / 1000
            )
        if outcome == "succeeded":
            self.metrics.series(self.metrics.jobs_succeeded, job.queue).inc()

    def _on_failed(self, state: core.State, fail: FailJob, token: int, status: str) -> None:
        self._on_outcome(state, fail.job_id, token, "failed")
        job = state.jobs.get(fail.job_id)
        queue = job.queue if job else "unknown"
        self.metrics.series(self.metrics.job_failures, queue, fail.kind).inc()
        attempt = None if job is None else _attempt_by_token(job, token)
        if attempt is not None and outcome_unknown(attempt):  # not one cancel ended
            self.metrics.series(self.metrics.unknown_outcomes, queue).inc()
        fields = {**_job_fields(job, token), "kind": fail.kind, "status": status}
        if status in ("retry_wait", "pending"):
            self.metrics.series(self.metrics.job_retries, queue).inc()
        fields["epoch"] = state.epoch
        if status == "dead_letter":
            reason = "permanent" if fail.kind == "permanent" else "attempts_exhausted"
            self._dead_lettered(reason, fields, fail.message)
        else:
            self.record_error("attempt", fail.kind, fail.message, fail.job_id, queue)
            log.info("job attempt failed", extra={**fields, "error": fail.message[:500]})

    def _on_reconciled(self, state: core.State, done: Reconciled, token: int, reason: str) -> None:
        """A reconcile decision: counted by decision, and the job's outcome
        counted as a completion or a dead letter would be."""
        self.metrics.series(self.metrics.reconcile_decisions, done.decision).inc()
        job = state.jobs.get(done.job_id)
        fields = {**_job_fields(job, token), "decision": done.decision, "status": done.status}
        fields["epoch"] = state.epoch
        log.info("job reconciled", extra={**fields, "evidence": reason[:500]})
        if done.status == "succeeded" and job is not None:
            self.metrics.series(self.metrics.jobs_succeeded, job.queue).inc()
        elif done.status == "dead_letter":
            self._dead_lettered("unreconciled", fields, reason)

    def _dead_lettered(self, reason: str, fields: dict[str, Any], message: str) -> None:
        self.metrics.dead_letters.labels(reason).inc()
        log.warning("job dead-lettered", extra={**fields, "reason": reason, "error": message[:500]})
        self.record_error("dead_letter", reason, message, fields.get("job_id"), fields.get("queue"))

    def _on_tick(self, state: core.State, ticked: Ticked) -> None:
        if ticked.dead_lettered:
            # Deadline dead letters: Ticked carries only their count.
            self.metrics.dead_letters.labels("deadline").inc(ticked.dead_lettered)
            log.warning(
                "jobs dead-lettered: deadline exceeded",
                extra={"count": ticked.dead_lettered, "epoch": state.epoch},
            )
            self.record_error("dead_letter", "deadline", f"{ticked.dead_lettered} job(s)")
        if ticked.leases_expired:
            self._find_expired(state)
        self._find_unreconciled(state)

    def _find_unreconciled(self, state: core.State) -> None:
        """Count the jobs a tick dead-lettered `unreconciled` (their
        reconciliation leases kept expiring unanswered)."""
        tasks = book_of(state).tasks
        for job_id in self._reconciling - tasks.keys():
            job = state.jobs.get(job_id)
            if job is None or job.status != "dead_letter" or not job.history:
                continue
            _, event, from_status, _, actor, _, token, detail = job.history[-1]
            by_tick = actor == "system" and from_status == "reconciling"
            if by_tick and job.last_error is not None and job.last_error[0] == "unreconciled":
                fields = {**_job_fields(job, token), "epoch": state.epoch}
                self._dead_lettered("unreconciled", fields, detail or "")
        self._reconciling = set(list(tasks)[:TRACKED_JOBS_MAX])

    def _find_expired(self, state: core.State) -> None:
        """Name each lease this leader granted that a tick just expired."""
        for job_id, token in list(self._leased.items()):
            job = state.jobs.get(job_id)
            attempt = None if job is None else _attempt_by_token(job, token)
            if job is None or attempt is None:
                self._leased.pop(job_id, None)
                continue
            if attempt.outcome != "lease_expired":
                continue
            self._leased.pop(job_id, None)
            self._progress.pop(job_id, None)
            was = "running" if attempt.started_at_ms is not None else "claimed"
            self.metrics.lease_expirations.labels(was).inc()
            if outcome_unknown(attempt):  # expired while running
                self.metrics.series(self.metrics.unknown_outcomes, job.queue).inc()
            fields = {**_job_fields(job, token), "epoch": attempt.epoch, "status": job.status}
            log.warning("lease expired", extra={**fields, "was": was})
            self.record_error("lease_expired", was, "lease expired", job_id, job.queue)
            if job.status == "dead_letter":
                self._dead_lettered("lease_expired", fields, "lease expired")

    # -- in-memory views ------------------------------------------------------

    def record_error(
        self,
        source: str,
        kind: str,
        message: str,
        job_id: str | None = None,
        queue: str | None = None,
    ) -> None:
        self.recent_errors.append(
            RecentError(wall_ms(), source, kind, message[:500], job_id, queue)
        )

    def stuck_jobs(self, limit: int = STUCK_LIST_MAX) -> list[dict[str, Any]]:
        """Running jobs whose last heartbeat progress (or start) is older than
        the threshold, oldest first. Only meaningful on the leader."""
        now = wall_ms()
        found: list[dict[str, Any]] = []
        with self._reading() as state:
            for job in _running_jobs(state):
                tracked = self._progress.get(job.id)
                attempt = job.attempts[-1]
                started_ms = attempt.started_at_ms or attempt.claimed_at_ms
                # Replicated time for the start; this node's clock for progress
                # it saw itself (a new leader has seen none: it counts from start).
                quiet_since_ms = (
                    started_ms if tracked is None else max(started_ms, tracked.changed_ms)
                )
                reference_ms = max(now, state.now_ms)
                if reference_ms - quiet_since_ms >= self.stuck_after_ms:
                    found.append(
                        {
                            "job_id": job.id,
                            "queue": job.queue,
                            "worker_id": job.lease.worker_id if job.lease else None,
                            "started_at_ms": started_ms,
                            "quiet_s": (reference_ms - quiet_since_ms) / 1000,
                            "fencing_token": attempt.fencing_token,
                        }
                    )
        found.sort(key=lambda item: -float(item["quiet_s"]))
        return found[:limit]

    def history_json(self) -> list[dict[str, Any]]:
        return [asdict(change) for change in reversed(self.leader_history)]

    def errors_json(self, limit: int = 50) -> list[dict[str, Any]]:
        return [asdict(error) for error in list(self.recent_errors)[::-1][:limit]]

    def skew_json(self) -> list[dict[str, Any]]:
        return [asdict(skew) for skew in sorted(self.clock_skew.values(), key=lambda s: s.node_id)]

    # -- sampling (every node) ------------------------------------------------

    def sample_leader(self) -> None:
        """Note a change of the known leader or term (once a second)."""
        status = self._status()
        current = (status.leader_id, status.term)
        last = self._last_leader
        if last is not None and last[0] == current[0]:
            return
        self._last_leader = current
        previous = None if last is None else last[0]
        if last is None and current[0] is None:
            return
        self.leader_history.append(LeaderChange(wall_ms(), status.term, current[0], previous))
        if last is not None:
            self.metrics.leader_observed.inc()
        level = logging.WARNING if current[0] is None else logging.INFO
        log.log(
            level,
            "leader changed" if current[0] else "leader lost",
            extra={"leader_id": current[0], "previous_leader_id": previous, "term": status.term},
        )

    def on_became_leader(self) -> None:
        """A new leader learns the leases it did not grant (they may expire
        under it) so that it can name them when they do."""
        self._leased.clear()
        with self._reading() as state:
            for job in _leased_jobs(state):
                if job.lease is not None and len(self._leased) < TRACKED_JOBS_MAX:
                    self._leased[job.id] = job.lease.fencing_token

    async def measure_skew(self, peers: dict[str, str], fetch: SkewFetch) -> None:
        """Leader only: each peer's wall clock against ours."""
        for node_id, url in sorted(peers.items()):
            sent_s = time.time()
            try:
                peer_ms = await asyncio.wait_for(fetch(url), SKEW_TIMEOUT_S)
            except Exception:
                self.clock_skew.pop(node_id, None)
                continue
            received_s = time.time()
            midpoint_ms = (sent_s + received_s) * 500
            self.clock_skew[node_id] = ClockSkew(
                node_id, peer_ms - midpoint_ms, (received_s - sent_s) * 1000, wall_ms()
            )
        self.clock_skew[self.node_id] = ClockSkew(self.node_id, 0.0, 0.0, wall_ms())

    def forget_skew(self) -> None:
        self.clock_skew.clear()


def _leased_jobs(state: core.State) -> Iterator[core.Job]:
    seen: set[str] = set()
    for _, token, job in state.leases:
        lease = job.lease
        if lease is not None and lease.fencing_token == token and job.id not in seen:
            seen.add(job.id)
            yield job


def _running_jobs(state: core.State) -> Iterator[core.Job]:
    for job in _leased_jobs(state):
        if job.status == "running":
            yield job


async def sample_forever(observer: Observer, tick: Callable[[], Any]) -> None:
    """The node's once-a-second sampling loop."""
    while True:
        with contextlib.suppress(Exception):
            observer.sample_leader()
            await tick()
        await asyncio.sleep(SAMPLE_PERIOD_S)


def _one_by_one(
    commands: Sequence[object], results: Sequence[object]
) -> Iterator[tuple[object, object]]:
    """The (command, result) pairs of an entry, a lease batch's ops and claim
    each as if it had come alone (its metrics and log lines are theirs)."""
    for command, result in zip(commands, results, strict=False):
        if type(command) is LeaseBatch and type(result) is BatchApplied:
            yield from zip(command.ops, result.results, strict=False)
            if command.claim is not None and result.claimed is not None:
                yield command.claim, result.claimed
        else:
            yield command, result
