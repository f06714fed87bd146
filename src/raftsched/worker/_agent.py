"""The worker agent: claim leases, run jobs, stop gracefully.

The claim loop long-polls for as many jobs as there are free slots
(`concurrency` minus jobs whose handler has not returned yet, minus slots a
claim in flight may fill; a sync handler that ignores cancellation keeps its
slot), for `poll_wait_s` but at most half the lease, so that a job granted
at the end of a poll still has half its lease (`WorkerConfig.claim_wait_s`).

On stop (SIGTERM/SIGINT) it stops claiming, gives running jobs
`shutdown_grace_s` to finish, then cancels them (reported as `unknown`
failures), and exits. A claim in flight at stop is abandoned: its connection
is closed, and the cluster ends the poll without granting it anything (a node
of 0.6.0 or earlier polls on until its wait ends, and may grant it a job
submitted meanwhile). A lease granted before the worker stopped listening
expires unstarted: the job is retried, with no attempt counted against it
(it never started). A second signal skips the grace period.

Next claims (`WorkerConfig.next_claims`, on by default): a lease batch that
reports jobs finished also claims their slots' next jobs (`next`, wait 0), so
under load a job costs no claim request of its own; the claim loop still
long-polls whatever stays free. Leases it brings are launched like claimed
ones (started before their handler runs). Once stopping, none is asked for,
and leases that still arrive are not started: they expire unstarted, as an
abandoned claim's do. A cluster that does not take `next` (a node of 0.5.0 or
earlier answers 400 naming it) turns them off for the worker's lifetime.

Kinds (`_kinds`): the worker runs each job with the handler of its kind
(`worker.handler("charge")`, or a `{kind: handler}` mapping; a job without a
kind with the default handler), claims only the kinds it has handlers for,
at most `max_concurrency` of a kind at once besides `concurrency` in all,
and dead-letters a job it has no handler for (`no_handler_for_kind`).

Shards (docs/shards.md, section 4): on a cluster of several data shards
(`_shards`: learnt at start) the worker runs one claim loop per shard, each
naming its shard (`Raftsched-Shard`) through a client of its own (so each
shard's calls go straight to the node hosting its leader), sharing the one
pool of slots (`_slots`: who claims how many). A job's lease operations and
effects go through the client and lease batcher of the shard it was leased
from, so a batch's next claim asks that shard. A shard without a leader
fails its own loop's claims only: that loop backs off (warnings) and its
slots go to the others. `WorkerConfig.shard` pins one shard instead, and a
cluster of one shard is claimed from exactly as before.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from raftsched.client import (
    AsyncClient,
    InvalidRequest,
    JsonObject,
    LeaseLost,
    NextClaim,
    RaftschedError,
    client_ssl_context,
    kinds_refused,
    next_claim,
    resolve_urls,
)
from raftsched.limits import BODY_BYTES_MAX
from raftsched.worker._batcher import LeaseBatcher, LeaseOps
from raftsched.worker._context import JobContext, Lease, log_fields
from raftsched.worker._job import Handler, JobRun, fail_op
from raftsched.worker._kinds import ClaimPlan, Routes, check_kind
from raftsched.worker._reconcile import (
    ReconcileContext,
    Reconciler,
    ReconcileRun,
    UnknownAttempt,
)
from raftsched.worker._shards import REFRESH_MIN_S, ShardMap, read_shard_map
from raftsched.worker._slots import CROWDED_POLL_WAIT_S, ShardSlots

log = logging.getLogger("raftsched.worker")

CLAIM_BACKOFF_INITIAL_S = 0.5
CLAIM_BACKOFF_MAX_S = 10.0
# The most jobs one claim may ask for (the API's `max_jobs` limit).
CLAIM_JOBS_MAX = 1000
# Ops after which their job's slot is free: a batch of them carries the next claim.
FINISHING_OPS = frozenset({"complete", "fail", "reconcile"})
# The longest a claim long-polls, as a share of the lease: a job granted at
# the end of the poll still has the rest of its lease to run (see
# `WorkerConfig.claim_wait_s`).
CLAIM_WAIT_LEASE_SHARE = 0.5


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    # Node URLs (a list, or one comma-separated string); None: $RAFTSCHED_URL.
    urls: Sequence[str] | str | None = None
    queues: tuple[str, ...] = ()
    concurrency: int = 4
    worker_id: str = field(default_factory=default_worker_id)
    lease_s: float = 30.0
    # How long a claim long-polls; at most half of lease_s (`claim_wait_s`).
    poll_wait_s: float = 20.0
    shutdown_grace_s: float = 30.0
    # After the grace period, how long cancelled handlers get to stop before
    # they are abandoned (their failure is reported without them).
    cancel_wait_s: float = 5.0
    # The bearer secret; None: $RAFTSCHED_TOKEN if it is set; "": none.
    token: str | None = None
    timeout_s: float = 10.0
    # HTTPS: the CA bundle to trust, and a client certificate for mutual TLS.
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    batch_linger_s: float = 0.005
    batch_max_ops: int = 100
    # The nodes' limit on a request body (their `max_body_bytes`): lease
    # batches are split to fit it. A node with a lower one says so in its
    # 413, and the worker splits to fit that from then on.
    max_body_bytes: int = BODY_BYTES_MAX
    # Reports of finished jobs also claim the next ones (see the module doc).
    next_claims: bool = True
    # At most this many jobs of a kind at once, on top of `concurrency`
    # (`Worker.handler(kind, max_concurrency=...)` sets one too).
    kind_concurrency: Mapping[str, int] = field(default_factory=dict)
    # Also claim the jobs of kinds without a handler here, and dead-letter
    # them (`_kinds`): for a pool that alone serves its queues.
    dead_letter_unknown_kinds: bool = False
    # A cluster of several data shards (docs/shards.md): claim from this
    # shard only, naming it on every request. None: claim from every shard
    # the cluster has (the module doc), sharing the slots.
    shard: int | None = None

    @property
    def claim_wait_s(self) -> float:
        """How long a claim long-polls: `poll_wait_s`, but at most half the
        lease. The worker's deadline for a lease counts from when it sent the
        claim (the only instant it knows the grant is not earlier than; the
        cluster's `expires_at` is another machine's wall clock), so a job
        granted `w` seconds into the poll has `lease_s - w` left. With
        `poll_wait_s >= lease_s` a job granted late was already past the
        deadline: never started, it expired and came back the same way."""
        return min(self.poll_wait_s, self.lease_s * CLAIM_WAIT_LEASE_SHARE)

    def validate(self) -> None:
        resolve_urls(self.urls)  # given, or in $RAFTSCHED_URL; URLs either way
        if not self.queues:
            raise ValueError("at least one queue is required")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        for kind, limit in self.kind_concurrency.items():
            check_kind(kind)
            if type(limit) is not int or limit < 1:
                raise ValueError(f"the concurrency of kind {kind!r} must be at least 1")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")
        if self.lease_s <= 0 or self.poll_wait_s < 0 or self.shutdown_grace_s < 0:
            raise ValueError("lease_s must be positive, poll_wait_s and grace non-negative")
        if self.shard is not None and not 0 <= self.shard < 64:
            raise ValueError("shard must be between 0 and 63")
        client_ssl_context(self.ca_file, self.client_cert, self.client_key)  # the files load


Handlers = Handler | Mapping[str | None, Handler]
"""A worker's handlers: the default one, or one per kind (the key None: the default)."""


