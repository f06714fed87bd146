"""Shared by the end-to-end tests and their fixtures."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def cluster_env() -> dict[str, str]:
    """Environment for node and worker processes: tests' handler modules importable."""
    paths = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}
