"""The shards' membership driver's next step (api.shard_routing): a shard
follows group 0's directory one change at a time, removes before adds (a
replaced node is usually dead: an add first would be refused, quorum_at_risk)."""

from __future__ import annotations

from typing import Any

from raftsched.api.shard_routing import next_membership_step

WANTED = {
    "n1": ("127.0.0.1:7001", "http://a"),
    "n2": ("127.0.0.1:7002", "http://b"),
    "n4": ("10.0.0.4:7000", "http://d"),
}


def _view(*members: str, change: Any = None, joining: list[str] | None = None) -> dict[str, Any]:
    return {
        "nodes": [{"id": m, "status": "member"} for m in members]
        + [{"id": "n9", "status": "removing"}],
        "membership": {"change": change, "joining": joining or []},
    }


def test_a_remove_comes_first_then_an_add_at_the_shifted_address_then_nothing() -> None:
    # A replacement: n3 gone from group 0 (dead, as the runbook leaves it),
    # n4 new. The shard counts n3 until it is removed.
    assert next_membership_step(_view("n1", "n2", "n3"), WANTED, 2, 100) == (
        "DELETE",
        "/v1/cluster/nodes/n3",
        None,
    )
    assert next_membership_step(_view("n1", "n2"), WANTED, 2, 100) == (
        "POST",
        "/v1/cluster/nodes",
        {"id": "n4", "raft_address": "10.0.0.4:7200", "http_url": "http://d"},
    )
    assert next_membership_step(_view("n1", "n2", "n4"), WANTED, 1, 100) is None


def test_a_plain_removal_and_a_plain_add() -> None:
    assert next_membership_step(_view("n1", "n2", "n3", "n4"), WANTED, 1, 100) == (
        "DELETE",
        "/v1/cluster/nodes/n3",
        None,
    )
    step = next_membership_step(_view("n1", "n2"), WANTED, 1, 100)
    assert step is not None and step[:2] == ("POST", "/v1/cluster/nodes")
    assert step[2] is not None and step[2]["raft_address"] == "10.0.0.4:7100"


def test_nothing_while_a_change_is_in_progress_or_the_shard_is_silent() -> None:
    assert next_membership_step(_view("n1", "n2", change={"kind": "add"}), WANTED, 1, 100) is None
    assert next_membership_step(_view("n1", "n2", joining=["n3"]), WANTED, 1, 100) is None
    assert next_membership_step(None, WANTED, 1, 100) is None
