"""Every metric family a node exports, declared here and nowhere else.

Theory of operation. A node builds one `NodeMetrics`: prometheus_client
instruments on a `CollectorRegistry` of its own, never the library's global
default (unit tests build several nodes' metrics in one process, and nothing
but the node's own families belongs on its /metrics). Families come in two
kinds:

- *instrumented*: counters and histograms the code moves as things happen
  (`metrics.ticks.inc()`); they are attributes of `NodeMetrics`;
- *sampled*: values read at scrape time from the replicated state, the Raft
  status, the proposer or process totals. The module that knows how to read
  one binds a reader to its `Family` with `NodeMetrics.sample`, and a
  `Sampled` collector yields a `GaugeMetricFamily` (or, for totals kept
  elsewhere, a `CounterMetricFamily`) from it on every scrape.

Names, label names and help text are an interface: the dashboards and alert
rules in cluster/ use them, and tests/unit/test_metrics_families.py holds
them to a list. Label values come from bounded sets (queue names, statuses,
routes, node ids), never job ids. prometheus_client would also export a
`_created` series per counter and histogram; this node never has (a restart
already shows as a counter reset), so they are turned off when this module is
imported, for the whole process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from raftsched.limits import METRIC_SCHEDULES_MAX
from raftsched.node import gc_tuning

disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE = CONTENT_TYPE_LATEST

LabelValues = tuple[str, ...]
Samples = Iterable[tuple[LabelValues, float]]
Kind = Literal["counter", "gauge", "histogram"]

LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
CLAIM_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
RUN_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)
FORK_PAUSE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
ENTRY_COMMANDS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 4000)

# Per-schedule series are exported for at most METRIC_SCHEDULES_MAX schedules
# (limits.py; the first by id); totals over all schedules are always exported.
# The help text says so.


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family as Prometheus sees it: its name (counters with their
    `_total`), type, help text, label names and, for histograms, buckets."""

    name: str
    kind: Kind
    help: str
    labels: LabelValues = ()
    buckets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        # The rule `promtool check metrics` enforces.
        if (self.kind == "counter") != self.name.endswith("_total"):
            raise ValueError(f"{self.kind} {self.name!r}: only counter names end in _total")
        if bool(self.buckets) != (self.kind == "histogram"):
            raise ValueError(f"{self.name!r}: buckets are for histograms, and they need some")


# -- instrumented: moved by the code as things happen ----------------------------

