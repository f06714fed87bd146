"""`raftsched node`: flags and TOML become a NodeConfig; mistakes exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raftsched.cli import main
from raftsched.config import NodeConfig, Peer
from raftsched.limits import (
    AUTH_FAILURES_PER_MINUTE,
    PROPOSAL_QUEUE_BYTES_MAX,
    PROPOSAL_QUEUE_COMMANDS_MAX,
)

SECRET = "s" * 24


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[NodeConfig]:
    import raftsched.process

    configs: list[NodeConfig] = []
    monkeypatch.setattr(raftsched.process, "run_node", configs.append)
    return configs


def secret_file(directory: Path) -> Path:
    path = directory / "secret"
    path.write_text(SECRET + "\n")
    return path


def test_flags_build_the_config(tmp_path: Path, captured: list[NodeConfig]) -> None:
    code = main([
        "node", "--id", "n1", "--data-dir", str(tmp_path / "n1"), "--http", "0.0.0.0:8701",
        "--raft", "10.0.0.1:9701", "--raft-bind", "0.0.0.0:9701",
        "--http-url", "http://10.0.0.1:8701/", "--secret-file", str(secret_file(tmp_path)),
        "--peer", "n2=10.0.0.2:9701@http://10.0.0.2:8701", "--durability", "none",
        "--proposal-queue-commands-max", "40", "--proposal-queue-bytes-max", "4096",
        "--insecure-http", "--auth-failures-per-minute", "25",
        "--otlp-endpoint", "http://collector:4318",
    ])  # fmt: skip
    assert code == 0
    [config] = captured
    assert config.node_id == "n1" and config.http_host == "0.0.0.0" and config.http_port == 8701
    assert config.raft_address == "10.0.0.1:9701" and config.raft_bind_address == "0.0.0.0:9701"
    assert config.http_url == "http://10.0.0.1:8701" and config.secret == SECRET
    assert config.peers == (Peer("n2", "10.0.0.2:9701", "http://10.0.0.2:8701"),)
    assert config.durability == "none"
    assert (config.proposal_queue_commands_max, config.proposal_queue_bytes_max) == (40, 4096)
    assert config.auth_failures_per_minute == 25
    assert config.otlp_endpoint == "http://collector:4318"


def test_toml_with_flags_overriding(tmp_path: Path, captured: list[NodeConfig]) -> None:
    secret_file(tmp_path)
    (tmp_path / "n1.toml").write_text(
        'id = "n1"\ndata_dir = "data/n1"\nhttp = "127.0.0.1:8701"\nraft = "127.0.0.1:9701"\n'
        'secret_file = "secret"\nmax_body_bytes = 2048\notlp_endpoint = "https://c:4318"\n'
        'peers = ["n2=127.0.0.1:9702@http://127.0.0.1:8702",'
        ' {id = "n3", raft = "127.0.0.1:9703", http_url = "http://127.0.0.1:8703"}]\n'
    )
    assert main(["node", "--config", str(tmp_path / "n1.toml"), "--http", "127.0.0.1:9999"]) == 0
    [config] = captured
    assert config.data_dir == tmp_path / "data" / "n1"  # relative to the file
    assert config.http_port == 9999 and config.max_body_bytes == 2048
    assert [peer.id for peer in config.peers] == ["n2", "n3"]
    assert config.proposal_queue_commands_max == PROPOSAL_QUEUE_COMMANDS_MAX
    assert config.proposal_queue_bytes_max == PROPOSAL_QUEUE_BYTES_MAX
    assert config.auth_failures_per_minute == AUTH_FAILURES_PER_MINUTE
    assert config.otlp_endpoint == "https://c:4318"


@pytest.mark.parametrize(
    ("toml", "flags", "message"),
    [
        ('id = "n1"\nhttps = "x"\n', [], "unknown keys in"),
        ("", ["--id", "n1"], "--data-dir is required"),
        ("", ["--id", "n1", "--data-dir", "d", "--http", "nope", "--raft", "h:1"], "HOST:PORT"),
        (
            "",
            [
                "--id",
                "n1",
                "--data-dir",
                "d",
                "--http",
                "127.0.0.1:1",
                "--raft",
                "h:1",
                "--proposal-queue-commands-max",
                "0",
            ],
            "proposal queue bounds",
        ),  # fmt: skip
        (
            "log_compaction_bytes = 1000\n",
            ["--id", "n1", "--data-dir", "d", "--http", "127.0.0.1:1", "--raft", "h:1"],
            "log_compaction_bytes must be at least 65536",
        ),
        (
            "",
            [
                "--id",
                "n1",
                "--data-dir",
                "d",
                "--http",
                "127.0.0.1:1",
                "--raft",
                "h:1",
                "--log-compaction-interval-s",
                "0",
            ],
            "log_compaction_interval_s must be between 1 and 86400",
        ),  # fmt: skip
        (
            "auth_failures_per_minute = 0\n",
            ["--id", "n1", "--data-dir", "d", "--http", "127.0.0.1:1", "--raft", "h:1"],
            "auth_failures_per_minute must be at least 1",
        ),
        (
            'otlp_endpoint = "collector:4318"\n',
            ["--id", "n1", "--data-dir", "d", "--http", "127.0.0.1:1", "--raft", "h:1"],
            "otlp_endpoint must be an http(s) URL",
        ),
    ],
)
def test_mistakes_exit_2(
    tmp_path: Path,
    captured: list[Any],
    capsys: pytest.CaptureFixture[str],
    toml: str,
    flags: list[str],
    message: str,
) -> None:
    (tmp_path / "c.toml").write_text(toml)
    args = ["node", "--config", str(tmp_path / "c.toml"), *flags]
    if "--http" in flags:
        args += ["--secret-file", str(secret_file(tmp_path))]
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert captured == []


def test_log_compaction_triggers_from_flags_and_toml(
    tmp_path: Path, captured: list[NodeConfig]
) -> None:
    secret_file(tmp_path)
    base = 'id = "n1"\ndata_dir = "d"\nhttp = "127.0.0.1:8701"\nraft = "127.0.0.1:9701"\n'
    (tmp_path / "n1.toml").write_text(
        base + 'secret_file = "secret"\nlog_compaction_bytes = 1048576\n'
        "log_compaction_interval_s = 60.0\nlog_compaction_entries = 300\n"
    )
    assert main(["node", "--config", str(tmp_path / "n1.toml")]) == 0
    assert main([
        "node", "--config", str(tmp_path / "n1.toml"), "--log-compaction-bytes", "131072",
        "--log-compaction-interval-s", "7.5",
    ]) == 0  # fmt: skip
    (tmp_path / "n2.toml").write_text(base + 'secret_file = "secret"\n')
    assert main(["node", "--config", str(tmp_path / "n2.toml")]) == 0
    from_toml, from_flags, defaults = captured
    assert (from_toml.log_compaction_bytes, from_toml.log_compaction_interval_s) == (1 << 20, 60)
    assert from_toml.log_compaction_entries == 300
    assert (from_flags.log_compaction_bytes, from_flags.log_compaction_interval_s) == (1 << 17, 7.5)
    assert (defaults.log_compaction_bytes, defaults.log_compaction_interval_s) == (64 << 20, 300)
    from raftsched import raft

    assert defaults.log_compaction_bytes == raft.LOG_COMPACTION_BYTES  # one default, two places


def test_short_secret_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "secret").write_text("short")
    code = main([
        "node", "--id", "n1", "--data-dir", str(tmp_path), "--http", "127.0.0.1:1",
        "--raft", "127.0.0.1:2", "--secret-file", str(tmp_path / "secret"),
    ])  # fmt: skip
    assert code == 2
    assert "at least 16 characters" in capsys.readouterr().err


def test_tls_flags_and_toml_keys(tmp_path: Path, captured: list[NodeConfig]) -> None:
    secret_file(tmp_path)
    (tmp_path / "n1.toml").write_text(
        'id = "n1"\ndata_dir = "n1"\nhttp = "10.0.0.1:8701"\nraft = "10.0.0.1:9701"\n'
        'secret_file = "secret"\ntls_cert = "tls/n1.pem"\ntls_key = "tls/n1.key"\n'
        'tls_client_ca = "tls/ca.pem"\npeers = ["n2=10.0.0.2:9701@https://10.0.0.2:8701"]\n'
    )
    assert main(["node", "--config", str(tmp_path / "n1.toml")]) == 0
    [config] = captured
    assert config.tls_cert_file == tmp_path / "tls" / "n1.pem"  # relative to the file
    assert config.tls_key_file == tmp_path / "tls" / "n1.key"
    assert config.tls_client_ca_file == tmp_path / "tls" / "ca.pem"
    assert config.tls_ca_file is None and not config.insecure_http
    assert config.advertised_http_url == "https://10.0.0.1:8701"
    code = main(["node", "--config", str(tmp_path / "n1.toml"), "--tls-ca", "/etc/ca.pem"])
    assert code == 0 and captured[-1].tls_ca_file == Path("/etc/ca.pem")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--http", "0.0.0.0:8701"], "is not a loopback address"),
        (["--http", "10.0.0.1:8701", "--tls-cert", "c.pem"], "go together"),
        (["--tls-client-ca", "ca.pem"], "--tls-client-ca needs --tls-cert"),
        (
            [
                "--tls-cert",
                "c.pem",
                "--tls-key",
                "k.pem",
                "--peer",
                "n2=127.0.0.1:9702@http://127.0.0.1:8702",
            ],
            "peer n2 is 'http://127.0.0.1:8702'",
        ),  # fmt: skip
    ],
)
def test_tls_mistakes_exit_2(
    tmp_path: Path,
    captured: list[NodeConfig],
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    message: str,
) -> None:
    base = ["node", "--id", "n1", "--data-dir", str(tmp_path / "n1"), "--http", "127.0.0.1:8701",
            "--raft", "127.0.0.1:9701", "--secret-file", str(secret_file(tmp_path))]  # fmt: skip
    assert main([*base, *flags]) == 2
    assert message in capsys.readouterr().err
    assert captured == []


def test_insecure_http_in_toml_must_be_a_boolean(
    tmp_path: Path, captured: list[NodeConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    secret_file(tmp_path)
    (tmp_path / "n1.toml").write_text(
        'id = "n1"\ndata_dir = "n1"\nhttp = "0.0.0.0:8701"\nraft = "10.0.0.1:9701"\n'
        'secret_file = "secret"\ninsecure_http = "yes"\n'
    )
    assert main(["node", "--config", str(tmp_path / "n1.toml")]) == 2
    assert "`insecure_http` must be true or false" in capsys.readouterr().err


def test_rotation_secrets_and_webhook_targets_from_flags_and_toml(
    tmp_path: Path, captured: list[NodeConfig]
) -> None:
    secret_file(tmp_path)
    (tmp_path / "next").write_text("n" * 20 + "\n")
    (tmp_path / "n1.toml").write_text(
        'id = "n1"\ndata_dir = "d"\nhttp = "127.0.0.1:8701"\nraft = "127.0.0.1:9701"\n'
        'secret_file = "secret"\nsecret_accept_files = ["next"]\n'
        'webhook_allow_private = true\nwebhook_allow_cidrs = ["10.1.0.0/16"]\n'
    )
    assert main(["node", "--config", str(tmp_path / "n1.toml")]) == 0
    assert main([
        "node", "--config", str(tmp_path / "n1.toml"), "--secret-accept-file",
        str(tmp_path / "secret"), "--webhook-allow-cidr", "127.0.0.0/8",
    ])  == 0  # fmt: skip
    from_file, from_flags = captured
    assert from_file.secret == SECRET and from_file.accepted_secrets == ("n" * 20,)
    assert from_file.webhook_allow_private and from_file.webhook_allow_cidrs == ("10.1.0.0/16",)
    policy = from_file.webhook_policy()
    assert policy.refusal("10.2.0.1") is None and policy.refusal("127.0.0.1") is not None
    assert from_flags.accepted_secrets == (SECRET,)
    assert from_flags.webhook_policy().refusal("127.0.0.1") is None


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--webhook-allow-cidr", "not-a-cidr", "--webhook-allow-cidr"),
        ("--secret-accept-file", "short", "at least 16 characters"),
    ],
)
def test_bad_rotation_or_webhook_flags_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    (tmp_path / "short").write_text("short")
    if flag == "--secret-accept-file":
        value = str(tmp_path / value)
    code = main([
        "node", "--id", "n1", "--data-dir", str(tmp_path), "--http", "127.0.0.1:1",
        "--raft", "127.0.0.1:2", "--secret-file", str(secret_file(tmp_path)), flag, value,
    ])  # fmt: skip
    assert code == 2
    assert message in capsys.readouterr().err
