"""Checker 8: an error-level line in a node log invalidates a campaign unless
the faults explain it (`chaos.checkers.EXPECTED_NODE_LOG_ERRORS`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import chaos_support  # noqa: F401 - puts the repository root on sys.path
from chaos.summary import render_text, summarize

from chaos import checkers
from raftsched.testing import ExpectedLogError, read_log_errors


def node_log(path: Path, *entries: tuple[str, str]) -> Path:
    lines = [
        json.dumps({"ts": "2026-12-02T00:00:00.000Z", "level": level, "logger": "x", "msg": msg})
        for level, msg in entries
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_unexpected_error_line_is_an_anomaly_and_an_expected_one_is_counted(
    tmp_path: Path,
) -> None:
    errors = {
        "n1": read_log_errors(node_log(tmp_path / "n1.log", ("info", "ok"), ("warning", "slow"))),
        "n2": read_log_errors(
            node_log(tmp_path / "n2.log", ("error", "failed _onTick"), ("error", "peer gone"))
        ),
    }
    expected = [ExpectedLogError("peer gone", reason="the nemesis kills peers")]
    check = checkers.node_logs_clean(errors, expected)
    assert check.name == "8_no_unexpected_node_log_errors"
    assert check.anomalies == 1
    assert check.examples == [{"node": "n2", "line": f"{tmp_path / 'n2.log'}:1: x: failed _onTick"}]
    seen = checkers.expected_log_errors_seen(errors, expected)
    assert seen == {"the nemesis kills peers": 1}

    args = argparse.Namespace(
        seed=3, nodes=3, workers=2, clients=2, unsafe_ignore_fencing=False,
        recovery_bound_s=60.0, out=tmp_path,
    )  # fmt: skip
    summary = summarize(
        args, [], [], {"jobs": []}, [check], [], [], 1.0, [], 10.0, expected_log_errors=seen
    )
    assert summary["valid"] is False
    assert summary["expected_log_errors"] == seen
    assert "expected node log errors: 1 (the nemesis kills peers)" in render_text(summary)


def test_every_expected_campaign_line_has_a_reason() -> None:
    for entry in checkers.EXPECTED_NODE_LOG_ERRORS:
        assert entry.pattern and entry.reason