LEADER_CHANGES = Family(
    "raftsched_leader_changes_total", "counter", "Times this node stopped being leader."
)
TICKS = Family("raftsched_ticks_total", "counter", "Tick commands committed by this node.")
LEASES_EXPIRED = Family(
    "raftsched_leases_expired_total", "counter", "Leases expired by ticks this node proposed."
)
LEASES_GRANTED = Family(
    "raftsched_leases_granted_total", "counter", "Leases granted through this node."
)
LEASE_LOST = Family(
    "raftsched_lease_lost_total",
    "counter",
    "Lease operations rejected for a stale token.",
    ("op",),
)
LEASE_REQUESTS = Family(
    "raftsched_lease_requests_total",
    "counter",
    "Requests of lease operations proposed by this node as leader, by form: "
    "one_command (a LeaseBatch, cluster version 6) or in_turn (a command per op).",
    ("form",),
)
ENTRIES_PROPOSED = Family(
    "raftsched_raft_entries_proposed_total", "counter", "Raft entries this node proposed."
)
ENTRY_COMMANDS = Family(
    "raftsched_raft_entry_commands",
    "histogram",
    "Commands per proposed Raft entry (group commit).",
    buckets=ENTRY_COMMANDS_BUCKETS,
)
COMMIT_SECONDS = Family(
    "raftsched_raft_commit_seconds",
    "histogram",
    "Time from proposing an entry to applying it.",
    buckets=LATENCY_BUCKETS_S,
)
HTTP_SECONDS = Family(
    "raftsched_http_request_duration_seconds",
    "histogram",
    "HTTP request latency by route and status.",
    ("method", "route", "status"),
    LATENCY_BUCKETS_S,
)
JOBS_SUBMITTED = Family(
    "raftsched_jobs_submitted_total", "counter", "Jobs created through this node.", ("queue",)
)
CLAIM_LATENCY = Family(
    "raftsched_job_claim_latency_seconds",
    "histogram",
    "From runnable (due) to leased, per granted lease.",
    ("queue",),
    CLAIM_BUCKETS_S,
)
EXECUTION_SECONDS = Family(
    "raftsched_job_execution_seconds",
    "histogram",
    "From handler start (or claim) to the attempt's outcome.",
    ("queue", "outcome"),
    RUN_BUCKETS_S,
)
JOB_ATTEMPTS = Family(
    "raftsched_job_attempts_total", "counter", "Attempts started (leases granted).", ("queue",)
)
JOB_RETRIES = Family(
    "raftsched_job_retries_total", "counter", "Failed attempts that will be retried.", ("queue",)
)
JOB_FAILURES = Family(
    "raftsched_job_failures_total",
    "counter",
    "Failed attempts by failure kind.",
    ("queue", "kind"),
)
JOBS_SUCCEEDED = Family(
    "raftsched_jobs_succeeded_total", "counter", "Jobs that succeeded.", ("queue",)
)
DEAD_LETTERS = Family(
    "raftsched_dead_letters_total", "counter", "Jobs dead-lettered, by reason.", ("reason",)
)
REPLAYS = Family("raftsched_replays_total", "counter", "Dead-letter replays.")
RECONCILE_DECISIONS = Family(
    "raftsched_reconcile_decisions_total",
    "counter",
    "Reconcile decisions on unknown outcomes, by decision: happened, did_not_happen, cannot_tell.",
    ("decision",),
)
UNKNOWN_OUTCOMES = Family(
    "raftsched_unknown_outcomes_total",
    "counter",
    "Attempts whose outcome is unknown (lease expired while running, or failed with kind "
    "unknown), per queue, whatever the job's on_unknown policy.",
    ("queue",),
)
CANCELS = Family("raftsched_cancels_total", "counter", "Accepted cancel requests.")
LEASE_RENEWALS = Family(
    "raftsched_lease_renewals_total", "counter", "Heartbeats that were accepted."
)
LEASE_EXPIRATIONS = Family(
    "raftsched_lease_expirations_total",
    "counter",
    "Leases expired, by the status before expiry.",
    ("status",),
)
LEADER_OBSERVED = Family(
    "raftsched_raft_leader_changes_observed_total",
    "counter",
    "Changes of the known leader seen by this node (including losing it).",
)
WEBHOOK_ATTEMPTS = Family(
    "raftsched_webhook_attempts_total", "counter", "Webhook POSTs made.", ("subscription",)
)
WEBHOOK_FAILURES = Family(
    "raftsched_webhook_failures_total",
    "counter",
    "Webhook POSTs that failed (non-2xx, timeout, connection).",
    ("subscription",),
)
WEBHOOK_PARKED = Family(
    "raftsched_webhook_parked_total",
    "counter",
    "Events parked after max attempts.",
    ("subscription",),
)
# Every relay, webhooks included (node/relay_status.py, docs/relays.md section 5).
SINK_PUBLISHED = Family(
    "raftsched_sink_published_total",
    "counter",
    "Events a relay published: confirmed by the broker, or answered 2xx by the webhook "
    "receiver, per subscription and sink kind.",
    ("subscription", "sink"),
)
SINK_RETRIED = Family(
    "raftsched_sink_retried_total",
    "counter",
    "Relay attempts that failed (the broker or receiver unreachable, or a refusal) and were "
    "tried again, per subscription and sink kind.",
    ("subscription", "sink"),
)
SINK_PARKED = Family(
    "raftsched_sink_parked_total",
    "counter",
    "Events a relay parked after max attempts, per subscription and sink kind.",
    ("subscription", "sink"),
)
FLOW_REJECTED = Family(
    "raftsched_flow_rejected_total",
    "counter",
    "Submissions this node answered 429 queue_full, by tenant and queue.",
    ("tenant", "queue"),
)
HTTP_AUTH_FAILURES = Family(
    "raftsched_http_auth_failures_total",
    "counter",
    "Requests refused 401 unauthenticated (or 429 rate_limited after repeated "
    "failures), by reason: missing, malformed, unknown, expired, revoked, rate_limited.",
    ("reason",),
)

