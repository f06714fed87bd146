"""A node's data directory is its user's alone (raftsched.process.prepare_data_dir)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from raftsched.process import prepare_data_dir


def test_a_new_data_directory_is_made_0700_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        prepare_data_dir(tmp_path / "parent" / "n1")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "parent" / "n1").stat().st_mode) == 0o700


def test_an_existing_one_is_left_alone_with_a_warning_if_others_may_read_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with caplog.at_level(logging.WARNING, logger="raftsched.node"):
        prepare_data_dir(shared)
        prepare_data_dir(private)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    warned = [record.getMessage() for record in caplog.records]
    assert len(warned) == 1 and str(shared) in warned[0] and "chmod 700" in warned[0]
