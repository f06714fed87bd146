"""The example deployments in cluster/ load with the real `raftsched node` parser
and describe consistent clusters (every node lists every other one, exactly)."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

from raftsched.cli import main
from raftsched.config import NodeConfig

CLUSTER_DIR = Path(__file__).resolve().parents[3] / "cluster"
EXAMPLES = {"three-node": 3, "five-node": 5, "compose": 3}
SECRET = "example-secret-" + "x" * 24


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> object:
    """Run `raftsched node --config FILE` with the real parser; return its config."""
    import raftsched.process

    configs: list[NodeConfig] = []
    monkeypatch.setattr(raftsched.process, "run_node", configs.append)
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")

    def run(path: Path) -> NodeConfig:
        # The files point at /etc/raftsched/secret (or a compose secret); the
        # flag overrides only that, as an operator could.
        code = main(["node", "--config", str(path), "--secret-file", str(secret)])
        assert code == 0, f"{path} was refused"
        config = configs.pop()
        config.validate()
        return config

    return run


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_example_cluster_configs_load_and_agree(example: str, load: object) -> None:
    files = sorted((CLUSTER_DIR / example).glob("n*.toml"))
    assert len(files) == EXAMPLES[example]
    configs = [load(path) for path in files]  # type: ignore[operator]
    by_id = {config.node_id: config for config in configs}
    assert sorted(by_id) == [path.stem for path in files]  # n1.toml holds id "n1"
    for config in configs:
        assert config.durability == "fsync"
        # Below the 5 s minimum lease the README recommends for production.
        assert config.leader_fallback_timeout_s < 5.0
        assert config.election_timeout_min_s < config.election_timeout_max_s
        assert config.data_dir == Path("/var/lib/raftsched")
        peers = {peer.id: (peer.raft_address, peer.http_url) for peer in config.peers}
        others = {
            other.node_id: (other.raft_address, other.advertised_http_url)
            for other in configs
            if other is not config
        }
        assert peers == others, f"{config.node_id}'s peers disagree with the other files"
        # Off loopback a node serves HTTPS, or says plainly that it does not.
        if example == "compose":
            assert config.insecure_http and not config.tls_enabled
        else:
            assert config.tls_enabled and config.advertised_http_url.startswith("https://")
            assert config.tls_ca_file == Path("/etc/raftsched/tls/ca.pem")


def test_example_configs_use_separate_hosts() -> None:
    for example in ("three-node", "five-node"):
        hosts = set()
        for path in (CLUSTER_DIR / example).glob("n*.toml"):
            match = re.search(r'^raft = "([^":]+):\d+"', path.read_text(), re.MULTILINE)
            assert match, path
            hosts.add(match.group(1))
        assert len(hosts) == EXAMPLES[example]


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string((CLUSTER_DIR / "systemd" / name).read_text())
    return parser


def test_node_unit_is_hardened_and_restarts() -> None:
    unit = _unit("raftsched-node.service")
    service = unit["Service"]
    assert service["ExecStart"].split()[1:] == ["node", "--config", "/etc/raftsched/node.toml"]
    assert service["Restart"] == "on-failure"
    assert service["User"] == "raftsched"
    assert service["StateDirectory"] == "raftsched"  # /var/lib/raftsched, the data_dir
    assert service["StateDirectoryMode"] == "0700"
    for option, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert service[option] == value, option
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_worker_unit_reads_its_environment_file() -> None:
    service = _unit("raftsched-worker@.service")["Service"]
    assert service["EnvironmentFile"] == "/etc/raftsched/worker-%i.env"
    assert "worker" in service["ExecStart"].split()
    assert service["Restart"] == "on-failure"


def test_compose_file_is_yaml_naming_existing_configs() -> None:
    text = (CLUSTER_DIR / "compose" / "compose.yaml").read_text()
    assert "\t" not in text
    for node in ("n1", "n2", "n3"):
        assert f"./{node}.toml:/etc/raftsched/node.toml:ro" in text
        assert (CLUSTER_DIR / "compose" / f"{node}.toml").exists()
    yaml = pytest.importorskip("yaml")  # not a dependency; checked where it is installed
    document = yaml.safe_load(text)
    assert set(document["services"]) == {"n1", "n2", "n3", "worker"}
    assert document["secrets"]["cluster_secret"]["file"] == "./secret"
    for node in ("n1", "n2", "n3"):
        service = document["services"][node]
        assert service["command"] == ["node", "--config", "/etc/raftsched/node.toml"]
        assert service["ports"] == [f"127.0.0.1:870{node[1]}:8701"]  # Raft is not published
