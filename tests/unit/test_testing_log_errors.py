"""The node-log gate that tests and the chaos campaign apply (`raftsched.testing`)."""

from __future__ import annotations

import json
from pathlib import Path

from raftsched.testing import ExpectedLogError, log_errors, read_log_errors


def line(level: str, logger: str, msg: str, exc: str | None = None) -> str:
    entry = {"ts": "2026-12-02T00:00:00.000Z", "level": level, "logger": logger, "msg": msg}
    if exc is not None:
        entry["exc"] = exc
    return json.dumps(entry)


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "n1.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_error_and_critical_json_lines_count_and_other_levels_do_not(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        line("info", "raftsched.node", "started"),
        line("warning", "pysyncobj.tcp", "reconnecting"),
        line("error", "pysyncobj.syncobj", "failed _onTick in _autoTickThread", "Trace\nEOFError"),
        line("critical", "pysyncobj.syncobj", "truncating already-applied log entries"),
    )
    errors = read_log_errors(path)
    assert [(error.line_number, error.text) for error in errors] == [
        (3, "pysyncobj.syncobj: failed _onTick in _autoTickThread\nTrace\nEOFError"),
        (4, "pysyncobj.syncobj: truncating already-applied log entries"),
    ]
    assert errors[0].describe() == (
        f"{path}:3: pysyncobj.syncobj: failed _onTick in _autoTickThread ... EOFError"
    )


def test_a_traceback_written_around_logging_counts_up_to_its_exception_line(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        line("info", "raftsched.node", "started"),
        "Exception in thread tick:",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in f',
        "ValueError: first",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "y.py", line 2, in g',
        "RuntimeError: second",
        line("info", "raftsched.node", "stopped"),
    )
    errors = read_log_errors(path)
    assert [error.line_number for error in errors] == [2]
    assert errors[0].text.splitlines()[-1] == "RuntimeError: second"
    assert errors[0].describe().endswith("Exception in thread tick: ... RuntimeError: second")


def test_expected_lines_are_left_out_and_a_line_cut_by_a_kill_still_counts(
    tmp_path: Path,
) -> None:
    cut = line("error", "raftsched.raft", "snapshot child failed")[:60]
    path = write(
        tmp_path,
        line("error", "raftsched.raft", "state machine raised applying entry 7"),
        cut + line("info", "raftsched.node", "started"),
    )
    expected = [ExpectedLogError(r"raised applying entry \d+", reason="the test makes it raise")]
    errors = log_errors(path, expected)
    assert [error.line_number for error in errors] == [2]
    assert log_errors(tmp_path / "absent.log") == []
