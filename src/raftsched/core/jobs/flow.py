"""Flow control: queue and tenant settings, token buckets, circuits, admission.

Every flow decision is taken when a command is applied, from the replicated
state, so a limit holds across every worker and survives a leader change.
This module keeps the replicated part in the `flow` section:

- per queue (`QueueFlow`): the settings (paused, rate limit, burst,
  concurrency limit, circuit window and probe interval) and the counters a
  claim moves: the token bucket (micro-tokens and when it was last refilled,
  in replicated time), the circuit (the last outcomes as a bit mask, open or
  not, when the next probe may be claimed) and the fair-share rotation
  (which tenant's turn it is, how many claims that turn has left, and
  whether the next claim belongs to the reserved high-priority share);
- per tenant (`TenantFlow`): weight, concurrency limit and maximum queued.

In a shard of a sharded cluster, the limits that are counts or rates have a
quota (`quota_book`, `SetShardQuotas`): where one is set, it is the limit
this shard enforces instead of the setting (`queue_gates`,
`tenant_concurrency_limit`, `tenant_max_queued`); the queue's token bucket
then refills at the quota's rate up to its burst.

Which pending jobs are claimable is the derived `runnable_index`; the claim
itself is `flow_claim`. A queue record with default settings exists only
while it carries rotation state, and is dropped when the queue has no
claimable job left, so arbitrary queue names do not accumulate.

The circuit. With `circuit_window` N set, the queue remembers its last N
attempt outcomes (success, or a counted failure: failed or lease expired
while running). When at least N/2 outcomes are known and more than half of
them are failures, the circuit opens: claims from the queue are limited to
one probe every `circuit_probe_ms`. A success while open closes it and
forgets the window; a failure keeps it open.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from raftsched.core.jobs.commands import (
    PauseQueue,
    PlanShardQuotas,
    SetQueue,
    SetShardQuotas,
    SetTenant,
)
from raftsched.core.jobs.quota_book import (
    QUOTA_QUEUES_MAX,
    QUOTA_TENANTS_MAX,
    ROUND_MAX,
    QueueQuota,
    TenantQuota,
    queue_quota,
    quotas_of,
    tenant_quota,
)
from raftsched.core.kernel import runnable_index, shard, wheel
from raftsched.core.kernel.commands import JobSpec
from raftsched.core.kernel.feature import Context
from raftsched.core.kernel.model import (
    OUTCOME_FAILED,
    OUTCOME_LEASE_EXPIRED,
    OUTCOME_SUCCEEDED,
    Job,
)
from raftsched.core.kernel.results import INVALID_REQUEST, INVALID_STATE, QUEUE_FULL, Ack, Rejected
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import (
    NAME_CHARS_MAX,
    TIME_MS_MAX,
    check_int,
    check_name,
    check_optional_int,
    invalid,
)

FLOW: Final = "flow"
MICRO: Final = 1_000_000  # micro-tokens per token
WEIGHT_MAX: Final = 10_000
LIMIT_MAX: Final = 1_000_000_000
RATE_MILLI_MAX: Final = 1_000_000_000  # a million claims per second
CIRCUIT_WINDOW_MIN: Final = 4
CIRCUIT_WINDOW_MAX: Final = 64  # the outcomes are one 64-bit mask
PROBE_MS_MIN: Final = 1
QUEUED_RETRY_AFTER_S: Final = 1

_QUEUE_FIELDS: Final = (
    "paused",
    "rate_milli",
    "burst",
    "concurrency_limit",
    "circuit_window",
    "circuit_probe_ms",
    "tokens_micro",
    "refilled_at_ms",
    "outcomes",
    "outcome_count",
    "circuit_open",
    "probe_at_ms",
    "cursor",
    "left",
    "high_turn",
)
_RUNTIME_FIELDS: Final = _QUEUE_FIELDS[6:]
_DEFAULT_SETTINGS: Final = (False, None, None, None, None, 5_000)


class QueueFlow:
    """One queue's settings and the counters its claims move (see module doc)."""

    __slots__ = _QUEUE_FIELDS

    def __init__(self) -> None:
        self.paused = False
        self.rate_milli: int | None = None
        self.burst: int | None = None
        self.concurrency_limit: int | None = None
        self.circuit_window: int | None = None
        self.circuit_probe_ms = 5_000
        self.tokens_micro = 0
        self.refilled_at_ms = 0
        self.outcomes = 0  # bit i set: the i-th most recent outcome failed
        self.outcome_count = 0
        self.circuit_open = False
        self.probe_at_ms = 0
        self.cursor: str | None = None  # the tenant whose turn it is
        self.left = 0  # claims left in that turn
        self.high_turn = False

    def settings(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in _QUEUE_FIELDS[:6])

    def is_default(self) -> bool:
        return self.settings() == _DEFAULT_SETTINGS

    def tokens_at(self, now_ms: int) -> int:
        """Micro-tokens in the bucket at `now_ms` (without storing the refill)
        under the settings' rate and burst (`bucket_tokens` for a quota's)."""
        assert self.rate_milli is not None and self.burst is not None
        return bucket_tokens(self, now_ms, (self.rate_milli, self.burst))