RAFT_MESSAGES_REFUSED = Family(
    "raftsched_raft_messages_refused_total",
    "counter",
    "Raft messages dropped unread because their sender is not who the cluster knows, by "
    "reason: cluster (another cluster's data), incarnation (a node whose data was lost).",
    ("reason",),
)

SNAPSHOT_FORK_PAUSE = Family(
    "raftsched_raft_snapshot_fork_pause_seconds",
    "histogram",
    "How long starting a snapshot stopped the Raft thread: waiting for the state's lock "
    "and fork() (page tables copied in the kernel), per snapshot.",
    buckets=FORK_PAUSE_BUCKETS_S,
)

INSTRUMENTED = (
    LEADER_CHANGES, TICKS, LEASES_EXPIRED, LEASES_GRANTED, LEASE_LOST, LEASE_REQUESTS,
    ENTRIES_PROPOSED,
    ENTRY_COMMANDS, COMMIT_SECONDS, HTTP_SECONDS, JOBS_SUBMITTED, CLAIM_LATENCY,
    EXECUTION_SECONDS, JOB_ATTEMPTS, JOB_RETRIES, JOB_FAILURES, JOBS_SUCCEEDED, DEAD_LETTERS,
    REPLAYS, CANCELS, LEASE_RENEWALS, LEASE_EXPIRATIONS, LEADER_OBSERVED, WEBHOOK_ATTEMPTS,
    WEBHOOK_FAILURES, WEBHOOK_PARKED, SINK_PUBLISHED, SINK_RETRIED, SINK_PARKED, FLOW_REJECTED,
    HTTP_AUTH_FAILURES, RAFT_MESSAGES_REFUSED, RECONCILE_DECISIONS, UNKNOWN_OUTCOMES,
    SNAPSHOT_FORK_PAUSE,
)  # fmt: skip

# -- sampled: read at scrape time ---------------------------------------------------

