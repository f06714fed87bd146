"""Reads of every shard (docs/shards.md, section 3, "Lists and counts", and
"Events and subscriptions"): a node of several shards answers a list, the
event stream and the counts by asking each shard and merging.

Each shard is asked as a read of its own would be: linearizable reads go to
the shard's leader (group 0 in this process when this node leads it, a
shard process over its socket, which answers itself when it leads the
shard or the read is `consistency=stale`, else its 307 is followed to the
node that hosts the leader, with the caller's credentials and the shard
named), so each shard's part reflects every write that shard acknowledged
before the read arrived. Across shards a read is not one snapshot. What
a node keeps in memory (the overview, the charts' series, /metrics) is its
own processes', read on the node that is asked, as with one shard.

- **Lists** (`GET /v1/jobs`, `/v1/workflows`, `/v1/schedules`) ask every
  shard not yet exhausted for a page after its own cursor, with the cursor
  after each item (`Raftsched-Cursors: each`), and merge them
  (raftsched.shard_merge): jobs and workflows newest first by
  (created_at, shard), schedules by id. The cursor is `v1.<c0>.<c1>...`.
- **Events** merge the shards' outboxes oldest first by (at, shard); each
  event gains `shard` and `id` (`evt_<seq>` in shard 0, `evt<k>_<seq>` in
  shard k). `after` is `v1.<seq0>.<seq1>...`; plain digits are shard 0's
  seq (the stream a node of an earlier release gave), the others from
  their start. `next_after` continues after the page; `last_seq` and
  `first_seq` are cursors of every shard's own.
- **Counts** (queues, tenants, the reconciliation report, the overview,
  the series, /metrics): api.shard_counts.
- **Subscriptions** (`GET /v1/subscriptions[/{id}]`): every shard's copy,
  its cursor and parked events (api.shard_subscriptions).

Any shard's error (503 while it elects a leader, 403 for a scope) is the
answer: a partial list would look complete.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web
from yarl import URL

from raftsched.api import events, jobs, schedules, shard_counts, shard_subscriptions, workflows
from raftsched.api.errors import ApiError, invalid
from raftsched.api.jsonbody import json_response
from raftsched.api.requests import Handler
from raftsched.api.shard_counts import ask_every, failed
from raftsched.shard_merge import DONE, START, Page, Position, below_next, merge, parse_cursor
from raftsched.shard_merge import format_cursor as format_positions
from raftsched.shards import CURSORS_HEADER, event_id

if TYPE_CHECKING:
    from raftsched.api.shard_routing import ShardRouter

Gather = Callable[["ShardRouter", web.Request, Handler], Awaitable[web.StreamResponse]]
_EACH: Final = {CURSORS_HEADER: "each"}


@dataclass(frozen=True, slots=True)
class ListKind:
    """How one list is merged: its answer's field, each item's merge key
    and direction, how a shard is pinned at its first item, and the check
    of its query (the page size)."""

    items: str
    key: Callable[[Mapping[str, Any]], Any]
    newest_first: bool
    resume: Callable[[str], Position] | None
    check: Callable[[Mapping[str, str]], int]


_JOBS: Final = ListKind(
    "jobs", lambda job: job["created_at"], True, below_next, jobs.check_list_query
)
_WORKFLOWS: Final = ListKind(
    "workflows", lambda flow: flow["created_at"], True, below_next, workflows.check_list_query
)
_SCHEDULES: Final = ListKind(
    "schedules", lambda schedule: schedule["id"], False, None, schedules.check_list_query
)


def _with_query(request: web.Request, changes: Mapping[str, str | None]) -> str:
    """The request's path and query, with `changes` made (None removes)."""
    query = {name: value for name, value in request.query.items() if name not in changes}
    query.update({name: value for name, value in changes.items() if value is not None})
    return str(URL(request.path).with_query(query))


def _page(kind: ListKind, shard: int, answer: Mapping[str, Any]) -> Page:
    items = answer.get(kind.items)
    cursors = answer.get("cursors")
    if not isinstance(items, list) or not isinstance(cursors, list) or len(items) != len(cursors):
        # A node of an earlier release, mid-upgrade, does not name them.
        raise ApiError(
            "unavailable",
            f"shard {shard}'s page names no cursor per item; retry once every node runs "
            "this release",
            {"reason": "shard_list_cursors", "shard": shard},
            headers={"Retry-After": "1"},
        )
    return Page(
        items, cursors, [kind.key(item) for item in items], answer.get("next_cursor") is not None
    )