Bucket = tuple[int, int]
"""A token bucket's (rate in tokens per 1,000 s, burst in tokens)."""


def bucket_tokens(record: QueueFlow, now_ms: int, bucket: Bucket) -> int:
    """Micro-tokens in `record`'s bucket at `now_ms` when it refills at
    `bucket`'s rate up to its burst (without storing the refill)."""
    rate_milli, burst = bucket
    elapsed_ms = max(0, now_ms - record.refilled_at_ms)
    return min(burst * MICRO, record.tokens_micro + elapsed_ms * rate_milli)


class TenantFlow:
    __slots__ = ("weight", "concurrency_limit", "max_queued")

    def __init__(
        self, weight: int = 1, concurrency_limit: int | None = None, max_queued: int | None = None
    ) -> None:
        self.weight = weight
        self.concurrency_limit = concurrency_limit
        self.max_queued = max_queued


class Flow:
    __slots__ = ("queues", "tenants")

    def __init__(self) -> None:
        self.queues: dict[str, QueueFlow] = {}
        self.tenants: dict[str, TenantFlow] = {}


DEFAULT_TENANT: Final = TenantFlow()
FRESH_QUEUE: Final = QueueFlow()
"""What a queue without a record holds (never changed)."""


def flow_of(state: State) -> Flow:
    section: Flow = state.sections[FLOW]
    return section


def tenant_flow(flow: Flow, tenant: str) -> TenantFlow:
    return flow.tenants.get(tenant, DEFAULT_TENANT)


# -- the limits this shard enforces ----------------------------------------------


def bucket_of(record: QueueFlow | None, quota: QueueQuota | None) -> Bucket | None:
    """The (rate, burst) the queue's bucket refills at in this shard: its
    quota's, else its setting's; None: no rate limit."""
    if quota is not None and quota.rate_milli is not None:
        assert quota.burst is not None
        return quota.rate_milli, quota.burst
    if record is not None and record.rate_milli is not None:
        assert record.burst is not None
        return record.rate_milli, record.burst
    return None


def queue_gates(
    record: QueueFlow | None, quota: QueueQuota | None
) -> tuple[int | None, Bucket | None]:
    """The queue's concurrency limit and bucket in this shard (see `bucket_of`)."""
    concurrency = None if record is None else record.concurrency_limit
    if quota is not None and quota.concurrency_limit is not None:
        concurrency = quota.concurrency_limit
    return concurrency, bucket_of(record, quota)


def tenant_concurrency_limit(state: State, flow: Flow, tenant: str) -> int | None:
    """The tenant's concurrency limit in this shard: its quota, else its setting."""
    quota = tenant_quota(state, tenant)
    if quota is not None and quota.concurrency_limit is not None:
        return quota.concurrency_limit
    settings = flow.tenants.get(tenant)
    return None if settings is None else settings.concurrency_limit


def tenant_max_queued(state: State, tenant: str) -> int | None:
    """The tenant's maximum of queued jobs in this shard: its quota, else its setting."""
    quota = tenant_quota(state, tenant)
    if quota is not None and quota.max_queued is not None:
        return quota.max_queued
    return tenant_flow(flow_of(state), tenant).max_queued


# -- encoding ------------------------------------------------------------------


