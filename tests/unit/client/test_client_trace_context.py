"""Both clients send the current span's W3C trace context with a workflow's
submission, as with a job's: the node keeps it with the workflow, whose
jobs' leases hand it to the workers (docs/observability.md). A redirect
to the leader carries it on; without a current span nothing is sent."""

from __future__ import annotations

import asyncio

from aiohttp import web
from fakecluster import FakeCluster, Seen, reply
from opentelemetry import trace

from raftsched.client import AsyncClient, Client
from spans import in_memory_spans

WORKFLOW = {
    "steps": [{"name": "a", "queue": "q"}, {"name": "b", "queue": "q", "depends_on": ["a"]}]
}
ANSWER = {"workflow": {"id": "wf_1", "status": "running"}}


def _redirect_to(leader_url: str):  # type: ignore[no-untyped-def]
    def script(seen: Seen) -> web.Response:
        return web.Response(status=307, headers={"Location": leader_url + seen.path})

    return script


def _expected(span: trace.Span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def test_the_blocking_client_sends_the_current_context_with_a_workflow(
    cluster: FakeCluster,
) -> None:
    in_memory_spans()
    follower, leader, _ = cluster.nodes
    follower.script = _redirect_to(leader.url)
    leader.script = lambda seen: reply(201, ANSWER)
    with Client([follower.url], timeout_s=2) as client:
        with trace.get_tracer("shop").start_as_current_span("order") as span:
            client.submit_workflow(WORKFLOW)
        client.submit_workflow(WORKFLOW)
    sent = [seen.headers.get("traceparent") for seen in (*follower.seen, *leader.seen)]
    # To the follower, then (redirected) to the leader; then straight to the leader.
    assert sent == [_expected(span), _expected(span), None]
    assert leader.seen[0].body == WORKFLOW, "the context is a header, not a body field"


def test_the_async_client_sends_the_current_context_with_a_workflow(
    cluster: FakeCluster,
) -> None:
    in_memory_spans()
    leader = cluster.nodes[0]
    leader.script = lambda seen: reply(201, ANSWER)

    async def scenario() -> trace.Span:
        async with AsyncClient([leader.url], timeout_s=2) as client:
            with trace.get_tracer("shop").start_as_current_span("order") as span:
                await client.submit_workflow(WORKFLOW)
            await client.submit_workflow(WORKFLOW)
        return span

    span = asyncio.run(scenario())
    assert [seen.headers.get("traceparent") for seen in leader.seen] == [_expected(span), None]
