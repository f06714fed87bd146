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

A section added after a release can be optional: left out of the
encoding while `at_default(state)`, and absent on decode meaning its default.
A state that never uses it then keeps exactly the bytes (and the digest) the
earlier release gave it, and that release can still read it.
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
    # Whether the section is as `create()` makes it; given, the section is
    # optional: left out of the encoding then (see the module docstring).
    at_default: Callable[[State], bool] | None = None

    @property
    def optional(self) -> bool:
        return self.at_default is not None

    def omitted(self, state: State) -> bool:
        """Whether `encode_state` leaves the section out of `state`'s encoding."""
        return self.at_default is not None and self.at_default(state)
