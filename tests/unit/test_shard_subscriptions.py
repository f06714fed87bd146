"""A subscription as every shard's copy shows it (api.shard_subscriptions):
counts summed, cursors per shard, parked events merged with ids naming
their shard, and the retry's outcome; a shard's error names the shard."""

from __future__ import annotations

import json
from typing import Any

from raftsched.api.shard_subscriptions import (
    merge_retried,
    merge_subscription,
    merge_subscriptions,
    refused,
)


def _parked(seq: int, parked_at: str) -> dict[str, Any]:
    return {
        "event": {"seq": seq, "type": "job.cancelled", "at": parked_at, "data": {"n": seq}},
        "attempts": 8,
        "error": "HTTP 500",
        "parked_at": parked_at,
        "retry": False,
    }


def _sub(cursor: int, parked: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "sub_a",
        "url": "http://127.0.0.1:9/hook",
        "types": ["job.cancelled"],
        "created_at": "2026-01-01T00:00:00.000Z",
        "cursor_seq": cursor,
        "oldest_undelivered_at": None,
        "parked_count": len(parked),
        "parked_dropped": 0,
        "lag_events": 0,
        "lag_s": 0.0,
        "connected": None,
        "parked": parked,
    }
    body.update(fields)
    return body


def test_every_shards_copy_is_one_subscription() -> None:
    group0 = _sub(
        7, [_parked(3, "2026-01-01T00:00:02.000Z"), _parked(5, "2026-01-01T00:00:09.000Z")]
    )
    shard1 = _sub(
        4,
        [_parked(2, "2026-01-01T00:00:02.000Z")],
        parked_dropped=3,
        oldest_undelivered_at="2026-01-01T00:00:08.000Z",
        url="ignored: group 0's record stands",
        lag_events=12,
        lag_s=4.5,
        connected=True,
    )
    shard2 = _sub(
        9,
        [_parked(6, "2026-01-01T00:00:01.000Z")],
        oldest_undelivered_at="2026-01-01T00:00:05.000Z",
        lag_events=3,
        lag_s=7.25,
        connected=False,
    )
    merged = merge_subscription({0: group0, 1: shard1, 2: shard2}, 3)
    assert merged["url"] == group0["url"]
    assert merged["cursor_seq"] == "v1.7.4.9"
    assert merged["parked_count"] == 4
    assert merged["parked_dropped"] == 3
    assert merged["oldest_undelivered_at"] == "2026-01-01T00:00:05.000Z"
    # The relays: lag summed and the largest; one shard's relay that could
    # not reach its broker makes the subscription's not connected.
    assert (merged["lag_events"], merged["lag_s"], merged["connected"]) == (15, 7.25, False)
    # Oldest parked first by (parked_at, shard); each names its shard.
    assert [(item["shard"], item["event"]["id"]) for item in merged["parked"]] == [
        (2, "evt2_6"),
        (0, "evt_3"),
        (1, "evt1_2"),
        (0, "evt_5"),
    ]
    assert all(item["event"]["shard"] == item["shard"] for item in merged["parked"])
    assert merged["parked"][1]["event"]["data"] == {"n": 3}
    assert merged["shards"] == [
        {"shard": 0, "copied": True, "cursor_seq": 7, "oldest_undelivered_at": None,
         "parked_count": 2, "parked_dropped": 0, "lag_events": 0, "lag_s": 0.0,
         "connected": None},
        {"shard": 1, "copied": True, "cursor_seq": 4,
         "oldest_undelivered_at": "2026-01-01T00:00:08.000Z", "parked_count": 1,
         "parked_dropped": 3, "lag_events": 12, "lag_s": 4.5, "connected": True},
        {"shard": 2, "copied": True, "cursor_seq": 9,
         "oldest_undelivered_at": "2026-01-01T00:00:05.000Z", "parked_count": 1,
         "parked_dropped": 0, "lag_events": 3, "lag_s": 7.25, "connected": False},
    ]  # fmt: skip


