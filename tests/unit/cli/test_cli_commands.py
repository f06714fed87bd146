"""Client-side commands against a scripted fake node: what they send, what
they print, and their exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakecluster import FakeCluster, Seen, error, reply

from raftsched.cli import main

JOB = {
    "id": "job_1", "queue": "q", "status": "dead_letter", "attempts_made": 3, "priority": 0,
    "last_error": {"kind": "permanent", "message": "bad card"}, "updated_at": "t",
    "attempts": [{"number": 1, "worker_id": "w1", "outcome": "failed"}],
}  # fmt: skip


def test_submit_sends_every_option(fake: FakeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    fake.nodes[0].script = lambda seen: reply(201, {"job": {**JOB, "status": "scheduled"}})
    code = main([
        "submit", "payments", "--payload", '{"amount": 5}', "--key", "k1",
        "--run-at", "2026-12-01T10:00:00+01:00", "--priority", "7", "--max-attempts", "2",
        "--label", "team=billing", "--url", fake.urls[0],
    ])  # fmt: skip
    assert code == 0
    assert fake.nodes[0].seen[0].body == {
        "queue": "payments",
        "payload": {"amount": 5},
        "idempotency_key": "k1",
        "run_at": "2026-12-01T09:00:00.000Z",
        "priority": 7,
        "max_attempts": 2,
        "labels": {"team": "billing"},
    }
    assert capsys.readouterr().out.strip() == "job_1  scheduled  queue=q"


def test_bad_payload_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["submit", "q", "--payload", "{nope"])
    assert exited.value.code == 2
    assert "not JSON" in capsys.readouterr().err


def test_delay_and_run_at_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        main(["submit", "q", "--delay-s", "1", "--run-at", "2026-01-01T00:00:00Z"])


def test_api_error_prints_code_and_exits_1(
    fake: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.nodes[0].script = lambda seen: error(404, "not_found", "no job job_9")
    assert main(["jobs", "get", "job_9", "--url", fake.urls[0]]) == 1
    assert capsys.readouterr().err.strip() == "error: not_found: no job job_9 (field: x)"


def test_unreachable_cluster_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--url", "http://127.0.0.1:9", "--timeout-s", "0.5", "cluster", "status"])
    assert code == 1
    assert capsys.readouterr().err.startswith("error: ")


def test_dlq_list_filters_and_shows_errors(
    fake: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.nodes[0].script = lambda seen: reply(200, {"jobs": [JOB], "next_cursor": "c2"})
    assert main(["dlq", "list", "--queue", "q", "--url", fake.urls[0]]) == 0
    assert fake.nodes[0].seen[0].query == {"queue": "q", "status": "dead_letter", "limit": "20"}
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == [
        "ID", "QUEUE", "KIND", "STATUS", "ATTEMPTS", "LAST", "ERROR", "UPDATED",
    ]  # fmt: skip
    assert "permanent: bad card" in out[1]
    assert out[-1] == "(more: --cursor c2)"


def test_global_options_work_before_the_command(
    fake: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.nodes[0].script = lambda seen: reply(200, {"job": JOB})
    assert main(["--json", "--url", fake.urls[0], "jobs", "get", "job_1"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == "job_1"


def test_url_from_environment(
    fake: FakeCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAFTSCHED_URL", f"http://127.0.0.1:9,{fake.urls[0]}")
    fake.nodes[0].script = lambda seen: reply(200, {"job": JOB})
    assert main(["jobs", "get", "job_1", "--timeout-s", "1"]) == 0
    assert "attempts_made" in capsys.readouterr().out


def test_replay_needs_a_reason_and_sends_it(fake: FakeCluster) -> None:
    with pytest.raises(SystemExit):
        main(["dlq", "replay", "job_1"])
    fake.nodes[0].script = lambda seen: reply(200, {"job": {**JOB, "status": "pending"}})
    assert main(["dlq", "replay", "job_1", "--reason", "fixed", "--url", fake.urls[0]]) == 0
    seen: Seen = fake.nodes[0].seen[0]
    assert (seen.path, seen.body) == ("/v1/jobs/job_1/replay", {"reason": "fixed"})


def test_history_and_cluster_tables(fake: FakeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    event = {
        "at": "t1",
        "event": "claim",
        "actor": "w1",
        "epoch": 1,
        "fencing_token": 4,
        "from_status": "pending",
        "to_status": "claimed",
        "detail": None,
        "extra": 1,
    }
    cluster = {"node_id": "n1", "leader": {"id": "n1", "http_url": "http://x"}, "term": 2,
               "commit_index": 9, "applied_index": 9, "cluster_id": "clu_1",
               "cluster_version": 4,
               "nodes": [{"id": "n1", "role": "leader", "reachable": True,
                          "version": {"release": "0.4.0", "command_version_max": 4}}]}  # fmt: skip
    fake.nodes[0].script = lambda seen: reply(
        200, {"events": [event]} if "history" in seen.path else cluster
    )
    assert main(["jobs", "history", "job_1", "--url", fake.urls[0]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["AT", "EVENT", "FROM_STATUS", "TO_STATUS"]
    assert lines[1].split()[-1] == '{"extra":1}'
    assert main(["cluster", "status", "--url", fake.urls[0]]) == 0
    out = capsys.readouterr().out
    fields = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert fields["leader"] == ["n1", "http://x"] and fields["cluster_id"] == ["clu_1"]
    assert fields["cluster_version"] == ["4"]
    assert fields["n1"][:2] == ["leader", "true"] and "0.4.0" in fields["n1"]


def test_ca_file_and_client_certificate_from_flags_or_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing-ca.pem"
    monkeypatch.setenv("RAFTSCHED_CA_FILE", str(missing))
    assert main(["jobs", "get", "job_1", "--url", "https://127.0.0.1:9"]) == 2
    assert "cannot load TLS files" in capsys.readouterr().err
    monkeypatch.delenv("RAFTSCHED_CA_FILE")
    monkeypatch.setenv("RAFTSCHED_CLIENT_KEY", str(tmp_path / "client.key"))
    assert main(["jobs", "get", "job_1", "--url", "https://127.0.0.1:9"]) == 2
    assert "needs its client certificate" in capsys.readouterr().err
    monkeypatch.delenv("RAFTSCHED_CLIENT_KEY")
    worker = ["worker", "--queue", "q", "--handler", "raftsched.demo:handle"]
    assert main([*worker, "--ca-file", str(missing)]) == 2
    assert "cannot load TLS files" in capsys.readouterr().err


def test_audit_list_sends_its_filters_and_prints_a_table(
    fake: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = {
        "seq": 7, "at": "2026-12-02T10:00:00.000Z", "actor": "alice (tok_1)",
        "kind": "job.replay", "target": "job_1", "tenant": "acme", "detail": "fixed",
    }  # fmt: skip
    fake.nodes[0].script = lambda seen: reply(200, {"entries": [entry], "next_cursor": "7"})
    code = main([
        "audit", "list", "--actor", "alice (tok_1)", "--kind", "job.replay", "--limit", "1",
        "--cursor", "9", "--url", fake.urls[0],
    ])  # fmt: skip
    assert code == 0
    seen: Seen = fake.nodes[0].seen[0]
    assert seen.path == "/v1/audit"
    assert seen.query == {
        "actor": "alice (tok_1)",
        "kind": "job.replay",
        "limit": "1",
        "cursor": "9",
    }
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["SEQ", "AT", "ACTOR", "KIND", "TARGET", "TENANT", "DETAIL"]
    assert "alice (tok_1)" in lines[1] and "job.replay" in lines[1] and "acme" in lines[1]
    assert lines[-1] == "(more: --cursor 7)"


def test_reconciliation_report_sends_its_window_and_prints_four_tables(
    fake: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    report = {
        "now": "2026-12-02T10:30:00.000Z", "since": "2026-12-02T09:00:00.000Z", "hours": 2,
        "reconciling": {"jobs": [{
            "job_id": "job_2", "queue": "pay", "tenant": "acme", "attempt": 1,
            "since": "2026-12-02T10:00:00.000Z", "tries": 2, "reconcile_queue": "pay-rc",
            "available_at": "2026-12-02T10:00:00.000Z",
            "lease": {"worker_id": "r7", "fencing_token": 9, "expires_at": "x"}}],
            "total": 3, "truncated": True},
        "unknown_outcomes": {
            "buckets": ["2026-12-02T09:00:00.000Z", "2026-12-02T10:00:00.000Z"],
            "queues": [{"queue": "pay", "total": 5, "counts": [4, 1]}]},
        "decisions": [{"queue": "pay", "happened": 1, "did_not_happen": 2, "cannot_tell": 0,
                       "unanswered": 1}],
        "completed": {"jobs": [{
            "job_id": "job_1", "queue": "pay", "tenant": "acme",
            "completed_at": "2026-12-02T10:10:00.000Z", "worker_id": "r7", "fencing_token": 8,
            "evidence": "provider lists ch_1"}], "total": 1, "truncated": False},
    }  # fmt: skip
    fake.nodes[0].script = lambda seen: reply(200, report)
    code = main(["reconciliation", "report", "--hours", "2", "--limit", "1", "--url", fake.urls[0]])
    assert code == 0
    seen: Seen = fake.nodes[0].seen[0]
    assert (seen.path, seen.query) == ("/v1/reconciliation", {"hours": "2", "limit": "1"})
    out = capsys.readouterr().out
    lines = [line.split() for line in out.splitlines()]
    assert "Waiting for a reconcile decision: 3 (showing 1)" in out
    assert ["job_2", "pay", "acme", "1", "2026-12-02T10:00:00.000Z", "2", "pay-rc", "r7"] in lines
    assert ["pay", "5", "1", "2026-12-02T09:00:00.000Z", "4"] in lines
    assert ["pay", "1", "2", "0", "1"] in lines
    assert "Completed by reconciliation: 1" in out
    assert "provider lists ch_1" in out and "job_1" in out


def test_submit_sends_a_kind_only_when_given(fake: FakeCluster) -> None:
    fake.nodes[0].script = lambda seen: reply(201, {"job": JOB})
    assert main(["submit", "q", "--kind", "email.send:v2", "--url", fake.urls[0]]) == 0
    assert main(["submit", "q", "--url", fake.urls[0]]) == 0
    kinded, plain = fake.nodes[0].seen
    assert kinded.body == {"queue": "q", "kind": "email.send:v2"}
    assert plain.body == {"queue": "q"}


def test_jobs_list_filters_by_kind_and_shows_it_and_show_is_get(
    fake: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    job = {**JOB, "status": "pending", "kind": "charge", "next_run_at": None}
    fake.nodes[0].script = lambda seen: reply(200, {"jobs": [job], "next_cursor": None})
    assert main(["jobs", "list", "--kind", "charge", "--url", fake.urls[0]]) == 0
    assert fake.nodes[0].seen[0].query == {"kind": "charge", "limit": "20"}
    header, row = capsys.readouterr().out.splitlines()[:2]
    assert header.split()[:4] == ["ID", "QUEUE", "KIND", "STATUS"]
    assert row.split()[:4] == ["job_1", "q", "charge", "pending"]
    fake.nodes[0].script = lambda seen: reply(200, {"job": job})
    assert main(["jobs", "show", "job_1", "--url", fake.urls[0]]) == 0
    shown = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()
             if line.strip()}  # fmt: skip
    assert shown["kind"] == ["charge"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--handler", "two words=raftsched.demo:handle"], "a kind is 1 to 128"),
        (["--handler", "a=raftsched.demo:handle", "--handler", "a=raftsched.demo:handle"],
         "kind 'a' given twice"),
        (["--handler", "raftsched.demo:handle", "--handler", "raftsched.demo:handle"],
         "the default handler given twice"),
        (["--handler", "a=raftsched.demo:nope"], "has no 'nope'"),
        (["--handler", "a=raftsched.demo:handle", "--kind-concurrency", "a=x"], "KIND=N"),
        (["--handler", "a=raftsched.demo:handle", "--kind-concurrency", "b=2"],
         "without a --handler: ['b']"),
        (["--handler", "a=raftsched.demo:handle", "--kind-concurrency", "a=0"], "at least 1"),
    ],
)  # fmt: skip
def test_worker_handlers_by_kind_are_checked_before_it_starts(
    options: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["worker", "--queue", "q", *options, "--url", "http://127.0.0.1:9"]) == 2
    assert message in capsys.readouterr().err


def test_worker_takes_several_handlers_one_per_kind_and_a_default() -> None:
    from raftsched.cli._worker import _handlers
    from raftsched.demo import handle

    handlers = _handlers(["raftsched.demo:handle", "charge=raftsched.demo:handle",
                          "email.send:v2=raftsched.demo:handle"])  # fmt: skip
    assert handlers == {None: handle, "charge": handle, "email.send:v2": handle}
