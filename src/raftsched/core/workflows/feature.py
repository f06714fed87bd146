"""The workflows feature: multi-step jobs with dependencies and compensations."""

from __future__ import annotations

from typing import Final

from raftsched.core.kernel.cluster_version import SPEC_TRACE_VERSION
from raftsched.core.kernel.feature import CommandKind, Feature, JobFinishedHook, TickWork
from raftsched.core.workflows import audit, handlers, invariants, model
from raftsched.core.workflows.codec import STEPS_FIELD
from raftsched.core.workflows.commands import CancelWorkflow, SubmitWorkflow

FEATURE: Final = Feature(
    name="workflows",
    sections=(model.SECTION,),
    # Tags 50-59.
    commands=(
        CommandKind(
            SubmitWorkflow,
            50,
            ("str", "steps", "str", "str?", "int?", "str", "bool", "str?", "str?"),
            handlers.apply_submit_workflow,
            # traceparent, tracestate: the submission's trace context.
            tail=2,
            tail_since=SPEC_TRACE_VERSION,
        ),
        CommandKind(
            CancelWorkflow,
            51,
            ("str", "str", "str"),
            handlers.apply_cancel_workflow,
            audit=audit.CANCEL,
        ),
    ),
    field_kinds=(STEPS_FIELD,),
    tick=(TickWork(60, handlers.tick),),
    next_due_ms=handlers.next_due_ms,
    check=invariants.check,
    on_job_finished=(JobFinishedHook(20, handlers.record_step_outcome),),
    lease_inputs=handlers.step_inputs,
)
