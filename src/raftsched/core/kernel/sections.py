"""State sections: replicated data that lives beside the jobs.

Schedules, workflows, the outbox and flow-control settings each keep their
records in a section of their own. A section is one object in
`State.sections[name]`, encoded after the jobs as `[name, data]` pairs in
the order of their names (never import order, which a formatter may change),
so the state's bytes stay deterministic, and
rebuilt by its own `decode` after the jobs exist (a section may refer to
jobs by id). A section encodes to plain msgpack data only.

Adding a section: give it a name no other section uses and list it in its
feature's record (`Feature.sections`); the registry refuses a name used twice
and orders the sections. Never rename a section: snapshots on disk name
their sections.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raftsched.core.kernel.state import State


@dataclass(frozen=True, slots=True)
class Section:
    name: str
    # A fresh, empty section object (what `new_state()` holds).
    create: Callable[[], Any]
    # The section as plain msgpack data: lists, ints, strings, bytes, None.
    encode: Callable[[State], Any]
    # Rebuild `state.sections[name]` (and any derived index) from that data.
    decode: Callable[[State, Any], None]
