"""Workflows: SubmitWorkflow, CancelWorkflow, and how a workflow advances.

Theory of operation. A workflow advances only inside the command that
changed one of its jobs: `lifecycle.finish` calls `record_step_outcome` (the
workflows feature's `on_job_finished` hook), which records the step's outcome
and then runs `_advance`, a loop that derives everything from the step
statuses:

- running: start every waiting step whose dependencies all succeeded (its job
  is created in this same command); under `continue`, skip steps that depend
  on an unsuccessful one; under `fail_fast`, the first unsuccessful step stops
  the workflow. When nothing is waiting or active it succeeds, or (some step
  did not succeed) stops as `failed`.
- stopping (failure, cancel, timeout): waiting steps are skipped, queued step
  jobs cancelled, leased ones asked to cancel; the workflow is `compensating`.
- compensating: once no step job is active, the compensations of succeeded
  steps run one at a time in reverse order of completion, each job getting
  the original step's result as input; then the workflow takes its final
  status. A failed compensation is recorded and the rest still run.

Cancelling a step job inside `_advance` re-enters `record_step_outcome` for that
job; the `advancing` flag turns the re-entry into bookkeeping only and the
outer loop picks up the change.

Every job a workflow creates, steps and compensations alike, gets the trace
context its submission carried (cluster version 8), unless its spec has one
of its own: the workers' attempts of all its steps join the one trace.
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from hashlib import blake2b
from typing import Any, Final

import msgpack

from raftsched.core.jobs.commands import CancelJob
from raftsched.core.jobs.operator_commands import cancel_job
from raftsched.core.jobs.submit import create_job
from raftsched.core.kernel.commands import JobSpec, Tick
from raftsched.core.kernel.feature import Context
from raftsched.core.kernel.model import CANCELLED as JOB_CANCELLED
from raftsched.core.kernel.model import DEAD_LETTER, Job
from raftsched.core.kernel.model import SUCCEEDED as JOB_SUCCEEDED
from raftsched.core.kernel.outbox import emit
from raftsched.core.kernel.results import (
    IDEMPOTENCY_CONFLICT,
    INVALID_STATE,
    NOT_FOUND,
    Rejected,
    WorkflowCancelAccepted,
    WorkflowSubmitted,
)
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import (
    KEY_CHARS_MAX,
    TEXT_CHARS_MAX,
    TIME_MS_MAX,
    check_name,
    check_optional_int,
    check_optional_name,
    check_spec,
    check_text,
    check_trace_context,
    invalid,
)
from raftsched.core.workflows.codec import step_row
from raftsched.core.workflows.commands import CancelWorkflow, StepSpec, SubmitWorkflow
from raftsched.core.workflows.model import (
    ACTIVE,
    CANCEL,
    CANCELLED,
    COMPENSATING,
    CONTINUE,
    FAIL,
    FAIL_FAST,
    FAILED,
    FAILURE_POLICIES,
    INITIAL_WORKFLOW_STATUS,
    OUTCOME_EVENTS,
    PENDING,
    PLAN,
    RUNNING,
    SKIP,
    START,
    STOP,
    SUCCEED,
    SUCCEEDED,
    TIMED_OUT,
    UNSUCCESSFUL_STEP,
    WAITING,
    Step,
    Workflow,
    WorkflowTable,
    step_job_id,
    table,
    transition_compensation,
    transition_step,
    transition_workflow,
)

STEPS_MAX: Final = 100
WORKFLOW_ID_CHARS_MAX: Final = 150
STEP_NAME_CHARS_MAX: Final = 100
SYSTEM_ACTOR: Final = "workflow"
_JOB_FINAL_EVENTS: Final = {JOB_SUCCEEDED: SUCCEED, DEAD_LETTER: FAIL, JOB_CANCELLED: CANCEL}
"""A step's (or compensation's) job reached this final status -> the step's event."""


