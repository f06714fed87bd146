"""Webhook subscriptions' views and their operator retry in a node of several
shards (docs/shards.md, "Events and subscriptions").

A subscription is created in group 0 and copied into every shard, whose
leader delivers that shard's outbox to its copy with a cursor and parked
events of its own. So a node of several shards answers:

- **`GET /v1/subscriptions/{id}`** by reading every shard's copy, each at
  its shard's leader as a list is (api.shard_reads): group 0's record
  (id, URL, types, creation) with `parked_count` and `parked_dropped`
  summed, `oldest_undelivered_at` the oldest of any shard, `cursor_seq`
  the cursor of every shard's own (`v1.<c0>.<c1>...`, as `GET /v1/events`'s
  `last_seq`; an empty part for a shard whose copy is not made yet), the
  parked events of every shard merged oldest parked first by (parked_at,
  shard), each shard's in its own order, each item with `shard` and its
  event with `id` (`evt_<seq>`, `evt<k>_<seq>`) and `shard`; the relays'
  `lag_events` summed, `lag_s` the largest, `connected` false when any
  shard's relay could not reach its broker or receiver at its last attempt,
  else true when one did, else null; and `shards`, each shard's own cursor,
  oldest undelivered event, parked counts, lag and connection, and whether
  its copy is made (`copied`).
- **`GET /v1/subscriptions`**: each of group 0's subscriptions so.
- **`POST /v1/subscriptions/{id}/retry`** by proposing the retry in every
  shard's copy, at its leader: `retried` summed, and `shards`. A shard
  that cannot take it (503 `no_leader` while it elects a leader) is the
  answer, naming it in `details.shard`: the other shards' retries stand,
  and repeating the retry is harmless (it marks what is parked again).

A shard without a copy yet answers 404: it counts nothing and parks
nothing. Group 0's 404 is the answer. Any other error of a shard fails the
request, as a read of every shard does (a partial view would look whole).
With `Raftsched-Shard: k` each of these is shard k's copy alone, as a
node of another asks for a shard's part. A one-shard cluster's answers are
as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from raftsched.api.jsonbody import json_response
from raftsched.api.requests import Handler
from raftsched.api.shard_counts import every_shard, failed
from raftsched.shard_merge import START, Page, Position, format_cursor, merge
from raftsched.shards import event_id

if TYPE_CHECKING:
    from raftsched.api.shard_routing import ShardRouter

    Gather = Callable[[ShardRouter, web.Request, Handler], Awaitable[web.StreamResponse]]

Answers = Sequence[tuple[int, dict[str, Any]]]

# A shard's 404: its copy is not made yet (group 0's is the answer).
_NO_COPY: Final = 404


# -- merging (pure: JSON answers in, JSON out) ----------------------------------------


def merge_subscription(
    parts: Mapping[int, Mapping[str, Any] | None], shards: int
) -> dict[str, Any]:
    """One subscription as every shard's copy shows it: `parts[0]` is group
    0's (required), `parts[k]` shard k's copy, None while it has none."""
    base = parts[0]
    assert base is not None
    copies = [parts.get(shard) for shard in range(shards)]
    body = dict(base)
    positions: list[Position] = [
        START if copy is None else str(copy["cursor_seq"]) for copy in copies
    ]
    body["cursor_seq"] = format_cursor(positions)
    oldest = [copy["oldest_undelivered_at"] for copy in copies if copy]
    body["oldest_undelivered_at"] = min((at for at in oldest if at), default=None)
    body["parked_count"] = sum(copy["parked_count"] for copy in copies if copy)
    body["parked_dropped"] = sum(copy["parked_dropped"] for copy in copies if copy)
    body["lag_events"] = sum(copy.get("lag_events", 0) for copy in copies if copy)
    body["lag_s"] = max((copy.get("lag_s", 0.0) for copy in copies if copy), default=0.0)
    body["connected"] = _connected([copy.get("connected") for copy in copies if copy])
    if "parked" in base:
        body["parked"] = _merged_parked(
            {shard: copy["parked"] for shard, copy in enumerate(copies) if copy}, shards
        )
    body["shards"] = [
        {
            "shard": shard,
            "copied": copy is not None,
            "cursor_seq": None if copy is None else copy["cursor_seq"],
            "oldest_undelivered_at": None if copy is None else copy["oldest_undelivered_at"],
            "parked_count": 0 if copy is None else copy["parked_count"],
            "parked_dropped": 0 if copy is None else copy["parked_dropped"],
            "lag_events": 0 if copy is None else copy.get("lag_events", 0),
            "lag_s": 0.0 if copy is None else copy.get("lag_s", 0.0),
            "connected": None if copy is None else copy.get("connected"),
        }
        for shard, copy in enumerate(copies)
    ]
    return body


def _connected(states: Sequence[bool | None]) -> bool | None:
    """Every shard's relay's connection as one: false when any could not
    reach its broker or receiver, else true when any did, else unknown."""
    if False in states:
        return False
    return True if True in states else None


def _merged_parked(
    lists: Mapping[int, Sequence[Mapping[str, Any]]], shards: int
) -> list[dict[str, Any]]:
    """Every shard's parked events, oldest parked first by (parked_at,
    shard), each shard's in its own order; each names its shard."""
    pages = {
        shard: Page(
            items,
            [str(item["event"]["seq"]) for item in items],
            [item["parked_at"] for item in items],
            False,
        )
        for shard, items in lists.items()
    }
    total = sum(len(items) for items in lists.values())
    merged = merge(pages, [START] * shards, max(total, 1), newest_first=False)
    return [
        {
            **item,
            "event": {
                **item["event"],
                "id": event_id(shard, item["event"]["seq"]),
                "shard": shard,
            },
            "shard": shard,
        }
        for shard, item in merged.items
    ]


