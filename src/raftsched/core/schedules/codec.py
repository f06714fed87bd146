"""The "schedule" codec field kind: a ScheduleSpec as plain msgpack data."""

from __future__ import annotations

from typing import Any, Final

from raftsched.core.kernel.codec import CodecError, decode_field, decode_spec, spec_row
from raftsched.core.kernel.feature import FieldKind
from raftsched.core.schedules.commands import ScheduleSpec

_SCHEDULE_KINDS: Final = (
    "str", "spec", "str?", "int?", "str", "int?", "int?", "int",
    "str", "str", "int", "int", "int", "bool",
)  # fmt: skip


def schedule_row(spec: ScheduleSpec) -> list[Any]:
    """A ScheduleSpec as plain data, fields in dataclass order (job as a spec row)."""
    row: list[Any] = [getattr(spec, name) for name in ScheduleSpec.__dataclass_fields__]
    row[1] = spec_row(spec.job)
    return row


def decode_schedule(row: object) -> ScheduleSpec:
    if type(row) is not tuple or len(row) != len(_SCHEDULE_KINDS):
        raise CodecError(f"a schedule has {len(_SCHEDULE_KINDS)} fields")
    values: list[Any] = [
        decode_spec(value) if kind == "spec" else decode_field(value, kind)
        for value, kind in zip(row, _SCHEDULE_KINDS, strict=True)
    ]
    return ScheduleSpec(*values)


SCHEDULE_FIELD: Final = FieldKind("schedule", schedule_row, decode_schedule, holds_specs=True)
