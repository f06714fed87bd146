"""The state diagrams of the docs, drawn from the transition tables.

The tables are the rules (`kernel.model.TRANSITIONS` for jobs,
`jobs.lifecycle.ON_ENTER` for what entering a job status does,
`workflows.model` for workflows, steps and compensations); the docs show
them. Each drawing sits in a docs page
between two marker comments,

    <!-- diagram:job begin ... -->
    ...
    <!-- diagram:job end -->

and `update` redraws whatever is between them. `python -m raftsched.diagrams`
(`make diagrams`) rewrites the pages, and tests/core/test_core_diagrams.py
fails when a committed page differs from what the tables draw. Diagrams are
mermaid `stateDiagram-v2` blocks, which GitHub renders.

Pure text in, text out: the file I/O is in `raftsched.diagrams`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Final

from raftsched.core.jobs.lifecycle import ON_ENTER
from raftsched.core.kernel import model
from raftsched.core.workflows import model as workflows_model

_START: Final = "[*]"  # mermaid's start and end pseudo-state

Table = Mapping[tuple[str | None, str], str]
"""(status, event) -> new status; a None status: the record has none yet."""


def _table(table: Mapping[tuple[str, str], str] | Table) -> Table:
    return {key: to_status for key, to_status in table.items()}


@dataclass(frozen=True, slots=True)
class Machine:
    """One transition table and what a drawing needs to know besides."""

    source: str  # where the rules live, named in the drawing's marker
    statuses: tuple[str, ...]  # in drawing order
    events: tuple[str, ...]  # in label order
    table: Table
    created_in: Mapping[str, str]  # status a record is created in -> by what
    final: frozenset[str]  # drawn with an edge to the end


JOB: Final = Machine(
    "kernel.model.TRANSITIONS",
    model.JOB_STATUSES,
    model.JOB_EVENTS,
    _table(model.TRANSITIONS),
    dict.fromkeys(model.INITIAL_STATUSES, model.SUBMIT),
    model.FINAL_STATUSES,
)
WORKFLOW: Final = Machine(
    "workflows.model.WORKFLOW_TRANSITIONS",
    workflows_model.WORKFLOW_STATUSES,
    workflows_model.EVENTS,
    _table(workflows_model.WORKFLOW_TRANSITIONS),
    {workflows_model.INITIAL_WORKFLOW_STATUS: workflows_model.SUBMIT},
    workflows_model.FINAL_WORKFLOW_STATUSES,
)
STEP: Final = Machine(
    "workflows.model.STEP_TRANSITIONS",
    workflows_model.STEP_STATUSES,
    workflows_model.EVENTS,
    _table(workflows_model.STEP_TRANSITIONS),
    {workflows_model.INITIAL_STEP_STATUS: workflows_model.SUBMIT},
    workflows_model.FINAL_STEP_STATUSES,
)
COMPENSATION: Final = Machine(
    "workflows.model.COMPENSATION_TRANSITIONS",
    workflows_model.COMPENSATION_STATUSES,
    workflows_model.EVENTS,
    _table(workflows_model.COMPENSATION_TRANSITIONS),
    {},  # created by the table's own row from None
    workflows_model.FINAL_COMPENSATION_STATUSES,
)

MACHINES: Final = {"job": JOB, "workflow": WORKFLOW, "step": STEP, "compensation": COMPENSATION}


def state_diagram(machine: Machine) -> str:
    """A mermaid `stateDiagram-v2`: one edge per (from, to) pair, labelled
    with every event that makes that move, in the machine's event order."""
    order = {status: index for index, status in enumerate(machine.statuses)}
    events = {event: index for index, event in enumerate(machine.events)}
    edges: dict[tuple[str, str], list[str]] = {}
    for status, label in machine.created_in.items():
        edges[_START, status] = [label]
    for (from_status, event), to_status in machine.table.items():
        source = _START if from_status is None else from_status
        edges.setdefault((source, to_status), []).append(event)

    def position(edge: tuple[str, str]) -> tuple[int, int]:
        return (-1 if edge[0] == _START else order[edge[0]], order[edge[1]])

    lines = ["```mermaid", "stateDiagram-v2"]
    for edge in sorted(edges, key=position):
        labels = sorted(edges[edge], key=lambda event: events.get(event, -1))
        lines.append(f"    {edge[0]} --> {edge[1]} : {', '.join(labels)}")
    for status in machine.statuses:
        if status in machine.final:
            lines.append(f"    {status} --> {_START}")
    lines.append("```")
    return "\n".join(lines)


def entry_table() -> str:
    """What `transition` calls on entering each job status (`ON_ENTER`),
    by name: what those functions do is the prose's job, and their docstrings'."""
    lines = ["| entering | `transition` then calls |", "|---|---|"]
    for status in model.JOB_STATUSES:
        lines.append(f"| `{status}` | `{ON_ENTER[status].__name__}` |")
    return "\n".join(lines)


DRAWINGS: Final[dict[str, tuple[str, Callable[[], str]]]] = {
    **{name: (each.source, partial(state_diagram, each)) for name, each in MACHINES.items()},
    "job-entry": ("jobs.lifecycle.ON_ENTER", entry_table),
}
"""Marker name -> (the rules it is drawn from, how to draw it)."""

_BLOCK: Final = re.compile(
    r"^<!-- diagram:(?P<name>[a-z-]+) begin\b[^\n]*-->\n.*?^<!-- diagram:(?P=name) end -->$",
    re.MULTILINE | re.DOTALL,
)


def block(name: str) -> str:
    """One drawing with its markers."""
    found = DRAWINGS.get(name)
    if found is None:
        raise ValueError(f"no diagram named {name!r}; known: {', '.join(DRAWINGS)}")
    source, draw = found
    return (
        f"<!-- diagram:{name} begin: drawn from {source} by `make diagrams`; do not edit -->\n"
        f"{draw()}\n"
        f"<!-- diagram:{name} end -->"
    )


def update(text: str) -> str:
    """`text` with every marked drawing redrawn from the tables."""
    return _BLOCK.sub(lambda match: block(match["name"]), text)


def names_in(text: str) -> list[str]:
    """The drawings `text` marks, in order."""
    return [match["name"] for match in _BLOCK.finditer(text)]
