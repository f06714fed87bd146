"""The blocking client. One instance may be shared by many threads."""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

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
from raftsched.client._http import HttpTransport
from raftsched.client._next_calls import NextClaim, NextLeases
from raftsched.client._read_calls import JobEffects, StatsSeries
from raftsched.client._routing import Attempts, Nodes, TransportFailure, base_of
from raftsched.client._schedules import SchedulesMixin
from raftsched.client._tls import StrPath, client_ssl_context

T = TypeVar("T")

# The three nodes of `raftsched dev`: what the CLI falls back to without
# --url or $RAFTSCHED_URL. The clients and the worker do not: a program that
# was not told where its cluster is says so rather than try localhost.
DEFAULT_URLS = ("http://127.0.0.1:8701", "http://127.0.0.1:8702", "http://127.0.0.1:8703")


# A call's request id labels the nodes' log lines for it: unique, not
# unguessable. A random prefix per process and a counter, as 32 hex digits
# like a uuid4's; uuid4 is a getrandom call per request (3 us).
_request_id_prefix = uuid.uuid4().hex[:16]
_request_ids = itertools.count(1)


def _new_request_id() -> str:
    return f"{_request_id_prefix}{next(_request_ids):016x}"


def _after_fork() -> None:
    global _request_id_prefix, _request_ids
    _request_id_prefix, _request_ids = uuid.uuid4().hex[:16], itertools.count(1)


os.register_at_fork(after_in_child=_after_fork)