async def gather_list(
    kind: ListKind, router: ShardRouter, request: web.Request, handler: Handler
) -> web.StreamResponse:
    limit = kind.check(request.query)
    text = request.query.get("cursor")
    positions = [START] * router.count if text is None else parse_cursor(text, router.count)
    if positions is None:
        raise invalid("cursor", "not a cursor this API returned")
    paths = {
        shard: _with_query(request, {"cursor": position})
        for shard, position in enumerate(positions)
        if position != DONE
    }
    answers = await ask_every(router, request, handler, paths, _EACH)
    refused = failed(answers)
    if refused is not None:
        return refused
    pages = {
        shard: _page(kind, shard, answer) for shard, (_, answer) in zip(paths, answers, strict=True)
    }
    merged = merge(pages, positions, limit, newest_first=kind.newest_first, resume=kind.resume)
    return json_response(
        {kind.items: [item for _, item in merged.items], "next_cursor": merged.cursor()}
    )


# -- events -------------------------------------------------------------------------


def _after(text: str | None, shards: int) -> list[Position]:
    """Each shard's seq to continue after: `v1.<seq0>.<seq1>...`, or digits
    for shard 0's (the others from their start)."""
    from_start: list[Position] = ["0"] * shards
    if text is None:
        return from_start
    if text.isascii() and text.isdigit() and len(text) <= 19:
        return [str(int(text)), *from_start[1:]]
    positions = parse_cursor(text, shards)
    if positions is None or any(
        position in (START, DONE) or len(str(position)) > 19 for position in positions
    ):
        raise invalid("after", "a seq, or the cursor (next_after, last_seq) an answer gave")
    return [str(int(str(position))) for position in positions]


async def gather_events(
    router: ShardRouter, request: web.Request, handler: Handler
) -> web.StreamResponse:
    """`GET /v1/events` of every shard: answered at once when any shard has
    an event after its position; else every shard is long-polled, and the
    first to have one answers (the others' polls are dropped)."""
    wait_s, limit, _ = events.check_events_query(request.query)
    positions = _after(request.query.get("after"), router.count)
    deadline = time.monotonic() + wait_s

    def paths(wait: float) -> dict[int, str]:
        return {
            shard: _with_query(request, {"after": position, "wait_s": f"{wait:.3f}"})
            for shard, position in enumerate(positions)
        }

    answers = await ask_every(router, request, handler, paths(0), {})
    refused = failed(answers)
    if refused is not None:
        return refused
    seen = dict(enumerate(answer for _, answer in answers))
    remaining = deadline - time.monotonic()
    if remaining > 0 and not any(answer.get("events") for answer in seen.values()):
        polled = await _first_with_events(router, request, handler, paths(remaining))
        if isinstance(polled, web.Response):
            return polled
        seen.update(polled)
    return json_response(_merged_events(seen, positions, limit))


async def _first_with_events(
    router: ShardRouter, request: web.Request, handler: Handler, paths: Mapping[int, str]
) -> dict[int, dict[str, Any]] | web.Response:
    """Long-poll every shard; the answers that came by the time the first
    one had events (or all answered), or the first error."""
    tasks = {
        asyncio.ensure_future(ask_every(router, request, handler, {shard: path}, {})): shard
        for shard, path in paths.items()
    }
    done: dict[int, dict[str, Any]] = {}
    pending = set(tasks)
    try:
        while pending:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                [(status, answer)] = task.result()
                if status != 200:
                    refused = failed([(status, answer)])
                    assert refused is not None
                    return refused
                done[tasks[task]] = answer
            if any(answer.get("events") for answer in done.values()):
                break
    finally:
        for task in pending:
            task.cancel()
    return done


def _merged_events(
    answers: Mapping[int, Mapping[str, Any]], positions: Sequence[Position], limit: int
) -> dict[str, Any]:
    pages = {}
    for shard, answer in answers.items():
        found = answer.get("events") or []
        pages[shard] = Page(
            found, [str(event["seq"]) for event in found], [event["at"] for event in found], False
        )
    merged = merge(pages, positions, limit, newest_first=False, endless=True)
    shown = [
        {**event, "id": event_id(shard, event["seq"]), "shard": shard}
        for shard, event in merged.items
    ]
    shards = sorted(answers)
    return {
        "events": shown,
        "next_after": format_positions(merged.positions),
        "last_seq": format_positions([str(answers[shard]["last_seq"]) for shard in shards]),
        "first_seq": format_positions([str(answers[shard]["first_seq"]) for shard in shards]),
    }


async def _jobs(router: ShardRouter, request: web.Request, handler: Handler) -> web.StreamResponse:
    return await gather_list(_JOBS, router, request, handler)


async def _workflows(
    router: ShardRouter, request: web.Request, handler: Handler
) -> web.StreamResponse:
    return await gather_list(_WORKFLOWS, router, request, handler)


async def _schedules(
    router: ShardRouter, request: web.Request, handler: Handler
) -> web.StreamResponse:
    return await gather_list(_SCHEDULES, router, request, handler)


# The routes a node of several shards answers by reading every shard (GET).
GATHERED: Final[dict[str, Gather]] = {
    "/v1/jobs": _jobs,
    "/v1/workflows": _workflows,
    "/v1/schedules": _schedules,
    "/v1/events": gather_events,
    **shard_counts.GATHERED,
    **shard_subscriptions.GATHERED,
}