def _encode(state: State) -> Any:
    flow = flow_of(state)
    queues = [
        [name, *(getattr(record, field) for field in _QUEUE_FIELDS)]
        for name, record in sorted(flow.queues.items())
    ]
    tenants = [
        [name, record.weight, record.concurrency_limit, record.max_queued]
        for name, record in sorted(flow.tenants.items())
    ]
    return [queues, tenants]


def _decode(state: State, data: Any) -> None:
    flow = Flow()
    queues, tenants = data
    for row in queues:
        record = QueueFlow()
        for field, value in zip(_QUEUE_FIELDS, row[1:], strict=True):
            setattr(record, field, value)
        flow.queues[row[0]] = record
    for name, weight, concurrency_limit, max_queued in tenants:
        flow.tenants[name] = TenantFlow(weight, concurrency_limit, max_queued)
    state.sections[FLOW] = flow


SECTION: Final = Section(FLOW, Flow, _encode, _decode)


# -- undo ----------------------------------------------------------------------


def guard_queue(state: State, queue: str, savepoint: Savepoint) -> QueueFlow:
    """The queue's record, created if missing, with its present values
    restored (or the record removed) if the command rolls back."""
    flow = flow_of(state)
    record = flow.queues.get(queue)
    if record is None:
        record = flow.queues[queue] = QueueFlow()

        def forget() -> None:
            flow.queues.pop(queue, None)

        savepoint.on_rollback(forget)
        return record
    saved = tuple(getattr(record, field) for field in _QUEUE_FIELDS)

    def restore() -> None:
        flow.queues[queue] = record
        for field, value in zip(_QUEUE_FIELDS, saved, strict=True):
            setattr(record, field, value)

    savepoint.on_rollback(restore)
    return record


def drop_if_idle(state: State, queue: str) -> None:
    """Forget a default-settings queue record once nothing is claimable there:
    its rotation state no longer matters; but not while a rate quota refills
    its bucket (`quota_book`). (The caller guarded the record.)"""
    flow = flow_of(state)
    record = flow.queues.get(queue)
    if (
        record is not None
        and record.is_default()
        and not runnable_index.has_lanes(state.runnable, queue)
    ):
        quota = queue_quota(state, queue)
        if quota is None or quota.rate_milli is None:
            del flow.queues[queue]


# -- commands ------------------------------------------------------------------


def apply_set_queue(state: State, command: SetQueue, context: Context) -> Ack | Rejected:
    savepoint = context.savepoint
    rejected = _check_set_queue(command)
    if rejected is not None:
        return rejected
    record = guard_queue(state, command.queue, savepoint)
    quota = queue_quota(state, command.queue)
    before = bucket_of(record, quota)
    rate_milli, burst = command.rate_limit_milli_per_s, _burst(command)
    # A rate quota keeps this shard's bucket as it is (quota_book).
    after = before if quota is not None and quota.rate_milli is not None else None
    if after is None and rate_milli is not None and burst is not None:
        after = (rate_milli, burst)
    bucket_changed = before != after
    record.paused = command.paused
    record.rate_milli = command.rate_limit_milli_per_s
    record.burst = _burst(command)
    record.concurrency_limit = command.concurrency_limit
    if record.circuit_window != command.circuit_window:
        record.outcomes = record.outcome_count = 0
        record.circuit_open = False
    record.circuit_window = command.circuit_window
    record.circuit_probe_ms = command.circuit_probe_ms
    if bucket_changed:
        record.tokens_micro = 0 if after is None else after[1] * MICRO
        record.refilled_at_ms = state.now_ms
    drop_if_idle(state, command.queue)
    return Ack()


