"""The dashboard's vendored charting library: the files are the ones the
README names (version and sha256), they ship in the package, and the route
serves exactly them (and nothing beside them)."""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path

import pytest

from raftsched.api.dashboard import VENDOR_NAME, _static_response
from raftsched.api.errors import ApiError

ROOT = Path(__file__).resolve().parents[2]
VENDOR = ROOT / "src" / "raftsched" / "static" / "vendor"


def _table() -> dict[str, str]:
    """file -> sha256, from static/vendor/README.md."""
    rows = re.findall(
        r"^\| `([^`]+)` \|.*\| `([0-9a-f]{64})` \|$", (VENDOR / "README.md").read_text(), re.M
    )
    return dict(rows)


def test_the_vendored_files_are_the_ones_the_readme_names() -> None:
    table = _table()
    assert set(table) == {"uPlot.iife.min.js", "uPlot.min.css"}
    for name, digest in table.items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name
    head = (VENDOR / "uPlot.iife.min.js").read_text()[:80]
    assert "(v1.6.32)" in head and "1.6.32" in (VENDOR / "README.md").read_text()
    assert "MIT License" in (VENDOR / "uPlot.LICENSE").read_text()


def test_the_package_data_ships_them() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["raftsched"]
    assert "static/vendor/*" in globs


def test_the_route_serves_them_and_nothing_else() -> None:
    response = _static_response("uPlot.iife.min.js", "vendor")
    assert response.content_type == "text/javascript"
    assert response.text == (VENDOR / "uPlot.iife.min.js").read_text()
    assert _static_response("uPlot.min.css", "vendor").content_type == "text/css"
    for name in ("README.md", "uPlot.LICENSE", "..", ".hidden.js", "a..js", "missing.js"):
        with pytest.raises(ApiError) as refused:
            _static_response(name, "vendor")
        assert refused.value.code == "not_found", name
    assert VENDOR_NAME.match("uPlot.iife.min.js")
