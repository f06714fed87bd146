"""docs/testing-handlers.md's examples are tests that pass.

Every ```python block of the page runs, in order, in one namespace (as one
test module would); then each `test_` function the blocks define is a test
here. A page whose examples stop working, or that loses them, fails.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "testing-handlers.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
# The page's tests, as written: a test added to the page must show up here too.
EXPECTED_TESTS_MIN = 7


def _blocks() -> list[str]:
    return PYTHON_BLOCK.findall(PAGE.read_text(encoding="utf-8"))


def _page_module() -> types.ModuleType:
    """The page's blocks as one module (a real module, so that dataclasses,
    annotations and pickling find it in sys.modules)."""
    module = types.ModuleType("docs_testing_handlers")
    sys.modules[module.__name__] = module
    for number, block in enumerate(_blocks(), start=1):
        code = compile(block, f"{PAGE.name} (python block {number})", "exec")
        exec(code, module.__dict__)
    return module


PAGE_MODULE = _page_module()
PAGE_TESTS: dict[str, Callable[[], Any]] = {
    name: value
    for name, value in vars(PAGE_MODULE).items()
    if name.startswith("test_") and callable(value)
}


def test_the_page_has_its_examples() -> None:
    assert len(_blocks()) >= 5
    assert len(PAGE_TESTS) >= EXPECTED_TESTS_MIN, sorted(PAGE_TESTS)


@pytest.mark.parametrize("name", sorted(PAGE_TESTS))
def test_page_example(name: str) -> None:
    PAGE_TESTS[name]()
