"""Workflow records, their statuses, the `workflows` section and its encoding.

A workflow is a DAG of steps; each step becomes one job when its last
dependency succeeds. Statuses (the tables below are the rules, and
docs/workflows.md draws them):

- workflow: `running` -> `succeeded`, or `running` -> `compensating` ->
  `failed | cancelled | timed_out`. `compensating` covers both waiting for
  steps that are still leased (they were asked to cancel) and running the
  compensations; `outcome` holds the final status it is heading for.
- step: `waiting` (dependencies not done) -> `active` (its job exists and is
  not final) -> `succeeded | failed | cancelled`; or `waiting` -> `skipped`
  (never started because the workflow stopped or a dependency failed).
- compensation of a succeeded step: None (nothing to undo) or `pending` ->
  `active` -> `succeeded | failed | cancelled`.

Step job ids derive from the workflow id and the step's position
(`job_<base>_s<i>`, compensations `job_<base>_c<i>`), so that the core never
draws an identifier of its own and a repeated proposal creates nothing twice.

A workflow submitted inside a trace keeps the W3C trace context in its
record (`trace`, cluster version 8), encoded only when it has one, and
hands it to every job it creates, whose record in the traces section
(`jobs.trace_book`) gives it to their leases; it goes when the workflow
is purged.
"""

from __future__ import annotations

import heapq
from typing import Any, Final

from raftsched.core.jobs.trace_book import TraceContext
from raftsched.core.kernel.codec import decode_spec, spec_row
from raftsched.core.kernel.commands import JobSpec
from raftsched.core.kernel.model import next_status
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State

WORKFLOWS: Final = "workflows"

RUNNING: Final = "running"
COMPENSATING: Final = "compensating"
SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
TIMED_OUT: Final = "timed_out"
WORKFLOW_STATUSES: Final = (RUNNING, COMPENSATING, SUCCEEDED, FAILED, CANCELLED, TIMED_OUT)
FINAL_WORKFLOW_STATUSES: Final = frozenset({SUCCEEDED, FAILED, CANCELLED, TIMED_OUT})

WAITING: Final = "waiting"
ACTIVE: Final = "active"
SKIPPED: Final = "skipped"
PENDING: Final = "pending"
STEP_STATUSES: Final = (WAITING, ACTIVE, SUCCEEDED, FAILED, CANCELLED, SKIPPED)
UNSUCCESSFUL_STEP: Final = frozenset({FAILED, CANCELLED, SKIPPED})

# Events: what happened to a workflow, a step or a compensation. Each table
# maps (status, event) to the new status, as `model.TRANSITIONS` does for
# jobs; a pair a table lacks is a bug (`kernel.model.ImpossibleTransition`).
SUBMIT: Final = "submit"  # creates the workflow and its steps; not a table row
START: Final = "start"
SKIP: Final = "skip"
PLAN: Final = "plan"
STOP: Final = "stop"
SUCCEED: Final = "succeed"
FAIL: Final = "fail"
CANCEL: Final = "cancel"
TIME_OUT: Final = "time_out"
EVENTS: Final = (SUBMIT, PLAN, START, SKIP, STOP, SUCCEED, FAIL, CANCEL, TIME_OUT)

INITIAL_WORKFLOW_STATUS: Final = RUNNING
WORKFLOW_TRANSITIONS: Final[dict[tuple[str, str], str]] = {
    (RUNNING, SUCCEED): SUCCEEDED,
    # Failure, cancel and timeout all stop first; `outcome` says which.
    (RUNNING, STOP): COMPENSATING,
    (COMPENSATING, FAIL): FAILED,
    (COMPENSATING, CANCEL): CANCELLED,
    (COMPENSATING, TIME_OUT): TIMED_OUT,
}
OUTCOME_EVENTS: Final = {FAILED: FAIL, CANCELLED: CANCEL, TIMED_OUT: TIME_OUT}
"""A stopped workflow's `outcome` -> the event that ends its compensating."""

INITIAL_STEP_STATUS: Final = WAITING
STEP_TRANSITIONS: Final[dict[tuple[str, str], str]] = {
    (WAITING, START): ACTIVE,
    (WAITING, SKIP): SKIPPED,
    (ACTIVE, SUCCEED): SUCCEEDED,
    (ACTIVE, FAIL): FAILED,
    (ACTIVE, CANCEL): CANCELLED,
}
FINAL_STEP_STATUSES: Final = frozenset({SUCCEEDED}) | UNSUCCESSFUL_STEP

