"""The commands of workflows."""

from __future__ import annotations

from dataclasses import dataclass

from raftsched.core.kernel.commands import Command, JobSpec


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One workflow step: its job, the steps it waits for, and an optional
    compensating job that undoes it when the workflow fails."""

    name: str
    job: JobSpec
    depends_on: tuple[str, ...] = ()
    compensation: JobSpec | None = None


@dataclass(frozen=True, slots=True)
class SubmitWorkflow(Command):
    """Start a workflow. Step job ids derive from `workflow_id` inside the core.

    `on_failure` is `fail_fast` (stop at the first failed step) or `continue`
    (steps that do not depend on a failed step still run).
    """

    workflow_id: str
    steps: tuple[StepSpec, ...]
    tenant: str = "default"
    idempotency_key: str | None = None
    timeout_ms: int | None = None
    on_failure: str = "fail_fast"
    compensate_on_cancel: bool = True
    # Since cluster version 8: the W3C trace context the submission carried
    # (its `traceparent` and `tracestate` headers), kept with the workflow
    # and given to every job it creates (a step's own wins), so that the
    # workers' attempts of all its steps join the submitter's trace. Not
    # part of the request's identity; encoded only when set (the kind's
    # `tail`), so a workflow without them encodes as release 0.7.0's did.
    traceparent: str | None = None
    tracestate: str | None = None


@dataclass(frozen=True, slots=True)
class CancelWorkflow(Command):
    workflow_id: str
    reason: str = ""
    actor: str = "api"


# -- Flow control: queues and tenants (issue 7) ----------------------------------
