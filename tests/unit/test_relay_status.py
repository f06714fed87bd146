"""The relays' figures (node/relay_status.py, docs/relays.md section 5) as
/metrics shows them, for webhook subscriptions: the deliverer runs against
a real core state, whose proposals this in-process leader applies, and two
real targets: an HTTP receiver that answers 500 once and then 200, and a
loopback port where nothing listens. The broker relays' figures are checked
against a real Redis in tests/e2e/test_relay_metrics.py."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from raftsched.core import State, apply_entry, new_state
from raftsched.core.events.commands import CreateSubscription
from raftsched.core.events.subscriptions import subscriptions
from raftsched.core.jobs.commands import CancelJob, SubmitJobs
from raftsched.core.kernel import outbox
from raftsched.core.kernel.commands import Command, Entry, JobSpec, TakeOver
from raftsched.core.kernel.results import Result
from raftsched.node.change import Change
from raftsched.node.metrics import NodeMetrics
from raftsched.node.webhook_targets import TargetPolicy
from raftsched.node.webhooks import DeliverySettings, WebhookDelivery

EVENTS = 3
MAX_ATTEMPTS = 3
START_MS = 1_000_000


class Leader:
    """A StateView over a real core state: each proposal is applied as an
    entry of its own, stamped with `clock_ms`, as a one-node leader would."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.leading = True
        self.clock_ms = state.now_ms
        self._metrics = NodeMetrics()
        self._changed = Change()

    @property
    def is_leader(self) -> bool:
        return self.leading

    @property
    def metrics(self) -> NodeMetrics:
        return self._metrics

    @contextmanager
    def reading(self) -> Iterator[State]:
        yield self.state

    def changed(self) -> Change:
        return self._changed

    def now_ms(self) -> int:
        return self.clock_ms

    async def propose(
        self, command: Command, size_bytes: int = 0, *, bounded: bool = True
    ) -> Result:
        (result,) = apply_entry(self.state, Entry(1, self.clock_ms, (command,)))
        changed, self._changed = self._changed, Change()
        changed.set()
        return result


def _state(hook_url: str, down_url: str) -> State:
    state = new_state()
    commands: list[Command] = [
        TakeOver(),
        CreateSubscription("hook", hook_url, ("job.cancelled",), "secret"),
        CreateSubscription("down", down_url, ("job.cancelled",), "secret"),
    ]
    for n in range(EVENTS):
        commands += [SubmitJobs((JobSpec(queue="q"),), (f"job_{n}",)), CancelJob(f"job_{n}")]
    for at, command in enumerate(commands):
        apply_entry(state, Entry(1, START_MS + at, (command,)))
    return state


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port  # closed again: a connection is refused


def _samples(metrics: NodeMetrics) -> dict[tuple[str, str, str], float]:
    """(family sample name, subscription, sink) -> value, of the sink families."""
    found: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name.startswith("raftsched_sink_"):
                labels = sample.labels
                found[(sample.name, labels["subscription"], labels["sink"])] = sample.value
    return found


async def _scenario() -> tuple[dict[str, object], ...]:
    answers = iter([500])

    async def hook(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=next(answers, 200))

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    leader = Leader(
        _state(f"http://127.0.0.1:{port}/hook", f"http://127.0.0.1:{_closed_port()}/hook")
    )
    settings = DeliverySettings(
        max_attempts=MAX_ATTEMPTS, backoff_s=0.01, backoff_max_s=0.02, timeout_s=2.0
    )
    policy = TargetPolicy(allow_cidrs=(ipaddress.ip_network("127.0.0.0/8"),))
    delivery = WebhookDelivery(leader, settings, policy=policy)
    newest = outbox.last_seq(leader.state)
    oldest_ms = outbox.events_after(leader.state, 0, ("job.cancelled",), 1)[0].at_ms
    leader.clock_ms = oldest_ms + 5_000
    before = _samples(leader.metrics)
    try:
        delivery.start(term=1)
        for _ in range(200):
            subs = subscriptions(leader.state)
            if subs["hook"].cursor == newest and len(subs["down"].parked) == EVENTS:
                break
            await asyncio.sleep(0.05)
        after = _samples(leader.metrics)
        connected = {sub: delivery.status.connected(sub) for sub in ("hook", "down")}
        leader.leading = False
        as_follower = _samples(leader.metrics)
        connected_as_follower = delivery.status.connected("hook")
    finally:
        await delivery.close()
        await runner.cleanup()
    facts = {"newest": newest, "connected": connected, "follower": connected_as_follower}
    return before, after, as_follower, facts


def test_published_retried_parked_connected_and_the_lag_per_subscription() -> None:
    before, after, as_follower, facts = asyncio.run(_scenario())
    newest = facts["newest"]
    assert isinstance(newest, int) and newest >= EVENTS
    # Before the relays ran: every event waits, the oldest for 5 s by the
    # leader's clock; no relay has tried, so no connection state yet.
    assert before == {
        ("raftsched_sink_lag_events", "hook", "webhook"): float(newest),
        ("raftsched_sink_lag_events", "down", "webhook"): float(newest),
        ("raftsched_sink_lag_seconds", "hook", "webhook"): 5.0,
        ("raftsched_sink_lag_seconds", "down", "webhook"): 5.0,
    }
    # The receiver refused the first POST (500) and took the rest; the port
    # where nothing listens refused every connection: each event was tried
    # MAX_ATTEMPTS times (retried after each failure but the last), then parked.
    assert after == {
        ("raftsched_sink_published_total", "hook", "webhook"): float(EVENTS),
        ("raftsched_sink_retried_total", "hook", "webhook"): 1.0,
        ("raftsched_sink_retried_total", "down", "webhook"): float(EVENTS * (MAX_ATTEMPTS - 1)),
        ("raftsched_sink_parked_total", "down", "webhook"): float(EVENTS),
        ("raftsched_sink_lag_events", "hook", "webhook"): 0.0,
        ("raftsched_sink_lag_events", "down", "webhook"): 0.0,
        ("raftsched_sink_lag_seconds", "hook", "webhook"): 0.0,
        ("raftsched_sink_lag_seconds", "down", "webhook"): 0.0,
        ("raftsched_sink_connected", "hook", "webhook"): 1.0,
        ("raftsched_sink_connected", "down", "webhook"): 0.0,
    }
    assert facts["connected"] == {"hook": True, "down": False}
    # A follower exports no gauge (and knows no connection); the counters
    # stay what this node did as leader.
    assert as_follower == {
        name: value for name, value in after.items() if name[0].endswith("_total")
    }
    assert facts["follower"] is None