COMPENSATION_STATUSES: Final = (PENDING, ACTIVE, SUCCEEDED, FAILED, CANCELLED)
COMPENSATION_TRANSITIONS: Final[dict[tuple[str | None, str], str]] = {
    # None: the workflow has not stopped, or the step has nothing to undo.
    (None, PLAN): PENDING,
    (PENDING, START): ACTIVE,
    (ACTIVE, SUCCEED): SUCCEEDED,
    (ACTIVE, FAIL): FAILED,
    (ACTIVE, CANCEL): CANCELLED,
}
FINAL_COMPENSATION_STATUSES: Final = frozenset({SUCCEEDED, FAILED, CANCELLED})

FAIL_FAST: Final = "fail_fast"
CONTINUE: Final = "continue"
FAILURE_POLICIES: Final = frozenset({FAIL_FAST, CONTINUE})

WorkflowHistory = tuple[int, str, str | None]
"""(at_ms, event, detail)."""


def transition_workflow(workflow: Workflow, event: str) -> None:
    workflow.status = next_status(WORKFLOW_TRANSITIONS, workflow.status, event, "workflow")


def transition_step(step: Step, event: str) -> None:
    step.status = next_status(STEP_TRANSITIONS, step.status, event, "step")


def transition_compensation(step: Step, event: str) -> None:
    step.comp_status = next_status(
        COMPENSATION_TRANSITIONS, step.comp_status, event, "compensation"
    )


def step_job_id(workflow_id: str, index: int, compensation: bool = False) -> str:
    base = workflow_id[3:] if workflow_id.startswith("wf_") else workflow_id
    return f"job_{base}_{'c' if compensation else 's'}{index}"


class Step:
    __slots__ = (
        "name",
        "spec",
        "deps",
        "compensation",
        "status",
        "job_id",
        "result",
        "comp_status",
        "comp_job_id",
        "comp_result",
    )

    def __init__(
        self,
        name: str,
        spec: JobSpec,
        deps: tuple[int, ...],
        compensation: JobSpec | None,
        status: str = INITIAL_STEP_STATUS,
        job_id: str | None = None,
        result: bytes | None = None,
        comp_status: str | None = None,
        comp_job_id: str | None = None,
        comp_result: bytes | None = None,
    ) -> None:
        self.name = name
        self.spec = spec
        self.deps = deps  # indexes of the steps this one waits for
        self.compensation = compensation
        self.status = status
        self.job_id = job_id
        self.result = result
        self.comp_status = comp_status
        self.comp_job_id = comp_job_id
        self.comp_result = comp_result

    def copy(self) -> Step:
        return Step(*(getattr(self, name) for name in Step.__slots__))


class Workflow:
    __slots__ = (
        "id",
        "seq",
        "tenant",
        "idempotency_key",
        "fingerprint",
        "on_failure",
        "compensate_on_cancel",
        "timeout_at_ms",
        "created_at_ms",
        "updated_at_ms",
        "status",
        "outcome",
        "reason",
        "completed",
        "compensations",
        "steps",
        "history",
        # The W3C (traceparent, tracestate) the submission carried, or None
        # (cluster version 8): every job the workflow creates keeps it.
        "trace",
        # Not encoded: true only while this workflow is being advanced.
        "advancing",
    )

    def __init__(
        self,
        id: str,
        seq: int,
        tenant: str,
        idempotency_key: str | None,
        fingerprint: bytes,
        on_failure: str,
        compensate_on_cancel: bool,
        timeout_at_ms: int | None,
        created_at_ms: int,
        updated_at_ms: int,
        status: str,
        outcome: str | None,
        reason: str | None,
        completed: list[int],
        compensations: list[int] | None,
        steps: list[Step],
        history: list[WorkflowHistory],
        trace: TraceContext | None = None,
    ) -> None:
        self.id = id
        self.seq = seq
        self.tenant = tenant
        self.idempotency_key = idempotency_key
        self.fingerprint = fingerprint
        self.on_failure = on_failure
        self.compensate_on_cancel = compensate_on_cancel
        self.timeout_at_ms = timeout_at_ms
        self.created_at_ms = created_at_ms
        self.updated_at_ms = updated_at_ms
        self.status = status
        self.outcome = outcome  # the final status a compensating workflow heads for
        self.reason = reason
        self.completed = completed  # step indexes in the order they succeeded
        # Step indexes to compensate, in order; None until the plan is made.
        self.compensations = compensations
        self.steps = steps
        self.history = history
        self.trace = trace
        self.advancing = False

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_WORKFLOW_STATUSES

    def step_named(self, name: str | None) -> Step | None:
        for step in self.steps:
            if step.name == name:
                return step
        return None

    def copy(self) -> Workflow:
        return Workflow(
            self.id,
            self.seq,
            self.tenant,
            self.idempotency_key,
            self.fingerprint,
            self.on_failure,
            self.compensate_on_cancel,
            self.timeout_at_ms,
            self.created_at_ms,
            self.updated_at_ms,
            self.status,
            self.outcome,
            self.reason,
            list(self.completed),
            None if self.compensations is None else list(self.compensations),
            [step.copy() for step in self.steps],
            list(self.history),
            self.trace,
        )


