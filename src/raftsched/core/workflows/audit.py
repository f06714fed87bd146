"""How a workflow cancel appears in the audit trail (`kernel.audit`)."""

from __future__ import annotations

from typing import Final

from raftsched.core.kernel.feature import Audit, AuditSubject
from raftsched.core.kernel.state import State
from raftsched.core.workflows.commands import CancelWorkflow
from raftsched.core.workflows.model import table


def _cancel(state: State, command: CancelWorkflow) -> AuditSubject:
    workflow_id = command.workflow_id
    workflow = table(state).workflows.get(workflow_id) if type(workflow_id) is str else None
    tenant = None if workflow is None else workflow.tenant
    return AuditSubject(workflow_id, tenant, command.reason or None)


CANCEL: Final = Audit("workflow.cancel", _cancel)
