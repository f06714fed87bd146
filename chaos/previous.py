"""The previous release, for the mixed-version phase: `git archive` of its
tag (or the commit it names, for a clone without tags) installed into a
virtualenv of its own, as an operator's old machines would have it
(tests/e2e/test_rolling_upgrade_gated.py does the same). Built once and kept
under runs/chaos/.previous/<commit>/ (about 20 s the first time)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from chaos.cluster import REPO_ROOT

TAG: Final = "v0.10.0"
COMMIT: Final = "8d73ec9ec7c7ab535abdb71551e55c3ca80317f0"
CACHE: Final = REPO_ROOT / "runs" / "chaos" / ".previous"
RELAY_EXTRA: Final = "redis"  # chaos/broker.py's redis-server


@dataclass(frozen=True)
class Release:
    version: str  # "0.5.0"
    python: str  # its virtualenv's interpreter
    source_dir: Path  # its src/ (first on the node's PYTHONPATH)


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, check=False)


def previous_release() -> Release:
    tagged = _git("rev-parse", "--verify", "--quiet", f"{TAG}^{{commit}}")
    commit = tagged.stdout.decode().strip() if tagged.returncode == 0 else COMMIT
    if commit != COMMIT:
        raise RuntimeError(f"{TAG} names {commit}, not {COMMIT}")
    root = CACHE / commit
    python = root / "venv" / "bin" / "python"
    tree = root / "tree"
    done = root / "installed"
    stamp = f"{commit} [{RELAY_EXTRA}]\n"  # an install without the extra is redone
    if not done.exists() or done.read_text() != stamp:
        shutil.rmtree(root, ignore_errors=True)
        tree.mkdir(parents=True)
        archive = _git("archive", commit)
        if archive.returncode != 0:
            raise RuntimeError(f"git archive {commit}: {archive.stderr.decode()[-500:]}")
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120)
        # With the extra of the campaign's broker relay, as an operator who
        # runs one installs it (a node without it cannot lead the relay).
        installed = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             f"{tree}[{RELAY_EXTRA}]"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if installed.returncode != 0:
            raise RuntimeError(f"installing {TAG} failed: {installed.stderr[-2000:]}")
        done.write_text(stamp)
    return Release(TAG.removeprefix("v"), str(python), tree / "src")
