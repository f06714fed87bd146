"""Counts and overviews of every shard (docs/shards.md, section 3): queues,
tenants, the reconciliation report, the dashboard's overview, the charts'
series and /metrics, in a node of several shards.

Each shard answers for its own jobs; the node sums what is counted and
keeps group 0's word for what is configured there (queue and tenant
settings, the nodes, the leader history, subscriptions):

- **queues** (`GET /v1/queues`, `/v1/queues/{name}`): depth, running,
  throttled, blocked keys and reconciling summed; the oldest runnable job
  is the oldest of any shard; tokens summed over the shards that have a
  rate; the circuit is open if any shard's is; settings are group 0's.
  A queue no shard knows is 404.
- **tenants** (`GET /v1/tenants`, `/v1/tenants/{name}`): queued, running
  and throttled summed; settings are group 0's.
- **the reconciliation report**: lists merged (reconciling oldest first,
  completed newest first) and cut to `limit`, totals summed, hourly counts
  added by hour.
- **the overview** (`GET /v1/overview`): status counts, queues and the
  per-queue counters summed; dead letters, stuck jobs and recent errors
  merged; the rest is group 0's. Each shard's part comes from the node
  that hosts its leader when that is known (stuck jobs and counters are a
  leader's knowledge), else from this node's replica; `shards` says which.
- **the charts' series** (`GET /v1/stats/series`): per 5 s bucket, rates
  and depth summed, the oldest runnable age the greatest, the lag p99 the
  greatest (an upper bound of the p99 of all claims: at least 99 % of each
  shard's claims were that fast). A shard without the queue's series adds
  nothing; a bucket unknown in any shard is unknown.
- **/metrics**: every series of this node's processes, each with a label
  `shard="k"` (group 0's too), as Prometheus users sum or split them.
  A shard process that does not answer leaves its series out.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from raftsched.api.jsonbody import json_response
from raftsched.api.requests import Handler
from raftsched.api.validation import query_integer
from raftsched.core.jobs.flow_queries import BLOCKED_LISTED_MAX
from raftsched.limits import LIST_LIMIT_MAX

if TYPE_CHECKING:
    from raftsched.api.shard_routing import ShardRouter

Gather = Callable[["ShardRouter", web.Request, Handler], Awaitable[web.StreamResponse]]
Answers = Sequence[tuple[int, dict[str, Any]]]

DEAD_LETTERS_SHOWN: Final = 20  # as api.dashboard
RECONCILIATION_LISTED_DEFAULT: Final = 100  # as api.reconciliation


# -- merging (pure: JSON answers in, JSON out) ----------------------------------------


def _total(values: Iterable[Any]) -> Any:
    """The sum of numbers; None if any is None (a part that is unknown)."""
    total: Any = 0
    for value in values:
        if value is None:
            return None
        total += value
    return total


def _greatest(values: Iterable[Any]) -> Any:
    known = [value for value in values if value is not None]
    return max(known) if known else None


def merge_queue(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One queue as every shard shows it; `parts[0]` is the one whose
    settings stand (group 0's when it knows the queue)."""
    body = dict(parts[0])
    for name in ("depth", "running", "throttled", "blocked_keys", "reconciling"):
        body[name] = sum(part.get(name) or 0 for part in parts)
    oldest = [part["oldest_runnable_at"] for part in parts if part.get("oldest_runnable_at")]
    body["oldest_runnable_at"] = min(oldest) if oldest else None
    body["oldest_runnable_age_s"] = _greatest(part.get("oldest_runnable_age_s") for part in parts)
    tokens = [part["tokens"] for part in parts if part.get("tokens") is not None]
    body["tokens"] = sum(tokens) if tokens else None
    circuits = [part["circuit"] for part in parts if part.get("circuit")]
    if body.get("circuit") and circuits:
        body["circuit"] = {
            **body["circuit"],
            "open": any(circuit["open"] for circuit in circuits),
            "recent_failures": sum(circuit["recent_failures"] for circuit in circuits),
            "recent_outcomes": sum(circuit["recent_outcomes"] for circuit in circuits),
        }
    blocked = [entry for part in parts for entry in part.get("blocked") or ()]
    if blocked:
        body["blocked"] = blocked[:BLOCKED_LISTED_MAX]
    return body


