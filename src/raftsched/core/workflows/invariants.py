"""Everything that must hold of the workflows section (`Feature.check`)."""

from __future__ import annotations

from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import check_trace_context
from raftsched.core.workflows.model import (
    ACTIVE,
    RUNNING,
    SUCCEEDED,
    WAITING,
    Step,
    Workflow,
    step_job_id,
    table,
)


def check(state: State) -> list[str]:
    problems: list[str] = []
    found = table(state)
    for workflow_id, workflow in found.workflows.items():
        where = f"workflow {workflow_id}"
        if workflow.advancing:
            problems.append(f"{where}: left advancing")
        timeout = (workflow.timeout_at_ms, workflow.seq, workflow.id)
        running = workflow.status == RUNNING and workflow.timeout_at_ms is not None
        if running and timeout not in found.timeouts:
            problems.append(f"{where}: timeout missing from the heap")
        for index, step in enumerate(workflow.steps):
            _check_step_record(state, workflow, index, step, problems)
        if workflow.status == SUCCEEDED and any(s.status != SUCCEEDED for s in workflow.steps):
            problems.append(f"{where}: succeeded with unsuccessful steps")
        if workflow.is_final and any(s.status in (WAITING, ACTIVE) for s in workflow.steps):
            problems.append(f"{where}: final with steps still to run")
        if len(set(workflow.completed)) != len(workflow.completed):
            problems.append(f"{where}: a step completed twice")
        trace = workflow.trace
        if trace is not None and (
            type(trace) is not tuple
            or len(trace) != 2
            or check_trace_context(trace[0], trace[1]) is not None
        ):
            problems.append(f"{where}: an invalid trace context")
    for (tenant, key), workflow_id in found.keys.items():
        keyed = found.workflows.get(workflow_id)
        if keyed is None or (keyed.tenant, keyed.idempotency_key) != (tenant, key):
            problems.append(f"workflow key {key}: points at the wrong workflow")
    return problems


def _check_step_record(
    state: State, workflow: Workflow, index: int, step: Step, problems: list[str]
) -> None:
    where = f"workflow {workflow.id} step {step.name}"
    if step.status == WAITING and step.job_id is not None:
        problems.append(f"{where}: waiting with a job")
    if step.status == ACTIVE:
        job = state.jobs.get(step.job_id or "")
        if job is None or job.is_final:
            problems.append(f"{where}: active without a live job")
        if step.job_id != step_job_id(workflow.id, index):
            problems.append(f"{where}: job id is not derived from the workflow")
    if step.comp_status == ACTIVE:
        job = state.jobs.get(step.comp_job_id or "")
        if job is None or job.is_final:
            problems.append(f"{where}: compensation active without a live job")