# Process totals (node/gc_tuning.py), bound by NodeMetrics itself.
GC_COLLECTIONS = Family(
    "raftsched_gc_collections_total",
    "counter",
    "Garbage collections in this process, by generation.",
    ("generation",),
)
GC_PAUSE_SECONDS = Family(
    "raftsched_gc_pause_seconds_total",
    "counter",
    "Time spent in garbage collections, by generation.",
    ("generation",),
)
GC_PAUSE_MAX = Family(
    "raftsched_gc_pause_max_seconds",
    "gauge",
    "The longest garbage collection so far, by generation.",
    ("generation",),
)
# Raft and the replica (node/service.py).
RAFT_IS_LEADER = Family("raftsched_raft_is_leader", "gauge", "1 if this node is the leader.")
RAFT_TERM = Family("raftsched_raft_term", "gauge", "Current Raft term.")
RAFT_COMMIT_INDEX = Family("raftsched_raft_commit_index", "gauge", "Raft commit index.")
RAFT_APPLIED_INDEX = Family("raftsched_raft_applied_index", "gauge", "Raft applied index.")
APPLY_HALTED = Family(
    "raftsched_apply_halted",
    "gauge",
    "1 while this replica has stopped applying at an entry its release cannot decode.",
)
RAFT_DISK_FULL = Family(
    "raftsched_raft_disk_full",
    "gauge",
    "1 while a write of this node's Raft files found no room and there is not room again yet.",
)
JOBS = Family("raftsched_jobs", "gauge", "Jobs by status.", ("status",))
SNAPSHOT_AGE = Family(
    "raftsched_raft_snapshot_age_seconds",
    "gauge",
    "Seconds since this node last wrote (or received) a snapshot.",
)
SNAPSHOT_DURATION = Family(
    "raftsched_raft_snapshot_duration_seconds",
    "gauge",
    "How long this node's last snapshot took to encode and write (in a forked child).",
)
SNAPSHOT_COW_BYTES = Family(
    "raftsched_raft_snapshot_cow_bytes",
    "gauge",
    "Memory the last snapshot child added: its private dirty pages at exit (pages it "
    "copied from the node's, copy-on-write, and its own buffers).",
)
SNAPSHOT_BYTES = Family(
    "raftsched_raft_snapshot_bytes",
    "gauge",
    "Size of the state in the last snapshot this node wrote or loaded.",
)
SNAPSHOT_LOAD_SECONDS = Family(
    "raftsched_raft_snapshot_load_seconds",
    "gauge",
    "How long this node's last snapshot load took (at start, or one sent by the leader): "
    "sync, read, check and restore.",
)
SNAPSHOTS = Family(
    "raftsched_raft_snapshots_total",
    "counter",
    "Snapshots this node wrote (event=written) or loaded (event=loaded) since it started.",
    ("event",),
)
QUEUE_DEPTH = Family("raftsched_queue_depth", "gauge", "Runnable jobs per queue.", ("queue",))
QUEUE_RUNNING = Family(
    "raftsched_queue_running", "gauge", "Claimed or running jobs per queue.", ("queue",)
)
QUEUE_RECONCILING = Family(
    "raftsched_queue_reconciling",
    "gauge",
    "Jobs reconciling (an unknown outcome waiting for a reconcile decision), per job queue.",
    ("queue",),
)
QUEUE_OLDEST_AGE = Family(
    "raftsched_queue_oldest_runnable_age_seconds",
    "gauge",
    "Age of the oldest runnable job per queue.",
    ("queue",),
)
# The proposer's queue (node/proposer.py).
PROPOSER_QUEUED_COMMANDS = Family(
    "raftsched_proposer_queued_commands",
    "gauge",
    "Commands waiting in this leader's proposer queue for a Raft entry.",
)
PROPOSER_QUEUED_BYTES = Family(
    "raftsched_proposer_queued_bytes",
    "gauge",
    "Request bytes of the commands waiting in this leader's proposer queue.",
)
PROPOSER_REFUSED = Family(
    "raftsched_proposer_refused_total",
    "counter",
    "Commands answered 503 unavailable because the proposer queue was full.",
)
# What the leader observes (node/observability.py).
JOBS_STUCK = Family(
    "raftsched_jobs_stuck",
    "gauge",
    "Running jobs without heartbeat progress for longer than the threshold "
    "(exported by the leader).",
)
STUCK_THRESHOLD = Family(
    "raftsched_stuck_threshold_seconds", "gauge", "The threshold behind raftsched_jobs_stuck."
)
OUTBOX_LAG = Family(
    "raftsched_outbox_lag_events",
    "gauge",
    "Outbox events not yet delivered, per webhook subscription.",
    ("subscription",),
)
FOLLOWER_LAG = Family(
    "raftsched_raft_follower_lag_entries",
    "gauge",
    "Commit index minus a follower's match index (exported by the leader).",
    ("node",),
)
CLOCK_SKEW = Family(
    "raftsched_clock_skew_seconds",
    "gauge",
    "Node's wall clock minus the leader's (exported by the leader).",
    ("node",),
)
CLOCK_SKEW_UNCERTAINTY = Family(
    "raftsched_clock_skew_uncertainty_seconds",
    "gauge",
    "Half the round trip of the skew measurement.",
    ("node",),
)
# Webhook delivery (node/webhooks.py).
OUTBOX_DEPTH = Family("raftsched_outbox_depth", "gauge", "Events held in the outbox.")
WEBHOOK_OLDEST_AGE = Family(
    "raftsched_webhook_oldest_undelivered_age_seconds",
    "gauge",
    "Age of the oldest matching event not yet delivered, per subscription.",
    ("subscription",),
)
# Every relay, webhooks included (node/relay_status.py): the leader's.
SINK_LAG_EVENTS = Family(
    "raftsched_sink_lag_events",
    "gauge",
    "Committed events after the subscription's cursor (those its filters leave out included), "
    "per subscription and sink kind (exported by the leader).",
    ("subscription", "sink"),
)
SINK_LAG_SECONDS = Family(
    "raftsched_sink_lag_seconds",
    "gauge",
    "Age of the oldest event the subscription takes that is not yet published, by the "
    "leader's clock, 0 when none, per subscription and sink kind (exported by the leader).",
    ("subscription", "sink"),
)
SINK_CONNECTED = Family(
    "raftsched_sink_connected",
    "gauge",
    "1 while the relay's last attempt reached its broker or webhook receiver, 0 after one "
    "that could not, per subscription and sink kind (exported by the leader once it tried).",
    ("subscription", "sink"),
)
# Flow control (api/queues.py).
TENANT_QUEUED = Family(
    "raftsched_tenant_queued",
    "gauge",
    "Jobs scheduled, pending or waiting to retry, per tenant.",
    ("tenant",),
)
TENANT_RUNNING = Family(
    "raftsched_tenant_running", "gauge", "Jobs claimed or running, per tenant.", ("tenant",)
)
TENANT_THROTTLED = Family(
    "raftsched_tenant_throttled",
    "gauge",
    "Claimable jobs held back by the tenant's concurrency limit, per tenant.",
    ("tenant",),
)
FLOW_QUEUE_QUEUED = Family(
    "raftsched_flow_queue_queued",
    "gauge",
    "Pending jobs (ordering-key jobs waiting their turn included), per queue.",
    ("queue",),
)
FLOW_QUEUE_RUNNING = Family(
    "raftsched_flow_queue_running", "gauge", "Jobs claimed or running, per queue.", ("queue",)
)
FLOW_QUEUE_THROTTLED = Family(
    "raftsched_flow_queue_throttled",
    "gauge",
    "Claimable jobs held back by the queue's pause, limits or circuit, per queue.",
    ("queue",),
)
FLOW_QUEUE_BLOCKED_KEYS = Family(
    "raftsched_flow_queue_blocked_keys",
    "gauge",
    "Ordering keys held by a dead-lettered job, per queue.",
    ("queue",),
)
FLOW_QUEUE_CIRCUIT_OPEN = Family(
    "raftsched_flow_queue_circuit_open",
    "gauge",
    "1 while the queue's circuit is open, per queue.",
    ("queue",),
)
# Schedules (api/schedules.py).
SCHEDULE_OCCURRENCES = Family(
    "raftsched_schedule_occurrences",
    "gauge",
    "Decided schedule occurrences by decision and missed reason (all schedules).",
    ("decision",),
)
SCHEDULE_OCCURRENCES_BY_SCHEDULE = Family(
    "raftsched_schedule_occurrences_by_schedule",
    "gauge",
    f"Decided occurrences per schedule (the first {METRIC_SCHEDULES_MAX} schedules by id).",
    ("schedule", "decision"),
)
SCHEDULE_FIRING_LAG = Family(
    "raftsched_schedule_firing_lag_seconds",
    "gauge",
    f"Last firing lag (fired - nominal time) per schedule (first {METRIC_SCHEDULES_MAX}).",
    ("schedule",),
)
SCHEDULES = Family("raftsched_schedules", "gauge", "Stored schedules.")