def merge_tenant(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    body = dict(parts[0])
    for name in ("queued", "running", "throttled"):
        body[name] = sum(part.get(name) or 0 for part in parts)
    return body


def merge_named(
    lists: Sequence[Sequence[Mapping[str, Any]]],
    merge_one: Callable[[Sequence[Mapping[str, Any]]], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Items named alike across the shards' lists (queues, tenants), merged,
    in name order; each merge starts with the earliest shard's item."""
    named: dict[str, list[Mapping[str, Any]]] = {}
    for items in lists:
        for item in items:
            named.setdefault(item["name"], []).append(item)
    return [merge_one(named[name]) for name in sorted(named)]


def merge_report(reports: Sequence[Mapping[str, Any]], limit: int) -> dict[str, Any]:
    """Reconciliation reports of every shard as one. Hours are aligned by
    their start: a shard whose clock is already in the next hour counts
    its first hour out of the window of the latest."""
    latest = max(reports, key=lambda report: report["since"])
    buckets: list[str] = latest["unknown_outcomes"]["buckets"]
    index = {bucket: position for position, bucket in enumerate(buckets)}
    unknown: dict[str, list[int]] = {}
    endings: dict[str, dict[str, int]] = {}
    for report in reports:
        own = report["unknown_outcomes"]["buckets"]
        for queue in report["unknown_outcomes"]["queues"]:
            counts = unknown.setdefault(queue["queue"], [0] * len(buckets))
            for bucket, count in zip(own, queue["counts"], strict=True):
                if bucket in index:
                    counts[index[bucket]] += count
        for decision in report["decisions"]:
            queue = decision["queue"]
            totals = endings.setdefault(queue, {})
            for kind, count in decision.items():
                if kind != "queue":
                    totals[kind] = totals.get(kind, 0) + count

    def listed(part: str, key: str, newest_first: bool) -> dict[str, Any]:
        jobs = [job for report in reports for job in report[part]["jobs"]]
        jobs.sort(key=lambda job: job[key], reverse=newest_first)
        total = sum(report[part]["total"] for report in reports)
        return {"jobs": jobs[:limit], "total": total, "truncated": total > min(limit, len(jobs))}

    return {
        "now": max(report["now"] for report in reports),
        "since": latest["since"],
        "hours": latest["hours"],
        "reconciling": listed("reconciling", "since", newest_first=False),
        "unknown_outcomes": {
            "buckets": buckets,
            "queues": [
                {"queue": queue, "total": sum(counts), "counts": counts}
                for queue, counts in sorted(unknown.items())
            ],
        },
        "decisions": [{"queue": queue, **endings[queue]} for queue in sorted(endings)],
        "completed": listed("completed", "completed_at", newest_first=True),
    }


def merge_overview(parts: Mapping[int, Mapping[str, Any]], errors_shown: int) -> dict[str, Any]:
    """The overview of every shard as one; group 0's (`parts[0]`) names
    the nodes, the leader history, the skew and the subscriptions' lag."""
    body = dict(parts[0])
    shown = list(parts.values())
    counts: dict[str, int] = {}
    for part in shown:
        for status, count in part["status_counts"].items():
            counts[status] = counts.get(status, 0) + count
    body["status_counts"] = counts
    body["queues"] = [
        {
            "name": queue[0]["name"],
            "depth": sum(item["depth"] for item in queue),
            "running": sum(item["running"] for item in queue),
            "oldest_runnable_age_s": _greatest(item["oldest_runnable_age_s"] for item in queue),
        }
        for queue in _by_name(part["queues"] for part in shown)
    ]
    dead = [item for part in shown for item in part["dead_letters"]]
    dead.sort(key=lambda item: item["updated_at"], reverse=True)
    body["dead_letters"] = dead[:DEAD_LETTERS_SHOWN]
    stuck = [item for part in shown for item in part["stuck_jobs"]]
    stuck.sort(key=lambda item: item["quiet_s"], reverse=True)
    body["stuck_jobs"] = stuck
    errors = [item for part in shown for item in part["recent_errors"]]
    errors.sort(key=lambda item: item["at_ms"], reverse=True)
    body["recent_errors"] = errors[:errors_shown]
    counters: dict[str, dict[str, float]] = {}
    for part in shown:
        for queue, totals in part["counters"].items():
            into = counters.setdefault(queue, {})
            for name, value in totals.items():
                into[name] = into.get(name, 0.0) + value
    body["counters"] = dict(sorted(counters.items()))
    return body


def _by_name(lists: Iterable[Iterable[Mapping[str, Any]]]) -> list[list[Mapping[str, Any]]]:
    named: dict[str, list[Mapping[str, Any]]] = {}
    for items in lists:
        for item in items:
            named.setdefault(item["name"], []).append(item)
    return [named[name] for name in sorted(named)]


# How each of the series' fields combines over the shards, per bucket.
_SERIES_SUMMED: Final = ("succeeded_per_s", "failed_per_s", "dead_lettered_per_s", "depth")
_SERIES_GREATEST_KNOWN: Final = ("due_to_lease_p99_s",)
_SERIES_GREATEST: Final = ("oldest_runnable_age_s",)


def merge_series(windows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The charts' series of every shard that has one, bucket by bucket
    (`windows[0]` names the node); only the buckets every shard's window
    holds (their clocks may stand a bucket apart at the window's ends)."""
    body = dict(windows[0])
    common = set(body["at"])
    for window in windows[1:]:
        common &= set(window["at"])
    at = [bucket for bucket in body["at"] if bucket in common]
    columns = []
    for window in windows:
        position = {bucket: index for index, bucket in enumerate(window["at"])}
        columns.append((window, [position[bucket] for bucket in at]))
    for field in (*_SERIES_SUMMED, *_SERIES_GREATEST, *_SERIES_GREATEST_KNOWN):
        values = []
        for index in range(len(at)):
            parts = [window[field][rows[index]] for window, rows in columns]
            if field in _SERIES_SUMMED:
                values.append(_total(parts))
            elif field in _SERIES_GREATEST:
                values.append(None if None in parts else max(parts))
            else:
                values.append(_greatest(parts))
        body[field] = values
    body["at"] = at
    body["queues"] = sorted({queue for window in windows for queue in window["queues"]})
    body["sampling_since"] = max(window["sampling_since"] for window in windows)
    return body


# A sample line of the text format: its name, then its labels or a space.
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{\}|\{| )")


def labelled_metrics(texts: Sequence[tuple[int, bytes]]) -> bytes:
    """The Prometheus text of several processes as one: each sample gains
    `shard="k"`; each family's HELP and TYPE come once, its samples
    together (the format wants a family in one block)."""
    families: dict[str, list[str]] = {}
    current: list[str] | None = None
    for shard, raw in texts:
        for line in raw.decode().splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                name = line.split(" ", 3)[2]
                if line.startswith("# HELP "):
                    known = name in families
                    current = families.setdefault(name, [])
                    if not known:
                        current.append(line)
                elif current is not None and len(current) == 1:
                    current.append(line)
                continue
            if not line or line.startswith("#"):
                continue
            found = _SAMPLE.match(line)
            if found is None or current is None:
                continue
            name, opening = found.group(1), found.group(2)
            rest = line[found.end() :]
            label = f'shard="{shard}"'
            if opening == "{}":
                current.append(f"{name}{{{label}}}{rest}")
            elif opening == "{":
                current.append(f"{name}{{{label},{rest}")
            else:
                current.append(f"{name}{{{label}}} {rest}")
    lines = [line for block in families.values() for line in block]
    return ("\n".join(lines) + "\n").encode()


# -- gathering ---------------------------------------------------------------------------


def failed(answers: Answers, allowed: frozenset[int] = frozenset()) -> web.Response | None:
    """The first shard's error among `answers` (but the `allowed` statuses),
    as the answer; None if there is none. A partial list or count would
    look complete, so a shard that cannot answer fails the read."""
    for status, answer in answers:
        if status != 200 and status not in allowed:
            headers = {"Retry-After": "1"} if status in (503, 504) else None
            return json_response(answer, status=status, headers=headers)
    return None


async def ask_every(
    router: ShardRouter,
    request: web.Request,
    handler: Handler,
    paths: Mapping[int, str],
    headers: Mapping[str, str],
) -> list[tuple[int, dict[str, Any]]]:
    """Each shard's (status, answer) to GET its path, from its leader (or
    this node's replica for a stale read), in the order of `paths`."""

    def in_group0(path: str) -> Callable[[int], Awaitable[dict[str, Any]]]:
        return lambda _size: router.answered_here(request, handler, path, headers)

    return list(
        await asyncio.gather(
            *(
                router.part(
                    request,
                    shard,
                    path,
                    None,
                    in_group0(path),
                    headers=headers,
                    what=f"the read of {request.path}",
                )
                for shard, path in paths.items()
            )
        )
    )


async def every_shard(
    router: ShardRouter, request: web.Request, handler: Handler
) -> list[tuple[int, dict[str, Any]]]:
    """Each shard's answer to the request's own path and query (`ask_every`)."""
    path = str(request.rel_url)
    return await ask_every(router, request, handler, dict.fromkeys(range(router.count), path), {})


async def _queues(
    router: ShardRouter, request: web.Request, handler: Handler
) -> web.StreamResponse:
    answers = await every_shard(router, request, handler)
    refused = failed(answers)
    if refused is not None:
        return refused
    lists = [answer["queues"] for _, answer in answers]
    return json_response({"queues": merge_named(lists, merge_queue)})


async def _queue(router: ShardRouter, request: web.Request, handler: Handler) -> web.StreamResponse:
    answers = await every_shard(router, request, handler)
    refused = failed(answers, frozenset({404}))
    if refused is not None:
        return refused
    parts = [answer["queue"] for status, answer in answers if status == 200]
    if not parts:
        return json_response(answers[0][1], status=404)
    return json_response({"queue": merge_queue(parts)})


async def _tenants(
    router: ShardRouter, request: web.Request, handler: Handler
) -> web.StreamResponse:
    answers = await every_shard(router, request, handler)
    refused = failed(answers)
    if refused is not None:
        return refused
    lists = [answer["tenants"] for _, answer in answers]
    return json_response({"tenants": merge_named(lists, merge_tenant)})


async def _tenant(
    router: ShardRouter, request: web.Request, handler: Handler
) -> web.StreamResponse:
    answers = await every_shard(router, request, handler)
    refused = failed(answers)
    if refused is not None:
        return refused
    return json_response({"tenant": merge_tenant([answer["tenant"] for _, answer in answers])})


async def _reconciliation(
    router: ShardRouter, request: web.Request, handler: Handler
) -> web.StreamResponse:
    answers = await every_shard(router, request, handler)
    refused = failed(answers)
    if refused is not None:
        return refused
    limit = query_integer(
        request.query, "limit", 1, LIST_LIMIT_MAX, default=RECONCILIATION_LISTED_DEFAULT
    )
    assert limit is not None  # every shard checked it
    return json_response(merge_report([answer for _, answer in answers], limit))


async def _overview(
    router: ShardRouter, request: web.Request, handler: Handler
) -> web.StreamResponse:
    path = str(request.rel_url)
    answers = await asyncio.gather(
        router.local(request, handler, 0, path),
        *(router.at_leader(request, handler, shard, path) for shard in range(1, router.count)),
    )
    (status, base), *others = answers
    if status != 200:
        return json_response(base, status=status)
    parts = {0: base}
    shards = [{"shard": 0, "from": base["node"]["id"]}]
    for shard, ((status, answer), source) in enumerate(others, start=1):
        if status == 200:
            parts[shard] = answer
        shards.append({"shard": shard, "from": source if status == 200 else None})
    errors_shown = query_integer(request.query, "errors", 0, 1 << 30, default=50)
    assert errors_shown is not None  # group 0 checked it
    body = merge_overview(parts, errors_shown)
    body["shards"] = shards
    return json_response(
        body, headers={"Raftsched-Applied-Index": str(base["node"]["applied_index"])}
    )


async def _series(
    router: ShardRouter, request: web.Request, handler: Handler
) -> web.StreamResponse:
    path = str(request.rel_url)
    answers = await asyncio.gather(
        *(router.local(request, handler, shard, path) for shard in range(router.count))
    )
    refused = failed(answers, frozenset({404}))
    if refused is not None:
        return refused
    windows = [answer for status, answer in answers if status == 200]
    if not windows:
        return json_response(answers[0][1], status=404)
    return json_response({**merge_series(windows), "node_id": router.node.node_id})


async def _metrics(
    router: ShardRouter, request: web.Request, handler: Handler
) -> web.StreamResponse:
    own = await handler(request)
    if own.status != 200 or not isinstance(own, web.Response) or not isinstance(own.body, bytes):
        return own
    texts = await asyncio.gather(
        *(router.local_text(request, shard, "/metrics") for shard in range(1, router.count))
    )
    parts = [(0, own.body)]
    parts += [(shard, text) for shard, text in enumerate(texts, start=1) if text is not None]
    headers = {name: own.headers[name] for name in ("Content-Type", "X-Content-Type-Options")}
    return web.Response(body=labelled_metrics(parts), headers=headers)


GATHERED: Final[dict[str, Gather]] = {
    "/v1/queues": _queues,
    "/v1/queues/{name}": _queue,
    "/v1/tenants": _tenants,
    "/v1/tenants/{name}": _tenant,
    "/v1/reconciliation": _reconciliation,
    "/v1/overview": _overview,
    "/v1/stats/series": _series,
    "/metrics": _metrics,
}
