"""The jobs feature: everything a job goes through, as one record.

Submission, leases, operator commands, retention, and flow control (queue
and tenant settings, admission, fair claims, circuits, ordering keys), which
are steps of a job's life cycle rather than a feature of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from raftsched.core.jobs import (
    audit,
    flow,
    quota_book,
    quota_plans,
    reconcile,
    reconcile_book,
    reconcile_log,
    tick,
    trace_book,
)
from raftsched.core.jobs.commands import (
    CancelJob,
    ClaimJobs,
    ClaimJobsOfKinds,
    CompleteJob,
    Configure,
    ConfigureWheel,
    FailJob,
    HeartbeatJob,
    LeaseBatch,
    PauseQueue,
    PlanShardQuotas,
    ReconcileJob,
    RecordEffect,
    ReplayJob,
    ReplayReconciled,
    RequestReconcile,
    SetQueue,
    SetShardQuotas,
    SetTenant,
    SetUnknownPolicy,
    StartJob,
    SubmitJobs,
)
from raftsched.core.jobs.final_events import emit_job_event
from raftsched.core.jobs.lease_batch import apply_lease_batch
from raftsched.core.jobs.leases import (
    apply_claim,
    apply_complete,
    apply_fail,
    apply_heartbeat,
    apply_start,
)
from raftsched.core.jobs.operator_commands import (
    apply_cancel,
    apply_configure,
    apply_configure_wheel,
    apply_record_effect,
    apply_replay,
    apply_replay_reconciled,
)
from raftsched.core.jobs.submit import apply_submit
from raftsched.core.kernel import shard, wheel
from raftsched.core.kernel.cluster_version import SPEC_KIND_VERSION
from raftsched.core.kernel.codec import CodecError, expect
from raftsched.core.kernel.feature import (
    CommandKind,
    Feature,
    FieldKind,
    JobFinishedHook,
    TickWork,
)
from raftsched.core.kernel.model import Job
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.state import State


def _attempt_ended(
    state: State, job: Job, outcome: str, counted: bool, savepoint: Savepoint
) -> None:
    """The queue's circuit counts the outcome; the reconciliation log notes
    an unknown one."""
    flow.feed_circuit(state, job, outcome, counted, savepoint)
    reconcile_log.note_attempt_ended(state, job, outcome, counted, savepoint)


def _encode_effects(effects: tuple[tuple[str, bytes], ...]) -> list[list[Any]]:
    return [[key, result] for key, result in effects]


def _decode_effects(value: object) -> tuple[tuple[str, bytes], ...]:
    if type(value) is not tuple:
        raise CodecError("effects must be an array")
    for pair in value:
        if type(pair) is not tuple or len(pair) != 2:
            raise CodecError("an effect is [key, result]")
        expect(pair[0], "str")
        expect(pair[1], "bytes")
    return value


def _encode_claim_kinds(kinds: tuple[tuple[str | None, int], ...]) -> list[list[Any]]:
    return [[kind, most] for kind, most in kinds]


def _decode_claim_kinds(value: object) -> tuple[tuple[str | None, int], ...]:
    if type(value) is not tuple:
        raise CodecError("kinds must be an array")
    for pair in value:
        if type(pair) is not tuple or len(pair) != 2:
            raise CodecError("a claim's kind is [kind, max_jobs]")
        expect(pair[0], "str?")
        expect(pair[1], "int")
    return value


def _encode_quota_rows(rows: tuple[tuple[Any, ...], ...]) -> list[list[Any]]:
    return [list(row) for row in rows]


def _quota_rows(width: int, what: str) -> Callable[[object], tuple[Any, ...]]:
    """The decoder of `SetShardQuotas`' rows of `width` fields: a name and
    integers or nil (what they may be is the handler's to check)."""

    def decode(value: object) -> tuple[Any, ...]:
        if type(value) is not tuple:
            raise CodecError(f"{what} must be an array")
        for row in value:
            if type(row) is not tuple or len(row) != width:
                raise CodecError(f"a row of {what} has {width} fields")
            expect(row[0], "str")
            for item in row[1:]:
                expect(item, "int?")
        return value

    return decode


def _check(state: State) -> list[str]:
    return (
        flow.check_flow(state)
        + quota_book.check(state)
        + quota_plans.check(state)
        + reconcile_book.check(state)
        + reconcile_log.check(state)
        + trace_book.check(state)
        + wheel.check(state)
    )


FEATURE: Final = Feature(
    name="jobs",
    sections=(
        flow.SECTION,
        quota_book.SECTION,
        quota_plans.SECTION,
        reconcile_book.SECTION,
        trace_book.SECTION,
        wheel.SECTION,
    ),
    commands=(
        CommandKind(SubmitJobs, 1, ("specs", "strs"), apply_submit),
        CommandKind(ClaimJobs, 2, ("str", "strs", "int", "int?"), apply_claim),
        CommandKind(StartJob, 3, ("str", "int"), apply_start),
        CommandKind(HeartbeatJob, 4, ("str", "int", "int?", "bytes?"), apply_heartbeat),
        CommandKind(CompleteJob, 5, ("str", "int", "bytes"), apply_complete),
        CommandKind(FailJob, 6, ("str", "int", "str", "str", "int?", "int"), apply_fail),
        CommandKind(CancelJob, 7, ("str", "str", "str"), apply_cancel, audit=audit.CANCEL),
        CommandKind(ReplayJob, 8, ("str", "str", "str"), apply_replay, audit=audit.REPLAY),
        CommandKind(RecordEffect, 9, ("str", "str", "int", "bytes"), apply_record_effect),
        CommandKind(Configure, 13, ("int?",), apply_configure),
        # Flow control: 60-79.
        CommandKind(
            SetQueue,
            60,
            ("str", "bool", "int?", "int?", "int?", "int?", "int"),
            flow.apply_set_queue,
            audit=audit.SET_QUEUE,
        ),
        CommandKind(
            PauseQueue, 61, ("str", "bool"), flow.apply_pause_queue, audit=audit.PAUSE_QUEUE
        ),
        CommandKind(
            SetTenant,
            62,
            ("str", "int", "int?", "int?"),
            flow.apply_set_tenant,
            audit=audit.SET_TENANT,
        ),
        # Reconciliation of unknown outcomes (jobs.reconcile): 100-109.
        CommandKind(
            SetUnknownPolicy,
            100,
            ("str", "str", "str"),
            reconcile.apply_set_unknown_policy,
            since=5,
            audit=audit.SET_UNKNOWN_POLICY,
        ),
        CommandKind(
            ReconcileJob,
            101,
            ("str", "int", "str", "bytes", "effect_results", "str", "int"),
            reconcile.apply_reconcile,
            since=5,
        ),
        CommandKind(
            ReplayReconciled,
            102,
            ("str", "str", "str"),
            apply_replay_reconciled,
            since=5,
            audit=audit.REPLAY_RECONCILED,
        ),
        CommandKind(
            RequestReconcile,
            103,
            ("str", "str", "str"),
            reconcile.apply_request_reconcile,
            since=5,
            audit=audit.REQUEST_RECONCILE,
        ),
        # Lease batches (jobs.lease_batch): 110-119.
        CommandKind(LeaseBatch, 110, ("commands", "command?"), apply_lease_batch, since=6),
        # The time wheel of packed future jobs (kernel.wheel): 120-129.
        CommandKind(
            ConfigureWheel,
            120,
            ("int", "int"),
            apply_configure_wheel,
            since=wheel.WHEEL_VERSION,
            audit=audit.CONFIGURE_WHEEL,
        ),
        # Job kinds (a claim of the kinds a worker has handlers for): 130-139.
        CommandKind(
            ClaimJobsOfKinds,
            130,
            ("str", "strs", "int", "int?", "claim_kinds"),
            apply_claim,
            since=SPEC_KIND_VERSION,
        ),
        # Shards: this shard's quotas of the flow limits (jobs.quota_book);
        # 140, SetShard, is the kernel's (kernel.shard).
        CommandKind(
            SetShardQuotas,
            141,
            ("int", "queue_quotas", "tenant_quotas"),
            flow.apply_set_shard_quotas,
            since=shard.SHARD_VERSION,
        ),
        # Group 0's record of every shard's quotas (jobs.quota_plans).
        CommandKind(
            PlanShardQuotas,
            142,
            ("int", "int", "queue_quotas", "tenant_quotas"),
            quota_plans.apply_plan_shard_quotas,
            since=shard.SHARD_VERSION,
        ),
    ),
    field_kinds=(
        FieldKind("effect_results", _encode_effects, _decode_effects),
        FieldKind("claim_kinds", _encode_claim_kinds, _decode_claim_kinds),
        FieldKind("queue_quotas", _encode_quota_rows, _quota_rows(4, "queue quotas")),
        FieldKind("tenant_quotas", _encode_quota_rows, _quota_rows(3, "tenant quotas")),
    ),
    tick=(
        TickWork(10, tick.expire_leases, reports="leases_expired"),
        TickWork(15, reconcile.expire_reconciliations),
        TickWork(20, tick.enforce_deadlines, reports="dead_lettered"),
        TickWork(25, tick.hydrate_wheel),
        TickWork(30, tick.make_due_runnable, reports="made_runnable"),
        # 40: schedules fire (they may submit jobs that are due at once).
        TickWork(50, tick.purge_finished, reports="purged"),
    ),
    next_due_ms=tick.next_due_ms,
    check=_check,
    on_job_finished=(
        JobFinishedHook(10, emit_job_event),
        # 20: the job's workflow advances.
        JobFinishedHook(30, flow.release_ordering_key),
        # 40: its schedule's buffered occurrence is made ready.
        JobFinishedHook(50, reconcile_book.close_finished),
    ),
    on_attempt_ended=_attempt_ended,
    on_new_epoch=tick.take_over,
    after_entry=tick.tidy_heaps,
    # Paced hydration of the time wheel (kernel.wheel): no command of its own.
    versions=(wheel.PACED_HYDRATION_VERSION,),
)
