"""`python -m raftsched.diagrams [--check] [DOCS]` (`make diagrams`): redraw
the state diagrams in the docs pages from the core's transition tables.

Every page `DOCS/*.md` (default `docs`) is rewritten where its marked
drawings differ from what `raftsched.core.diagrams` draws; the rest of the
page is left as it is. With `--check` nothing is written, and the exit status
is 1 when a page would change.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from raftsched.core.diagrams import update


def redraw(docs: Path, check: bool) -> list[Path]:
    """The pages whose drawings were (or, with `check`, would be) redrawn."""
    changed: list[Path] = []
    for page in sorted(docs.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        redrawn = update(text)
        if redrawn != text:
            changed.append(page)
            if not check:
                page.write_text(redrawn, encoding="utf-8")
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raftsched.diagrams", description=__doc__)
    parser.add_argument("docs", nargs="?", default="docs", type=Path, help="the docs directory")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    if not args.docs.is_dir():
        parser.error(f"{args.docs} is not a directory")
    changed = redraw(args.docs, args.check)
    verb = "would redraw" if args.check else "redrew"
    for page in changed:
        print(f"{verb} {page}", file=sys.stderr)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
