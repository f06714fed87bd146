"""The docs point at things that exist.

Pages move and sections are renamed (the benchmark runs were gathered into
docs/benchmarks.md, for one); a link left behind fails silently for the
reader. Every relative Markdown link in the pages below must name a file of
the repository, a `#fragment` must name a heading of the page it points at
(GitHub's anchors), and every `make X` command must be a target of the
Makefile.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [*ROOT.joinpath("docs").glob("*.md"), ROOT / "README.md", ROOT / "cluster" / "README.md"]
)

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
MAKE = re.compile(r"(?:^|`)make ([a-z][a-z-]*)", re.MULTILINE)  # commands, not prose
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {_anchor(heading) for heading in HEADING.findall(text)}


def _targets() -> set[str]:
    makefile = ROOT.joinpath("Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-z][a-z-]*):", makefile, re.MULTILINE))


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_links_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in _anchors(linked):
            broken.append(f"{target}: no such heading")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_make_targets_exist(page: Path) -> None:
    named = set(MAKE.findall(page.read_text(encoding="utf-8")))
    assert named <= _targets(), sorted(named - _targets())