class Client(SchedulesMixin):
    """Typed blocking client for the raftsched HTTP API.

    `urls`: node base URLs (a list, or one comma-separated string); None
    (the default) takes `$RAFTSCHED_URL`, and with neither it raises
    ValueError. `token`: the bearer secret; None (the default) takes
    `$RAFTSCHED_TOKEN` if it is set, and "" sends none. Calls
    follow redirects to the leader, move to another node when one is down,
    wait out 503s, and repeat after an unknown outcome only when that is safe
    (see `raftsched.client._calls`). Each call gives up after `retry_budget_s`.
    Answers are the API's JSON objects, unwrapped (`submit` returns the Job).

    HTTPS: `ca_file` is the CA bundle to trust instead of the system's
    (a cluster with its own CA); `client_cert` and `client_key` are shown to
    a cluster that requires client certificates (mutual TLS).

    `shard`: a cluster of several data shards (docs/shards.md) answers every
    call of this client from shard `shard` (the `Raftsched-Shard` header):
    a worker's claims, say. Calls by id and submissions find their shard
    without it.
    """

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
        self._retry_budget_s = retry_budget_s
        # None: $RAFTSCHED_TOKEN, if set; "" sends no token at all.
        self._token = token_from_env() if token is None else (token or None)
        context = client_ssl_context(ca_file, client_cert, client_key)
        self._transport = HttpTransport(min(connect_timeout_s, timeout_s), context)

    @property
    def urls(self) -> list[str]:
        return list(self._nodes.urls)

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- execution -------------------------------------------------------

    def call(self, call: Call[T]) -> T:
        """Execute a prepared call with redirects, failover and retries."""
        return call.unwrap(self._execute(call))

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, object] | None = None,
        body: Any = None,
        retry_unknown: bool | None = None,
    ) -> Response:
        """Any endpoint; returns the raw 2xx Response (errors still raise)."""
        return self._execute(
            calls.raw(method, path, query=query, body=body, retry_unknown=retry_unknown)
        )

    def _execute(self, call: Call[Any]) -> Response:
        attempts = Attempts(self._nodes, call, budget_s=self._retry_budget_s)
        headers = request_headers(call, _new_request_id(), self._token, self._shard)
        body = encode_body(call)
        timeout_s = self._timeout_s + call.extra_timeout_s
        while True:
            try:
                response = self._transport.send(call.method, attempts.url, body, headers, timeout_s)
            except TransportFailure as failure:
                step: Response | float = attempts.on_failure(failure)
            else:
                step = attempts.on_response(response)
            if isinstance(step, Response):
                return step
            if step > 0:
                time.sleep(step)

    def _send_once(self, url: str, path: str) -> Response | None:
        """One GET to one node, no failover; None if it did not answer."""
        call = calls.raw("GET", path)
        headers = request_headers(call, _new_request_id(), self._token, self._shard)
        try:
            return self._transport.send("GET", base_of(url) + path, None, headers, self._timeout_s)
        except TransportFailure:
            return None

    # --- jobs --------------------------------------------------------------

    def submit(
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
        """Submit one job; returns the Job (the original one on an idempotent repeat)."""
        request = calls.job_request(
            queue, payload, idempotency_key=idempotency_key, run_at=run_at, delay_s=delay_s,
            priority=priority, max_attempts=max_attempts, backoff=backoff, lease_s=lease_s,
            deadline_s=deadline_s, tenant=tenant, ordering_key=ordering_key,
            correlation_id=correlation_id, labels=labels, on_unknown=on_unknown,
            reconcile_queue=reconcile_queue, kind=kind,
        )  # fmt: skip
        return self.call(calls.submit(request))

    def submit_batch(self, jobs: Sequence[Mapping[str, Any]]) -> list[JsonObject]:
        """Submit job requests (see `job_request`) together; per-item
        `{"job": Job}` or `{"error": {...}}` in order (`item_error` reads the latter)."""
        return self.call(calls.submit_batch(jobs))

    def get_job(self, job_id: str, *, consistency: Consistency | None = None) -> JsonObject:
        return self.call(calls.get_job(job_id, consistency))

    def list_jobs(
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
        """One page: `{"jobs": [Job], "next_cursor": str | None}`, newest first."""
        return self.call(
            calls.list_jobs(
                queue=queue, status=status, tenant=tenant, schedule_id=schedule_id,
                workflow_id=workflow_id, limit=limit, cursor=cursor, consistency=consistency,
                kind=kind,
            )
        )  # fmt: skip

    def iter_jobs(
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
    ) -> Iterator[JsonObject]:
        """Every matching job, following `next_cursor` page by page."""
        cursor: str | None = None
        while True:
            page = self.list_jobs(
                queue=queue, status=status, tenant=tenant, schedule_id=schedule_id,
                workflow_id=workflow_id, limit=page_size, cursor=cursor, consistency=consistency,
                kind=kind,
            )  # fmt: skip
            yield from page.get("jobs", [])
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def cancel_job(self, job_id: str, reason: str | None = None) -> JsonObject:
        return self.call(calls.cancel_job(job_id, reason))

    def replay_job(self, job_id: str, reason: str) -> JsonObject:
        """Dead letter -> pending (operator). Not repeated after an unknown outcome."""
        return self.call(calls.replay_job(job_id, reason))

    def job_history(
        self, job_id: str, *, consistency: Consistency | None = None
    ) -> list[JsonObject]:
        return self.call(calls.job_history(job_id, consistency))

    def wait_job(
        self,
        job_id: str,
        *,
        statuses: Sequence[str] = ("succeeded", "dead_letter", "cancelled"),
        timeout_s: float = 30.0,
        poll_s: float = 0.2,
    ) -> JsonObject:
        """Poll until the job reaches one of `statuses`; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.get_job(job_id)
            if job.get("status") in statuses:
                return job
            if time.monotonic() + poll_s > deadline:
                raise TimeoutError(f"{job_id} is {job.get('status')} after {timeout_s} s")
            time.sleep(poll_s)

    def reconciliation(
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
        return self.call(calls.reconciliation(hours, limit, consistency))

    # --- leases --------------------------------------------------------------

    def claim(
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
        return self.call(
            calls.claim(worker_id, queues, max_jobs, wait_s, lease_s, kinds, kind_max_jobs)
        )

    def start(self, job_id: str, fencing_token: int) -> JsonObject:
        return self.call(calls.lease_op(job_id, "start", calls.start_body(fencing_token)))

    def heartbeat(
        self,
        job_id: str,
        fencing_token: int,
        *,
        extend_s: float | None = None,
        progress: Mapping[str, Any] | None = None,
    ) -> JsonObject:
        """Returns `{"expires_at", "cancel_requested"}`; raises LeaseLost."""
        body = calls.heartbeat_body(fencing_token, extend_s, progress)
        return self.call(calls.lease_op(job_id, "heartbeat", body))

    @overload
    def complete(
        self, job_id: str, fencing_token: int, result: Any = None, *, next_claim: None = None
    ) -> JsonObject: ...

    @overload
    def complete(
        self, job_id: str, fencing_token: int, result: Any = None, *, next_claim: NextClaim
    ) -> tuple[JsonObject, NextLeases]: ...

    def complete(
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
            return self.call(calls.lease_op(job_id, "complete", body))
        return self.call(next_calls.lease_op_then_claim(job_id, "complete", body, next_claim))

    @overload
    def fail(
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
    def fail(
        self,
        job_id: str,
        fencing_token: int,
        *,
        kind: FailureKind = "transient",
        message: str = "",
        retry_after_s: float | None = None,
        next_claim: NextClaim,
    ) -> tuple[JsonObject, NextLeases]: ...

    def fail(
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
            return self.call(calls.lease_op(job_id, "fail", body))
        return self.call(next_calls.lease_op_then_claim(job_id, "fail", body, next_claim))

    def reconcile(
        self,
        job_id: str,
        fencing_token: int,
        decision: ReconcileDecision,
        *,
        result: Any = None,
        effects: Mapping[str, Any] | None = None,
        reason: str = "",
    ) -> JsonObject:
        """Answer a reconciliation lease (one with `reconcile`), with its own
        fencing token: `happened` (with the effect's `result`, and `effects`
        to record by key), `did_not_happen` or `cannot_tell` (with a
        `reason`) -> `{"job_id", "decision", "status", "next_run_at", "replayed"}`."""
        body = calls.reconcile_body(fencing_token, decision, result, effects, reason)
        return self.call(calls.lease_op(job_id, "reconcile", body))

    @overload
    def lease_batch(
        self, ops: Sequence[Mapping[str, Any]], *, next_claim: None = None
    ) -> list[JsonObject]: ...

    @overload
    def lease_batch(
        self, ops: Sequence[Mapping[str, Any]], *, next_claim: NextClaim
    ) -> tuple[list[JsonObject], NextLeases]: ...

    def lease_batch(
        self, ops: Sequence[Mapping[str, Any]], *, next_claim: NextClaim | None = None
    ) -> list[JsonObject] | tuple[list[JsonObject], NextLeases]:
        """`[{"op", "job_id", "fencing_token", ...}]` -> per-op result or `{"error"}`.
        With `next_claim` (its `worker_id` required), also claim after the ops:
        returns (the results, NextLeases)."""
        if next_claim is None:
            return self.call(calls.lease_batch(ops))
        return self.call(next_calls.lease_batch_then_claim(ops, next_claim))

    # --- effects ---------------------------------------------------------------

    def record_effect(self, key: str, job_id: str, fencing_token: int, result: Any) -> JsonObject:
        """`{"effect": Effect, "replayed": bool}`; first writer wins."""
        return self.call(calls.record_effect(key, job_id, fencing_token, result))

    def get_effect(self, key: str, *, consistency: Consistency | None = None) -> JsonObject:
        """The Effect; raises NotFound if none is recorded."""
        return self.call(calls.get_effect(key, consistency))

    def job_effects(
        self, job_id: str, *, limit: int | None = None, consistency: Consistency | None = None
    ) -> JobEffects:
        """The effects the job recorded, oldest first: `{"effects": [Effect],
        "total": n}`, at most `limit` of them (1 to 1000, default 100);
        `total` counts them all. NotFound for a job that does not exist or
        is outside the token's tenants or queues."""
        return self.call(read_calls.job_effects(job_id, limit, consistency))

    # --- cluster -----------------------------------------------------------------

    def cluster(self, *, consistency: Consistency | None = None) -> JsonObject:
        return self.call(calls.cluster(consistency))

    def add_node(self, node_id: str, raft_address: str, http_url: str) -> JsonObject:
        """Add a member (admin); the answer is the change once committed."""
        return self.call(calls.add_node(node_id, raft_address, http_url))

    def remove_node(self, node_id: str) -> JsonObject:
        """Remove a member (admin), the leader too (it hands over first)."""
        return self.call(calls.remove_node(node_id))

    # --- flow control: queues and tenants ---------------------------------------

    def set_queue(self, name: str, **settings: Any) -> JsonObject:
        """Replace a queue's settings: paused, rate_limit_per_s, burst,
        concurrency_limit, circuit_window, circuit_probe_interval_s."""
        return self.call(flow_calls.set_queue(name, settings))

    def pause_queue(self, name: str) -> JsonObject:
        return self.call(flow_calls.pause_queue(name, True))

    def resume_queue(self, name: str) -> JsonObject:
        return self.call(flow_calls.pause_queue(name, False))

    def get_queue(self, name: str, *, consistency: Consistency | None = None) -> JsonObject:
        return self.call(flow_calls.get_queue(name, consistency))

    def list_queues(self, *, consistency: Consistency | None = None) -> list[JsonObject]:
        return self.call(flow_calls.list_queues(consistency))

    def set_tenant(self, name: str, **settings: Any) -> JsonObject:
        """Replace a tenant's settings: weight, concurrency_limit, max_queued."""
        return self.call(flow_calls.set_tenant(name, settings))

    def get_tenant(self, name: str, *, consistency: Consistency | None = None) -> JsonObject:
        return self.call(flow_calls.get_tenant(name, consistency))

    def list_tenants(self, *, consistency: Consistency | None = None) -> list[JsonObject]:
        return self.call(flow_calls.list_tenants(consistency))

    # --- workflows, events and subscriptions ------------------------------------

    def submit_workflow(self, request: Mapping[str, Any]) -> JsonObject:
        """Submit a workflow (api.md body); answers the Workflow with its steps."""
        return self.call(wf_calls.submit_workflow(request))

    def get_workflow(
        self, workflow_id: str, *, consistency: Consistency | None = None
    ) -> JsonObject:
        return self.call(wf_calls.get_workflow(workflow_id, consistency))

    def list_workflows(
        self,
        *,
        status: str | None = None,
        tenant: str | None = None,
        limit: int | None = None,
        consistency: Consistency | None = None,
    ) -> JsonObject:
        return self.call(wf_calls.list_workflows(status, tenant, limit, consistency))

    def workflow_history(
        self, workflow_id: str, *, consistency: Consistency | None = None
    ) -> list[JsonObject]:
        return self.call(wf_calls.workflow_history(workflow_id, consistency))

    def cancel_workflow(self, workflow_id: str, reason: str | None = None) -> JsonObject:
        return self.call(wf_calls.cancel_workflow(workflow_id, reason))

    def events(
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
        return self.call(wf_calls.events(after, types, wait_s, limit, consistency))

    def audit(
        self,
        *,
        actor: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        consistency: Consistency | None = None,
    ) -> JsonObject:
        """`{"entries": [...], "next_cursor"}`: operator actions, newest first."""
        return self.call(wf_calls.audit(actor, kind, limit, cursor, consistency))

    def create_subscription(
        self,
        url: str,
        secret: str,
        types: Sequence[str] = (),
        *,
        subscription_id: str | None = None,
    ) -> JsonObject:
        return self.call(wf_calls.create_subscription(url, secret, types, subscription_id))

    def create_broker_subscription(
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
        return self.call(
            wf_calls.create_broker_subscription(sink, types, subscription_id, tenants, key_field)
        )

    def list_subscriptions(self, *, consistency: Consistency | None = None) -> list[JsonObject]:
        return self.call(wf_calls.list_subscriptions(consistency))

    def get_subscription(
        self, subscription_id: str, *, consistency: Consistency | None = None
    ) -> JsonObject:
        return self.call(wf_calls.get_subscription(subscription_id, consistency))

    def delete_subscription(self, subscription_id: str) -> None:
        self.call(wf_calls.delete_subscription(subscription_id))

    # --- API tokens (admin) and who the caller is -------------------------------

    def create_token(
        self,
        name: str,
        role: str,
        *,
        tenants: Sequence[str] = ("*",),
        queues: Sequence[str] = ("*",),
        expires_at: str | None = None,
    ) -> JsonObject:
        """`{"token": Token, "secret": "rsk_..."}`: the secret is shown only here."""
        return self.call(wf_calls.create_token(name, role, tenants, queues, expires_at))

    def list_tokens(self, *, consistency: Consistency | None = None) -> list[JsonObject]:
        return self.call(wf_calls.list_tokens(consistency))

    def get_token(self, token_id: str, *, consistency: Consistency | None = None) -> JsonObject:
        return self.call(wf_calls.get_token(token_id, consistency))

    def revoke_token(self, token_id: str) -> JsonObject:
        return self.call(wf_calls.revoke_token(token_id))

    def whoami(self) -> JsonObject:
        """`{"token": Token | None, "auth": "on" | "off", ...}`."""
        return self.call(wf_calls.whoami())

    def retry_parked(self, subscription_id: str) -> JsonObject:
        return self.call(wf_calls.retry_parked(subscription_id))

    def metrics(self) -> str:
        return self.call(calls.metrics())

    def stats_series(self, queue: str | None = None, *, window_s: int | None = None) -> StatsSeries:
        """The charts' figures of `queue` (None: the whole cluster) over the
        last `window_s` seconds (5 to 3600, default 3600), one value per 5 s
        bucket. Answered by the node the call reaches, from its own memory
        (`node_id` names it); counts agree on every node. Needs a token for
        every tenant (Forbidden otherwise); NotFound for a queue without a
        series on that node (no job this past hour)."""
        return self.call(read_calls.stats_series(queue, window_s))

    def healthz(self, url: str | None = None) -> bool:
        """Does this node (default: the preferred one) serve? No failover."""
        response = self._send_once(url or self._nodes.preferred(), "/healthz")
        return response is not None and response.status == 200

    def readyz(self, url: str | None = None) -> bool:
        """Does this node know a leader and has it caught up? No failover."""
        response = self._send_once(url or self._nodes.preferred(), "/readyz")
        return response is not None and response.status == 200