def test_a_shard_keeps_its_own_order_of_parked_events() -> None:
    """A re-parked event moves to the end of its shard's list: the merge
    never takes a shard's item before that shard's earlier ones."""
    group0 = _sub(
        0, [_parked(9, "2026-01-01T00:00:05.000Z"), _parked(2, "2026-01-01T00:00:06.000Z")]
    )
    shard1 = _sub(0, [_parked(1, "2026-01-01T00:00:01.000Z")])
    merged = merge_subscription({0: group0, 1: shard1}, 2)
    assert [item["event"]["id"] for item in merged["parked"]] == ["evt1_1", "evt_9", "evt_2"]


def test_a_shard_without_a_copy_yet_counts_nothing() -> None:
    group0 = _sub(7, [_parked(3, "2026-01-01T00:00:02.000Z")])
    merged = merge_subscription({0: group0, 1: None, 2: _sub(2, [])}, 3)
    assert merged["cursor_seq"] == "v1.7..2"
    assert merged["parked_count"] == 1
    assert [item["event"]["id"] for item in merged["parked"]] == ["evt_3"]
    assert merged["shards"][1] == {
        "shard": 1,
        "copied": False,
        "cursor_seq": None,
        "oldest_undelivered_at": None,
        "parked_count": 0,
        "parked_dropped": 0,
        "lag_events": 0,
        "lag_s": 0.0,
        "connected": None,
    }


def test_the_connection_of_every_shards_relay_as_one() -> None:
    def merged(*states: bool | None) -> bool | None:
        parts = {k: _sub(0, [], connected=state) for k, state in enumerate(states)}
        answer: bool | None = merge_subscription(parts, len(states))["connected"]
        return answer

    assert merged(None, None) is None  # no relay tried yet (or no leader answered)
    assert merged(None, True) is True
    assert merged(True, False, True) is False
    assert merged(True, True) is True


def test_a_list_is_group_0s_subscriptions_each_merged() -> None:
    def listed(sub_id: str, cursor: int, parked_count: int) -> dict[str, Any]:
        body = _sub(cursor, [], id=sub_id, parked_count=parked_count)
        del body["parked"]
        return body

    lists = {
        0: [listed("sub_b", 1, 0), listed("sub_a", 2, 1)],
        1: [listed("sub_a", 5, 2), listed("sub_gone", 9, 9)],
        2: [],
    }
    merged = merge_subscriptions(lists, 3)
    assert [sub["id"] for sub in merged] == ["sub_b", "sub_a"]
    assert [sub["cursor_seq"] for sub in merged] == ["v1.1..", "v1.2.5."]
    assert [sub["parked_count"] for sub in merged] == [0, 3]
    assert all("parked" not in sub for sub in merged)
    assert [shard["copied"] for shard in merged[1]["shards"]] == [True, True, False]


def test_the_retry_sums_every_shards_count() -> None:
    assert merge_retried({0: 2, 1: None, 2: 3}, 3) == {
        "retried": 5,
        "shards": [
            {"shard": 0, "copied": True, "retried": 2},
            {"shard": 1, "copied": False, "retried": 0},
            {"shard": 2, "copied": True, "retried": 3},
        ],
    }


def _error(code: str, **details: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": code, "details": details}}


def test_a_shards_error_names_the_shard() -> None:
    ok: tuple[int, dict[str, Any]] = (200, {"retried": 0})
    assert refused([ok, (404, _error("not_found")), ok]) is None  # no copy yet
    group0 = refused([(404, _error("not_found")), ok, ok])
    assert group0 is not None and group0.status == 404
    down = refused([ok, ok, (503, {"error": {"code": "no_leader", "message": "no leader"}})])
    assert down is not None and down.status == 503
    assert down.headers["Retry-After"] == "1"
    assert down.body is not None
    body = json.loads(bytes(down.body))  # type: ignore[arg-type]
    assert body["error"]["code"] == "no_leader"
    assert body["error"]["details"] == {"shard": 2}
    named = refused([ok, (503, _error("no_leader", shard=1)), ok])
    assert named is not None and named.body is not None
    assert json.loads(bytes(named.body))["error"]["details"] == {"shard": 1}  # type: ignore[arg-type]
