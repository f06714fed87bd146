"""The log scan that e2e tests use to prove secrets never reach a node log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raftsched.testing import find_secrets_in_logs

RAFT = "raft-secret-Zq9/x+y=w"
HOOK = "webhook-secret-4242"


def write_log(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_finds_each_secret_by_label_and_line_in_every_form(tmp_path: Path) -> None:
    first = write_log(
        tmp_path / "n1.log",
        json.dumps({"level": "info", "msg": "started"}),
        json.dumps({"level": "info", "msg": f"secret {RAFT} and {HOOK}"}),
    )
    second = write_log(
        tmp_path / "n2.log",
        json.dumps({"msg": "url-encoded: raft-secret-Zq9%2Fx%2By%3Dw"}),
        json.dumps({"msg": 'escaped: a"b-secret-value'}),
    )
    found = find_secrets_in_logs(
        [first, second, tmp_path / "absent.log"],
        {"raft": RAFT, "webhook": HOOK, "quoted": 'a"b-secret-value'},
    )
    assert [(s.path.name, s.line_number, s.label) for s in found] == [
        ("n1.log", 2, "raft"),
        ("n1.log", 2, "webhook"),
        ("n2.log", 1, "raft"),
        ("n2.log", 2, "quoted"),
    ]
    assert RAFT not in found[0].describe()


def test_a_clean_log_has_no_sightings_and_short_secrets_are_refused(tmp_path: Path) -> None:
    log = write_log(tmp_path / "n1.log", json.dumps({"msg": "raft-secret-other"}))
    assert find_secrets_in_logs([log], {"raft": RAFT}) == []
    with pytest.raises(ValueError, match="too short"):
        find_secrets_in_logs([log], {"pin": "1234"})