def _keep_undo(state: State, savepoint: Savepoint, workflow: Workflow) -> None:
    """Before changing a workflow: how to put it back if the command fails."""
    saved, found = workflow.copy(), table(state)
    savepoint.on_rollback(lambda: _restore(found, saved))


def _restore(found: WorkflowTable, saved: Workflow) -> None:
    found.workflows[saved.id] = saved
    found.index(saved)


def _history(state: State, workflow: Workflow, event: str, detail: str | None = None) -> None:
    workflow.history.append((state.now_ms, event, detail))
    workflow.updated_at_ms = state.now_ms


# -- SubmitWorkflow -------------------------------------------------------------


def apply_submit_workflow(
    state: State, command: SubmitWorkflow, context: Context
) -> WorkflowSubmitted | Rejected:
    savepoint = context.savepoint
    checked = _check_submit(command)
    if isinstance(checked, Rejected):
        return checked
    found = table(state)
    fingerprint = _fingerprint(command)
    key = command.idempotency_key
    if key is not None:
        original_id = found.keys.get((command.tenant, key))
        if original_id is not None:
            original = found.workflows[original_id]
            if original.fingerprint == fingerprint:
                return WorkflowSubmitted(original.id, created=False)
            return Rejected(
                IDEMPOTENCY_CONFLICT,
                "this idempotency key was used with a different workflow",
                {"field": "idempotency_key", "workflow_id": original.id},
            )
    existing = found.workflows.get(command.workflow_id)
    if existing is not None:
        if existing.fingerprint == fingerprint:
            return WorkflowSubmitted(existing.id, created=False)  # a retried proposal
        return invalid("workflow_id", f"workflow id {command.workflow_id} is already in use")
    for index in range(len(command.steps)):
        for compensation in (False, True):
            if step_job_id(command.workflow_id, index, compensation) in state.jobs:
                return invalid("workflow_id", "a step job id derived from it is in use")
    workflow = _create(state, command, checked, fingerprint)
    savepoint.on_rollback(lambda: _forget(found, workflow))
    _advance(state, savepoint, workflow)
    return WorkflowSubmitted(workflow.id, created=True)


def _forget(found: WorkflowTable, workflow: Workflow) -> None:
    found.workflows.pop(workflow.id, None)
    if workflow.idempotency_key is not None:
        found.keys.pop((workflow.tenant, workflow.idempotency_key), None)
    found.next_seq = min(found.next_seq, workflow.seq)


def _check_submit(command: SubmitWorkflow) -> list[tuple[int, ...]] | Rejected:
    """Validate everything; on success, each step's dependencies as indexes."""
    rejected = (
        check_name(command.workflow_id, "workflow_id", WORKFLOW_ID_CHARS_MAX)
        or check_name(command.tenant, "tenant")
        or check_optional_name(command.idempotency_key, "idempotency_key", KEY_CHARS_MAX)
        or check_optional_int(command.timeout_ms, "timeout", 1, TIME_MS_MAX)
        or check_trace_context(command.traceparent, command.tracestate)
    )
    if rejected is not None:
        return rejected
    if type(command.on_failure) is not str or command.on_failure not in FAILURE_POLICIES:
        return invalid("on_failure", "on_failure is fail_fast or continue")
    if type(command.compensate_on_cancel) is not bool:
        return invalid("compensate_on_cancel", "compensate_on_cancel must be a boolean")
    steps = command.steps
    if type(steps) is not tuple or not 1 <= len(steps) <= STEPS_MAX:
        return invalid("steps", f"a workflow has 1 to {STEPS_MAX} steps")
    positions: dict[str, int] = {}
    for index, step in enumerate(steps):
        rejected = _check_step(step, index, positions)
        if rejected is not None:
            return rejected
        positions[step.name] = index
    deps: list[tuple[int, ...]] = []
    for index, step in enumerate(steps):
        for name in step.depends_on:
            if name not in positions:
                return invalid(f"steps[{index}].depends_on", f"unknown step {name!r}")
        deps.append(tuple(positions[name] for name in step.depends_on))
    cycle = _find_cycle(deps)
    if cycle is not None:
        names = " -> ".join(steps[i].name for i in cycle)
        return invalid(f"steps[{cycle[0]}].depends_on", f"the steps form a cycle: {names}")
    return deps