SAMPLED = (
    GC_COLLECTIONS, GC_PAUSE_SECONDS, GC_PAUSE_MAX, RAFT_IS_LEADER, RAFT_TERM,
    RAFT_COMMIT_INDEX, RAFT_APPLIED_INDEX, APPLY_HALTED, RAFT_DISK_FULL, JOBS, SNAPSHOT_AGE,
    SNAPSHOT_DURATION, SNAPSHOT_COW_BYTES, SNAPSHOT_BYTES, SNAPSHOT_LOAD_SECONDS, SNAPSHOTS,
    QUEUE_DEPTH, QUEUE_RUNNING, QUEUE_RECONCILING, QUEUE_OLDEST_AGE, PROPOSER_QUEUED_COMMANDS,
    PROPOSER_QUEUED_BYTES, PROPOSER_REFUSED, JOBS_STUCK, STUCK_THRESHOLD, OUTBOX_LAG, FOLLOWER_LAG,
    CLOCK_SKEW, CLOCK_SKEW_UNCERTAINTY, OUTBOX_DEPTH, WEBHOOK_OLDEST_AGE, SINK_LAG_EVENTS,
    SINK_LAG_SECONDS, SINK_CONNECTED, TENANT_QUEUED, TENANT_RUNNING, TENANT_THROTTLED,
    FLOW_QUEUE_QUEUED, FLOW_QUEUE_RUNNING, FLOW_QUEUE_THROTTLED,
    FLOW_QUEUE_BLOCKED_KEYS, FLOW_QUEUE_CIRCUIT_OPEN, SCHEDULE_OCCURRENCES,
    SCHEDULE_OCCURRENCES_BY_SCHEDULE, SCHEDULE_FIRING_LAG, SCHEDULES,
)  # fmt: skip