def _burst(command: SetQueue) -> int | None:
    """Without a rate there is no bucket; without a burst it holds one
    second's worth of tokens (at least one)."""
    rate = command.rate_limit_milli_per_s
    if rate is None:
        return None
    if command.burst is not None:
        return command.burst
    return max(1, rate // 1000)


def _check_set_queue(command: SetQueue) -> Rejected | None:
    if type(command.paused) is not bool:
        return invalid("paused", "paused is true or false")
    if command.burst is not None and command.rate_limit_milli_per_s is None:
        return invalid("burst", "a burst needs a rate limit")
    return (
        check_name(command.queue, "queue")
        or check_optional_int(command.rate_limit_milli_per_s, "rate_limit", 1, RATE_MILLI_MAX)
        or check_optional_int(command.burst, "burst", 1, LIMIT_MAX)
        or check_optional_int(command.concurrency_limit, "concurrency_limit", 0, LIMIT_MAX)
        or check_optional_int(
            command.circuit_window, "circuit_window", CIRCUIT_WINDOW_MIN, CIRCUIT_WINDOW_MAX
        )
        or check_int(command.circuit_probe_ms, "circuit_probe", PROBE_MS_MIN, TIME_MS_MAX)
    )


def apply_pause_queue(state: State, command: PauseQueue, context: Context) -> Ack | Rejected:
    savepoint = context.savepoint
    rejected = check_name(command.queue, "queue")
    if rejected is None and type(command.paused) is not bool:
        rejected = invalid("paused", "paused is true or false")
    if rejected is not None:
        return rejected
    record = guard_queue(state, command.queue, savepoint)
    record.paused = command.paused
    drop_if_idle(state, command.queue)
    return Ack()


def apply_set_tenant(state: State, command: SetTenant, context: Context) -> Ack | Rejected:
    savepoint = context.savepoint
    rejected = (
        check_name(command.tenant, "tenant")
        or check_int(command.weight, "weight", 1, WEIGHT_MAX)
        or check_optional_int(command.concurrency_limit, "concurrency_limit", 0, LIMIT_MAX)
        or check_optional_int(command.max_queued, "max_queued", 0, LIMIT_MAX)
    )
    if rejected is not None:
        return rejected
    tenants = flow_of(state).tenants
    name = command.tenant
    previous = tenants.get(name)
    savepoint.on_rollback(lambda: _restore_tenant(tenants, name, previous))
    record = TenantFlow(command.weight, command.concurrency_limit, command.max_queued)
    if record.weight == 1 and record.concurrency_limit is None and record.max_queued is None:
        tenants.pop(name, None)  # the defaults: nothing to store
    else:
        tenants[name] = record
    return Ack()


def _restore_tenant(tenants: dict[str, TenantFlow], name: str, record: TenantFlow | None) -> None:
    if record is None:
        tenants.pop(name, None)
    else:
        tenants[name] = record


def apply_set_shard_quotas(
    state: State, command: SetShardQuotas, context: Context
) -> Ack | Rejected:
    """This shard's quotas of one rebalance round, replacing the last
    round's (quota_book); a queue whose bucket changes keeps the tokens it
    has, at most the new burst."""
    savepoint = context.savepoint
    rejected = check_quota_round(command)
    if rejected is not None:
        return rejected
    if shard.identity(state) is None:
        return Rejected(
            INVALID_STATE,
            "quotas are a shard's share of the flow limits, and this group is no shard",
        )
    quotas = quotas_of(state)
    queues = {name: QueueQuota(*rest) for name, *rest in command.queues}
    tenants = {name: TenantQuota(*rest) for name, *rest in command.tenants}
    if command.round < quotas.round:
        return Rejected(
            INVALID_STATE,
            f"round {command.round} is older than this shard's quotas, of round {quotas.round}",
            {"round": quotas.round},
        )
    if command.round == quotas.round:
        if (queues, tenants) == (quotas.queues, quotas.tenants):
            return Ack()  # a repeated proposal
        return Rejected(
            INVALID_REQUEST,
            f"round {command.round} gave this shard other quotas",
            {"field": "round"},
        )
    records = flow_of(state).queues
    now_ms = state.now_ms
    changed = []
    for name in sorted(quotas.queues.keys() | queues.keys()):
        record = records.get(name)
        before = bucket_of(record, quotas.queues.get(name))
        after = bucket_of(record, queues.get(name))
        if before == after:
            continue
        record = guard_queue(state, name, savepoint)
        if after is not None:
            tokens = after[1] * MICRO  # a new bucket starts full
            if before is not None:
                tokens = min(tokens, bucket_tokens(record, now_ms, before))
            record.tokens_micro = tokens
            record.refilled_at_ms = now_ms
        changed.append(name)
    previous = (quotas.round, quotas.queues, quotas.tenants)

    def restore() -> None:
        quotas.round, quotas.queues, quotas.tenants = previous

    savepoint.on_rollback(restore)
    quotas.round, quotas.queues, quotas.tenants = command.round, queues, tenants
    for name in changed:
        drop_if_idle(state, name)  # with no rate left, a default record goes
    return Ack()


def check_quota_round(command: SetShardQuotas | PlanShardQuotas) -> Rejected | None:
    """A round, then at most QUOTA_*_MAX rows of each kind in ascending
    order of name, each with at least one quota in range (a rate with its
    burst); a bad row is named by its field and index."""
    rejected = check_int(command.round, "round", 1, ROUND_MAX)
    if rejected is not None:
        return rejected
    return _check_rows(command.queues, "queues", QUOTA_QUEUES_MAX, _check_queue_row) or (
        _check_rows(command.tenants, "tenants", QUOTA_TENANTS_MAX, _check_tenant_row)
    )


def _check_rows(
    rows: object, field: str, most: int, check_row: Callable[[tuple[Any, ...]], str | None]
) -> Rejected | None:
    if type(rows) is not tuple or len(rows) > most:
        return invalid(field, f"{field} must be at most {most} rows")
    previous = ""
    for index, row in enumerate(rows):
        problem = check_row(row) if type(row) is tuple else "a row is a tuple"
        if problem is None and check_name(row[0], field) is not None:
            problem = f"a name is a non-empty string of at most {NAME_CHARS_MAX} chars"
        if problem is None and not row[0] > previous:
            problem = "rows are in ascending order of name, each name once"
        if problem is not None:
            return Rejected(
                INVALID_REQUEST, f"{field}[{index}]: {problem}", {"field": field, "index": index}
            )
        previous = row[0]
    return None


def _quota(value: object, high: int) -> bool:
    return value is None or (type(value) is int and 0 <= value <= high)


def _check_queue_row(row: tuple[Any, ...]) -> str | None:
    if len(row) != 4:
        return "a queue's row is (queue, concurrency_limit, rate_limit, burst)"
    _, concurrency, rate_milli, burst = row
    if not (
        _quota(concurrency, LIMIT_MAX)
        and _quota(rate_milli, RATE_MILLI_MAX)
        and _quota(burst, LIMIT_MAX)
    ):
        return f"quotas are from 0 to {LIMIT_MAX} (a rate to {RATE_MILLI_MAX}), or none"
    if (rate_milli is None) != (burst is None):
        return "a rate quota comes with its burst"
    if concurrency is None and rate_milli is None:
        return "a row gives at least one quota"
    return None


def _check_tenant_row(row: tuple[Any, ...]) -> str | None:
    if len(row) != 3:
        return "a tenant's row is (tenant, concurrency_limit, max_queued)"
    _, concurrency, max_queued = row
    if not (_quota(concurrency, LIMIT_MAX) and _quota(max_queued, LIMIT_MAX)):
        return f"quotas are from 0 to {LIMIT_MAX}, or none"
    if concurrency is None and max_queued is None:
        return "a row gives at least one quota"
    return None


# -- hooks -----------------------------------------------------------------------


def admit(state: State, spec: JobSpec) -> Rejected | None:
    """Backpressure: a new job for a tenant at its maximum of queued jobs is
    refused, and nothing is stored."""
    limit = tenant_max_queued(state, spec.tenant)
    if limit is None:
        return None
    counts = state.runnable.tenants.get(spec.tenant)
    queued = 0 if counts is None else counts[0]
    if queued < limit:
        return None
    return Rejected(
        QUEUE_FULL,
        f"tenant {spec.tenant} has {queued} queued jobs, its maximum; retry later",
        {"tenant": spec.tenant, "max_queued": limit, "retry_after_s": QUEUED_RETRY_AFTER_S},
    )


def release_ordering_key(state: State, job: Job, savepoint: Savepoint) -> None:
    """on_job_finished: release (or, dead-lettered, keep blocking) the job's
    ordering key. Only derived data (the runnable index) changes."""
    if job.ordering_key is not None:
        runnable_index.finished(state.runnable, job, state.jobs)


def feed_circuit(state: State, job: Job, outcome: str, counted: bool, savepoint: Savepoint) -> None:
    """on_attempt_ended: count the attempt's outcome in its queue's circuit, if any."""
    queues: dict[str, QueueFlow] = state.sections[FLOW].queues
    record = queues.get(job.queue) if queues else None
    if record is None or record.circuit_window is None:
        return
    if outcome == OUTCOME_SUCCEEDED:
        failed = False
    elif counted and outcome in (OUTCOME_FAILED, OUTCOME_LEASE_EXPIRED):
        failed = True
    else:
        return  # cancelled, or not the handler's doing (deadline, never started)
    record = guard_queue(state, job.queue, savepoint)
    record_outcome(record, failed, state.now_ms)


def record_outcome(record: QueueFlow, failed: bool, now_ms: int) -> None:
    window = record.circuit_window
    assert window is not None
    if record.circuit_open:
        if not failed:
            record.circuit_open = False
            record.outcomes = record.outcome_count = 0
        return
    record.outcomes = ((record.outcomes << 1) | failed) & ((1 << window) - 1)
    record.outcome_count = min(window, record.outcome_count + 1)
    failures = record.outcomes.bit_count()
    if record.outcome_count * 2 >= window and failures * 2 > record.outcome_count:
        record.circuit_open = True
        record.probe_at_ms = now_ms + record.circuit_probe_ms


def check_flow(state: State) -> list[str]:
    """Invariants of the flow section and the runnable index."""
    problems: list[str] = []
    flow = flow_of(state)
    for name, record in flow.queues.items():
        if record.rate_milli is not None and record.burst is None:
            problems.append(f"flow: queue {name} has a rate without a burst")
    for name, quota in quotas_of(state).queues.items():
        if quota.rate_milli is not None and name not in flow.queues:
            problems.append(f"flow: queue {name} has a rate quota and no bucket")
    _check_index(state, problems)
    return problems


def _check_index(state: State, problems: list[str]) -> None:
    """The live runnable index chooses exactly as one rebuilt from the jobs."""
    live = state.runnable
    fresh = runnable_index.RunnableIndex()
    pending = []
    for job in state.jobs.values():
        runnable_index.add_new(fresh, job)
        if job.status == "pending":
            pending.append(job)
    for job in wheel.packed_jobs(state):
        runnable_index.add_new(fresh, job)
    runnable_index.rebuild(fresh, pending)
    for queue, lanes in runnable_index.all_lanes(live):
        if lanes.ring != sorted(lanes.counts) or any(n <= 0 for n in lanes.counts.values()):
            problems.append(f"flow: ring of {queue} disagrees with its counts")
    if any(not by_kind for by_kind in live.kinds.values()):
        problems.append("flow: a queue without kinds keeps an empty table of them")
    live_counts = _lane_counts(live)
    fresh_counts = _lane_counts(fresh)
    if live_counts != fresh_counts:
        problems.append(f"flow: claimable counts {live_counts} != {fresh_counts}")
    nonzero = {t: c for t, c in live.tenants.items() if any(c)}
    if nonzero != {t: c for t, c in fresh.tenants.items() if any(c)}:
        problems.append(f"flow: tenant counts {nonzero} disagree with the jobs")
    live_heads = {
        key: runnable_index.chain_head(chain, state.jobs) for key, chain in live.keys.items()
    }
    live_heads = {key: head for key, head in live_heads.items() if head is not None}
    fresh_heads = {key: chain[0] for key, chain in fresh.keys.items()}
    if live_heads != fresh_heads:
        problems.append("flow: ordering-key heads disagree with the jobs")
    if live.blocked != fresh.blocked:
        problems.append("flow: blocked ordering keys disagree with the jobs")
    in_lanes = {
        (queue, tenant, id(entry[2]))
        for queue, lanes in runnable_index.all_lanes(live)
        for tenant, heap in lanes.heaps.items()
        for entry in heap
        if lanes is runnable_index.lane_of(live, queue, entry[2].kind)
    }
    for job in pending:
        if runnable_index.is_head(fresh, job) and (job.queue, job.tenant, id(job)) not in in_lanes:
            problems.append(f"job {job.id}: claimable but not in its lane")


def _lane_counts(index: runnable_index.RunnableIndex) -> dict[tuple[str, str | None], Any]:
    """Each lane's claimable count per tenant, by (queue, kind)."""
    counts: dict[tuple[str, str | None], Any] = {
        (queue, None): lanes.counts for queue, lanes in index.queues.items()
    }
    for queue, by_kind in index.kinds.items():
        for kind, lanes in by_kind.items():
            counts[queue, kind] = lanes.counts
    return counts