def _check_step(step: object, index: int, positions: dict[str, int]) -> Rejected | None:
    where = f"steps[{index}]"
    if type(step) is not StepSpec:
        return invalid(where, "each step must be a StepSpec")
    rejected = check_name(step.name, f"{where}.name", STEP_NAME_CHARS_MAX)
    if rejected is not None:
        return rejected
    if step.name in positions:
        return invalid(f"{where}.name", f"duplicate step name {step.name!r}")
    depends_on = step.depends_on
    if type(depends_on) is not tuple or len(set(depends_on)) != len(depends_on):
        return invalid(f"{where}.depends_on", "depends_on lists distinct step names")
    if any(type(name) is not str for name in depends_on):
        return invalid(f"{where}.depends_on", "depends_on lists step names")
    return _prefixed(check_spec(step.job), where) or (
        None
        if step.compensation is None
        else _prefixed(check_spec(step.compensation), f"{where}.compensation")
    )


def _prefixed(rejected: Rejected | None, where: str) -> Rejected | None:
    if rejected is None:
        return None
    field = rejected.details.get("field", "")
    return invalid(f"{where}.{field}", rejected.message)


def _find_cycle(deps: list[tuple[int, ...]]) -> list[int] | None:
    """A cycle as step indexes (first repeated at the end), or None."""
    state = [0] * len(deps)  # 0 unvisited, 1 on the path, 2 done
    for root in range(len(deps)):
        if state[root]:
            continue
        path: list[int] = []
        stack: list[tuple[int, int]] = [(root, 0)]
        while stack:
            node, position = stack.pop()
            if position == 0:
                state[node] = 1
                path.append(node)
            if position < len(deps[node]):
                stack.append((node, position + 1))
                child = deps[node][position]
                if state[child] == 1:
                    return [*path[path.index(child) :], child]
                if state[child] == 0:
                    stack.append((child, 0))
            else:
                state[node] = 2
                path.pop()
    return None


def _fingerprint(command: SubmitWorkflow) -> bytes:
    """What makes two submissions the same request: all but the workflow id
    and the trace context (a repeat from another span is the same request,
    as a job's is, `submit.spec_fingerprint`)."""
    row = [
        command.tenant,
        command.idempotency_key,
        command.timeout_ms,
        command.on_failure,
        command.compensate_on_cancel,
        [step_row(step) for step in command.steps],
    ]
    return blake2b(msgpack.packb(row), digest_size=16).digest()


def _create(
    state: State, command: SubmitWorkflow, deps: list[tuple[int, ...]], fingerprint: bytes
) -> Workflow:
    found = table(state)
    seq = found.next_seq
    found.next_seq = seq + 1
    now_ms = state.now_ms
    timeout_at_ms = None if command.timeout_ms is None else now_ms + command.timeout_ms
    steps = [
        Step(step.name, step.job, deps[index], step.compensation)
        for index, step in enumerate(command.steps)
    ]
    workflow = Workflow(
        command.workflow_id,
        seq,
        command.tenant,
        command.idempotency_key,
        fingerprint,
        command.on_failure,
        command.compensate_on_cancel,
        timeout_at_ms,
        now_ms,
        now_ms,
        INITIAL_WORKFLOW_STATUS,
        None,
        None,
        [],
        None,
        steps,
        [(now_ms, "submitted", None)],
        None if command.traceparent is None else (command.traceparent, command.tracestate),
    )
    found.workflows[workflow.id] = workflow
    found.index(workflow)
    return workflow


# -- CancelWorkflow -------------------------------------------------------------


