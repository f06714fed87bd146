"""Routing in a node of several shards (docs/shards.md, sections 2 and 3).

A node started with `--shards S` (S > 1) answers every request as before,
after authentication, but first decides which shard it is for:

- **A request naming a shard** with `Raftsched-Shard: k` (workers' claims)
  goes to shard k, never anywhere else; on a route that is not a shard's
  (tokens, membership, queue settings, ...) the header is ignored. A value
  that names no shard is 400 `invalid_request`.
- **An id names its shard** (`raftsched.shards.shard_of_id`): a job and its
  history, effects, cancel, replay and lease operations, a workflow, a
  schedule. An id naming a shard >= S is 404.
- **A submission is placed**: by its ordering key, else its idempotency key
  (`raftsched.shards.key_shard`), else round-robin over the shards whose
  leader is known. Workflows and schedules are placed whole; a step or
  template whose ordering key belongs to another shard is 422
  `ordering_key_shard`. A batch of jobs goes where its keys place it; one
  whose keys place jobs in several shards needs an idempotency key on every
  job (else 422 `batch_spans_shards`), is validated whole, then split, each
  part proposed in its shard and the answers merged in the request's order.
  A lease batch is split by its jobs' shards.
- **Reads of every shard** (lists, counts, queues, tenants, the
  reconciliation report, the overview, the series, events, /metrics) ask
  each shard and merge (api.shard_reads, api.shard_counts); with the
  header they are that shard's alone.
- **Membership** (`POST /v1/cluster/nodes`, `DELETE .../{id}`) is changed
  in group 0 by the request; every shard follows group 0's directory
  (`ShardRouter.drive_membership`, below). With the header, a change is
  that shard's alone (the drivers' own requests, and an operator's repair).
- **Subscriptions** are written in group 0 and copied into every shard;
  their views read every shard's copy, and the operator's retry of parked
  events is proposed in every shard's copy (api.shard_subscriptions).
- **Everything else** (tokens, settings, backup) is answered by group 0,
  as before (backup: every group's, api.backup).

Membership of the shards. Group 0's replicated directory is what every
group's members must be. Each node, once a second, compares it with the
member directory of every shard whose leader is its own shard process, and
when they differ asks that process (over the socket, as the node itself)
for the one change that brings the shard closer: removing a member that
group 0 no longer has, else adding a member of group 0's directory that the
shard lacks, at its Raft address shifted by `k × stride`. Removals first,
the runbook's order for a replacement: a replaced node is usually dead,
and adding to a group that still counts it would need more voters than
are reachable (refused, quorum_at_risk), forever. The shard's own
membership code does the change exactly as group 0's does (one change at a
time, a new member caught up before the next, quorum checks, a removed
leader handing over), so a shard's change never stacks on another. A shard
led elsewhere is driven by the node hosting its leader; a new leader's node
takes over where the last stopped. `GET /v1/cluster` shows each shard's
members and change, and `membership.shards_behind` the shards whose members
are not yet group 0's.

Shard 0 is group 0, answered in this process. Shard k >= 1 is this node's
shard process, reached over the Unix socket in its data directory: the
request (method, path, query, headers, body) goes there with the caller's
principal in `INTERNAL_PRINCIPAL_HEADER`, and the answer streams back. A
shard process that leads its shard answers; one that does not answers its
own 307 to the node hosting the leader, which passes through unchanged (a
request the node placed gets `?shard=k` added to the Location, so that the
node it goes to keeps the placement of a job without keys). The parts of a
split batch whose shard leads elsewhere are sent on by the node itself to
that leader's node, with the caller's own credentials and the shard named.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, cast

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from raftsched.api import jobs, leases, scope, shard_reads, shard_subscriptions, workflows
from raftsched.api.errors import ApiError, from_proposal_error
from raftsched.api.jsonbody import json_response, loads
from raftsched.api.principal import ANONYMOUS, encode_principal, principal_if_set
from raftsched.api.requests import Handler, read_body, read_json
from raftsched.api.validation import choice, parse_job, require_object, string
from raftsched.core.jobs.quota_book import quotas_of
from raftsched.core.kernel import shard as core_shard
from raftsched.core.kernel.commands import JobSpec
from raftsched.limits import LEASE_BATCH_OPS_MAX, WAIT_S_MAX
from raftsched.logs import REQUEST_ID
from raftsched.node.lease_ops import PROPOSAL_ERRORS
from raftsched.node.proposer import NotLeader
from raftsched.node.shard_view import quotas_in_line, settings_digest, settings_of
from raftsched.node.view import NodeView
from raftsched.shards import (
    INTERNAL_KEY_HEADER,
    INTERNAL_PRINCIPAL_HEADER,
    SHARD_HEADER,
    SHARD_PORT_STRIDE,
    SHARD_QUERY,
    key_shard,
    shard_of_id,
    shift_address,
    socket_path,
)

log = logging.getLogger("raftsched.api")

# How often the node asks its shard processes who leads (round-robin skips
# a shard without a leader), and how long it waits for each answer.
STATUS_PERIOD_S: Final = 1.0
STATUS_TIMEOUT_S: Final = 3.0
# A shard process that does not accept the connection this fast is down.
CONNECT_TIMEOUT_S: Final = 5.0
# While a proxied request (a long poll) waits, whether its client left.
CLIENT_CHECK_S: Final = 0.5
# How long the shards' membership driver waits for this node's replica of
# group 0 to catch up with its leader before a change (else next period).
CATCH_UP_S: Final = 5.0
# Redirects the node follows itself for a part of a split batch.
PART_REDIRECTS_MAX: Final = 3
PART_TIMEOUT_S: Final = WAIT_S_MAX + 30.0  # a part's next claim may long-poll

_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# A shard process takes the principal its node names, never a client's
# claim to one, and needs no bearer secret.
_NOT_FORWARDED: Final = _HOP_BY_HOP | {
    INTERNAL_PRINCIPAL_HEADER.lower(),
    INTERNAL_KEY_HEADER.lower(),
    SHARD_HEADER.lower(),
    "authorization",
}
# Headers of a shard's answer the node sets itself.
_NOT_RETURNED: Final = _HOP_BY_HOP | {"date", "server"}
# What a part sent on to another node carries of the caller's request.
_PART_HEADERS: Final = ("Authorization", "traceparent", "tracestate", "X-Request-Id")

# A shard header value: a decimal number without sign, spaces or leading zeros.
_SHARD_VALUE = re.compile(r"0|[1-9][0-9]{0,3}")
# Path parameters that hold an id naming its shard.
_ID_PARAMS: Final = ("job_id", "workflow_id", "schedule_id")
# Routes the shard header may send to a shard: the shards' data, and what
# tells about one shard (its time and identity, readiness, status, digest).
# Reads that a node answers by asking every shard (api.shard_reads) are also
# one shard's with the header, which is how a node asks another node for a
# shard it leads; their routes' writes (queue and tenant settings) are
# group 0's whatever the header says.
_HEADER_PREFIXES: Final = ("/v1/jobs", "/v1/leases", "/v1/workflows", "/v1/schedules")
_HEADER_ROUTES: Final = frozenset(
    {
        "/v1/effects",
        "/v1/effects/{key}",
        "/v1/time",
        "/healthz",
        "/readyz",
        "/v1/cluster",
        "/v1/debug/digest",
        "/metrics",
        "/v1/backup",
        "/v1/cluster/nodes",
        "/v1/cluster/nodes/{node_id}",
        "/v1/subscriptions/{subscription_id}/retry",
    }
)

_PLACED: Final = web.RequestKey("raftsched_placed_shard", int)


def header_routable(method: str, route: str) -> bool:
    return (
        route in _HEADER_ROUTES
        or route.startswith(_HEADER_PREFIXES)
        or (method == "GET" and route in shard_reads.GATHERED)
    )


def routed_elsewhere(request: web.Request) -> bool:
    """Whether this request goes to a shard process rather than group 0, as
    far as its headers and path say (a submission's body is not read here).
    Authentication leaves the checks on a job's state to the shard that
    holds the job."""
    router = request.app.get(SHARD_ROUTER)
    return router is not None and router.static_shard(request) != 0


def redirect_location(request: web.Request, base_url: str) -> str:
    """Where a 307 sends `request`: the same path and query at `base_url`,
    with `?shard=k` when this node placed the request in shard k."""
    placed = request.get(_PLACED)
    url = request.rel_url
    if placed is not None:
        url = url.update_query({SHARD_QUERY: str(placed)})
    return base_url.rstrip("/") + str(url)


class ShardRouter:
    """The node process's side of its shards: which shard a request is for,
    and the connections to its shard processes."""

    def __init__(
        self,
        node: NodeView,
        count: int,
        data_dir: Path,
        *,
        pid_of: Callable[[int], int | None],
        peer_ssl: Any = None,
        stride: int = SHARD_PORT_STRIDE,
    ) -> None:
        self.node = node
        self.count = count
        self.stride = stride
        self._pid_of = pid_of
        self._peer_ssl = True if peer_ssl is None else peer_ssl
        self._sockets = {shard: socket_path(data_dir, shard) for shard in range(1, count)}
        self._sessions: dict[int, aiohttp.ClientSession] = {}
        self._remote: aiohttp.ClientSession | None = None
        # Each shard's last /readyz answer (None: its process did not answer).
        self.known: dict[int, dict[str, Any] | None] = dict.fromkeys(self._sockets)
        self._turn = itertools.count()
        self._poll_task: asyncio.Task[None] | None = None

    # -- lifecycle (the application's startup and cleanup) --------------------

    async def on_startup(self, app: web.Application) -> None:
        for shard, path in self._sockets.items():
            self._sessions[shard] = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(path)),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
                auto_decompress=False,
            )
        self._remote = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=PART_TIMEOUT_S, sock_connect=CONNECT_TIMEOUT_S)
        )
        self._poll_task = asyncio.get_running_loop().create_task(self._poll_forever())

    async def on_cleanup(self, app: web.Application) -> None:
        if self._poll_task is not None:
            self._poll_task.cancel()
        for session in self._sessions.values():
            await session.close()
        if self._remote is not None:
            await self._remote.close()

    # -- which shard -------------------------------------------------------------

    def header_shard(self, request: web.Request) -> int | None:
        """The shard the request names (`Raftsched-Shard`), or None; 400 for
        a value that names none."""
        value = request.headers.get(SHARD_HEADER)
        if value is None:
            return None
        return self._shard_number(value.strip(), SHARD_HEADER)

    def _shard_number(self, value: str, field: str) -> int:
        if not _SHARD_VALUE.fullmatch(value) or int(value) >= self.count:
            raise ApiError(
                "invalid_request",
                f"{field}: must name a shard, 0 to {self.count - 1}",
                {"field": field, "shards": self.count},
            )
        return int(value)

    def static_shard(self, request: web.Request) -> int:
        """The shard the header or a path id names (0 when neither does, or
        the header is not valid: routing answers that 400)."""
        resource = request.match_info.route.resource
        if resource is None:
            return 0
        value = request.headers.get(SHARD_HEADER)
        if value is not None and header_routable(request.method, resource.canonical):
            value = value.strip()
            valid = _SHARD_VALUE.fullmatch(value) and int(value) < self.count
            return int(value) if valid else 0
        for name in _ID_PARAMS:
            identifier = request.match_info.get(name)
            if identifier is not None:
                return shard_of_id(identifier)
        return 0

    def _named(self, identifier: str, what: str) -> int:
        """The shard `identifier` names; 404 if this cluster has no such shard."""
        shard = shard_of_id(identifier)
        if shard >= self.count:
            raise ApiError(
                "not_found",
                f"no {what} {identifier}: it names shard {shard}, and this cluster has "
                f"{self.count} shards",
                {"shard": shard, "shards": self.count},
            )
        return shard

    def next_shard(self) -> int:
        """Round-robin over the shards whose leader is known (all of them if
        none is): where a submission without keys goes."""
        led = [0] if self.node.leader() is not None else []
        led += [k for k, seen in self.known.items() if seen and seen.get("leader_id")]
        candidates = led or list(range(self.count))
        return candidates[next(self._turn) % len(candidates)]

    def _hint(self, request: web.Request) -> int | None:
        """`?shard=k` on a request this node's peer placed and redirected."""
        value = request.query.get(SHARD_QUERY)
        return None if value is None else self._shard_number(value, SHARD_QUERY)

    def _key_shard(self, spec: JobSpec) -> tuple[int, str] | None:
        """Where a job's keys place it, and which key: the ordering key, else
        the idempotency key; None for a job without keys."""
        if spec.ordering_key is not None:
            return key_shard(spec.tenant, spec.ordering_key, self.count), "ordering_key"
        if spec.idempotency_key is not None:
            return key_shard(spec.tenant, spec.idempotency_key, self.count), "idempotency_key"
        return None

    # -- the route ---------------------------------------------------------------

    async def route(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Answer `request` in group 0 (`handler`) or in the shard it is for."""
        resource = request.match_info.route.resource
        if resource is None:
            return await handler(request)
        route = resource.canonical
        placement = _PLACEMENTS.get((request.method, route))
        named = self.header_shard(request) if header_routable(request.method, route) else None
        if named is not None:
            if placement is not None:
                return await placement(self, request, handler, named)
            return await self._to(request, handler, named)
        if request.method == "GET":
            gather = shard_reads.GATHERED.get(route)
            if gather is not None:
                return await gather(self, request, handler)
        for name in _ID_PARAMS:
            identifier = request.match_info.get(name)
            if identifier is not None:
                shard = self._named(identifier, name.removesuffix("_id"))
                return await self._to(request, handler, shard)
        if placement is None:
            return await handler(request)
        return await placement(self, request, handler, None)

    async def _to(
        self, request: web.Request, handler: Handler, shard: int, *, placed: bool = False
    ) -> web.StreamResponse:
        if placed:
            request[_PLACED] = shard
        if shard == 0:
            response = await handler(request)
            if not response.prepared:
                response.headers[SHARD_HEADER] = "0"
            return response
        return await self._proxy(request, shard, placed=placed)

    def _placed(
        self,
        request: web.Request,
        keyed: int | None,
        named: int | None,
        why: str = "the job's keys",
    ) -> int:
        """The shard a submission goes to: where its keys place it, checked
        against the shard the request named; else the named one, the one a
        redirecting node placed it in, or the next in turn."""
        if keyed is not None:
            if named is not None and named != keyed:
                raise ApiError(
                    "wrong_shard",
                    f"{SHARD_HEADER} names shard {named}, but {why} place it in shard {keyed}",
                    {"shard": keyed, "named": named},
                )
            return keyed
        if named is not None:
            return named
        hinted = self._hint(request)
        return hinted if hinted is not None else self.next_shard()

    # -- submissions -------------------------------------------------------------

    async def _submit_job(
        self, request: web.Request, handler: Handler, named: int | None
    ) -> web.StreamResponse:
        spec = parse_job(await read_json(request))
        keyed = self._key_shard(spec)
        shard = self._placed(request, None if keyed is None else keyed[0], named)
        return await self._to(request, handler, shard, placed=True)

    async def _submit_batch(
        self, request: web.Request, handler: Handler, named: int | None
    ) -> web.StreamResponse:
        body = require_object(await read_json(request))
        raw_jobs, specs = jobs.parse_batch(request, body)  # the whole batch, before any part
        keyed = [self._key_shard(spec) for spec in specs]
        first = next((found[0] for found in keyed if found is not None), None)
        if named is not None:
            for index, found in enumerate(keyed):
                if found is not None and found[0] != named:
                    raise ApiError(
                        "wrong_shard",
                        f"{SHARD_HEADER} names shard {named}, but jobs[{index}].{found[1]} "
                        f"places that job in shard {found[0]}",
                        {"shard": found[0], "named": named, "index": index},
                    )
        shard = self._placed(request, first, named)
        # Jobs without keys go with the first keyed job (or all to one shard).
        shards = [shard if found is None else found[0] for found in keyed]
        if len(set(shards)) == 1:
            return await self._to(request, handler, shard, placed=True)
        for index, spec in enumerate(specs):
            if spec.idempotency_key is None:
                raise ApiError(
                    "batch_spans_shards",
                    "the batch's keys place its jobs in several shards "
                    f"({', '.join(map(str, sorted(set(shards))))}), where it commits per "
                    f"shard: every job needs an idempotency key, so that retrying the whole "
                    f"batch after a partial failure is exact; jobs[{index}] has none",
                    {"index": index, "shards": sorted(set(shards))},
                )
        parts = _parts(shards)

        async def group0(indexes: list[int], size_bytes: int) -> dict[str, Any]:
            return await jobs.batch_answer(request, [specs[i] for i in indexes], size_bytes)

        answers = await asyncio.gather(
            *(
                self.part(
                    request,
                    shard,
                    "/v1/jobs/batch",
                    {"jobs": [raw_jobs[i] for i in indexes]},
                    functools.partial(group0, indexes),
                )
                for shard, indexes in parts.items()
            )
        )
        results: list[Any] = [None] * len(specs)
        for indexes, (status, answer) in zip(parts.values(), answers, strict=True):
            if status != 200:
                # Committed parts stand; the client retries the whole batch,
                # which their idempotency keys make exact.
                return json_response(answer, status=status, headers=_retry_after(status))
            for local, index in enumerate(indexes):
                results[index] = _reindexed(answer["results"][local], "jobs", local, index)
        return json_response({"results": results})

    async def _submit_workflow(
        self, request: web.Request, handler: Handler, named: int | None
    ) -> web.StreamResponse:
        fields = workflows.parse_workflow(await read_json(request))
        tenant: str = fields["tenant"]
        keyed: int | None = None
        why = "the workflow's idempotency key"
        if fields["idempotency_key"] is not None:
            keyed = key_shard(tenant, fields["idempotency_key"], self.count)
        specs = [
            (f"steps[{i}].{where}ordering_key", spec)
            for i, step in enumerate(fields["steps"])
            for where, spec in (("", step.job), ("compensation.", step.compensation))
            if spec is not None and spec.ordering_key is not None
        ]
        if keyed is None and specs:
            keyed = key_shard(tenant, str(specs[0][1].ordering_key), self.count)
            why = f"{specs[0][0]}"
        shard = self._placed(request, keyed, named, why)
        for field, spec in specs:
            belongs = key_shard(tenant, str(spec.ordering_key), self.count)
            if belongs != shard:
                raise _ordering_key_shard(field, belongs, shard, "workflow")
        return await self._to(request, handler, shard, placed=True)

    def _schedule_shard(
        self, body: object, prefix: str
    ) -> tuple[int | None, tuple[str, int] | None]:
        """A schedule's shard as its id names it (None: no id given) and as
        its template's ordering key does ((field, shard) or None); validates
        the schedule (400) on the way."""
        from raftsched.api.schedules import parse_schedule

        document = require_object(body, prefix.rstrip(".") or "body")
        given = document.get("id")
        # A schedule without an id gets one drawn by the shard it goes to.
        spec = parse_schedule(
            document if given is not None else {**document, "id": "sch_placeholder"},
            prefix=prefix,
        )
        by_id = self._named(spec.id, "schedule") if given is not None else None
        key = spec.job.ordering_key
        by_key = None
        if key is not None:
            by_key = (f"{prefix}job.ordering_key", key_shard(spec.job.tenant, key, self.count))
        if by_id is not None and by_key is not None and by_key[1] != by_id:
            raise _ordering_key_shard(by_key[0], by_key[1], by_id, "schedule")
        return by_id, by_key

    async def _create_schedule(
        self, request: web.Request, handler: Handler, named: int | None
    ) -> web.StreamResponse:
        by_id, by_key = self._schedule_shard(await read_json(request), "")
        keyed = by_id if by_id is not None else None if by_key is None else by_key[1]
        shard = self._placed(request, keyed, named, "the schedule's id or ordering key")
        return await self._to(request, handler, shard, placed=True)

    async def _create_schedules(
        self, request: web.Request, handler: Handler, named: int | None
    ) -> web.StreamResponse:
        body = require_object(await read_json(request))
        items = body.get("schedules")
        if not isinstance(items, list):
            return await handler(request)  # its 400
        found: list[tuple[int, int]] = []
        for index, item in enumerate(items):
            by_id, by_key = self._schedule_shard(item, f"schedules[{index}].")
            keyed = by_id if by_id is not None else None if by_key is None else by_key[1]
            if keyed is not None:
                found.append((index, keyed))
        if len({shard for _, shard in found}) > 1:
            raise ApiError(
                "batch_spans_shards",
                "the schedules' ids or ordering keys place them in several shards "
                f"({', '.join(str(shard) for shard in sorted({s for _, s in found}))}): "
                "create them in one batch per shard",
                {"shards": sorted({shard for _, shard in found})},
            )
        keyed = found[0][1] if found else None
        shard = self._placed(request, keyed, named, "the schedules' ids or ordering keys")
        return await self._to(request, handler, shard, placed=True)

    async def _record_effect(
        self, request: web.Request, handler: Handler, named: int | None
    ) -> web.StreamResponse:
        if named is not None:
            return await self._to(request, handler, named)
        body = await read_json(request)
        job_id = body.get("job_id") if isinstance(body, dict) else None
        if not isinstance(job_id, str):
            return await handler(request)  # its 400
        return await self._to(request, handler, self._named(job_id, "job"))

    async def _get_effect(
        self, request: web.Request, handler: Handler, named: int | None
    ) -> web.StreamResponse:
        """An effect is recorded in its job's shard, and its key names no
        shard: every shard is asked (each as a read of its own says, so a
        linearizable lookup sees every effect recorded before it), and the
        first that holds the key answers, naming the others in `also_in`
        (keys derived from a job's id are never in two)."""
        if named is not None:
            return await self._to(request, handler, named)
        key = request.match_info["key"]
        path = str(request.rel_url)

        async def group0(size_bytes: int) -> dict[str, Any]:
            return (await leases.effect_answer(request, key))[0]

        answers = await asyncio.gather(
            *(self.part(request, shard, path, None, group0) for shard in range(self.count))
        )
        found = [(shard, answer) for shard, (status, answer) in enumerate(answers) if status == 200]
        if found:
            body = dict(found[0][1])
            if len(found) > 1:
                body["also_in"] = [shard for shard, _ in found[1:]]
            return json_response(body)
        failed = [(status, answer) for status, answer in answers if status != 404]
        if failed:  # a shard that could not say may hold it
            status, answer = failed[0]
            return json_response(answer, status=status, headers=_retry_after(status))
        return json_response(answers[0][1], status=404)

    async def _membership(
        self, request: web.Request, handler: Handler, named: int | None
    ) -> web.StreamResponse:
        """A membership change: group 0's (the directory every shard
        follows, `drive_membership`), or with the header one shard's alone."""
        return await self._to(request, handler, named or 0)

    async def _lease_batch(
        self, request: web.Request, handler: Handler, named: int | None
    ) -> web.StreamResponse:
        if named is not None:
            return await self._to(request, handler, named)
        body = await read_json(request)
        ops = body.get("ops") if isinstance(body, dict) else None
        if (
            not isinstance(body, dict)
            or not body.keys() <= {"ops", "next"}
            or not isinstance(ops, list)
            or not 1 <= len(ops) <= LEASE_BATCH_OPS_MAX
        ):
            return await handler(request)  # its 400
        shards = [self._op_shard(op, index) for index, op in enumerate(ops)]
        parts = _parts(shards)
        if len(parts) == 1:
            return await self._to(request, handler, shards[0])
        # The claim is checked before any part is proposed, as a batch's is.
        scope_next = leases.next_request(body, worker_required=True, after_success_only=False)
        if scope_next is not None:
            scope.require_queues(request, scope_next.queues)
        carrier = shards[0]  # the next claim rides with the first operation's shard

        def part_body(shard: int, indexes: Sequence[int]) -> dict[str, Any]:
            part: dict[str, Any] = {"ops": [ops[i] for i in indexes]}
            if shard == carrier and "next" in body:
                part["next"] = body["next"]
            return part

        async def group0(document: Mapping[str, Any], size_bytes: int) -> dict[str, Any]:
            return await leases.lease_batch_answer(request, document, size_bytes)

        documents = {shard: part_body(shard, indexes) for shard, indexes in parts.items()}
        answers = await asyncio.gather(
            *(
                self.part(
                    request,
                    shard,
                    "/v1/leases/batch",
                    documents[shard],
                    functools.partial(group0, documents[shard]),
                )
                for shard in parts
            )
        )
        results: list[Any] = [None] * len(ops)
        answer: dict[str, Any] = {}
        for (shard, indexes), (status, part) in zip(parts.items(), answers, strict=True):
            for local, index in enumerate(indexes):
                # Each operation stands alone: a part that failed whole fails
                # each of its operations with its error.
                entry = part["results"][local] if status == 200 else part
                results[index] = _reindexed(entry, "ops", local, index)
            if shard == carrier and "next" in body:
                answer["next"] = part.get("next", part) if status == 200 else part
        return json_response({"results": results, **answer})

    async def _retry_parked(
        self, request: web.Request, handler: Handler, named: int | None
    ) -> web.StreamResponse:
        """The operator's retry of a subscription's parked events: in every
        shard's copy, or in the named shard's alone."""
        if named is not None:
            return await self._to(request, handler, named)
        return await shard_subscriptions.retry_every_shard(self, request, handler)

    def _op_shard(self, op: object, index: int) -> int:
        """The shard of a lease batch's operation: its job's. One that is not
        well formed, or names a shard >= S, goes to group 0, which answers
        it as an op on its own would be answered (400, 404)."""
        try:
            item = require_object(op, f"ops[{index}]")
            choice(item, "op", leases.OP_FIELDS)
            job_id = string(item, "job_id", required=True)
        except ApiError:
            return 0
        assert job_id is not None
        shard = shard_of_id(job_id)
        return shard if shard < self.count else 0

    # -- a shard's part of a split batch, or of a read of every shard ------------

    async def part(
        self,
        request: web.Request,
        shard: int,
        path: str,
        document: Mapping[str, Any] | None,
        in_group0: Callable[[int], Awaitable[dict[str, Any]]],
        *,
        headers: Mapping[str, str] | None = None,
        what: str = "the batch",
    ) -> tuple[int, dict[str, Any]]:
        """(status, JSON answer) of one shard's part: group 0 in this
        process, a shard process over its socket, and, where that shard is
        led from another node, that node, asked by this one. A POST of
        `document`, or a GET (`document` None) of `path` with its query;
        `headers` go with it wherever it goes."""
        method = "GET" if document is None else "POST"
        data = None if document is None else json.dumps(document).encode()
        location: str | None = None
        if shard == 0:
            try:
                return 200, await in_group0(0 if data is None else len(data))
            except NotLeader:
                leader = self.node.leader()
                if leader is None or leader.http_url is None or leader.id == self.node.node_id:
                    return 503, _no_leader(shard)
                location = leader.http_url.rstrip("/") + path
            except ApiError as error:
                return error.status, error.body()
            except PROPOSAL_ERRORS as error:
                failed = from_proposal_error(error)
                return failed.status, failed.body()
        else:
            try:
                status, answered, answer = await self._call(
                    request, shard, method, path, data, headers
                )
            except ApiError as error:
                return error.status, error.body()
            if status not in (307, 308):
                return status, answer
            location = answered.get("Location")
        return await self._sent_on(request, shard, location, method, data, headers, what)

    async def _sent_on(
        self,
        request: web.Request,
        shard: int,
        location: str | None,
        method: str,
        data: bytes | None,
        extra: Mapping[str, str] | None = None,
        what: str = "the batch",
    ) -> tuple[int, dict[str, Any]]:
        """A part sent to the node that leads its shard, as its client would
        have sent it there (its own credentials), with the shard named."""
        assert self._remote is not None
        headers = {name: request.headers[name] for name in _PART_HEADERS if name in request.headers}
        headers.update(extra or {})
        headers[SHARD_HEADER] = str(shard)
        if data is not None:
            headers["Content-Type"] = "application/json"
        for _ in range(PART_REDIRECTS_MAX):
            if not location:
                return 503, _no_leader(shard)
            try:
                async with self._remote.request(
                    method,
                    location,
                    data=data,
                    headers=headers,
                    allow_redirects=False,
                    ssl=self._peer_ssl,
                ) as response:
                    if response.status in (307, 308):
                        location = response.headers.get("Location")
                        continue
                    if method == "GET" and response.status == 200:
                        named = response.headers.get(SHARD_HEADER)
                        if named != str(shard):
                            return 503, _not_named(shard, named)
                    answer = await response.json(content_type=None)
                    return response.status, answer if isinstance(answer, dict) else {}
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as error:
                failed = ApiError(
                    "outcome_unknown" if isinstance(error, asyncio.TimeoutError) else "unavailable",
                    f"shard {shard}'s part of {what} could not be sent to its leader: {error}",
                    {"reason": "shard_part_failed", "shard": shard},
                )
                return failed.status, failed.body()
        return 503, _no_leader(shard)

    async def answered_here(
        self, request: web.Request, handler: Handler, path: str, headers: Mapping[str, str]
    ) -> dict[str, Any]:
        """Group 0's JSON answer to `path` (with its query), from its handler
        in this process, asked as `request` (GET, or a POST whose handler
        reads no body: the retry of parked events) with `headers` added: a
        request to every shard asks shard 0 so. Raises what the handler
        raises (NotLeader: the caller asks group 0's leader instead)."""
        sent = CIMultiDict(request.headers)
        sent.update(headers)
        response = await handler(request.clone(rel_url=path, headers=sent))
        assert isinstance(response, web.Response) and response.body is not None
        answer = loads(cast(bytes, response.body))
        assert isinstance(answer, dict), answer
        return answer

    async def local(
        self,
        request: web.Request,
        handler: Handler,
        shard: int,
        path: str,
        timeout_s: float = STATUS_TIMEOUT_S,
    ) -> tuple[int, dict[str, Any]]:
        """(status, JSON answer) of this node's own replica of `shard` to
        GET `path`: what a process keeps in its memory (the overview, the
        charts' series) is read on every node, never redirected."""
        try:
            if shard == 0:
                return 200, await self.answered_here(request, handler, path, {})
            status, _, answer = await asyncio.wait_for(
                self._call(request, shard, "GET", path, None), timeout_s
            )
        except ApiError as error:
            return error.status, error.body()
        except TimeoutError as error:
            failed = _shard_unavailable(shard, error)
            return failed.status, failed.body()
        return status, answer

    async def at_leader(
        self, request: web.Request, handler: Handler, shard: int, path: str
    ) -> tuple[tuple[int, dict[str, Any]], str]:
        """(status, JSON answer) to GET `path` from the process that leads
        shard `shard` when its node is known (what a leader alone knows: stuck
        jobs, the counters of what it proposed), else from this node's own
        replica; and the id of the node that answered."""
        seen = self.known.get(shard) or {}
        leader_id = seen.get("leader_id")
        url = self.node.http_urls.get(leader_id) if isinstance(leader_id, str) else None
        if url and leader_id != self.node.node_id:
            try:
                status, answer = await asyncio.wait_for(
                    self._sent_on(
                        request,
                        shard,
                        url.rstrip("/") + path,
                        "GET",
                        None,
                        None,
                        f"the read of {request.path}",
                    ),
                    STATUS_TIMEOUT_S,
                )
            except TimeoutError:
                status, answer = 504, {}
            if status == 200:
                return (status, answer), str(leader_id)
        return await self.local(request, handler, shard, path), self.node.node_id

    async def local_text(self, request: web.Request, shard: int, path: str) -> bytes | None:
        """The body of shard `shard`'s process's answer to GET `path` (its
        /metrics), or None if it does not answer 200 in time."""
        try:
            async with self._sessions[shard].get(
                "http://shard" + path,
                headers=self._forward_headers(request),
                timeout=aiohttp.ClientTimeout(total=STATUS_TIMEOUT_S),
            ) as response:
                if response.status != 200:
                    return None
                return await response.read()
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None

    async def open_part_stream(
        self, request: web.Request, shard: int, path: str, remote: aiohttp.ClientSession
    ) -> aiohttp.ClientResponse:
        """Shard `shard`'s answer to GET `path` with its body not yet read
        (a backup's part, streamed): this node's shard process, or, when it
        redirects, the node hosting the shard's leader, asked with the
        caller's credentials and the shard named (on `remote`). Raises
        ApiError for anything but a 200 that names the shard; the caller
        releases the answer."""
        try:
            response = await self._sessions[shard].get(
                "http://shard" + path,
                headers=self._forward_headers(request),
                allow_redirects=False,
            )
        except (aiohttp.ClientError, OSError) as error:
            raise _shard_unavailable(shard, error) from None
        headers = {name: request.headers[name] for name in _PART_HEADERS if name in request.headers}
        headers[SHARD_HEADER] = str(shard)
        remote_hop = False
        for _ in range(PART_REDIRECTS_MAX):
            if response.status not in (307, 308):
                break
            location = response.headers.get("Location")
            response.release()
            if not location:
                raise ApiError("no_leader", f"shard {shard} has no known leader; retry shortly")
            try:
                response = await remote.get(
                    location, headers=headers, allow_redirects=False, ssl=self._peer_ssl
                )
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                raise ApiError(
                    "unavailable",
                    f"shard {shard}'s part could not be asked of its leader: {error}",
                    {"reason": "shard_part_failed", "shard": shard},
                    headers={"Retry-After": "1"},
                ) from None
            remote_hop = True
        if response.status != 200:
            status = response.status
            try:
                answer = await response.json(content_type=None)
            except (aiohttp.ClientError, ValueError):
                answer = None
            finally:
                response.release()
            failure = answer.get("error") if isinstance(answer, dict) else None
            code = failure.get("code") if isinstance(failure, dict) else None
            raise ApiError(
                code if isinstance(code, str) and status >= 400 else "unavailable",
                f"shard {shard}'s part: {status} "
                f"{failure.get('message') if isinstance(failure, dict) else ''}".rstrip(),
                {"reason": "shard_part_failed", "shard": shard, "status": status},
                headers={"Retry-After": "1"},
            )
        if remote_hop and response.headers.get(SHARD_HEADER) != str(shard):
            named = response.headers.get(SHARD_HEADER)
            response.release()
            raise ApiError(
                "unavailable",
                _not_named(shard, named)["error"]["message"],
                {"reason": "shard_not_named", "shard": shard},
                headers={"Retry-After": "1"},
            )
        return response

    # -- over a shard process's socket --------------------------------------------

    def _forward_headers(self, request: web.Request) -> dict[str, str]:
        headers = {
            name: value
            for name, value in request.headers.items()
            if name.lower() not in _NOT_FORWARDED
        }
        principal = principal_if_set(request)
        if principal is not None:
            headers[INTERNAL_PRINCIPAL_HEADER] = encode_principal(principal)
        request_id = REQUEST_ID.get()
        if request_id is not None:
            headers["X-Request-Id"] = request_id
        return headers

    async def _call(
        self,
        request: web.Request,
        shard: int,
        method: str,
        path: str,
        data: bytes | None,
        extra: Mapping[str, str] | None = None,
    ) -> tuple[int, Mapping[str, str], dict[str, Any]]:
        """A whole JSON exchange with shard `shard`'s process."""
        headers = self._forward_headers(request)
        headers.update(extra or {})
        if data is not None:
            headers["Content-Type"] = "application/json"
        session = self._sessions[shard]
        try:
            async with session.request(
                method, "http://shard" + path, headers=headers, data=data, allow_redirects=False
            ) as response:
                answer = await response.json(content_type=None)
                return response.status, response.headers, answer if isinstance(answer, dict) else {}
        except (aiohttp.ClientError, OSError, ValueError) as error:
            raise _shard_unavailable(shard, error) from None

    async def _proxy(self, request: web.Request, shard: int, *, placed: bool) -> web.StreamResponse:
        """Pass `request` to shard `shard`'s process and stream its answer back."""
        session = self._sessions[shard]
        data = await read_body(request)
        url = request.rel_url
        if SHARD_QUERY in url.query and placed:
            url = url.without_query_params(SHARD_QUERY)
        sending = session.request(
            request.method,
            "http://shard" + str(url),
            headers=self._forward_headers(request),
            data=data,
            allow_redirects=False,
        )
        try:
            upstream = await _unless_gone(request, sending)
        except _ClientGone:
            return json_response({"error": {"code": "unavailable"}}, status=503)
        except (aiohttp.ClientError, OSError) as error:
            raise _shard_unavailable(shard, error) from None
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in _NOT_RETURNED:
                    response.headers.add(name, value)
            # Which shard answered: a node that asks another for one shard's
            # part of a read checks it (an earlier release ignored the
            # header on some reads and answered group 0's).
            response.headers[SHARD_HEADER] = str(shard)
            if placed and upstream.status in (307, 308) and "Location" in upstream.headers:
                location = URL(upstream.headers["Location"])
                response.headers["Location"] = str(location.update_query({SHARD_QUERY: str(shard)}))
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            try:
                await response.prepare(request)
            except ConnectionResetError:
                # The client left between the shard's answer and ours (a
                # peer's read-index ask through GET /v1/time gives up after
                # 2 s): nobody to answer, not an error of this node's.
                # aiohttp's own finish sees the closed transport and logs
                # the request as cut off by the client.
                log.debug("the client left before shard %d's answer was sent", shard)
                return response
            try:
                async for chunk in upstream.content.iter_chunked(64 * 1024):
                    await response.write(chunk)
            except (aiohttp.ClientError, OSError) as error:
                log.warning("shard %d's answer was cut off: %s", shard, error)
                return response
            await response.write_eof()
        return response

    # -- status: readiness, leaders, /v1/cluster -------------------------------------

    async def _poll_forever(self) -> None:
        while True:
            await self.refresh()
            try:
                await self.drive_membership()
            except Exception:  # never stop polling; tried again next period
                log.warning("the shards' membership driver failed", exc_info=True)
            await asyncio.sleep(STATUS_PERIOD_S)

    # -- membership of the shards (the module's docstring) -------------------------

    def wanted_members(self) -> dict[str, tuple[str, str | None]] | None:
        """Group 0's members by id (Raft address, HTTP URL) as this node's
        replica records them, or None before the first change: until then
        every group's members are the start-up flags, alike."""
        directory = self.node.directory
        if not directory.replicated:
            return None
        return {m.node_id: (m.raft_address, m.http_url) for m in directory.members}

    async def drive_membership(self) -> None:
        """The next change of each shard this node leads whose members are
        not group 0's (one request per shard; its own driver does the rest)."""
        wanted = self.wanted_members()
        if wanted is None:
            return
        for shard, seen in self.known.items():
            if not seen or seen.get("leader_id") != self.node.node_id:
                continue
            view = await self._get_json(shard, "/v1/cluster", encode_principal(ANONYMOUS))
            step = next_membership_step(view, wanted, shard, self.stride)
            if step is None:
                continue
            # This node's replica of group 0 may trail its leader's: a
            # directory read before a change applied here would undo it in
            # the shard. So it catches up first and acts only if the
            # directory it then reads asks for the same step.
            if not await self.node.catch_up(CATCH_UP_S):
                continue
            fresh = self.wanted_members()
            if fresh is None or next_membership_step(view, fresh, shard, self.stride) != step:
                continue
            method, path, document = step
            data = None if document is None else json.dumps(document).encode()
            headers = {INTERNAL_PRINCIPAL_HEADER: encode_principal(ANONYMOUS)}
            if data is not None:
                headers["Content-Type"] = "application/json"
            try:
                async with self._sessions[shard].request(
                    method,
                    "http://shard" + path,
                    data=data,
                    headers=headers,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=30.0),
                ) as response:
                    answer = await response.text()
                    status = response.status
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                log.warning("shard %d's membership change %s %s: %s", shard, method, path, error)
                continue
            if status == 202:
                log.info("shard %d follows group 0's members: %s %s", shard, method, path)
            elif status != 409:  # 409: a change in progress there; asked again
                log.warning(
                    "shard %d refused its membership change %s %s: %d %s",
                    shard,
                    method,
                    path,
                    status,
                    answer[:500],
                )

    async def refresh(self) -> dict[int, dict[str, Any] | None]:
        """Ask every shard process for its `/readyz` now; remember the answers."""
        answers = await asyncio.gather(*(self._readyz(shard) for shard in self._sockets))
        self.known = dict(zip(self._sockets, answers, strict=True))
        return self.known

    async def _readyz(self, shard: int) -> dict[str, Any] | None:
        return await self._get_json(shard, "/readyz")

    async def _get_json(
        self, shard: int, path: str, principal_header: str | None = None
    ) -> dict[str, Any] | None:
        headers = {} if principal_header is None else {INTERNAL_PRINCIPAL_HEADER: principal_header}
        try:
            async with self._sessions[shard].get(
                "http://shard" + path,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=STATUS_TIMEOUT_S),
            ) as response:
                answer = await response.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return None
        return answer if isinstance(answer, dict) else None

    async def not_ready(self) -> list[dict[str, Any]]:
        """The local shard replicas that are not ready, and why (`/readyz`)."""
        known = await self.refresh()
        missing: list[dict[str, Any]] = []
        for shard, seen in known.items():
            if seen is None:
                missing.append({"shard": shard, "reason": "its process does not answer"})
            elif not seen.get("ready"):
                entry = {"shard": shard, "reason": "not ready"}
                entry.update(
                    {
                        name: seen[name]
                        for name in (
                            "leader_id",
                            "commit_index",
                            "applied_index",
                            "halted",
                            "disk_full",
                        )
                        if name in seen
                    }
                )
                missing.append(entry)
        return missing

    async def cluster_shards(self, request: web.Request) -> list[dict[str, Any]]:
        """`GET /v1/cluster`'s `shards`: each shard as this node's replica sees it."""
        node = self.node
        status = node.status()
        leader = node.leader()
        target = max(status.commit_index, status.leader_commit_index or 0)
        led = None if leader is None else {"id": leader.id, "http_url": leader.http_url}
        entries: list[dict[str, Any]] = [
            {
                "shard": 0,
                "leader": led,
                "term": status.term,
                "commit_index": status.commit_index,
                "applied_index": status.applied_index,
                "cluster_version": node.cluster_version(),
                "cluster_id": node.cluster_id(),
                "identity_recorded": _recorded(node),
                **_settings_of(node, 0, None),
                "ready": leader is not None and status.applied_index >= target,
                "pid": os.getpid(),
                "status": "running",
            }
        ]
        principal = encode_principal(principal_if_set(request) or ANONYMOUS)
        shards = list(self._sockets)
        views = await asyncio.gather(
            *(self._get_json(shard, "/v1/cluster", principal) for shard in shards)
        )
        readies = await asyncio.gather(*(self._readyz(shard) for shard in shards))
        urls = node.http_urls
        for shard, view, ready in zip(shards, views, readies, strict=True):
            entry: dict[str, Any] = {"shard": shard, "pid": self._pid_of(shard)}
            if view is None or "term" not in view:
                entry.update({"leader": None, "ready": False, "status": "down"})
            else:
                leader_id = (view.get("leader") or {}).get("id")
                entry.update(
                    {
                        "leader": (
                            None
                            if leader_id is None
                            else {"id": leader_id, "http_url": urls.get(leader_id)}
                        ),
                        "term": view.get("term"),
                        "commit_index": view.get("commit_index"),
                        "applied_index": view.get("applied_index"),
                        "cluster_version": view.get("cluster_version"),
                        "cluster_id": view.get("cluster_id"),
                        "identity_recorded": view.get("shard_identity") is not None,
                        "members": sorted(shard_members(view) or ()),
                        "membership_change": (view.get("membership") or {}).get("change"),
                        **_settings_of(node, shard, view.get("shard_settings")),
                        "ready": bool(ready and ready.get("ready")),
                        "status": "running",
                    }
                )
            entries.append(entry)
        return entries


def shard_members(view: Mapping[str, Any] | None) -> set[str] | None:
    """The member ids a group's `GET /v1/cluster` lists (those being added
    included, those being removed not), or None if it did not answer."""
    if view is None or not isinstance(view.get("nodes"), list):
        return None
    return {
        str(item.get("id"))
        for item in view["nodes"]
        if isinstance(item, dict) and item.get("status") not in ("removing", "removed")
    }


def next_membership_step(
    view: Mapping[str, Any] | None,
    wanted: Mapping[str, tuple[str, str | None]],
    shard: int,
    stride: int,
) -> tuple[str, str, dict[str, Any] | None] | None:
    """The one request (method, path, body) that brings shard `shard`'s
    members (its `GET /v1/cluster`, `view`) closer to group 0's (`wanted`):
    a remove first, in id order, then an add (the module's docstring says
    why); None when they agree, when
    the shard did not answer, or while a change is in progress there."""
    have = shard_members(view)
    if view is None or have is None:
        return None
    membership = view.get("membership") or {}
    if membership.get("change") is not None or membership.get("joining"):
        return None
    for node_id in sorted(have - set(wanted)):
        return "DELETE", f"/v1/cluster/nodes/{node_id}", None
    for node_id in sorted(set(wanted) - have):
        address, url = wanted[node_id]
        document = {"id": node_id, "raft_address": shift_address(address, shard, stride)}
        if url is not None:
            document["http_url"] = url
        return "POST", "/v1/cluster/nodes", document
    return None


_PlacementHandler = Callable[
    [ShardRouter, web.Request, Handler, "int | None"], Awaitable[web.StreamResponse]
]
_PLACEMENTS: Final[dict[tuple[str, str], _PlacementHandler]] = {
    ("POST", "/v1/jobs"): ShardRouter._submit_job,
    ("POST", "/v1/jobs/batch"): ShardRouter._submit_batch,
    ("POST", "/v1/workflows"): ShardRouter._submit_workflow,
    ("POST", "/v1/schedules"): ShardRouter._create_schedule,
    ("POST", "/v1/schedules/batch"): ShardRouter._create_schedules,
    ("POST", "/v1/effects"): ShardRouter._record_effect,
    ("GET", "/v1/effects/{key}"): ShardRouter._get_effect,
    ("POST", "/v1/cluster/nodes"): ShardRouter._membership,
    ("DELETE", "/v1/cluster/nodes/{node_id}"): ShardRouter._membership,
    ("POST", "/v1/leases/batch"): ShardRouter._lease_batch,
    ("POST", "/v1/subscriptions/{subscription_id}/retry"): ShardRouter._retry_parked,
}

SHARD_ROUTER: Final = web.AppKey("shard_router", ShardRouter)


def _parts(shards: Sequence[int]) -> dict[int, list[int]]:
    """Indexes by shard, the shards in the order they first appear."""
    parts: dict[int, list[int]] = {}
    for index, shard in enumerate(shards):
        parts.setdefault(shard, []).append(index)
    return parts


def _reindexed(entry: Any, list_name: str, local: int, index: int) -> Any:
    """A part's answer entry as the whole request's: `ops[0].x` of the part
    is `ops[5].x` of the request."""
    error = entry.get("error") if isinstance(entry, dict) else None
    if local == index or not isinstance(error, dict):
        return entry
    old, new = f"{list_name}[{local}]", f"{list_name}[{index}]"
    details = dict(error.get("details") or {})
    field = details.get("field")
    if isinstance(field, str) and field.startswith(old):
        details["field"] = new + field[len(old) :]
    message = error.get("message")
    if isinstance(message, str) and message.startswith(old):
        message = new + message[len(old) :]
    return {**entry, "error": {**error, "message": message, "details": details}}


def _retry_after(status: int) -> dict[str, str]:
    return {"Retry-After": "1"} if status in (503, 504) else {}


def _no_leader(shard: int) -> dict[str, Any]:
    return ApiError(
        "no_leader", f"shard {shard} has no known leader; retry shortly", {"shard": shard}
    ).body()


def _not_named(shard: int, named: str | None) -> dict[str, Any]:
    return ApiError(
        "unavailable",
        f"the node leading shard {shard} answered for shard {named or 'none named'} (a node of "
        "an earlier release, during an upgrade?); retry once every node runs this release",
        {"reason": "shard_not_named", "shard": shard},
    ).body()


def _shard_unavailable(shard: int, error: BaseException) -> ApiError:
    return ApiError(
        "unavailable",
        f"shard {shard}'s process on this node does not answer ({error}); retry, or use "
        "another node",
        {"reason": "shard_unavailable", "shard": shard},
        headers={"Retry-After": "1"},
    )


def _ordering_key_shard(field: str, belongs: int, shard: int, what: str) -> ApiError:
    return ApiError(
        "ordering_key_shard",
        f"{field} belongs to shard {belongs}, but the {what} is in shard {shard}: a "
        f"{what}'s jobs live in one shard, and that key's jobs in shard {belongs} keep their "
        "order only there",
        {"field": field, "shard": belongs, "placed_in": shard},
    )


class _ClientGone(Exception):
    pass


async def _unless_gone(request: web.Request, awaitable: Awaitable[Any]) -> Any:
    """Await `awaitable`, a shard's answer, unless the client leaves first
    (a worker that stopped while its claim long-polled): then the request
    to the shard is dropped, so that the shard process's claim sees its
    connection close and grants nothing."""
    task = asyncio.ensure_future(awaitable)
    while True:
        done, _ = await asyncio.wait({task}, timeout=CLIENT_CHECK_S)
        if done:
            return task.result()
        transport = request.transport
        if transport is None or transport.is_closing():
            task.cancel()
            raise _ClientGone


def _settings_of(node: NodeView, shard: int, seen: object) -> dict[str, Any]:
    """A shard's `settings_in_line` (its settings and subscriptions are group
    0's), `quota_round` and `quotas_in_line` (it enforces its quota of every
    limit group 0 records), as this node's replicas say (node.shard_settings);
    `seen` is the shard's `shard_settings`, None for group 0's own entry.
    Nothing before the group recorded its shard."""
    with node.reading() as state:
        if core_shard.identity(state) is None:
            return {}
        mine = settings_digest(settings_of(state))
        if seen is None:
            own_round = quotas_of(state).round
            return {
                "settings_in_line": True,
                "quota_round": own_round,
                "quotas_in_line": quotas_in_line(state, shard, own_round),
            }
        if not isinstance(seen, dict):
            return {}
        applied = seen.get("quota_round")
        return {
            "settings_in_line": seen.get("digest") == mine,
            "quota_round": applied,
            "quotas_in_line": isinstance(applied, int) and quotas_in_line(state, shard, applied),
        }


def _recorded(node: NodeView) -> bool:
    """Whether this group has recorded its shard (`SetShard`)."""
    with node.reading() as state:
        return core_shard.identity(state) is not None