@dataclass(slots=True)
class _Link:
    """A shard the worker claims from: the client that names it (shard 0's,
    unpinned, is the worker's own client, which names none: group 0 is
    shard 0) and the batcher of its jobs' lease operations, whose next
    claims therefore ask that shard. `owned`: the worker made the client and
    closes it."""

    shard: int
    client: AsyncClient
    batcher: LeaseBatcher
    owned: bool


class Worker:
    def __init__(
        self,
        config: WorkerConfig,
        handler: Handlers | None = None,
        *,
        client: AsyncClient | None = None,
    ) -> None:
        """`handler`: the default handler (jobs without a kind), or a mapping
        `{kind: handler}` (None: the default). More with `handler(kind)`."""
        config.validate()
        self.config = config
        self._routes = Routes(take_unknown=config.dead_letter_unknown_kinds)
        if isinstance(handler, Mapping):
            for kind, each in handler.items():
                self._routes.add(kind, each, None)
        elif handler is not None:
            self._routes.add(None, handler, None)
        for kind, limit in config.kind_concurrency.items():
            self._routes.limit(kind, limit)
        self._client = client
        self._runs: dict[asyncio.Task[None], JobRun | ReconcileRun | UnroutedRun] = {}
        # Reconcile handlers by reconcile queue; None: any queue (`reconciler`).
        self._reconcilers: dict[str | None, Reconciler] = {}
        self._stopping: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._slot_freed: asyncio.Event | None = None
        # Slots that claims in flight (the claim loops', next claims) may fill.
        self._reserved = 0
        # Jobs whose report, carrying a next claim, is in flight: their slots
        # are that claim's to fill, though the jobs still count as running.
        self._finishing = 0
        self._next_claims = config.next_claims
        # While running: the shards claimed from (the first one's client is
        # the worker's own), their loops, and how they share the slots.
        self._links: dict[int, _Link] = {}
        self._loops: dict[int, asyncio.Task[None]] = {}
        self._slots = ShardSlots()
        self._open = False
        # The cluster's shards: None until read (and never for a pinned shard).
        self._map: ShardMap | None = None
        self._map_task: asyncio.Task[None] | None = None
        self._map_read_at: float | None = None
        self._crash: BaseException | None = None

    def handler(
        self, kind: str | None = None, *, max_concurrency: int | None = None
    ) -> Callable[[Handler], Handler]:
        """Register the handler of `kind` (a decorator; None: the default
        handler, for jobs without a kind), with at most `max_concurrency` of
        its jobs at once besides the worker's `concurrency`. Call before
        `run()`. The worker claims only the kinds it has handlers for."""

        def register(handler: Handler) -> Handler:
            self._routes.add(kind, handler, max_concurrency)
            return handler

        return register

    @property
    def kinds(self) -> list[str]:
        """The kinds this worker has handlers for (besides a default one)."""
        return self._routes.kinds

    def reconciler(self, queue: str | None = None) -> Callable[[Reconciler], Reconciler]:
        """Register a reconcile handler (a decorator) for the reconciliations
        claimed from `queue` (None: any queue this worker claims). A queue
        not among `config.queues` is claimed too. Call before `run()`."""

        def register(handler: Reconciler) -> Reconciler:
            self._reconcilers[queue] = handler
            return handler

        return register

    @property
    def queues(self) -> tuple[str, ...]:
        """What the worker claims from: its queues and its reconcilers' queues."""
        extra = [queue for queue in self._reconcilers if queue is not None]
        return tuple(dict.fromkeys((*self.config.queues, *extra)))

    @property
    def running(self) -> int:
        return len(self._runs)

    @property
    def shards(self) -> list[int]:
        """The shards the worker claims from (while it runs): [0] on a
        cluster of one shard, the pinned one with `config.shard`."""
        return sorted(self._links)

    def stop(self) -> None:
        """Stop claiming and drain; a second call skips the grace period.
        Call on the worker's loop (signal handlers installed by `run_worker` do)."""
        if self._stopping is None or self._hurry is None:
            return
        if self._stopping.is_set():
            log.info("worker stop again: cancelling running jobs now")
            self._hurry.set()
        else:
            log.info("worker stopping", extra={"running": self.running})
            self._stopping.set()

    async def run(self) -> None:
        """Claim and run jobs until `stop()`, then drain. Returns when done."""
        routes = self._routes
        if not routes.handlers:
            raise ValueError("a worker needs a handler: a default one or one for a kind")
        unserved = sorted(set(routes.limits) - set(routes.handlers))
        if unserved:
            raise ValueError(f"concurrency set for kinds without a handler: {unserved}")
        self._stopping, self._hurry, self._slot_freed = (asyncio.Event() for _ in range(3))
        config = self.config
        client = self._client or AsyncClient(
            config.urls,
            timeout_s=config.timeout_s,
            token=config.token,
            ca_file=config.ca_file,
            client_cert=config.client_cert,
            client_key=config.client_key,
            shard=config.shard,
        )
        self._open, self._crash, self._slots = True, None, ShardSlots()
        self._add_link(config.shard or 0, client, owned=self._client is None)
        log.info(
            "worker started",
            extra={
                "worker_id": config.worker_id,
                "queues": ",".join(config.queues),
                "concurrency": config.concurrency,
                "lease_s": config.lease_s,
                "poll_wait_s": config.claim_wait_s,
                "kinds": ",".join(routes.kinds),
                "default_handler": routes.has_default,
                **({} if config.shard is None else {"shard": config.shard}),
            },
        )
        try:
            if config.shard is None:
                # Which shards to claim from, before any claim takes the slots.
                self._map_task = asyncio.ensure_future(self._read_map())
                await _first(self._map_task, self._stopping.wait())
            await self._claim_until_stopped()
            if self._crash is not None:
                raise self._crash
            await self._drain()
        finally:
            self._open = False
            if self._map_task is not None:
                self._map_task.cancel()
                await asyncio.gather(self._map_task, return_exceptions=True)
            for link in self._links.values():
                await link.batcher.close()
            for link in self._links.values():
                if link.owned:
                    await link.client.close()
            self._links.clear()
            self._loops.clear()
        log.info("worker stopped", extra={"worker_id": config.worker_id})

    # -- shards ---------------------------------------------------------------

    def _add_link(self, shard: int, client: AsyncClient, *, owned: bool) -> _Link:
        config = self.config
        batcher = LeaseBatcher(
            client,
            linger_s=config.batch_linger_s,
            max_ops=config.batch_max_ops,
            next_claims=_Refill(self, shard),
            body_bytes_max=config.max_body_bytes,
        )
        link = self._links[shard] = _Link(shard, client, batcher, owned)
        self._slots.add(shard)
        return link

    @property
    def _sharded(self) -> bool:
        """Whether this worker names shards (several, or a pinned one) in its logs."""
        return self.config.shard is not None or len(self._links) > 1

    def _shard_fields(self, shard: int) -> dict[str, int]:
        return {"shard": shard} if self._sharded else {}

    async def _read_map(self) -> None:
        """Read the cluster's shards (`_shards`) and claim from each of them."""
        self._map_read_at = time.monotonic()
        base = self._links[0].client
        try:
            shard_map = await read_shard_map(base)
        except (RaftschedError, ValueError) as error:  # ValueError: not JSON
            known = "claiming from shard 0 until it is read" if self._map is None else "as before"
            log.warning(
                f"could not read the cluster's shards; {known}",
                extra={"error": str(error), "retry_in_s": REFRESH_MIN_S},
            )
            return
        first = self._map is None
        self._map = shard_map
        if shard_map.count == 1:
            return
        added = [shard for shard in range(1, shard_map.count) if shard not in self._links]
        for shard in added:
            self._add_link(shard, base.for_shard(shard), owned=True)
        for shard, url in shard_map.leaders.items():
            if shard in self._links:
                self._links[shard].client.prefer(url)
        if first or added:
            log.info(
                "claiming from every shard of the cluster",
                extra={"shards": shard_map.count, "worker_id": self.config.worker_id},
            )
        if self._loops:  # the loops run already: start the new shards'
            for shard in added:
                self._start_loop(shard)
            self._wake()

    def _map_changed(self) -> None:
        """A claim suggests the map changed (its shard's leader moved, or the
        map was never read): read it again, at most every REFRESH_MIN_S. A
        cluster of one shard stays one, a count read from /v1/time names no
        leaders, and a pinned worker never reads it."""
        if self.config.shard is not None or self._stopping_now():
            return
        if self._map is not None and (self._map.count == 1 or not self._map.names_leaders):
            return  # nothing to learn: S never changes
        if self._map_task is not None and not self._map_task.done():
            return
        now = time.monotonic()
        if self._map_read_at is not None and now - self._map_read_at < REFRESH_MIN_S:
            return
        self._map_task = asyncio.get_running_loop().create_task(self._read_map())

    # -- the claim loops --------------------------------------------------------

    async def _claim_until_stopped(self) -> None:
        assert self._stopping is not None
        for shard in list(self._links):
            self._start_loop(shard)
        await self._stopping.wait()
        while self._loops and not all(task.done() for task in self._loops.values()):
            await asyncio.gather(*self._loops.values(), return_exceptions=True)

    def _start_loop(self, shard: int) -> None:
        if shard not in self._loops and not self._stopping_now():
            task = asyncio.get_running_loop().create_task(
                self._claim_loop(self._links[shard]), name=f"claim-shard-{shard}"
            )
            self._loops[shard] = task

    def _wake(self) -> None:
        """Slots came back or the loops' order changed: let waiting loops look."""
        if self._slot_freed is not None:
            self._slot_freed.set()

    async def _claim_loop(self, link: _Link) -> None:
        try:
            await self._claim_from(link)
        except Exception as error:  # a bug: stop the worker and raise it from run()
            self._crash = error
            assert self._stopping is not None
            self._stopping.set()

    async def _claim_from(self, link: _Link) -> None:
        assert self._stopping is not None and self._slot_freed is not None
        backoff_s = CLAIM_BACKOFF_INITIAL_S
        routes, slots, shard = self._routes, self._slots, link.shard
        while not self._stopping.is_set():
            slots.wait(shard)
            free = self._free_slots()
            share = min(slots.share(shard, free), CLAIM_JOBS_MAX)
            parts = len(self._links)
            plan = routes.plan(share, probe=routes.probe_due(), parts=parts) if share > 0 else None
            if plan is None:
                # Every slot taken, other shards' turn first, every kind at its
                # limit, or nothing to run before the cluster takes kinds: wait
                # for a slot or the probe.
                if share > 0:
                    # Nothing to claim here: the slots are the others' turn.
                    # (Only waiting loops are woken: loops that rest for the
                    # same reason would wake each other back and forth.)
                    slots.rest(shard)
                    if slots.others_wait(shard):
                        self._wake()
                self._slot_freed.clear()
                waits: list[Awaitable[object]] = [self._slot_freed.wait(), self._stopping.wait()]
                if free > 0 and routes.falling_back:
                    waits.append(asyncio.sleep(routes.probe_s))
                await _first(*waits)
                continue
            wait_s = self.config.claim_wait_s
            if slots.crowded(shard, free - plan.max_jobs):
                wait_s = min(wait_s, CROWDED_POLL_WAIT_S)
            claim_sent_at = time.monotonic()
            claim = asyncio.ensure_future(self._claim(link.client, plan, wait_s))
            self._reserved += plan.max_jobs
            slots.poll(shard, plan.max_jobs)
            routes.hold(plan)
            try:
                await _first(claim, self._stopping.wait())
            finally:
                self._reserved -= plan.max_jobs
                slots.polled(shard, plan.max_jobs)
                routes.release(plan)
            if not claim.done():
                # Stopping: cancelling closes the poll's connection, and the
                # cluster ends a poll whose client is gone without granting
                # it anything. A lease granted before that expires unstarted.
                claim.cancel()
                await asyncio.gather(claim, return_exceptions=True)
                break
            try:
                leases = claim.result()
            except RaftschedError as error:
                if plan.kinds is not None and kinds_refused(error):
                    self._kinds_refused(error)  # claim again at once, without them
                    continue
                log.warning(
                    "claim failed",
                    extra={
                        "error": str(error),
                        "retry_in_s": backoff_s,
                        **self._shard_fields(shard),
                    },
                )
                slots.rest(shard)  # its slots are the other shards' meanwhile
                self._wake()
                self._map_changed()
                await _first(asyncio.sleep(backoff_s), self._stopping.wait())
                backoff_s = min(backoff_s * 2, CLAIM_BACKOFF_MAX_S)
                continue
            backoff_s = CLAIM_BACKOFF_INITIAL_S
            if plan.kinds is not None and routes.taken():
                log.info("the cluster takes job kinds now: claiming only this worker's")
            for data in leases:
                self._launch(link, data, claim_sent_at)
            if len(leases) < plan.max_jobs:
                self._wake()  # slots it held came back
            if self._map is None:
                self._map_changed()  # not read at start: the cluster answers now

    def _free_slots(self) -> int:
        return self.config.concurrency - self.running - self._reserved

    def _kinds_refused(self, error: RaftschedError) -> None:
        """The cluster does not take a claim's kinds yet (module doc of `_kinds`)."""
        routes = self._routes
        if routes.refused():
            fallback = (
                "claiming every job of the queues for the default handler"
                if routes.has_default or routes.take_unknown
                else "claiming nothing: this worker has no default handler"
            )
            log.warning(
                "the cluster does not take job kinds yet (cluster version below 8, or a "
                f"node of 0.7.0 or earlier); until it does, {fallback}",
                extra={"worker_id": self.config.worker_id, "error": str(error),
                       "retry_in_s": routes.probe_s},
            )  # fmt: skip

    # -- next claims (called by the batcher through _Refill) -------------------

    def _ask_next(self, ops: Sequence[JsonObject], shard: int) -> NextClaim | None:
        """The next claim for a batch of `shard` that reports finished jobs:
        as many jobs as will be free once they and the others reported
        meanwhile end, less a slot for each other shard's loop that holds
        none (`_slots`), unless stopping or turned off."""
        finishing = _finishing(ops)
        if not finishing or not self._next_claims or self._stopping_now():
            return None
        wanted = self._free_slots() + self._finishing + finishing - self._slots.owed(shard)
        wanted = min(wanted, CLAIM_JOBS_MAX)
        if wanted <= 0:
            return None
        routes, ids = self._routes, _finishing_ids(ops)
        routes.finishing(ids)  # their kinds' slots are this claim's to fill
        plan = routes.plan(wanted)
        if plan is None:
            routes.finishing(ids, -1)
            return None
        self._reserved += plan.max_jobs
        self._slots.reserve(shard, plan.max_jobs)
        routes.hold(plan)
        self._finishing += finishing
        config = self.config
        return next_claim(
            self.queues,
            max_jobs=plan.max_jobs,
            wait_s=0.0,
            lease_s=config.lease_s,
            worker_id=config.worker_id,
            kinds=plan.kinds,
            kind_max_jobs=plan.caps or None,
        )

    def _next_granted(
        self,
        ops: Sequence[JsonObject],
        claim: NextClaim,
        leases: list[JsonObject],
        sent_at: float,
        shard: int,
    ) -> None:
        self._reserved -= claim.max_jobs
        self._slots.unreserve(shard, claim.max_jobs)
        self._finishing -= _finishing(ops)
        routes = self._routes
        routes.release(ClaimPlan(claim.max_jobs, claim.kinds, claim.kind_max_jobs or {}))
        routes.finishing(_finishing_ids(ops), -1)
        link = self._links.get(shard)
        for data in leases:
            if link is None or not self._open or self._stopping_now():
                log.warning(
                    "lease not started: the worker is stopping; it expires unstarted",
                    extra={
                        "job_id": data.get("job_id"),
                        "fencing_token": data.get("fencing_token"),
                    },
                )
                continue
            self._launch(link, data, sent_at)
        self._wake()  # a claim asked for more than it got

    def _next_refused(self, error: InvalidRequest) -> None:
        if self._next_claims:
            self._next_claims = False
            log.warning(
                "the cluster does not take next claims (a node of 0.5.0 or earlier); "
                "claiming separately from now on",
                extra={"worker_id": self.config.worker_id, "error": str(error)},
            )

    def _stopping_now(self) -> bool:
        return self._stopping is None or self._stopping.is_set()

    async def _claim(self, client: AsyncClient, plan: ClaimPlan, wait_s: float) -> list[JsonObject]:
        config = self.config
        return await client.claim(
            config.worker_id,
            self.queues,
            max_jobs=plan.max_jobs,
            wait_s=wait_s,
            lease_s=config.lease_s,
            kinds=plan.kinds,
            kind_max_jobs=plan.caps or None,
        )

    def _launch(self, link: _Link, data: JsonObject, claim_sent_at: float) -> None:
        lease = Lease.from_json(data, self.config.lease_s)
        loop = asyncio.get_running_loop()
        run: JobRun | ReconcileRun | UnroutedRun
        routes = self._routes
        batcher = link.batcher
        if lease.kind is not None and routes.falling_back and routes.taken():
            log.info("a lease with a kind: the cluster takes job kinds now")
        if lease.reconcile is not None:
            attempt = UnknownAttempt.from_json(lease.reconcile)
            reconciler = self._reconcilers.get(attempt.queue) or self._reconcilers.get(None)
            if reconciler is None:
                # Unanswered, the lease lapses and the question is asked again.
                log.warning(
                    "no reconciler for this queue; the reconciliation lease will lapse",
                    extra={"job_id": lease.job_id, "queue": attempt.queue},
                )
                return
            context = ReconcileContext(lease, attempt, self.config.worker_id)
            run = ReconcileRun(context, reconciler, batcher)
        else:
            handler = routes.handler_for(lease.kind)
            if handler is None:
                unrouted = routes.unrouted(lease.kind, self.config.worker_id)
                run = UnroutedRun(lease, unrouted, batcher)
            else:
                ctx = JobContext(
                    lease, worker_id=self.config.worker_id, client=link.client, loop=loop
                )
                run = JobRun(ctx, handler, batcher, claim_sent_at=claim_sent_at)
            routes.started(lease.job_id, lease.kind)
        task = loop.create_task(run.run(), name=f"job-{lease.job_id}")
        self._runs[task] = run
        self._slots.started(link.shard)
        task.add_done_callback(partial(self._finished, lease.job_id, link.shard))
        log.info(
            "job leased",
            extra={
                "job_id": lease.job_id,
                "attempt": lease.attempt,
                "fencing_token": lease.fencing_token,
                "epoch": lease.epoch,
                "queue": lease.queue,
                "kind": lease.kind,
                **self._shard_fields(link.shard),
            },
        )

    def _finished(self, job_id: str, shard: int, task: asyncio.Task[None]) -> None:
        self._runs.pop(task, None)
        self._routes.ended(job_id)
        self._slots.ended(shard)
        if not task.cancelled() and task.exception() is not None:
            log.error("job run crashed", exc_info=task.exception())
        self._wake()

    async def _drain(self) -> None:
        assert self._hurry is not None
        if not self._runs:
            return
        log.info(
            "worker draining",
            extra={"running": self.running, "grace_s": self.config.shutdown_grace_s},
        )
        tasks = set(self._runs)
        await _first(asyncio.wait(tasks, timeout=self.config.shutdown_grace_s), self._hurry.wait())
        for run in list(self._runs.values()):
            run.cancel("shutdown")
        if self._runs:
            await asyncio.wait(set(self._runs), timeout=self.config.cancel_wait_s)
        for run in list(self._runs.values()):
            run.abandon()
        if self._runs:
            # Reports go out now; bounded by the client's own retry budget.
            await asyncio.wait(set(self._runs), timeout=self.config.timeout_s * 2)


