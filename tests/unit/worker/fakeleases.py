"""An in-memory stand-in for the lease endpoints, served by aiohttp on the
test's own event loop: just enough of api.md for the worker's logic (claim,
the lease batch and its next claim, effects), with hooks to lose leases,
request cancellation, stall heartbeats, delay next claims or refuse them as a
node of 0.5.0 does; jobs of kinds, claims of kinds with caps, or their
refusal as by a cluster below version 8; data shards (`shard_count`): the
`Raftsched-Shard` header picks a shard's jobs, `/v1/cluster` and `/v1/time`
name the shards, and a shard may be down (503 `no_leader`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from raftsched.worker import Worker, WorkerConfig


@dataclass
class FakeJob:
    id: str
    payload: Any
    token: int = 0
    status: str = "pending"
    attempt: int = 0
    cancel_requested: bool = False
    result: Any = None
    error: dict[str, Any] | None = None
    heartbeats: int = 0
    progress: list[Any] = field(default_factory=list)
    # A reconciling job: its lease asks about this attempt, from this queue.
    reconcile_queue: str | None = None
    decision: dict[str, Any] | None = None
    kind: str | None = None
    # The W3C trace context it was submitted with (its leases carry it).
    traceparent: str | None = None
    tracestate: str | None = None
    # Where it came from: a workflow's step, or a schedule's occurrence.
    workflow_id: str | None = None
    step: str | None = None
    schedule_id: str | None = None
    # The data shard that holds it (a request names it with Raftsched-Shard).
    shard: int = 0


class FakeLeases:
    def __init__(self) -> None:
        self.jobs: dict[str, FakeJob] = {}
        self.effects: dict[str, dict[str, Any]] = {}
        self.batches: list[list[dict[str, Any]]] = []
        self.ops: list[tuple[str, str]] = []  # (op, job_id) in arrival order
        self.stall_heartbeats = False
        self.lose_lease_on_effect = False  # another worker got the job meanwhile
        self.claims = 0  # POST /v1/leases requests
        self.claim_waits: list[float] = []  # their wait_s
        self.nexts: list[dict[str, Any]] = []  # the next claims batches carried
        self.refuse_next = False  # answer `next` as a node of 0.5.0 does
        self.next_delay_s = 0.0  # how long a batch with a next claim takes
        self.refuse_kinds = False  # answer claims of kinds as a cluster below version 8
        self.claim_bodies: list[dict[str, Any]] = []  # every claim's, next claims' too
        # The `traceparent` header of each lease batch and effect request (None: none).
        self.batch_traceparents: list[str | None] = []
        self.effect_traceparents: list[str | None] = []
        # A node's body limit for lease batches: a larger one is answered 413,
        # naming the limit unless `name_body_limit` is off (a node of 0.7.0).
        self.max_body_bytes: int | None = None
        self.name_body_limit = True
        self.batch_sizes: list[int] = []  # the body of every lease batch, in bytes
        self.refused_batches = 0
        # Data shards: more than one answers /v1/cluster with them (or 403,
        # as to a worker token, with `cluster_forbidden`; /v1/time names them).
        self.shard_count = 1
        self.cluster_forbidden = False
        self.cluster_unavailable = False  # /v1/cluster answers 503
        self.cluster_reads = 0
        self.down_shards: set[int] = set()  # their claims answer 503 no_leader
        self.claim_shards: list[int] = []  # the shard each claim is for
        self.claim_headers: list[str | None] = []  # the Raftsched-Shard each claim sent
        # Slots held by claims in flight (their max_jobs), per shard, and the most at once.
        self.polling: Counter[int] = Counter()
        self.polling_max = 0
        self.misrouted: list[tuple[str, int]] = []  # (job id, shard named) of lease ops
        self.batch_shards: list[int] = []  # the shard each lease batch named
        self._tokens = itertools.count(1000)
        self._runner: web.AppRunner | None = None
        self.url = ""

    def add(
        self, job_id: str, payload: Any = None, kind: str | None = None, shard: int = 0
    ) -> FakeJob:
        job = self.jobs[job_id] = FakeJob(job_id, payload, kind=kind, shard=shard)
        return job

    def _claimable(
        self, body: dict[str, Any], statuses: tuple[str, ...], shard: int = 0
    ) -> list[FakeJob]:
        """What a claim takes, in order: with `kinds`, only those kinds ("*":
        any other), at most `kind_max_jobs[kind]` of a kind; reconciliations
        whatever their kind, as the cluster grants them."""
        kinds, caps = body.get("kinds"), body.get("kind_max_jobs") or {}
        taken: Counter[str | None] = Counter()
        found = []
        for job in self.jobs.values():
            if job.status not in statuses or job.shard != shard:
                continue
            if kinds is not None and job.status != "reconciling":
                key = job.kind if job.kind in kinds else "*"
                if key not in kinds or taken[key] >= caps.get(key, 10**6):
                    continue
                taken[key] += 1
            found.append(job)
        return found[: body["max_jobs"]]

    @staticmethod
    def _too_old() -> dict[str, Any]:
        details = {"reason": "cluster_version", "command": "ClaimJobsOfKinds",
                   "command_version": 8, "cluster_version": 7}  # fmt: skip
        return {"code": "invalid_state", "message": "upgrade every node first", "details": details}

    def lose_lease(self, job_id: str) -> None:
        self.jobs[job_id].token = next(self._tokens)  # another worker's token now

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/leases", self._claim)
        app.router.add_post("/v1/leases/batch", self._batch)
        app.router.add_post("/v1/effects", self._record_effect)
        app.router.add_get("/v1/effects/{key}", self._get_effect)
        app.router.add_get("/v1/cluster", self._cluster)
        app.router.add_get("/v1/time", self._time)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def wait_for(self, predicate: Any, timeout_s: float = 5.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await asyncio.sleep(0.01)

    @staticmethod
    def _shard(request: web.Request) -> int:
        return int(request.headers.get("Raftsched-Shard", "0"))

    async def _cluster(self, request: web.Request) -> web.Response:
        self.cluster_reads += 1
        if self.cluster_unavailable:
            error = {"code": "unavailable", "message": "not now"}
            return web.json_response({"error": error}, status=503, headers={"Retry-After": "0"})
        if self.cluster_forbidden:
            error = {"code": "forbidden", "message": "a worker token may not"}
            return web.json_response({"error": error}, status=403)
        body: dict[str, Any] = {"node_id": "n1"}
        if self.shard_count > 1:
            leader = {"id": "n1", "http_url": self.url}
            body["shards"] = [
                {"shard": shard, "leader": None if shard in self.down_shards else leader}
                for shard in range(self.shard_count)
            ]
        return web.json_response(body)

    async def _time(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = {"node_id": "n1", "wall_ms": 0}
        if self.shard_count > 1:
            body["shards"] = self.shard_count
        return web.json_response(body)

    async def _claim(self, request: web.Request) -> web.Response:
        body = await request.json()
        shard = self._shard(request)
        self.claims += 1
        self.claim_shards.append(shard)
        self.claim_headers.append(request.headers.get("Raftsched-Shard"))
        self.claim_waits.append(body["wait_s"])
        self.claim_bodies.append(body)
        if shard in self.down_shards:
            error = {"code": "no_leader", "message": f"shard {shard} has no leader"}
            return web.json_response({"error": error}, status=503, headers={"Retry-After": "0"})
        if self.refuse_kinds and "kinds" in body:
            return web.json_response({"error": self._too_old()}, status=409)
        loop = asyncio.get_running_loop()
        until = loop.time() + body["wait_s"]
        self.polling[shard] += body["max_jobs"]
        self.polling_max = max(self.polling_max, self.polling.total())
        try:
            while True:
                ready = self._claimable(body, ("pending", "reconciling"), shard)
                if ready or loop.time() >= until:
                    break
                await asyncio.sleep(0.01)
        finally:
            self.polling[shard] -= body["max_jobs"]
        leases = [self._grant(job, body["lease_s"]) for job in ready]
        return web.json_response({"leases": leases})

    def add_reconciling(self, job_id: str, payload: Any = None, queue: str = "q") -> FakeJob:
        job = self.add(job_id, payload)
        job.status, job.attempt, job.reconcile_queue = "reconciling", 1, queue
        return job

    def _grant(self, job: FakeJob, lease_s: float) -> dict[str, Any]:
        if job.status == "reconciling":
            job.status, job.token = "asked", next(self._tokens)
            lease = self._lease(job, lease_s)
            lease["reconcile"] = {
                "attempt": job.attempt, "fencing_token": 7, "worker_id": "w-crashed",
                "started_at": "2029-12-31T23:59:00.000Z", "effect_keys": ["charge:1"],
                "queue": job.reconcile_queue,
            }  # fmt: skip
            return lease
        job.status, job.token = "claimed", next(self._tokens)
        job.attempt += 1
        return self._lease(job, lease_s)

    def _lease(self, job: FakeJob, lease_s: float) -> dict[str, Any]:
        return {
            "job_id": job.id, "attempt": job.attempt, "epoch": 1, "fencing_token": job.token,
            "expires_at": "2030-01-01T00:00:00.000Z", "lease_s": lease_s, "queue": "q",
            "payload": job.payload, "idempotency_key": f"key-{job.id}", "ordering_key": None,
            "correlation_id": None, "workflow_id": job.workflow_id, "step": job.step,
            "schedule_id": job.schedule_id, "inputs": {}, "kind": job.kind,
            "traceparent": job.traceparent, "tracestate": job.tracestate,
        }  # fmt: skip

    async def _batch(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.batch_sizes.append(len(raw))
        if self.max_body_bytes is not None and len(raw) > self.max_body_bytes:
            self.refused_batches += 1
            details = {"max_body_bytes": self.max_body_bytes} if self.name_body_limit else {}
            error = {"code": "payload_too_large", "message": "too large", "details": details}
            return web.json_response({"error": error}, status=413)
        body = json.loads(raw)
        ops, claim = body["ops"], body.get("next")
        if claim is not None and self.refuse_next:
            error = {"code": "invalid_request", "message": "next: unknown field",
                     "details": {"field": "next"}}  # fmt: skip
            return web.json_response({"error": error}, status=400)
        self.batches.append(ops)
        shard = self._shard(request)
        self.batch_shards.append(shard)
        self.misrouted += [(op["job_id"], shard) for op in ops
                           if self.jobs[op["job_id"]].shard != shard]  # fmt: skip
        self.batch_traceparents.append(request.headers.get("traceparent"))
        if self.stall_heartbeats and any(op["op"] == "heartbeat" for op in ops):
            await asyncio.sleep(3600)
        answer: dict[str, Any] = {"results": [self._apply(op) for op in ops]}
        if claim is not None:
            self.nexts.append(claim)
            self.claim_bodies.append(claim)
            await asyncio.sleep(self.next_delay_s)
            if self.refuse_kinds and "kinds" in claim:
                answer["next"] = {"error": self._too_old()}  # the ops stand
                return web.json_response(answer)
            ready = self._claimable(claim, ("pending",), shard)
            lease_s = claim.get("lease_s") or 30
            answer["next"] = {"leases": [self._grant(job, lease_s) for job in ready]}
        return web.json_response(answer)

    def _apply(self, op: dict[str, Any]) -> dict[str, Any]:
        job = self.jobs[op["job_id"]]
        self.ops.append((op["op"], job.id))
        if job.status == "asked" and op["fencing_token"] == job.token:
            if op["op"] == "reconcile":
                job.decision = op
                job.status = "decided"
                return {"job_id": job.id, "decision": op["decision"], "status": "succeeded"}
            if op["op"] == "heartbeat":
                job.heartbeats += 1
                return {"expires_at": "2030-01-01T00:00:00.000Z", "cancel_requested": False}
        if op["fencing_token"] != job.token or job.status not in ("claimed", "running"):
            return {"error": {"code": "lease_lost", "message": "not the current token"}}
        if op["op"] == "start":
            job.status = "running"
        elif op["op"] == "heartbeat":
            job.heartbeats += 1
            job.progress.append(op.get("progress"))
        elif op["op"] == "complete":
            job.status, job.result = "succeeded", op.get("result")
        elif op["op"] == "fail":
            job.error = op["error"]
            job.status = "failed"
        return {"expires_at": "2030-01-01T00:00:00.000Z", "cancel_requested": job.cancel_requested}

    async def _record_effect(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.effect_traceparents.append(request.headers.get("traceparent"))
        if self.lose_lease_on_effect:
            self.lose_lease(body["job_id"])
        if body["fencing_token"] != self.jobs[body["job_id"]].token:
            error = {"code": "lease_lost", "message": "stale token"}
            return web.json_response({"error": error}, status=409)
        if body["key"] in self.effects:
            return web.json_response({"effect": self.effects[body["key"]], "replayed": True})
        effect = self.effects[body["key"]] = {"key": body["key"], "result": body["result"]}
        return web.json_response({"effect": effect, "replayed": False}, status=201)

    async def _get_effect(self, request: web.Request) -> web.Response:
        effect = self.effects.get(request.match_info["key"])
        if effect is None:
            return web.json_response({"error": {"code": "not_found", "message": "no"}}, status=404)
        return web.json_response(effect)


Scenario = Callable[[FakeLeases], Awaitable[None]]


@contextlib.asynccontextmanager
async def running_worker(
    fake: FakeLeases,
    handler: Any,
    *,
    setup: Callable[[Worker], None] | None = None,
    **options: Any,
) -> AsyncIterator[Worker]:
    """A worker of `handler` (a default handler, or handlers by kind);
    `setup` registers more before it runs."""
    settings: dict[str, Any] = {"concurrency": 4, "lease_s": 5.0, "poll_wait_s": 0.2}
    settings.update(options)
    worker = Worker(WorkerConfig([fake.url], ("q",), worker_id="w-test", **settings), handler)
    if setup is not None:
        setup(worker)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)


def run(scenario: Scenario) -> None:
    async def main() -> None:
        fake = FakeLeases()
        await fake.start()
        try:
            await scenario(fake)
        finally:
            await fake.stop()

    asyncio.run(main())