def apply_cancel_workflow(
    state: State, command: CancelWorkflow, context: Context
) -> WorkflowCancelAccepted | Rejected:
    savepoint = context.savepoint
    rejected = (
        check_name(command.workflow_id, "workflow_id")
        or check_text(command.reason, "reason", TEXT_CHARS_MAX)
        or check_name(command.actor, "actor")
    )
    if rejected is not None:
        return rejected
    workflow = table(state).workflows.get(command.workflow_id)
    if workflow is None:
        return Rejected(
            NOT_FOUND, f"no workflow {command.workflow_id}", {"workflow_id": command.workflow_id}
        )
    if workflow.status == RUNNING:
        _keep_undo(state, savepoint, workflow)
        reason = command.reason or f"cancelled by {command.actor}"
        _stop(state, savepoint, workflow, CANCELLED, reason)
        _advance(state, savepoint, workflow)
    elif workflow.is_final and workflow.status != CANCELLED:
        return Rejected(
            INVALID_STATE,
            f"cannot cancel a workflow that is {workflow.status}",
            {"status": workflow.status},
        )
    return WorkflowCancelAccepted(workflow.id, workflow.status)


# -- advancing ------------------------------------------------------------------


def record_step_outcome(state: State, job: Job, savepoint: Savepoint) -> None:
    """on_job_finished: a job of a workflow (a step or a compensation) reached
    a final status; record it and let the workflow advance."""
    if job.workflow_id is None:
        return
    workflow = table(state).workflows.get(job.workflow_id)
    if workflow is None:
        return
    step = workflow.step_named(job.step)
    event = _JOB_FINAL_EVENTS.get(job.status)
    if step is None or event is None:
        return
    if job.id == step.job_id and step.status == ACTIVE:
        _keep_undo(state, savepoint, workflow)
        transition_step(step, event)
        if step.status == SUCCEEDED:
            step.result = job.result
            workflow.completed.append(workflow.steps.index(step))
        _history(state, workflow, f"step_{step.status}", step.name)
    elif job.id == step.comp_job_id and step.comp_status == ACTIVE:
        _keep_undo(state, savepoint, workflow)
        transition_compensation(step, event)
        step.comp_result = job.result
        _history(state, workflow, f"compensation_{step.comp_status}", step.name)
    else:
        return
    if not workflow.advancing:
        _advance(state, savepoint, workflow)


def _advance(state: State, savepoint: Savepoint, workflow: Workflow) -> None:
    workflow.advancing = True
    try:
        if workflow.status == RUNNING:
            _advance_running(state, savepoint, workflow)
        if workflow.status == COMPENSATING:
            _advance_compensating(state, savepoint, workflow)
    finally:
        workflow.advancing = False


def _advance_running(state: State, savepoint: Savepoint, workflow: Workflow) -> None:
    steps = workflow.steps
    failed = next((step for step in steps if step.status in (FAILED, CANCELLED)), None)
    if failed is not None and workflow.on_failure == FAIL_FAST:
        _stop(state, savepoint, workflow, FAILED, f"step {failed.name} {failed.status}")
        return
    # Steps are validated acyclic but not sorted: repeat until nothing changes.
    changed = True
    while changed:
        changed = False
        for index, step in enumerate(steps):
            if step.status != WAITING:
                continue
            statuses = [steps[dep].status for dep in step.deps]
            if all(status == SUCCEEDED for status in statuses):
                _start_step(state, savepoint, workflow, index, step)
                changed = True
            elif workflow.on_failure == CONTINUE and any(
                status in UNSUCCESSFUL_STEP for status in statuses
            ):
                transition_step(step, SKIP)
                _history(state, workflow, "step_skipped", step.name)
                changed = True
    if any(step.status in (WAITING, ACTIVE) for step in steps):
        return
    unsuccessful = [step.name for step in steps if step.status != SUCCEEDED]
    if unsuccessful:
        _stop(
            state, savepoint, workflow, FAILED, f"steps did not succeed: {', '.join(unsuccessful)}"
        )
    else:
        _finish(state, savepoint, workflow, SUCCEED)