def _finishing(ops: Sequence[JsonObject]) -> int:
    return sum(1 for op in ops if op.get("op") in FINISHING_OPS)


def _finishing_ids(ops: Sequence[JsonObject]) -> list[str]:
    return [str(op.get("job_id")) for op in ops if op.get("op") in FINISHING_OPS]


class UnroutedRun:
    """A lease of a job the worker has no handler for: failed as permanent
    (a dead letter, `no_handler_for_kind: ...`) without being started."""

    def __init__(self, lease: Lease, error: BaseException, batcher: LeaseOps) -> None:
        self._lease = lease
        self._error = error
        self._batcher = batcher

    def cancel(self, reason: str) -> None:
        """Nothing runs: the report goes out whatever happens."""

    def abandon(self) -> None:
        """Nothing runs to abandon."""

    async def run(self) -> None:
        fields = {**log_fields(self._lease), "error": str(self._error)}
        op = fail_op(self._lease, "permanent", self._error)
        try:
            await self._batcher.op(op)
        except LeaseLost:
            log.warning("job without a handler: lease lost before its report", extra=fields)
            return
        except RaftschedError as error:
            # Unreported, the lease lapses unstarted and the job is claimed again.
            log.warning("job without a handler: report failed", extra={**fields, "why": str(error)})
            return
        log.warning("job dead-lettered: this worker has no handler for its kind", extra=fields)


