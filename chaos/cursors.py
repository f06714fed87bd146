"""Events cursors as the API writes them (docs/shards.md, "Events and
subscriptions"): plain digits in a one-shard cluster, `v1.<seq0>.<seq1>...`
in a sharded one, for `GET /v1/events`' `last_seq` and a subscription's
`cursor_seq` alike."""

from __future__ import annotations

from typing import Any


def cursor_seqs(cursor: Any) -> list[int | None]:
    """Each shard's seq in an events cursor: plain digits (one shard), or
    `v1.<seq0>.<seq1>...`, where an empty part is a shard with nothing yet
    (a subscription's copy not made)."""
    text = str(cursor)
    if not text.startswith("v1."):
        return [int(text)]
    return [int(part) if part else None for part in text.split(".")[1:]]


def shard0_seq(cursor: Any) -> int:
    """Shard 0's seq in an events cursor: plain digits, or `v1.<seq0>....`."""
    text = str(cursor)
    return int(text.split(".")[1]) if text.startswith("v1.") else int(text)
