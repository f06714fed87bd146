"""The asyncio client (aiohttp). Same calls, same routing as `Client`.

Create it inside a running loop (or first use it there) and close it with
`await client.close()` or `async with AsyncClient(...) as client`.
"""

from __future__ import annotations

import asyncio
import copy
import ssl
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

import aiohttp
from yarl import URL

from raftsched.client import _calls as calls
from raftsched.client import _flow_calls as flow_calls
from raftsched.client import _next_calls as next_calls
from raftsched.client import _read_calls as read_calls
from raftsched.client import _workflow_calls as wf_calls
from raftsched.client._calls import (
    Call,
    Consistency,
    FailureKind,
    JsonObject,
    ReconcileDecision,
    Response,
    RunAt,
    encode_body,
    request_headers,
    token_from_env,
)
from raftsched.client._next_calls import NextClaim, NextLeases
from raftsched.client._read_calls import JobEffects, StatsSeries
from raftsched.client._routing import Attempts, Nodes, TransportFailure, base_of
from raftsched.client._schedules import AsyncSchedulesMixin
from raftsched.client._tls import StrPath, client_ssl_context

T = TypeVar("T")


class AsyncClient(AsyncSchedulesMixin):
    """Async twin of `raftsched.client.Client`; see its documentation."""

    def __init__(
        self,
        urls: Sequence[str] | str | None = None,
        *,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 2.0,
        retry_budget_s: float = 15.0,
        token: str | None = None,
        ca_file: StrPath | None = None,
        client_cert: StrPath | None = None,
        client_key: StrPath | None = None,
        shard: int | None = None,
    ) -> None:
        self._nodes = Nodes(urls)
        # A client of one data shard names it on every call (docs/shards.md).
        self._shard = shard
        self._timeout_s = timeout_s
        self._connect_timeout_s = min(connect_timeout_s, timeout_s)
        context = client_ssl_context(ca_file, client_cert, client_key)
        # True: aiohttp's default verification against the system's store.
        self._ssl: ssl.SSLContext | bool = True if context is None else context
        self._retry_budget_s = retry_budget_s
        # None: $RAFTSCHED_TOKEN, if set; "" sends no token at all.
        self._token = token_from_env() if token is None else (token or None)
        self._session: aiohttp.ClientSession | None = None

    @property
    def urls(self) -> list[str]:
        return list(self._nodes.urls)

    @property
    def shard(self) -> int | None:
        """The data shard this client names on every call (None: none)."""
        return self._shard

    def for_shard(self, shard: int | None) -> AsyncClient:
        """A client like this one (nodes, credentials, TLS, timeouts) that
        names `shard` on every call, with connections and a preferred node
        of its own: a shard's calls go to the node hosting its leader, which
        is not another shard's. Close it apart from this one."""
        twin = copy.copy(self)
        twin._nodes = Nodes(self._nodes.urls)
        twin._nodes.prefer(self._nodes.preferred())
        twin._shard = shard
        twin._session = None
        return twin

    def prefer(self, url: str) -> None:
        """Send the next call to the node at `url` first (one that leads, say);
        redirects and failures move on from it as from any node."""
        self._nodes.prefer(base_of(url))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- execution -------------------------------------------------------

    async def call(self, call: Call[T]) -> T:
        return call.unwrap(await self._execute(call))

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, object] | None = None,
        body: Any = None,
        retry_unknown: bool | None = None,
    ) -> Response:
        return await self._execute(
            calls.raw(method, path, query=query, body=body, retry_unknown=retry_unknown)
        )

    async def _execute(self, call: Call[Any]) -> Response:
        attempts = Attempts(self._nodes, call, budget_s=self._retry_budget_s)
        headers = request_headers(call, uuid.uuid4().hex, self._token, self._shard)
        body = encode_body(call)
        timeout_s = self._timeout_s + call.extra_timeout_s
        while True:
            try:
                response = await self._send(call.method, attempts.url, body, headers, timeout_s)
            except TransportFailure as failure:
                step: Response | float = attempts.on_failure(failure)
            else:
                step = attempts.on_response(response)
            if isinstance(step, Response):
                return step
            if step > 0:
                await asyncio.sleep(step)

    async def _send(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout_s: float,
    ) -> Response:
        session = self._session_now()
        timeout = aiohttp.ClientTimeout(total=timeout_s, connect=self._connect_timeout_s)
        try:
            async with session.request(
                method,
                URL(url, encoded=True),
                data=body,
                headers=dict(headers),
                timeout=timeout,
                allow_redirects=False,  # redirects are followed by Attempts, body kept
                ssl=self._ssl,
            ) as answer:
                data = await answer.read()
                answer_headers = {name.lower(): value for name, value in answer.headers.items()}
                return Response(answer.status, answer_headers, data, url)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as error:
            raise TransportFailure(error, sent=False) from error
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise TransportFailure(error, sent=True) from error

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def _send_once(self, url: str, path: str) -> Response | None:
        call = calls.raw("GET", path)
        headers = request_headers(call, uuid.uuid4().hex, self._token, self._shard)
        try:
            return await self._send("GET", base_of(url) + path, None, headers, self._timeout_s)
        except TransportFailure:
            return None

    # --- jobs --------------------------------------------------------------

    async def submit(
        self,
        queue: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        run_at: RunAt | None = None,
        delay_s: float | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        backoff: Mapping[str, float] | None = None,
        lease_s: float | None = None,
        deadline_s: float | None = None,
        tenant: str | None = None,
        ordering_key: str | None = None,
        correlation_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        on_unknown: Literal["retry", "reconcile"] | None = None,
        reconcile_queue: str | None = None,
        kind: str | None = None,
    ) -> JsonObject:
        request = calls.job_request(
            queue, payload, idempotency_key=idempotency_key, run_at=run_at, delay_s=delay_s,
            priority=priority, max_attempts=max_attempts, backoff=backoff, lease_s=lease_s,
            deadline_s=deadline_s, tenant=tenant, ordering_key=ordering_key,
            correlation_id=correlation_id, labels=labels, on_unknown=on_unknown,
            reconcile_queue=reconcile_queue, kind=kind,
        )  # fmt: skip
        return await self.call(calls.submit(request))

    async def submit_batch(self, jobs: Sequence[Mapping[str, Any]]) -> list[JsonObject]:
        return await self.call(calls.submit_batch(jobs))

    async def get_job(self, job_id: str, *, consistency: Consistency | None = None) -> JsonObject:
        return await self.call(calls.get_job(job_id, consistency))

    async def list_jobs(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        tenant: str | None = None,
        schedule_id: str | None = None,
        workflow_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        consistency: Consistency | None = None,
        kind: str | None = None,
    ) -> JsonObject:
        return await self.call(
            calls.list_jobs(
                queue=queue, status=status, tenant=tenant, schedule_id=schedule_id,
                workflow_id=workflow_id, limit=limit, cursor=cursor, consistency=consistency,
                kind=kind,
            )
        )  # fmt: skip

    async def iter_jobs(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        tenant: str | None = None,
        schedule_id: str | None = None,
        workflow_id: str | None = None,
        page_size: int | None = None,
        consistency: Consistency | None = None,
        kind: str | None = None,
    ) -> AsyncIterator[JsonObject]:
        cursor: str | None = None
        while True:
            page = await self.list_jobs(
                queue=queue, status=status, tenant=tenant, schedule_id=schedule_id,
                workflow_id=workflow_id, limit=page_size, cursor=cursor, consistency=consistency,
                kind=kind,
            )  # fmt: skip
            for job in page.get("jobs", []):
                yield job
            cursor = page.get("next_cursor")
            if not cursor:
                return

    async def cancel_job(self, job_id: str, reason: str | None = None) -> JsonObject:
        return await self.call(calls.cancel_job(job_id, reason))

    async def replay_job(self, job_id: str, reason: str) -> JsonObject:
        return await self.call(calls.replay_job(job_id, reason))

    async def job_history(
        self, job_id: str, *, consistency: Consistency | None = None
    ) -> list[JsonObject]:
        return await self.call(calls.job_history(job_id, consistency))

    async def reconciliation(
        self,
        *,
        hours: int | None = None,
        limit: int | None = None,
        consistency: Consistency | None = None,
    ) -> JsonObject:
        """The reconciliation report: `{"now", "since", "hours", "reconciling":
        {"jobs", "total", "truncated"}, "unknown_outcomes": {"buckets",
        "queues"}, "decisions", "completed": {"jobs", "total",
        "truncated"}}` over the last `hours` (1 to 168, default 24), at most
        `limit` jobs per list (default 100); a scoped token's own jobs only."""
        return await self.call(calls.reconciliation(hours, limit, consistency))

    # --- leases --------------------------------------------------------------

    async def claim(
        self,
        worker_id: str,
        queues: Sequence[str],
        *,
        max_jobs: int = 1,
        wait_s: float = 20.0,
        lease_s: float = 30.0,
        kinds: Sequence[str | None] | None = None,
        kind_max_jobs: Mapping[str, int] | None = None,
    ) -> list[JsonObject]:
        """Long-poll for up to `max_jobs` leases; [] after `wait_s`. With
        `kinds`, only jobs of those kinds (None: jobs without one), at most
        `kind_max_jobs[kind]` of a kind (cluster version 8)."""
        return await self.call(
            calls.claim(worker_id, queues, max_jobs, wait_s, lease_s, kinds, kind_max_jobs)
        )

    async def start(self, job_id: str, fencing_token: int) -> JsonObject:
        return await self.call(calls.lease_op(job_id, "start", calls.start_body(fencing_token)))

    async def heartbeat(
        self,
        job_id: str,
        fencing_token: int,
        *,
        extend_s: float | None = None,
        progress: Mapping[str, Any] | None = None,
    ) -> JsonObject:
        body = calls.heartbeat_body(fencing_token, extend_s, progress)
        return await self.call(calls.lease_op(job_id, "heartbeat", body))

    @overload
    async def complete(
        self, job_id: str, fencing_token: int, result: Any = None, *, next_claim: None = None
    ) -> JsonObject: ...

    @overload
    async def complete(
        self, job_id: str, fencing_token: int, result: Any = None, *, next_claim: NextClaim
    ) -> tuple[JsonObject, NextLeases]: ...

    async def complete(
        self,
        job_id: str,
        fencing_token: int,
        result: Any = None,
        *,
        next_claim: NextClaim | None = None,
    ) -> JsonObject | tuple[JsonObject, NextLeases]:
        """The job succeeded. With `next_claim` (see `raftsched.client.next_claim`),
        also claim: returns (the answer, NextLeases); raises InvalidRequest with
        field `next` from a node of 0.5.0 or earlier (`next_refused`)."""
        body = calls.complete_body(fencing_token, result)
        if next_claim is None:
            return await self.call(calls.lease_op(job_id, "complete", body))
        return await self.call(next_calls.lease_op_then_claim(job_id, "complete", body, next_claim))

    @overload
    async def fail(
        self,
        job_id: str,
        fencing_token: int,
        *,
        kind: FailureKind = "transient",
        message: str = "",
        retry_after_s: float | None = None,
        next_claim: None = None,
    ) -> JsonObject: ...

    @overload
    async def fail(
        self,
        job_id: str,
        fencing_token: int,
        *,
        kind: FailureKind = "transient",
        message: str = "",
        retry_after_s: float | None = None,
        next_claim: NextClaim,
    ) -> tuple[JsonObject, NextLeases]: ...

    async def fail(
        self,
        job_id: str,
        fencing_token: int,
        *,
        kind: FailureKind = "transient",
        message: str = "",
        retry_after_s: float | None = None,
        next_claim: NextClaim | None = None,
    ) -> JsonObject | tuple[JsonObject, NextLeases]:
        """The attempt failed. `next_claim`: as for `complete`."""
        body = calls.fail_body(fencing_token, kind, message, retry_after_s)
        if next_claim is None:
            return await self.call(calls.lease_op(job_id, "fail", body))
        return await self.call(next_calls.lease_op_then_claim(job_id, "fail", body, next_claim))

    async def reconcile(
        self,
        job_id: str,
        fencing_token: int,
        decision: ReconcileDecision,
        *,
        result: Any = None,
        effects: Mapping[str, Any] | None = None,
        reason: str = "",
    ) -> JsonObject:
        """Answer a reconciliation lease (see `Client.reconcile`)."""
        body = calls.reconcile_body(fencing_token, decision, result, effects, reason)
        return await self.call(calls.lease_op(job_id, "reconcile", body))

    @overload
    async def lease_batch(
        self, ops: Sequence[Mapping[str, Any]], *, next_claim: None = None
    ) -> list[JsonObject]: ...

    @overload
    async def lease_batch(
        self, ops: Sequence[Mapping[str, Any]], *, next_claim: NextClaim
    ) -> tuple[list[JsonObject], NextLeases]: ...

    async def lease_batch(
        self, ops: Sequence[Mapping[str, Any]], *, next_claim: NextClaim | None = None
    ) -> list[JsonObject] | tuple[list[JsonObject], NextLeases]:
        """`[{"op", "job_id", "fencing_token", ...}]` -> per-op result or `{"error"}`.
        With `next_claim` (its `worker_id` required), also claim after the ops:
        returns (the results, NextLeases)."""
        if next_claim is None:
            return await self.call(calls.lease_batch(ops))
        return await self.call(next_calls.lease_batch_then_claim(ops, next_claim))

    # --- effects ---------------------------------------------------------------

    async def record_effect(
        self, key: str, job_id: str, fencing_token: int, result: Any
    ) -> JsonObject:
        return await self.call(calls.record_effect(key, job_id, fencing_token, result))

    async def get_effect(self, key: str, *, consistency: Consistency | None = None) -> JsonObject:
        return await self.call(calls.get_effect(key, consistency))

    async def job_effects(
        self, job_id: str, *, limit: int | None = None, consistency: Consistency | None = None
    ) -> JobEffects:
        """The effects the job recorded, oldest first: `{"effects": [Effect],
        "total": n}`, at most `limit` of them (1 to 1000, default 100);
        `total` counts them all. NotFound for a job that does not exist or
        is outside the token's tenants or queues."""
        return await self.call(read_calls.job_effects(job_id, limit, consistency))

    # --- cluster -----------------------------------------------------------------

    async def cluster(self, *, consistency: Consistency | None = None) -> JsonObject:
        return await self.call(calls.cluster(consistency))

    async def add_node(self, node_id: str, raft_address: str, http_url: str) -> JsonObject:
        return await self.call(calls.add_node(node_id, raft_address, http_url))

    async def remove_node(self, node_id: str) -> JsonObject:
        return await self.call(calls.remove_node(node_id))

    # --- flow control: queues and tenants ---------------------------------------

    async def set_queue(self, name: str, **settings: Any) -> JsonObject:
        """Replace a queue's settings: paused, rate_limit_per_s, burst,
        concurrency_limit, circuit_window, circuit_probe_interval_s."""
        return await self.call(flow_calls.set_queue(name, settings))

    async def pause_queue(self, name: str) -> JsonObject:
        return await self.call(flow_calls.pause_queue(name, True))

    async def resume_queue(self, name: str) -> JsonObject:
        return await self.call(flow_calls.pause_queue(name, False))

    async def get_queue(self, name: str, *, consistency: Consistency | None = None) -> JsonObject:
        return await self.call(flow_calls.get_queue(name, consistency))

    async def list_queues(self, *, consistency: Consistency | None = None) -> list[JsonObject]:
        return await self.call(flow_calls.list_queues(consistency))

    async def set_tenant(self, name: str, **settings: Any) -> JsonObject:
        """Replace a tenant's settings: weight, concurrency_limit, max_queued."""
        return await self.call(flow_calls.set_tenant(name, settings))

    async def get_tenant(self, name: str, *, consistency: Consistency | None = None) -> JsonObject:
        return await self.call(flow_calls.get_tenant(name, consistency))

    async def list_tenants(self, *, consistency: Consistency | None = None) -> list[JsonObject]:
        return await self.call(flow_calls.list_tenants(consistency))

    # --- workflows, events and subscriptions ------------------------------------

    async def submit_workflow(self, request: Mapping[str, Any]) -> JsonObject:
        """Submit a workflow (api.md body); answers the Workflow with its steps."""
        return await self.call(wf_calls.submit_workflow(request))

    async def get_workflow(
        self, workflow_id: str, *, consistency: Consistency | None = None
    ) -> JsonObject:
        return await self.call(wf_calls.get_workflow(workflow_id, consistency))

    async def list_workflows(
        self,
        *,
        status: str | None = None,
        tenant: str | None = None,
        limit: int | None = None,
        consistency: Consistency | None = None,
    ) -> JsonObject:
        return await self.call(wf_calls.list_workflows(status, tenant, limit, consistency))

    async def workflow_history(
        self, workflow_id: str, *, consistency: Consistency | None = None
    ) -> list[JsonObject]:
        return await self.call(wf_calls.workflow_history(workflow_id, consistency))

    async def cancel_workflow(self, workflow_id: str, reason: str | None = None) -> JsonObject:
        return await self.call(wf_calls.cancel_workflow(workflow_id, reason))

    async def events(
        self,
        after: int | str = 0,
        *,
        types: Sequence[str] | None = None,
        wait_s: float | None = None,
        limit: int | None = None,
        consistency: Consistency | None = None,
    ) -> JsonObject:
        """`{"events": [...], "last_seq", "first_seq"}`: events with seq > after.

        In a cluster of several shards `after` is the cursor an answer gave
        (`next_after`, or `last_seq` to start from now: `v1.<seq0>.<seq1>...`),
        each event names its `shard` and `id`, and `last_seq` and `first_seq`
        are such cursors too (docs/events.md)."""
        return await self.call(wf_calls.events(after, types, wait_s, limit, consistency))

    async def audit(
        self,
        *,
        actor: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        consistency: Consistency | None = None,
    ) -> JsonObject:
        """`{"entries": [...], "next_cursor"}`: operator actions, newest first."""
        return await self.call(wf_calls.audit(actor, kind, limit, cursor, consistency))

    async def create_subscription(
        self,
        url: str,
        secret: str,
        types: Sequence[str] = (),
        *,
        subscription_id: str | None = None,
    ) -> JsonObject:
        return await self.call(wf_calls.create_subscription(url, secret, types, subscription_id))

    async def create_broker_subscription(
        self,
        sink: Mapping[str, Any],
        types: Sequence[str] = (),
        *,
        subscription_id: str | None = None,
        tenants: Sequence[str] | None = None,
        key_field: str | None = None,
    ) -> JsonObject:
        """A subscription whose events the leader publishes to a broker
        (docs/relays.md), e.g. `sink={"kind": "redis", "url": ..., "stream": ...}`."""
        return await self.call(
            wf_calls.create_broker_subscription(sink, types, subscription_id, tenants, key_field)
        )

    async def list_subscriptions(
        self, *, consistency: Consistency | None = None
    ) -> list[JsonObject]:
        return await self.call(wf_calls.list_subscriptions(consistency))

    async def get_subscription(
        self, subscription_id: str, *, consistency: Consistency | None = None
    ) -> JsonObject:
        return await self.call(wf_calls.get_subscription(subscription_id, consistency))

    async def delete_subscription(self, subscription_id: str) -> None:
        await self.call(wf_calls.delete_subscription(subscription_id))

    # --- API tokens (admin) and who the caller is -------------------------------

    async def create_token(
        self,
        name: str,
        role: str,
        *,
        tenants: Sequence[str] = ("*",),
        queues: Sequence[str] = ("*",),
        expires_at: str | None = None,
    ) -> JsonObject:
        """`{"token": Token, "secret": "rsk_..."}`: the secret is shown only here."""
        return await self.call(wf_calls.create_token(name, role, tenants, queues, expires_at))

    async def list_tokens(self, *, consistency: Consistency | None = None) -> list[JsonObject]:
        return await self.call(wf_calls.list_tokens(consistency))

    async def get_token(
        self, token_id: str, *, consistency: Consistency | None = None
    ) -> JsonObject:
        return await self.call(wf_calls.get_token(token_id, consistency))

    async def revoke_token(self, token_id: str) -> JsonObject:
        return await self.call(wf_calls.revoke_token(token_id))

    async def whoami(self) -> JsonObject:
        """`{"token": Token | None, "auth": "on" | "off", ...}`."""
        return await self.call(wf_calls.whoami())

    async def retry_parked(self, subscription_id: str) -> JsonObject:
        return await self.call(wf_calls.retry_parked(subscription_id))

    async def metrics(self) -> str:
        return await self.call(calls.metrics())

    async def stats_series(
        self, queue: str | None = None, *, window_s: int | None = None
    ) -> StatsSeries:
        """The charts' figures of `queue` (None: the whole cluster) over the
        last `window_s` seconds (5 to 3600, default 3600), one value per 5 s
        bucket. Answered by the node the call reaches, from its own memory
        (`node_id` names it); counts agree on every node. Needs a token for
        every tenant (Forbidden otherwise); NotFound for a queue without a
        series on that node (no job this past hour)."""
        return await self.call(read_calls.stats_series(queue, window_s))

    async def healthz(self, url: str | None = None) -> bool:
        response = await self._send_once(url or self._nodes.preferred(), "/healthz")
        return response is not None and response.status == 200

    async def readyz(self, url: str | None = None) -> bool:
        response = await self._send_once(url or self._nodes.preferred(), "/readyz")
        return response is not None and response.status == 200