def _start_step(
    state: State, savepoint: Savepoint, workflow: Workflow, index: int, step: Step
) -> None:
    job_id = step_job_id(workflow.id, index)
    _create_job(state, savepoint, workflow, step.spec, job_id, step.name)
    transition_step(step, START)
    step.job_id = job_id
    _history(state, workflow, "step_started", step.name)


def _create_job(
    state: State, savepoint: Savepoint, workflow: Workflow, spec: JobSpec, job_id: str, step: str
) -> None:
    """A step's or a compensation's job, in the workflow's tenant, with the
    workflow's trace context unless the step's spec has one of its own."""
    if spec.tenant != workflow.tenant:
        spec = _with_tenant(spec, workflow.tenant)
    trace = workflow.trace
    if trace is not None and spec.traceparent is None:
        spec = replace(spec, traceparent=trace[0], tracestate=trace[1])
    job = create_job(state, spec, job_id, savepoint)
    job.workflow_id = workflow.id
    job.step = step


def _with_tenant(spec: JobSpec, tenant: str) -> JobSpec:
    return replace(spec, tenant=tenant)


def _stop(
    state: State, savepoint: Savepoint, workflow: Workflow, outcome: str, reason: str
) -> None:
    """Failure, cancel or timeout: nothing new starts; running steps are asked to stop."""
    transition_workflow(workflow, STOP)
    workflow.outcome = outcome
    workflow.reason = reason
    _history(state, workflow, "stopping", f"{outcome}: {reason}")
    for step in workflow.steps:
        if step.status == WAITING:
            transition_step(step, SKIP)
            _history(state, workflow, "step_skipped", step.name)
    for step in workflow.steps:
        if step.status == ACTIVE and step.job_id is not None:
            _cancel_job(state, savepoint, step.job_id, reason)


def _cancel_job(state: State, savepoint: Savepoint, job_id: str, reason: str) -> None:
    job = state.jobs.get(job_id)
    if job is None or job.is_final or job.cancel_requested:
        return
    cancel_job(state, CancelJob(job_id, reason[:TEXT_CHARS_MAX], SYSTEM_ACTOR), savepoint)


def _advance_compensating(state: State, savepoint: Savepoint, workflow: Workflow) -> None:
    steps = workflow.steps
    if any(step.status == ACTIVE for step in steps):
        return  # wait for leased steps to honour the cancel request
    if workflow.compensations is None:
        wanted = workflow.outcome != CANCELLED or workflow.compensate_on_cancel
        plan = [
            index
            for index in reversed(workflow.completed)
            if wanted and steps[index].compensation is not None
        ]
        workflow.compensations = plan
        for index in plan:
            transition_compensation(steps[index], PLAN)
    for index in workflow.compensations:
        step = steps[index]
        if step.comp_status == ACTIVE:
            return  # one at a time, in order
        if step.comp_status == PENDING:
            _start_compensation(state, savepoint, workflow, index, step)
            return
    _finish(state, savepoint, workflow, OUTCOME_EVENTS[workflow.outcome or FAILED])


def _start_compensation(
    state: State, savepoint: Savepoint, workflow: Workflow, index: int, step: Step
) -> None:
    assert step.compensation is not None
    job_id = step_job_id(workflow.id, index, compensation=True)
    _create_job(state, savepoint, workflow, step.compensation, job_id, step.name)
    transition_compensation(step, START)
    step.comp_job_id = job_id
    _history(state, workflow, "compensation_started", step.name)


def _finish(state: State, savepoint: Savepoint, workflow: Workflow, event: str) -> None:
    transition_workflow(workflow, event)
    status = workflow.status
    _history(state, workflow, "finished", status)
    heapq.heappush(table(state).retention, (workflow.updated_at_ms, workflow.seq, workflow.id))
    data: dict[str, Any] = {"workflow_id": workflow.id, "tenant": workflow.tenant}
    if workflow.reason is not None:
        data["reason"] = workflow.reason[:200]
    if workflow.compensations:
        comp = [workflow.steps[index].comp_status for index in workflow.compensations]
        compensated = all(each == SUCCEEDED for each in comp)
        emit(
            state,
            "workflow.compensated" if compensated else "workflow.compensation_failed",
            {**data, "steps": [workflow.steps[i].name for i in workflow.compensations]},
            savepoint,
        )
    emit(state, f"workflow.{status}", data, savepoint)


