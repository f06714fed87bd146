"""The one entry point: apply a committed Raft entry to the state.

`apply_entry` first lets time and epoch advance (the takeover), then applies
each command in order through one small handler per command type. Nothing
escapes: pysyncobj re-applies a raising entry forever on every replica, so a
bug becomes a recorded `Rejected(internal_error)` after the savepoint has put
the state back as it was. The one exception is an entry that this code cannot
decode (`apply_encoded` raises `CodecError`): rejecting it would leave this
replica behind every replica that applied it, so the node stops applying.
"""

from __future__ import annotations

from contextlib import suppress

from raftsched.core.events import handlers as events_commands
from raftsched.core.events.commands import (
    AckDelivery,
    AckParked,
    ConfigureOutbox,
    CreateSubscription,
    DeleteSubscription,
    ParkDelivery,
    RetryParked,
)
from raftsched.core.jobs import flow
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
from raftsched.core.jobs.tick import apply_tick, take_over, tidy_heaps
from raftsched.core.kernel import cluster_version
from raftsched.core.kernel.codec import CodecError, decode_entry
from raftsched.core.kernel.commands import (
    Barrier,
    Command,
    Entry,
    RaiseClusterVersion,
    TakeOver,
    Tick,
)
from raftsched.core.kernel.results import INTERNAL_ERROR, INVALID_REQUEST, Ack, Rejected, Result
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import TIME_MS_MAX, TOKEN_MAX
from raftsched.core.schedules import handlers as schedule_commands
from raftsched.core.schedules.commands import (
    BackfillSchedule,
    CreateSchedule,
    DeleteSchedule,
    PauseSchedule,
    ResumeSchedule,
    TriggerSchedule,
    UpdateSchedule,
)
from raftsched.core.workflows import handlers as workflows
from raftsched.core.workflows.commands import CancelWorkflow, SubmitWorkflow

COMMAND_TYPES = frozenset(
    {
        SubmitJobs,
        ClaimJobs,
        StartJob,
        HeartbeatJob,
        CompleteJob,
        FailJob,
        CancelJob,
        ReplayJob,
        RecordEffect,
        Tick,
        TakeOver,
        Barrier,
        Configure,
        RaiseClusterVersion,
        ConfigureOutbox,
        CreateSubscription,
        DeleteSubscription,
        AckDelivery,
        ParkDelivery,
        RetryParked,
        AckParked,
        SubmitWorkflow,
        CancelWorkflow,
        SetQueue,
        PauseQueue,
        SetTenant,
        CreateSchedule,
        UpdateSchedule,
        DeleteSchedule,
        PauseSchedule,
        ResumeSchedule,
        TriggerSchedule,
        BackfillSchedule,
    }
)
COMMANDS_PER_ENTRY_MAX = 100_000


def apply_encoded(state: State, data: bytes) -> list[Result]:
    """Decode one committed entry and apply it. This is what the Raft adapter calls.

    Raises `CodecError`, with the state untouched, when this code cannot
    decode the entry: most likely a newer release proposed a command kind
    this one does not know. The caller must stop applying (node.machine):
    every replica that could decode the entry applied it, so skipping or
    rejecting it here would diverge from them without a word.
    """
    try:
        entry = decode_entry(data)
    except CodecError:
        raise
    except Exception as error:  # a codec bug: this code cannot read the entry either
        raise CodecError(f"undecodable entry: {type(error).__name__}: {error}") from error
    return apply_entry(state, entry)


def apply_entry(state: State, entry: Entry) -> list[Result]:
    """Apply one entry: one result per command, in order. Never raises."""
    problem = _check_entry(entry)
    if problem is not None:
        count = len(entry.commands) if type(entry) is Entry and type(entry.commands) is tuple else 1
        return [Rejected(INVALID_REQUEST, problem, {"field": "entry"})] * max(count, 1)
    try:
        _advance(state, entry)
    except Exception as error:  # a bug; every replica meets it at the same entry
        message = f"advancing time failed: {type(error).__name__}: {error}"[:1000]
        return [Rejected(INTERNAL_ERROR, message, {})] * max(len(entry.commands), 1)
    stale = entry.epoch < state.epoch
    savepoint = Savepoint(state)
    results = [_apply_command(state, command, stale, savepoint) for command in entry.commands]
    # A bug in tidying touches derived data only, and Tick settles the heaps anyway.
    with suppress(Exception):
        tidy_heaps(state, len(entry.commands))
    return results


