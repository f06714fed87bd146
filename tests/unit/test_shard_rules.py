"""Shards (docs/shards.md): ids that name their shard, placement by key, the
record of S in a data directory, and a shard process's configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raftsched.api.principal import ANONYMOUS, Principal, Role, decode_principal, encode_principal
from raftsched.config import ConfigError, NodeConfig, Peer, config_from_json, config_to_json
from raftsched.core.workflows.model import step_job_id
from raftsched.node.draws import Draws
from raftsched.shards import (
    ShardCountMismatch,
    key_hash,
    key_shard,
    recorded_shards,
    settle_shards,
    shard_of_id,
    shift_address,
    socket_path,
)


def test_ids_name_their_shard() -> None:
    assert shard_of_id("job_01M92JG3GK7J82V40SSRTBNYNR") == 0
    assert shard_of_id("job1_01M92JG3GK7J82V40SSRTBNYNR") == 1
    assert shard_of_id("wf12_01M92JG3GK7J82V40SSRTBNYNR") == 12
    assert shard_of_id("sch3_01M92JG3GK7J82V40SSRTBNYNR") == 3
    assert shard_of_id("sub2_x") == 2
    # Not drawn by a shard: today's ids, ids a client chose, leading zeros.
    for other in ("nightly", "job01_x", "job_1_x", "jobs1_x", "job-1_x", "", "job1", "wf_x"):
        assert shard_of_id(other) == 0, other
    # A workflow's steps take their ids from the workflow's (core.workflows.model).
    assert shard_of_id(step_job_id("wf4_01M92JG3GK7J82V40SSRTBNYNR", 2)) == 4
    assert shard_of_id(step_job_id("wf4_01M92JG3GK7J82V40SSRTBNYNR", 0, True)) == 4
    assert shard_of_id(step_job_id("wf_01M92JG3GK7J82V40SSRTBNYNR", 1)) == 0


def test_a_shard_process_draws_ids_naming_its_shard() -> None:
    clock = iter(range(1_764_547_200_000, 1_764_547_300_000))
    group0, shard2 = Draws(lambda: next(clock)), Draws(lambda: next(clock), shard=2)
    assert group0.new_id("job").startswith("job_")
    for prefix in ("job", "wf", "sch", "sub"):
        drawn = shard2.new_id(prefix)
        assert drawn.startswith(f"{prefix}2_") and len(drawn) == len(prefix) + 2 + 26
        assert shard_of_id(drawn) == 2
    assert all(shard_of_id(each) == 2 for each in shard2.new_ids("job", 5))


def test_placement_is_blake2b_of_the_msgpack_pair_and_never_changes() -> None:
    # Pinned: every node and every release must place a key alike.
    assert key_hash("default", "order-1") == 17696903406705499741
    assert key_hash("acme", "k") == 1767869023793378653
    assert [key_shard("default", f"k{i}", 3) for i in range(10)] == [1, 1, 0, 1, 1, 2, 0, 0, 1, 0]
    assert key_shard("default", "k", 1) == 0
    # The tenant is part of the key.
    assert key_hash("a", "k") != key_hash("b", "k")


def test_the_data_directory_records_its_number_of_shards(tmp_path: Path) -> None:
    new = tmp_path / "new"
    new.mkdir()
    assert recorded_shards(new) is None
    settle_shards(new, 3, durable=False)
    assert recorded_shards(new) == 3
    settle_shards(new, 3, durable=False)
    with pytest.raises(ShardCountMismatch, match="created with --shards 3"):
        settle_shards(new, 1, durable=False)
    with pytest.raises(ShardCountMismatch, match="start it with --shards 3"):
        settle_shards(new, 4, durable=False)
    # One shard in a new directory writes nothing: it stays as it always was.
    single = tmp_path / "single"
    single.mkdir()
    settle_shards(single, 1, durable=False)
    assert list(single.iterdir()) == []
    # A directory from before shards (Raft files, no record) has one.
    old = tmp_path / "old"
    (old / "raft").mkdir(parents=True)
    assert recorded_shards(old) == 1
    settle_shards(old, 1, durable=False)
    with pytest.raises(ShardCountMismatch, match="created without --shards"):
        settle_shards(old, 2, durable=False)
    (new / "shards.json").write_text("{}")
    with pytest.raises(ShardCountMismatch, match="does not hold"):
        recorded_shards(new)


def _config(tmp_path: Path, **changes: object) -> NodeConfig:
    settings: dict[str, object] = {
        "node_id": "n1",
        "data_dir": tmp_path / "n1",
        "http_host": "127.0.0.1",
        "http_port": 8701,
        "raft_address": "127.0.0.1:9701",
        "secret": "s" * 32,
        "peers": (
            Peer("n2", "127.0.0.1:9702", "http://127.0.0.1:8702"),
            Peer("n3", "127.0.0.1:9703", "http://127.0.0.1:8703"),
        ),
        "shards": 3,
    }
    settings.update(changes)
    return NodeConfig(**settings)  # type: ignore[arg-type]


def test_a_shard_process_config_shifts_every_raft_address(tmp_path: Path) -> None:
    config = _config(tmp_path, raft_bind_address="0.0.0.0:9701")
    config.validate()
    shard = config.for_shard(2)
    shard.validate()
    assert shard.shard == 2 and shard.shards == 3
    assert shard.data_dir == tmp_path / "n1" / "shards" / "2"
    assert shard.raft_address == "127.0.0.1:9901"
    assert shard.raft_bind_address == "0.0.0.0:9901"
    assert [p.raft_address for p in shard.peers] == ["127.0.0.1:9902", "127.0.0.1:9903"]
    # Redirects name the nodes' public URLs; no token is bootstrapped there.
    assert shard.advertised_http_url == "http://127.0.0.1:8701"
    assert [p.http_url for p in shard.peers] == ["http://127.0.0.1:8702", "http://127.0.0.1:8703"]
    assert shard.admin_token_file is None
    assert shard.secret == config.secret
    assert shift_address("[::1]:9701", 1, 100) == "[::1]:9801"


def test_a_shard_process_config_goes_through_json_whole(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        accepted_secrets=("a" * 20,),
        webhook_allow_cidrs=("10.0.0.0/8",),
        admin_token_file=tmp_path / "admin.token",
        extra={"x": "y"},
    ).for_shard(1)
    assert config_from_json(json.loads(json.dumps(config_to_json(config)))) == config


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"shards": 0}, "between 1 and 64"),
        ({"shards": 65}, "between 1 and 64"),
        ({"shard_port_stride": 0}, "at least 1"),
        ({"shard_port_stride": 1}, "would listen on 127.0.0.1:9702"),
        ({"raft_address": "127.0.0.1:65500"}, "would listen on port 65600"),
        ({"data_dir": Path("/tmp") / ("d" * 100)}, "longer than the 107 bytes"),
    ],
)
def test_shard_settings_that_cannot_work_are_usage_errors(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, **changes).validate()


def test_one_shard_checks_nothing_new(tmp_path: Path) -> None:
    _config(tmp_path, shards=1, shard_port_stride=0, data_dir=Path("/tmp") / ("d" * 200)).validate()


def test_the_shard_socket_lives_in_the_shard_data_directory(tmp_path: Path) -> None:
    assert socket_path(tmp_path, 2) == tmp_path / "shards" / "2" / "api.sock"


def test_a_principal_goes_to_a_shard_process_and_back() -> None:
    scoped = Principal("tok_1", "ci é", Role.WORKER, frozenset({"a", "b"}), frozenset({"q"}))
    for principal in (scoped, ANONYMOUS):
        text = encode_principal(principal)
        assert text.isascii()
        assert decode_principal(text) == principal
    for bad in ("", "[]", '{"name": 1}', '{"name": "x", "role": "root"}', '{"name":"x"}'):
        with pytest.raises(ValueError):
            decode_principal(bad)