FAMILIES = INSTRUMENTED + SAMPLED


class Sampled:
    """A prometheus_client collector: families whose samples one reader
    returns at scrape time, `{family name: [(label values, value), ...]}`.
    A reader that serves several families reads the state once for all."""

    def __init__(
        self, families: Sequence[Family], read: Callable[[], Mapping[str, Samples]]
    ) -> None:
        self.families = tuple(families)
        self._read = read

    def describe(self) -> Iterator[Metric]:
        # Lets the registry refuse a family bound twice, without reading state.
        for family in self.families:
            yield _metric_family(family)

    def collect(self) -> Iterator[Metric]:
        values = self._read()
        for family in self.families:
            metric = _metric_family(family)
            for labels, value in sorted(values.get(family.name, ())):
                metric.add_metric(labels, value)
            yield metric


def _metric_family(family: Family) -> CounterMetricFamily | GaugeMetricFamily:
    if family.kind == "counter":
        return CounterMetricFamily(family.name, family.help, labels=family.labels)
    return GaugeMetricFamily(family.name, family.help, labels=family.labels)


class NodeMetrics:
    """The families of one node on a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # Labelled series already made, by family and label values: asking
        # prometheus-client for one (`labels()`) validates the values and
        # takes the family's lock each time, several µs on every request.
        self._series: dict[tuple[object, tuple[str, ...]], Any] = {}
        self._counters: dict[str, Counter] = {}
        self._bound: set[str] = set()
        counter, histogram = self._counter, self._histogram
        self.leader_changes = counter(LEADER_CHANGES)
        self.ticks = counter(TICKS)
        self.leases_expired = counter(LEASES_EXPIRED)
        self.leases_granted = counter(LEASES_GRANTED)
        self.lease_lost = counter(LEASE_LOST)
        self.lease_requests = counter(LEASE_REQUESTS)
        self.entries_proposed = counter(ENTRIES_PROPOSED)
        self.entry_commands = histogram(ENTRY_COMMANDS)
        self.commit_seconds = histogram(COMMIT_SECONDS)
        self.http_seconds = histogram(HTTP_SECONDS)
        self.jobs_submitted = counter(JOBS_SUBMITTED)
        self.claim_latency = histogram(CLAIM_LATENCY)
        self.execution_seconds = histogram(EXECUTION_SECONDS)
        self.job_attempts = counter(JOB_ATTEMPTS)
        self.job_retries = counter(JOB_RETRIES)
        self.job_failures = counter(JOB_FAILURES)
        self.jobs_succeeded = counter(JOBS_SUCCEEDED)
        self.dead_letters = counter(DEAD_LETTERS)
        self.replays = counter(REPLAYS)
        self.reconcile_decisions = counter(RECONCILE_DECISIONS)
        self.unknown_outcomes = counter(UNKNOWN_OUTCOMES)
        self.cancels = counter(CANCELS)
        self.lease_renewals = counter(LEASE_RENEWALS)
        self.lease_expirations = counter(LEASE_EXPIRATIONS)
        self.leader_observed = counter(LEADER_OBSERVED)
        self.webhook_attempts = counter(WEBHOOK_ATTEMPTS)
        self.webhook_failures = counter(WEBHOOK_FAILURES)
        self.webhook_parked = counter(WEBHOOK_PARKED)
        self.sink_published = counter(SINK_PUBLISHED)
        self.sink_retried = counter(SINK_RETRIED)
        self.sink_parked = counter(SINK_PARKED)
        self.flow_rejected = counter(FLOW_REJECTED)
        self.http_auth_failures = counter(HTTP_AUTH_FAILURES)
        self.raft_messages_refused = counter(RAFT_MESSAGES_REFUSED)
        self.snapshot_fork_pause = histogram(SNAPSHOT_FORK_PAUSE)
        self.sample_together((GC_COLLECTIONS, GC_PAUSE_SECONDS, GC_PAUSE_MAX), _gc_samples)

    def series(self, family: Counter | Histogram, *labels: str) -> Any:
        """`family.labels(*labels)`, made once. Label values here come from
        bounded sets (routes, statuses, queues, outcomes), so the cache is
        bounded by what the families already hold."""
        key = (family, labels)
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = family.labels(*labels)
        return found

    def _counter(self, family: Family) -> Counter:
        assert family.kind == "counter" and family in INSTRUMENTED, family
        made = Counter(family.name, family.help, family.labels, registry=self.registry)
        self._counters[family.name] = made
        self._bound.add(family.name)
        return made

    def _histogram(self, family: Family) -> Histogram:
        assert family.kind == "histogram" and family in INSTRUMENTED, family
        self._bound.add(family.name)
        return Histogram(
            family.name, family.help, family.labels, registry=self.registry, buckets=family.buckets
        )

    def sample(self, family: Family, read: Callable[[], Samples]) -> None:
        """Bind the reader of one sampled family (once per node)."""
        self.sample_together((family,), lambda: {family.name: read()})

    def sample_together(
        self, families: Sequence[Family], read: Callable[[], Mapping[str, Samples]]
    ) -> None:
        """Bind one reader to several sampled families (one pass over the state)."""
        for family in families:
            if family not in SAMPLED:
                raise ValueError(f"{family.name} is not a sampled family of this module")
        self.registry.register(Sampled(families, read))  # refuses a family bound twice
        self._bound.update(family.name for family in families)

    def unbound(self) -> list[str]:
        """Declared families nothing exports yet (a node with its API has none)."""
        return [family.name for family in FAMILIES if family.name not in self._bound]

    def totals(self, family: Family) -> dict[LabelValues, float]:
        """An instrumented counter's values by label values (for the dashboard)."""
        found: dict[LabelValues, float] = {}
        for metric in self._counters[family.name].collect():
            for sample in metric.samples:
                if sample.name == family.name:
                    found[tuple(sample.labels[name] for name in family.labels)] = sample.value
        return found

    def render(self) -> bytes:
        """The Prometheus text exposition (served with `CONTENT_TYPE`)."""
        return generate_latest(self.registry)


def _gc_samples() -> dict[str, Samples]:
    pauses = gc_tuning.pauses
    return {
        GC_COLLECTIONS.name: [((str(g),), float(n)) for g, n in enumerate(pauses.count)],
        GC_PAUSE_SECONDS.name: [((str(g),), s) for g, s in enumerate(pauses.seconds)],
        GC_PAUSE_MAX.name: [((str(g),), s) for g, s in enumerate(pauses.longest)],
    }