class _Refill:
    """The worker as the `NextClaims` of the batcher of one shard's jobs."""

    def __init__(self, worker: Worker, shard: int) -> None:
        self._worker = worker
        self._shard = shard

    def ask(self, ops: Sequence[JsonObject]) -> NextClaim | None:
        return self._worker._ask_next(ops, self._shard)

    def granted(
        self,
        ops: Sequence[JsonObject],
        claim: NextClaim,
        leases: list[JsonObject],
        sent_at: float,
    ) -> None:
        self._worker._next_granted(ops, claim, leases, sent_at, self._shard)

    def refused(self, error: InvalidRequest) -> None:
        self._worker._next_refused(error)

    def kinds_refused(self, error: RaftschedError) -> None:
        self._worker._kinds_refused(error)


async def _first(*awaitables: Any) -> None:
    """Wait until the first of `awaitables` finishes; cancel the others
    (except tasks created by the caller, which it checks itself)."""
    futures = [asyncio.ensure_future(item) for item in awaitables]
    _, pending = await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    for future, item in zip(futures, awaitables, strict=True):
        if future in pending and future is not item:
            future.cancel()


def load_handler(spec: str) -> Handler:
    """'package.module:function' (or 'module:Class.method') -> the callable."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"handler must look like module:function, got {spec!r}")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ValueError(f"{module_name} has no {attribute!r}")
    if not callable(target):
        raise ValueError(f"{spec} is not callable")
    return cast(Handler, target)


def run_worker(
    config: WorkerConfig,
    handler: Handlers | None,
    reconcilers: Mapping[str | None, Reconciler] | None = None,
) -> int:
    """Run a worker on a new event loop until SIGTERM/SIGINT; returns 0.
    `handler`: the default handler, or handlers by kind (None: the default);
    `reconcilers`: reconcile handlers by queue (None: any queue)."""

    async def main() -> None:
        worker = Worker(config, handler)
        for queue, reconciler in (reconcilers or {}).items():
            worker.reconciler(queue)(reconciler)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, worker.stop)
        await worker.run()

    asyncio.run(main())
    return 0
