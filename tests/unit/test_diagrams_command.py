"""`python -m raftsched.diagrams` redraws stale pages, and `--check` only tells."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftsched.core.diagrams import block
from raftsched.diagrams import main

STALE = "# Page\n\n<!-- diagram:workflow begin -->\nold\n<!-- diagram:workflow end -->\n"


def test_check_reports_a_stale_page_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "page.md"
    page.write_text(STALE, encoding="utf-8")
    assert main(["--check", str(tmp_path)]) == 1
    assert page.read_text(encoding="utf-8") == STALE
    assert "would redraw" in capsys.readouterr().err


def test_a_redrawn_page_then_passes_the_check(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(STALE, encoding="utf-8")
    (tmp_path / "other.md").write_text("untouched\n", encoding="utf-8")
    assert main([str(tmp_path)]) == 0
    assert page.read_text(encoding="utf-8") == f"# Page\n\n{block('workflow')}\n"
    assert (tmp_path / "other.md").read_text(encoding="utf-8") == "untouched\n"
    assert main(["--check", str(tmp_path)]) == 0


def test_a_missing_docs_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path / "missing")])
    assert exited.value.code == 2