def merge_subscriptions(
    lists: Mapping[int, Sequence[Mapping[str, Any]] | None], shards: int
) -> list[dict[str, Any]]:
    """Group 0's subscriptions (`lists[0]`), in its order, each merged with
    the shards' copies of the same id (a copy group 0 no longer has, about
    to be deleted, is left out)."""
    by_shard = {
        shard: {copy["id"]: copy for copy in copies or ()} for shard, copies in lists.items()
    }
    return [
        merge_subscription(
            {0: sub, **{k: by_shard.get(k, {}).get(sub["id"]) for k in range(1, shards)}}, shards
        )
        for sub in lists[0] or ()
    ]


def merge_retried(retried: Mapping[int, int | None], shards: int) -> dict[str, Any]:
    """The retry's answer: each shard's count (None: it has no copy yet)."""
    counts = [retried.get(shard) for shard in range(shards)]
    return {
        "retried": sum(count or 0 for count in counts),
        "shards": [
            {"shard": shard, "copied": count is not None, "retried": count or 0}
            for shard, count in enumerate(counts)
        ],
    }


def refused(answers: Answers) -> web.Response | None:
    """The first shard's error among every shard's `answers` (in shard
    order), naming the shard in `details.shard`; a shard's 404 (no copy
    yet) is none, group 0's is."""
    for shard, (status, answer) in enumerate(answers):
        if status == 200 or (shard > 0 and status == _NO_COPY):
            continue
        return failed([(status, _naming(shard, answer))])
    return None


def _naming(shard: int, answer: dict[str, Any]) -> dict[str, Any]:
    error = answer.get("error")
    if not isinstance(error, dict):
        return answer
    details = error.get("details")
    if not isinstance(details, dict):
        details = {}
    if "shard" in details:
        return answer
    return {**answer, "error": {**error, "details": {**details, "shard": shard}}}


def _copies(answers: Answers, field: str) -> dict[int, Any]:
    return {
        shard: answer.get(field) if status == 200 else None
        for shard, (status, answer) in enumerate(answers)
    }


# -- gathering ---------------------------------------------------------------------------


def _gathering(key: str, merge: Callable[[dict[int, Any], int], Any]) -> Gather:
    """A read of every shard's copy (`key` of each answer), merged by `merge`;
    a shard's refusal is the answer (`refused`)."""

    async def gather(
        router: ShardRouter, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        answers = await every_shard(router, request, handler)
        failure = refused(answers)
        if failure is not None:
            return failure
        return json_response({key: merge(_copies(answers, key), router.count)})

    return gather


async def retry_every_shard(
    router: ShardRouter, request: web.Request, handler: Handler
) -> web.StreamResponse:
    """`POST /v1/subscriptions/{id}/retry` in every shard, each at its leader."""
    path = str(request.rel_url)

    async def in_group0(_size: int) -> dict[str, Any]:
        return await router.answered_here(request, handler, path, {})

    answers = await asyncio.gather(
        *(
            router.part(request, shard, path, {}, in_group0, what=f"the retry of {request.path}")
            for shard in range(router.count)
        )
    )
    failure = refused(answers)
    if failure is not None:
        return failure
    counts = {
        shard: answer.get("retried") if status == 200 else None
        for shard, (status, answer) in enumerate(answers)
    }
    return json_response(merge_retried(counts, router.count))


GATHERED: Final = {
    "/v1/subscriptions": _gathering("subscriptions", merge_subscriptions),
    "/v1/subscriptions/{subscription_id}": _gathering("subscription", merge_subscription),
}