def _check_entry(entry: object) -> str | None:
    if type(entry) is not Entry:
        return "not an Entry"
    if type(entry.epoch) is not int or not 0 <= entry.epoch <= TOKEN_MAX:
        return "entry epoch must be a non-negative integer"
    if type(entry.now_ms) is not int or not 0 <= entry.now_ms <= TIME_MS_MAX:
        return "entry now_ms must be a non-negative integer"
    if type(entry.commands) is not tuple or len(entry.commands) > COMMANDS_PER_ENTRY_MAX:
        return "entry commands must be a tuple"
    return None


def _advance(state: State, entry: Entry) -> None:
    """Replicated time never runs backwards; a higher epoch is a takeover."""
    if entry.now_ms > state.now_ms:
        state.now_ms = entry.now_ms
    if entry.epoch > state.epoch:
        state.epoch = entry.epoch
        take_over(state)


def _apply_command(state: State, command: Command, stale: bool, savepoint: Savepoint) -> Result:
    if type(command) not in COMMAND_TYPES:
        return Rejected(INVALID_REQUEST, "unknown command type", {"field": "command"})
    savepoint.reset()
    try:
        return _dispatch(state, command, stale, savepoint)
    except Exception as error:
        # If even the rollback fails there is nothing better to do than to
        # record the failure; every replica fails the same way.
        with suppress(Exception):
            savepoint.rollback()
        return Rejected(
            INTERNAL_ERROR,
            f"{type(command).__name__} failed: {type(error).__name__}: {error}"[:1000],
            {},
        )


def _dispatch(state: State, command: Command, stale: bool, savepoint: Savepoint) -> Result:
    match command:
        case SubmitJobs():
            return apply_submit(state, command, savepoint)
        case ClaimJobs():
            return apply_claim(state, command, stale, savepoint)
        case StartJob():
            return apply_start(state, command, savepoint)
        case HeartbeatJob():
            return apply_heartbeat(state, command, savepoint)
        case CompleteJob():
            return apply_complete(state, command, savepoint)
        case FailJob():
            return apply_fail(state, command, savepoint)
        case CancelJob():
            return apply_cancel(state, command, savepoint)
        case ReplayJob():
            return apply_replay(state, command, savepoint)
        case RecordEffect():
            return apply_record_effect(state, command, savepoint)
        case Tick():
            return apply_tick(state, command, stale, savepoint)
        case TakeOver() | Barrier():
            return Ack()
        case Configure():
            return apply_configure(state, command)
        case RaiseClusterVersion():
            return cluster_version.apply_raise_cluster_version(state, command)
        case (
            ConfigureOutbox()
            | CreateSubscription()
            | DeleteSubscription()
            | AckDelivery()
            | ParkDelivery()
            | RetryParked()
            | AckParked()
        ):
            return events_commands.apply(state, command)
        case SubmitWorkflow():
            return workflows.apply_submit_workflow(state, command, savepoint)
        case CancelWorkflow():
            return workflows.apply_cancel_workflow(state, command)
        case SetQueue():
            return flow.apply_set_queue(state, command, savepoint)
        case PauseQueue():
            return flow.apply_pause_queue(state, command, savepoint)
        case SetTenant():
            return flow.apply_set_tenant(state, command, savepoint)
        case CreateSchedule():
            return schedule_commands.apply_create(state, command, savepoint)
        case UpdateSchedule():
            return schedule_commands.apply_update(state, command, savepoint)
        case DeleteSchedule():
            return schedule_commands.apply_delete(state, command, savepoint)
        case PauseSchedule():
            return schedule_commands.apply_pause(state, command, savepoint)
        case ResumeSchedule():
            return schedule_commands.apply_resume(state, command, savepoint)
        case TriggerSchedule():
            return schedule_commands.apply_trigger(state, command, savepoint)
        case BackfillSchedule():
            return schedule_commands.apply_backfill(state, command, savepoint)
        case _:
            return Rejected(INVALID_REQUEST, "unknown command type", {"field": "command"})