# -- lease inputs ---------------------------------------------------------------


def step_inputs(state: State, job: Job) -> bytes | None:
    """A msgpack map of step name -> result: the dependencies' results for a
    step, the original step's result for a compensation."""
    workflow = table(state).workflows.get(job.workflow_id or "")
    if workflow is None:
        return None
    step = workflow.step_named(job.step)
    if step is None:
        return None
    sources = [step] if job.id == step.comp_job_id else [workflow.steps[i] for i in step.deps]
    packer = msgpack.Packer()
    parts = [packer.pack_map_header(len(sources))]
    for source in sources:
        parts.append(packer.pack(source.name))
        parts.append(source.result if source.result is not None else b"\xc0")
    return b"".join(parts)


# -- time: timeouts and retention -------------------------------------------------


def tick(state: State, budget: int, command: Tick, context: Context) -> int:
    """Tick step: time out running workflows, purge old finished ones."""
    savepoint = context.savepoint
    found = table(state)
    done = 0
    while done < budget and found.timeouts and found.timeouts[0][0] <= state.now_ms:
        entry = heapq.heappop(found.timeouts)
        _undo_pop(state, savepoint, found.timeouts, entry)
        workflow = found.workflows.get(entry[2])
        if workflow is None or workflow.status != RUNNING or workflow.timeout_at_ms != entry[0]:
            continue
        _keep_undo(state, savepoint, workflow)
        _stop(state, savepoint, workflow, TIMED_OUT, "timed_out")
        _advance(state, savepoint, workflow)
        done += 1
    while done < budget and found.retention:
        entry = found.retention[0]
        if entry[0] + state.retention_ms > state.now_ms:
            break
        heapq.heappop(found.retention)
        _undo_pop(state, savepoint, found.retention, entry)
        workflow = found.workflows.get(entry[2])
        if workflow is None or not workflow.is_final or workflow.updated_at_ms != entry[0]:
            continue
        _purge(state, savepoint, found, workflow)
        done += 1
    return done


def _undo_pop(
    state: State,
    savepoint: Savepoint,
    heap: list[tuple[int, int, str]],
    entry: tuple[int, int, str],
) -> None:
    savepoint.on_rollback(lambda: heapq.heappush(heap, entry))


def _purge(state: State, savepoint: Savepoint, found: WorkflowTable, workflow: Workflow) -> None:
    before = dict(found.workflows)
    del found.workflows[workflow.id]
    key = workflow.idempotency_key
    if key is not None and found.keys.get((workflow.tenant, key)) == workflow.id:
        del found.keys[workflow.tenant, key]
    savepoint.on_rollback(lambda: _unpurge(found, before, workflow))


def _unpurge(found: WorkflowTable, before: dict[str, Workflow], workflow: Workflow) -> None:
    found.workflows.clear()
    found.workflows.update(before)
    if workflow.idempotency_key is not None:
        found.keys[workflow.tenant, workflow.idempotency_key] = workflow.id


def next_due_ms(state: State) -> int | None:
    found = table(state)
    candidates: list[int] = []
    while found.timeouts:
        due_ms, _, workflow_id = found.timeouts[0]
        workflow = found.workflows.get(workflow_id)
        if workflow is not None and workflow.status == RUNNING and workflow.timeout_at_ms == due_ms:
            candidates.append(due_ms)
            break
        heapq.heappop(found.timeouts)
    while found.retention:
        updated_ms, _, workflow_id = found.retention[0]
        workflow = found.workflows.get(workflow_id)
        if workflow is not None and workflow.is_final and workflow.updated_at_ms == updated_ms:
            candidates.append(updated_ms + state.retention_ms)
            break
        heapq.heappop(found.retention)
    return min(candidates) if candidates else None