class WorkflowTable:
    """The section object. `keys`, `timeouts` and `retention` are derived."""

    __slots__ = ("workflows", "next_seq", "keys", "timeouts", "retention")

    def __init__(self) -> None:
        self.workflows: dict[str, Workflow] = {}
        self.next_seq = 1
        self.keys: dict[tuple[str, str], str] = {}
        # (timeout_at_ms, seq, id) of running workflows, lazily deleted.
        self.timeouts: list[tuple[int, int, str]] = []
        # (updated_at_ms, seq, id) of finished workflows, lazily deleted.
        self.retention: list[tuple[int, int, str]] = []

    def index(self, workflow: Workflow) -> None:
        if workflow.idempotency_key is not None:
            self.keys[workflow.tenant, workflow.idempotency_key] = workflow.id
        if workflow.timeout_at_ms is not None and not workflow.is_final:
            heapq.heappush(self.timeouts, (workflow.timeout_at_ms, workflow.seq, workflow.id))
        if workflow.is_final:
            heapq.heappush(self.retention, (workflow.updated_at_ms, workflow.seq, workflow.id))


def table(state: State) -> WorkflowTable:
    found: WorkflowTable = state.sections[WORKFLOWS]
    return found


# -- encoding -------------------------------------------------------------------


def _step_row(step: Step) -> list[Any]:
    compensation = None if step.compensation is None else spec_row(step.compensation)
    return [
        step.name,
        spec_row(step.spec),
        list(step.deps),
        compensation,
        step.status,
        step.job_id,
        step.result,
        step.comp_status,
        step.comp_job_id,
        step.comp_result,
    ]


def _workflow_row(workflow: Workflow) -> list[Any]:
    """17 fields; 19 with the trace context (cluster version 8), so that a
    workflow without one encodes as release 0.7.0's did."""
    row = [
        workflow.id,
        workflow.seq,
        workflow.tenant,
        workflow.idempotency_key,
        workflow.fingerprint,
        workflow.on_failure,
        workflow.compensate_on_cancel,
        workflow.timeout_at_ms,
        workflow.created_at_ms,
        workflow.updated_at_ms,
        workflow.status,
        workflow.outcome,
        workflow.reason,
        workflow.completed,
        workflow.compensations,
        [_step_row(step) for step in workflow.steps],
        [list(record) for record in workflow.history],
    ]
    if workflow.trace is not None:
        row += workflow.trace  # traceparent, tracestate
    return row


def _encode(state: State) -> Any:
    found = table(state)
    return [found.next_seq, [_workflow_row(wf) for wf in found.workflows.values()]]


def _decode_step(row: Any) -> Step:
    name, spec, deps, compensation, *rest = row
    return Step(
        name,
        decode_spec(spec),
        tuple(deps),
        None if compensation is None else decode_spec(compensation),
        *rest,
    )


_TRACED_ROW: Final = 19
"""A workflow row with its trace context (`_workflow_row`)."""


def _decode(state: State, data: Any) -> None:
    next_seq, rows = data
    found = WorkflowTable()
    found.next_seq = next_seq
    for row in rows:
        trace: TraceContext | None = None
        if len(row) == _TRACED_ROW:
            *row, traceparent, tracestate = row
            trace = (traceparent, tracestate)
        *head, completed, compensations, steps, history = row
        fields: list[Any] = [
            *head,
            list(completed),
            None if compensations is None else list(compensations),
            [_decode_step(step) for step in steps],
            [tuple(record) for record in history],
            trace,
        ]
        workflow = Workflow(*fields)
        found.workflows[workflow.id] = workflow
        found.index(workflow)
    state.sections[WORKFLOWS] = found


SECTION: Final = Section(WORKFLOWS, WorkflowTable, _encode, _decode)
