"""The "steps" codec field kind: a workflow's StepSpecs as plain msgpack data."""

from __future__ import annotations

from typing import Any, Final

from raftsched.core.kernel.codec import CodecError, decode_field, decode_spec, expect, spec_row
from raftsched.core.kernel.feature import FieldKind
from raftsched.core.workflows.commands import StepSpec


def step_row(step: StepSpec) -> list[Any]:
    compensation = None if step.compensation is None else spec_row(step.compensation)
    return [step.name, spec_row(step.job), list(step.depends_on), compensation]


def _step_rows(steps: tuple[StepSpec, ...]) -> list[list[Any]]:
    return [step_row(step) for step in steps]


def _decode_steps(value: object) -> tuple[StepSpec, ...]:
    if type(value) is not tuple:
        raise CodecError("steps must be an array")
    return tuple(_decode_step(row) for row in value)


def _decode_step(row: object) -> StepSpec:
    if type(row) is not tuple or len(row) != 4:
        raise CodecError("a workflow step is [name, spec, depends_on, compensation]")
    name, spec, depends_on, compensation = row
    expect(name, "str")
    return StepSpec(
        name,
        decode_spec(spec),
        decode_field(depends_on, "strs"),
        None if compensation is None else decode_spec(compensation),
    )


STEPS_FIELD: Final = FieldKind("steps", _step_rows, _decode_steps, holds_specs=True)
