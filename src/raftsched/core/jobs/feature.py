"""The jobs feature: everything a job goes through, as one record.

Submission, leases, operator commands, retention, and flow control (queue
and tenant settings, admission, fair claims, circuits, ordering keys), which
are steps of a job's life cycle rather than a feature of their own.
"""

from __future__ import annotations

from typing import Final

from raftsched.core.jobs import audit, flow, tick
from raftsched.core.jobs.commands import (
    CancelJob,
    ClaimJobs,
    CompleteJob,
    Configure,
    FailJob,
    HeartbeatJob,
    PauseQueue,
    RecordEffect,
    ReplayJob,
    SetQueue,
    SetTenant,
    StartJob,
    SubmitJobs,
)
from raftsched.core.jobs.final_events import emit_job_event
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
    apply_record_effect,
    apply_replay,
)
from raftsched.core.jobs.submit import apply_submit
from raftsched.core.kernel.feature import CommandKind, Feature, JobFinishedHook, TickWork

FEATURE: Final = Feature(
    name="jobs",
    sections=(flow.SECTION,),
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
    ),
    tick=(
        TickWork(10, tick.expire_leases, reports="leases_expired"),
        TickWork(20, tick.enforce_deadlines, reports="dead_lettered"),
        TickWork(30, tick.make_due_runnable, reports="made_runnable"),
        # 40: schedules fire (they may submit jobs that are due at once).
        TickWork(50, tick.purge_finished, reports="purged"),
    ),
    next_due_ms=tick.next_due_ms,
    check=flow.check_flow,
    on_job_finished=(
        JobFinishedHook(10, emit_job_event),
        # 20: the job's workflow advances.
        JobFinishedHook(30, flow.release_ordering_key),
        # 40: its schedule's buffered occurrence is made ready.
    ),
    on_attempt_ended=flow.feed_circuit,
    on_new_epoch=tick.take_over,
    after_entry=tick.tidy_heaps,
)
