"""Test ids for parameters whose `repr` holds an address (`<object object at
0x7f...>`): the address differs between processes, and pytest-xdist's
workers must collect the same ids."""

from __future__ import annotations

import re
from typing import Any

_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def stable_id(value: Any, width: int = 40) -> str:
    """`repr(value)` without memory addresses, cut to `width` characters."""
    return _ADDRESS.sub("", repr(value))[:width]
