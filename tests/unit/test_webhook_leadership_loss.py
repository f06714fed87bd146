"""The webhook deliverer when leadership goes between a delivery and its
acknowledgement (found by the chaos campaign, checker 8: a node logged
"webhook delivery failed" with a NotLeader traceback at error level after a
partition deposed it mid-batch).

Losing leadership there is an expected turn of events: the replicated cursor
did not move, so the events are delivered again (at least once). The
deliverer says so in a warning and carries on; an error line would make every
chaos run with a partition invalid. The node side here is a real core state
whose leader has just been deposed: each proposal answers NotLeader, as
`service.Node.propose` does then; the receiver is a real HTTP server."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from aiohttp import web

from raftsched.core import State, apply_entry, new_state
from raftsched.core.events.commands import AckDelivery, CreateSubscription
from raftsched.core.jobs.commands import CancelJob, SubmitJobs
from raftsched.core.kernel.commands import Command, Entry, JobSpec, TakeOver
from raftsched.core.kernel.results import Result
from raftsched.node.change import Change
from raftsched.node.metrics import NodeMetrics
from raftsched.node.proposer import NotLeader
from raftsched.node.webhook_targets import TargetPolicy
from raftsched.node.webhooks import DeliverySettings, WebhookDelivery


class DeposedLeader:
    """A StateView over a real state whose proposals all answer NotLeader."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._metrics = NodeMetrics()
        self._changed = Change()
        self.proposed: list[Command] = []

    @property
    def is_leader(self) -> bool:
        return True  # it does not know yet

    @property
    def metrics(self) -> NodeMetrics:
        return self._metrics

    @contextmanager
    def reading(self) -> Iterator[State]:
        yield self.state

    def changed(self) -> Change:
        return self._changed

    def now_ms(self) -> int:
        return self.state.now_ms

    async def propose(
        self, command: Command, size_bytes: int = 0, *, bounded: bool = True
    ) -> Result:
        self.proposed.append(command)
        raise NotLeader()


def _state_with_one_event(url: str) -> State:
    state = new_state()
    commands: list[Command] = [
        TakeOver(),
        CreateSubscription("s1", url, (), "secret"),
        SubmitJobs((JobSpec(queue="q"),), ("job_1",)),
        CancelJob("job_1"),  # job.cancelled: the one event to deliver
    ]
    for at, command in enumerate(commands):
        apply_entry(state, Entry(1, 1_000_000 + at, (command,)))
    return state


def test_lost_leadership_while_acknowledging_is_a_warning_not_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="raftsched.webhooks")
    received, proposed = asyncio.run(_deliver_while_deposed())
    assert [event["type"] for event in received][:1] == ["job.cancelled"]
    assert any(isinstance(c, AckDelivery) for c in proposed)
    levels = {
        (r.levelname, r.getMessage()) for r in caplog.records if r.name == "raftsched.webhooks"
    }
    assert (
        "WARNING",
        "webhook progress not recorded; its events will be delivered again",
    ) in levels
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def _deliver_while_deposed() -> tuple[list[dict[str, Any]], list[Command]]:
    received: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    view = DeposedLeader(_state_with_one_event(f"http://127.0.0.1:{port}/hook"))
    policy = TargetPolicy(allow_cidrs=(ipaddress.ip_network("127.0.0.0/8"),))
    delivery = WebhookDelivery(view, DeliverySettings(max_attempts=1), policy=policy)
    try:
        delivery.start(term=1)
        for _ in range(100):
            if any(isinstance(c, AckDelivery) for c in view.proposed):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
    finally:
        await delivery.close()
        await runner.cleanup()
    return received, view.proposed
