"""The docs draw the transition tables as they are, and the drawings say
everything the tables do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raftsched.core import diagrams
from raftsched.core.diagrams import MACHINES, block, names_in, state_diagram, update

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted(DOCS.glob("*.md"))
EDGE = re.compile(r"^    (\S+) --> (\S+)(?: : (.+))?$", re.MULTILINE)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_the_committed_diagrams_are_what_the_tables_draw(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert update(text) == text, f"run `make diagrams`: {page.name} is stale"


def test_every_diagram_is_in_the_docs_once() -> None:
    found = [name for page in PAGES for name in names_in(page.read_text(encoding="utf-8"))]
    assert sorted(found) == sorted(diagrams.DRAWINGS)


@pytest.mark.parametrize("name", list(MACHINES))
def test_a_diagram_has_one_labelled_edge_per_row_and_nothing_else(name: str) -> None:
    machine = MACHINES[name]
    drawn: set[tuple[str | None, str, str]] = set()
    for source, target, labels in EDGE.findall(state_diagram(machine)):
        if target == "[*]":
            assert source in machine.final and not labels
            continue
        for event in labels.split(", "):
            drawn.add((None if source == "[*]" else source, event, target))
    rows = {(status, event, target) for (status, event), target in machine.table.items()}
    created = {(None, event, status) for status, event in machine.created_in.items()}
    assert drawn == rows | created


@pytest.mark.parametrize("name", list(MACHINES))
def test_every_status_is_reachable_and_only_final_ones_are_dead_ends(name: str) -> None:
    machine = MACHINES[name]
    reached = set(machine.created_in) | set(machine.table.values())
    assert reached == set(machine.statuses)
    leaving = {status for status, _event in machine.table}
    for status in machine.statuses:
        assert status in leaving or status in machine.final, status
    assert {event for _status, event in machine.table} <= set(machine.events)


def test_update_redraws_only_between_the_markers() -> None:
    stale = "intro\n<!-- diagram:step begin -->\nhand-drawn\n<!-- diagram:step end -->\nrest\n"
    assert update(stale) == f"intro\n{block('step')}\nrest\n"
    assert update(update(stale)) == update(stale)
    assert update("no markers\n") == "no markers\n"


def test_an_unknown_diagram_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="no diagram named 'nope'"):
        update("<!-- diagram:nope begin -->\n<!-- diagram:nope end -->\n")
