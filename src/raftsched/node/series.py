"""An hour of figures per queue and for the cluster, for the dashboard's charts.

Every node keeps its own: a bounded ring in memory, never replicated, served
by `GET /v1/stats/series` (api/stats.py) from whichever node is asked.

What each 5 s bucket holds, for the cluster and for each of at most
`QUEUES_MAX` queues:

- `succeeded`, `dead_lettered`: jobs that reached that status, counted from
  the replicated outbox (`job.succeeded`, `job.dead_lettered` events, core
  kernel.outbox), whose sequence numbers only grow;
- `failed`: attempts a worker reported failed (`fail`, any kind; the same
  count as `raftsched_job_failures_total`), counted from the results this
  replica applies;
- `due_to_lease_p99_s`: the 99th percentile of due-to-lease lag of the leases
  this replica applies (from when a job became runnable, its `run_at` or the
  end of its retry backoff, to the claim that leased it, in replicated time;
  as `raftsched_job_claim_latency_seconds`);
- `depth`, `oldest_runnable_age_s`: sampled from this replica once per
  bucket, a quarter of a second before it ends.

Theory of operation
-------------------
Counts are monotonic by construction: an outbox event is read once, by its
sequence number, and an applied result is seen once, when it is applied. No
rate is ever a difference of gauges. A count goes into the bucket of the
*replicated* time at which it happened (the event's `at`, the entry's
`now_ms`), so every replica puts the same counts into the same buckets: all
nodes chart the same rates, whichever of them leads, and a leader change
changes nothing. A node that restarts fills the hour back in: the outbox
holds a day of events, and replaying its Raft log applies the entries since
its last snapshot again.

What a node cannot know it answers `null`, never 0:
- a bucket overlapping a span whose entries this replica never applied (a
  snapshot it loaded, at start or from the leader, skipped them): `failed`
  and `due_to_lease_p99_s` there;
- a bucket overlapping a span whose outbox events were gone before this node
  read them (dropped from a full outbox, or trimmed): `succeeded` and
  `dead_lettered` there;
- `depth` and `oldest_runnable_age_s` of a bucket this process did not sample
  (before it started, or while its loop was held up);
- a queue's counts before its series was made, once some queue was refused
  one (see below); `due_to_lease_p99_s` of a bucket without a claim.

Counts stamped later than this node's clock (its clock behind the leader's)
go into its current bucket; a count older than the ring is dropped.

Bounds: `SLOTS` buckets (an hour of 5 s), `QUEUES_MAX` queue series besides
the cluster's; a queue beyond that gets a series only when one of the others
has been idle for the whole hour, and counts only in the cluster's figures
until then. Each series is six arrays of `SLOTS` doubles (34,608 bytes), so
the ring is at most (QUEUES_MAX + 1) x 34,608 bytes (1.8 MB), plus at most
`LAGS_OPEN_MAX` open lag histograms (a bucket's histogram is reduced to its
99th percentile `LAGS_OPEN_BUCKETS` buckets after it ends).

Threads: `count_applied` runs on the Raft thread (under the replica's lock,
from node.machine), `note_restored` too; the sampler and the readers run on
the asyncio loop. One lock of its own guards the ring; it is taken after the
replica's lock, never before it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Final

from raftsched import core
from raftsched.core.kernel.outbox import OutboxEvent, decode_data, outbox
from raftsched.core.kernel.results import BatchApplied, Claimed, Failed, Lease
from raftsched.timefmt import format_ms

log = logging.getLogger("raftsched.series")

PERIOD_MS: Final = 5_000
WINDOW_S: Final = 3_600
# An hour of complete 5 s buckets and the one filling.
SLOTS: Final = WINDOW_S * 1000 // PERIOD_MS + 1
QUEUES_MAX: Final = 50
# A bucket's lag histogram is kept this many buckets after it ends (claims
# applied late, by a follower catching up, still count), then reduced to its
# 99th percentile; at most LAGS_OPEN_MAX are kept at once (a node replaying
# an hour of log at start makes many).
LAGS_OPEN_BUCKETS: Final = 12
LAGS_OPEN_MAX: Final = 1_024
# Lag histogram resolution: 8 buckets per doubling, so a p99 is at most 9%
# above the true one (it is the upper edge of its histogram bucket).
LAG_STEPS_PER_DOUBLING: Final = 8
# Outbox events read per chunk; the sampler yields to the loop between chunks
# and reads at most OUTBOX_CHUNKS_MAX chunks per bucket (the rest next time).
OUTBOX_CHUNK: Final = 5_000
OUTBOX_CHUNKS_MAX: Final = 40
# Spans of missing data remembered (older ones are outside the hour anyway).
GAPS_MAX: Final = 16
# The gauges are sampled this long before a bucket ends.
SAMPLE_BEFORE_END_MS: Final = 250

FIELDS: Final = (
    "succeeded_per_s",
    "failed_per_s",
    "dead_lettered_per_s",
    "depth",
    "oldest_runnable_age_s",
    "due_to_lease_p99_s",
)
SUCCEEDED, FAILED, DEAD_LETTERED, DEPTH, OLDEST_AGE, LAG_P99 = range(len(FIELDS))
COUNTS: Final = (SUCCEEDED, FAILED, DEAD_LETTERED)
# The outbox events counted, and the count each goes to.
EVENT_FIELDS: Final = {"job.succeeded": SUCCEEDED, "job.dead_lettered": DEAD_LETTERED}
NAN: Final = math.nan

Reading = Callable[[], AbstractContextManager[core.State]]


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class _Series:
    """One queue's (or the cluster's) columns: counts start at 0 in a bucket
    the ring holds, the sampled figures at NaN (not sampled)."""

    __slots__ = ("columns", "since_bucket", "exact_before", "last_active_bucket")

    def __init__(self, slots: int, bucket: int, exact_before: bool) -> None:
        self.columns = [array("d", [0.0]) * slots for _ in COUNTS] + [
            array("d", [NAN]) * slots for _ in (DEPTH, OLDEST_AGE, LAG_P99)
        ]
        # Counts before `since_bucket` are zeros when `exact_before` (nothing
        # of this queue was refused before the series was made), else unknown.
        self.since_bucket = bucket
        self.exact_before = exact_before
        self.last_active_bucket = bucket

    def clear(self, slot: int) -> None:
        columns = self.columns
        for field in COUNTS:
            columns[field][slot] = 0.0
        for field in (DEPTH, OLDEST_AGE, LAG_P99):
            columns[field][slot] = NAN

    def nbytes(self) -> int:
        return sum(column.itemsize * len(column) for column in self.columns)


@dataclass(frozen=True, slots=True)
class Window:
    """What `GET /v1/stats/series` answers: one list per field, oldest first,
    None where unknown; counts as rates per second."""

    queue: str | None
    period_s: float
    at: list[str]
    values: dict[str, list[float | None]]
    queues: list[str]
    sampling_since: str


class SeriesRing:
    def __init__(
        self,
        clock_ms: Callable[[], int] = wall_ms,
        *,
        slots: int = SLOTS,
        period_ms: int = PERIOD_MS,
        queues_max: int = QUEUES_MAX,
    ) -> None:
        self._clock_ms = clock_ms
        self.slots = slots
        self.period_ms = period_ms
        self.queues_max = queues_max
        self._lock = threading.Lock()
        self._bucket_at = array("q", [-1]) * slots  # which bucket each slot holds
        self.started_ms = clock_ms()
        start = self.started_ms // period_ms
        self._total = _Series(slots, start, exact_before=True)
        self._queues: dict[str, _Series] = {}
        self.refusals = 0  # counts of queues that found no room for a series
        # (series key, bucket) -> {lag step: claims}; None is the cluster.
        self._lags: dict[tuple[str | None, int], dict[int, int]] = {}
        # Spans [from_ms, to_ms) of replicated time without data, by source.
        self._applied_gaps: deque[tuple[int, int]] = deque(maxlen=GAPS_MAX)
        self._outbox_gaps: deque[tuple[int, int]] = deque(maxlen=GAPS_MAX)
        self._outbox_seq: int | None = None  # the last event read
        self._outbox_at_ms = 0  # and its time

    # -- the ring --------------------------------------------------------------

    def now_ms(self) -> int:
        return self._clock_ms()

    def _now_bucket(self) -> int:
        return self._clock_ms() // self.period_ms

    def _slot(self, bucket: int, now_bucket: int) -> int | None:
        """The slot of `bucket`, taken over (cleared) if it held an older
        one; None for a bucket older than the ring or the slot's bucket."""
        if bucket <= now_bucket - self.slots:
            return None
        slot = bucket % self.slots
        held = self._bucket_at[slot]
        if held == bucket:
            return slot
        if held > bucket:
            return None
        self._bucket_at[slot] = bucket
        self._total.clear(slot)
        for series in self._queues.values():
            series.clear(slot)
        return slot

    def _series(
        self, queue: str | None, bucket: int, now_bucket: int, active: bool
    ) -> _Series | None:
        """The queue's series (None: the cluster's), made when `active` and
        there is room (an idle queue's is given up after a whole hour)."""
        if queue is None:
            return self._total
        found = self._queues.get(queue)
        if found is not None or not active:
            return found
        if len(self._queues) >= self.queues_max:
            idlest = min(self._queues, key=lambda name: self._queues[name].last_active_bucket)
            if self._queues[idlest].last_active_bucket > now_bucket - self.slots:
                self.refusals += 1
                return None
            del self._queues[idlest]
        made = self._queues[queue] = _Series(self.slots, bucket, exact_before=self.refusals == 0)
        return made

    def _count(self, bucket: int, queue: str, field: int, amount: int, now_bucket: int) -> None:
        """Add to a queue's count and the cluster's (the lock held)."""
        bucket = min(bucket, now_bucket)
        slot = self._slot(bucket, now_bucket)
        if slot is None:
            return
        self._total.columns[field][slot] += amount
        series = self._series(queue, bucket, now_bucket, active=True)
        if series is None:
            return
        series.columns[field][slot] += amount
        series.last_active_bucket = max(series.last_active_bucket, bucket)
        series.since_bucket = min(series.since_bucket, bucket)

    def _lag(self, bucket: int, queue: str, step: int, claims: int, now_bucket: int) -> None:
        """Add claims to the lag histograms of a queue and the cluster."""
        bucket = min(bucket, now_bucket)
        slot = self._slot(bucket, now_bucket)
        if slot is None:
            return
        for key in (None, queue):
            series = self._series(key, bucket, now_bucket, active=True)
            # A bucket already reduced to its p99 takes no late claims.
            if series is None or not math.isnan(series.columns[LAG_P99][slot]):
                continue
            histogram = self._lags.get((key, bucket))
            if histogram is None:
                if len(self._lags) >= LAGS_OPEN_MAX:
                    self._close_lags(next(iter(self._lags)))
                histogram = self._lags[(key, bucket)] = {}
            histogram[step] = histogram.get(step, 0) + claims
            if key is not None:
                series.last_active_bucket = max(series.last_active_bucket, bucket)

    def _close_lags(self, key: tuple[str | None, int]) -> None:
        histogram = self._lags.pop(key)
        queue, bucket = key
        series = self._total if queue is None else self._queues.get(queue)
        slot = bucket % self.slots
        if series is not None and self._bucket_at[slot] == bucket:
            series.columns[LAG_P99][slot] = p99_s(histogram)

    # -- what the replica applies (the Raft thread) ------------------------------

    def count_applied(self, state: core.State, results: Sequence[object]) -> None:
        """After each applied entry, under the replica's lock: its failed
        attempts and granted leases, in the bucket of its replicated time."""
        failed: dict[str, int] = {}
        lags: dict[tuple[str, int], int] = {}
        _collect(state, results, failed, lags)
        if not failed and not lags:
            return
        bucket = state.now_ms // self.period_ms
        with self._lock:
            now_bucket = self._now_bucket()
            for queue, count in failed.items():
                self._count(bucket, queue, FAILED, count, now_bucket)
            for (queue, step), claims in lags.items():
                self._lag(bucket, queue, step, claims, now_bucket)

    def note_restored(self, before_ms: int, after_ms: int) -> None:
        """The replica loaded a snapshot: the entries between the replicated
        times `before_ms` and `after_ms` were never applied here."""
        if after_ms > before_ms:
            with self._lock:
                self._applied_gaps.append((before_ms, after_ms + 1))

    # -- the sampler (the loop) --------------------------------------------------

    def sample_gauges(self, reading: Reading) -> None:
        """Depth and oldest runnable age of every queue, into this node's
        current bucket."""
        with reading() as state:
            stats = core.queue_stats(state)
            replicated_ms = state.now_ms
        now_ms = self._clock_ms()
        reference_ms = max(now_ms, replicated_ms)
        bucket = now_ms // self.period_ms
        with self._lock:
            slot = self._slot(bucket, bucket)
            if slot is None:
                return
            depth_total, oldest_s = 0, 0.0
            seen: set[str] = set()
            for queue, stat in stats.items():
                oldest = stat.oldest_runnable_at_ms
                age_s = 0.0 if oldest is None else max(0, reference_ms - oldest) / 1000
                depth_total += stat.depth
                oldest_s = max(oldest_s, age_s)
                series = self._series(queue, bucket, bucket, active=stat.depth > 0)
                if series is None:
                    continue
                seen.add(queue)
                series.columns[DEPTH][slot] = stat.depth
                series.columns[OLDEST_AGE][slot] = age_s
                if stat.depth:
                    series.last_active_bucket = max(series.last_active_bucket, bucket)
            for queue, series in self._queues.items():
                if queue not in seen:  # no stored job left in it
                    series.columns[DEPTH][slot] = 0.0
                    series.columns[OLDEST_AGE][slot] = 0.0
            self._total.columns[DEPTH][slot] = depth_total
            self._total.columns[OLDEST_AGE][slot] = oldest_s

    def read_outbox(self, reading: Reading, limit: int = OUTBOX_CHUNK) -> bool:
        """Count up to `limit` new outbox events; True if more are waiting."""
        window_start_ms = (self._now_bucket() - self.slots + 1) * self.period_ms
        with reading() as state:
            events, more = self._new_events(state, window_start_ms, limit)
        counted: list[tuple[int, str, int]] = []
        for event in events:
            field = EVENT_FIELDS.get(event.type)
            if field is None:
                continue
            queue = decode_data(event).get("queue")
            if isinstance(queue, str):
                counted.append((event.at_ms // self.period_ms, queue, field))
        with self._lock:
            now_bucket = self._now_bucket()
            for bucket, queue, field in counted:
                self._count(bucket, queue, field, 1, now_bucket)
        return more

    def _new_events(
        self, state: core.State, window_start_ms: int, limit: int
    ) -> tuple[list[OutboxEvent], bool]:
        """The events after the last one read (from the hour's start on the
        first read), and whether more are waiting; notes a span whose events
        were gone before they could be read. The replica's lock is held."""
        box = outbox(state)
        events, head = box.events, box.head
        first = box.first()
        if self._outbox_seq is None:
            # Events older than the outbox's retention may have been trimmed,
            # and dropped ones (a full outbox) are older than the first held.
            gone_until_ms = state.now_ms - box.retention_ms
            if box.dropped and first is not None:
                gone_until_ms = max(gone_until_ms, first.at_ms + 1)
            if box.next_seq > 1 and gone_until_ms > window_start_ms:
                with self._lock:
                    self._outbox_gaps.append((0, gone_until_ms))
        elif first is not None and first.seq > self._outbox_seq + 1:
            with self._lock:
                self._outbox_gaps.append((self._outbox_at_ms, first.at_ms + 1))
        after = -1 if self._outbox_seq is None else self._outbox_seq
        start = max(
            bisect_right(events, after, lo=head, key=_seq),
            bisect_left(events, window_start_ms, lo=head, key=_at_ms),
        )
        chunk = events[start : start + limit]
        if chunk:
            self._outbox_seq, self._outbox_at_ms = chunk[-1].seq, chunk[-1].at_ms
        else:
            self._outbox_seq, self._outbox_at_ms = box.next_seq - 1, state.now_ms
        return chunk, start + limit < len(events)

    def close_lags(self) -> None:
        """Reduce the histograms of buckets ended long enough ago to their p99."""
        with self._lock:
            oldest_open = self._now_bucket() - LAGS_OPEN_BUCKETS
            for key in [key for key in self._lags if key[1] < oldest_open]:
                self._close_lags(key)

    async def sample(self, reading: Reading) -> None:
        """One bucket's work: the gauges, the new outbox events, old lags."""
        self.sample_gauges(reading)
        for _ in range(OUTBOX_CHUNKS_MAX):
            if not self.read_outbox(reading):
                break
            await asyncio.sleep(0)  # a long backlog is read between requests
        self.close_lags()

    # -- reading -------------------------------------------------------------------

    def queues(self) -> list[str]:
        with self._lock:
            return sorted(self._queues)

    def read(self, queue: str | None, window_s: int) -> Window | None:
        """The complete buckets of the last `window_s` seconds (the current
        one is still filling); None for a queue without a series."""
        period_s = self.period_ms / 1000
        count = max(1, min(self.slots - 1, math.ceil(window_s / period_s)))
        last = self._now_bucket() - 1
        buckets = range(last - count + 1, last + 1)
        with self._lock:
            series = self._total if queue is None else self._queues.get(queue)
            if series is None:
                return None
            applied_unknown = self._gap_buckets(self._applied_gaps, buckets)
            outbox_unknown = self._gap_buckets(self._outbox_gaps, buckets)
            values: dict[str, list[float | None]] = {name: [] for name in FIELDS}
            lists = [values[name] for name in FIELDS]
            columns = series.columns
            for bucket in buckets:
                slot = bucket % self.slots
                held = self._bucket_at[slot] == bucket
                before = bucket < series.since_bucket and not series.exact_before
                for field in COUNTS:
                    unknown = applied_unknown if field == FAILED else outbox_unknown
                    if before or bucket in unknown:
                        lists[field].append(None)
                    else:
                        count_value = columns[field][slot] if held else 0.0
                        lists[field].append(count_value / period_s)
                for field in (DEPTH, OLDEST_AGE):
                    lists[field].append(_number(columns[field][slot]) if held else None)
                lists[LAG_P99].append(
                    None
                    if bucket in applied_unknown
                    else self._p99(series, queue, bucket, slot, held)
                )
            names = sorted(self._queues)
        return Window(
            queue,
            period_s,
            [format_ms(bucket * self.period_ms) for bucket in buckets],
            values,
            names,
            format_ms(self.started_ms),
        )

    def _p99(
        self, series: _Series, queue: str | None, bucket: int, slot: int, held: bool
    ) -> float | None:
        if not held:
            return None
        histogram = self._lags.get((queue, bucket))
        if histogram is not None:
            return p99_s(histogram)
        return _number(series.columns[LAG_P99][slot])

    def _gap_buckets(self, gaps: Iterable[tuple[int, int]], buckets: range) -> set[int]:
        found: set[int] = set()
        for from_ms, to_ms in gaps:
            first = max(buckets.start, from_ms // self.period_ms)
            last = min(buckets.stop - 1, (to_ms - 1) // self.period_ms)
            found.update(range(first, last + 1))
        return found

    def nbytes(self) -> int:
        """The columns' memory (the arrays' buffers)."""
        with self._lock:
            series = [self._total, *self._queues.values()]
            return self._bucket_at.itemsize * self.slots + sum(s.nbytes() for s in series)


def _seq(event: OutboxEvent) -> int:
    return event.seq


def _at_ms(event: OutboxEvent) -> int:
    return event.at_ms


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def _collect(
    state: core.State,
    results: Iterable[object],
    failed: dict[str, int],
    lags: dict[tuple[str, int], int],
) -> None:
    """The failed attempts ({queue: count}) and granted leases ({(queue, lag
    step): count}) of an entry's results, a lease batch's ops and claim
    included. Summed here, so that a claim of a thousand leases takes the
    ring's lock once and touches a histogram once per queue and step."""
    for result in results:
        if isinstance(result, Claimed):
            _leases(result.leases, lags)
        elif isinstance(result, Failed):
            job = state.jobs.get(result.job_id)
            if job is not None:
                failed[job.queue] = failed.get(job.queue, 0) + 1
        elif isinstance(result, BatchApplied):
            _collect(state, result.results, failed, lags)
            if result.claimed is not None:
                _collect(state, (result.claimed,), failed, lags)


def _leases(leases: Iterable[Lease], lags: dict[tuple[str, int], int]) -> None:
    log2 = math.log2
    for lease in leases:
        since_ms = lease.runnable_since_ms
        if since_ms is not None:
            # Inline lag_step: this runs for every lease on every replica.
            lag_ms = lease.expires_at_ms - lease.lease_ms - since_ms
            step = -1 if lag_ms < 1 else int(log2(lag_ms) * LAG_STEPS_PER_DOUBLING)
            key = (lease.queue, step)
            lags[key] = lags.get(key, 0) + 1


def lag_step(lag_ms: int) -> int:
    """The histogram bucket of a lag: [2^(s/8), 2^((s+1)/8)) ms, or -1 below 1 ms."""
    if lag_ms < 1:
        return -1
    return int(math.log2(lag_ms) * LAG_STEPS_PER_DOUBLING)


def p99_s(histogram: dict[int, int]) -> float:
    """The 99th percentile of a lag histogram, in seconds: the upper edge of
    the step that holds it (0 when it is below a millisecond)."""
    total = sum(histogram.values())
    rank = math.ceil(0.99 * total)
    seen = 0
    for step in sorted(histogram):
        seen += histogram[step]
        if seen >= rank:
            if step < 0:
                return 0.0
            return round(2 ** ((step + 1) / LAG_STEPS_PER_DOUBLING) / 1000, 6)
    return 0.0  # an empty histogram is never kept


async def sample_forever(series: SeriesRing, reading: Reading) -> None:
    """Sample once per bucket, shortly before it ends, on this node's clock."""
    while True:
        now_ms = series.now_ms()
        end_ms = (now_ms // series.period_ms + 1) * series.period_ms
        wait_ms = end_ms - SAMPLE_BEFORE_END_MS - now_ms
        if wait_ms <= 0:
            wait_ms += series.period_ms
        await asyncio.sleep(wait_ms / 1000)
        try:
            await series.sample(reading)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("sampling the dashboard's series failed")
