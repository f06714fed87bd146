"""Webhook targets: which addresses a node refuses, at creation and at delivery.

The delivery test runs a real receiver on loopback and a resolver the test
controls: the name resolves to a public address when the subscription is
checked and to loopback when the event is delivered (DNS rebinding). The
checked connector must refuse it without sending a byte.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from raftsched.node.webhook_targets import TargetPolicy
from raftsched.node.webhooks import REFUSED, DeliverySettings, checked_session, post_once

DEFAULT = TargetPolicy()


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "::1",
        "::ffff:127.0.0.1",  # IPv4 inside IPv6 is judged as IPv4
        "169.254.169.254",
        "169.254.10.1",
        "fe80::1",
        "fd00:ec2::254",
        "100.100.100.200",
        "0.0.0.0",
        "::",
        "224.0.0.1",
        "ff02::1",
        "240.0.0.1",
        "255.255.255.255",
    ],
)
def test_always_refused_even_with_private_allowed(address: str) -> None:
    assert DEFAULT.refusal(address) is not None
    assert TargetPolicy(allow_private=True).refusal(address) is not None


@pytest.mark.parametrize(
    "address", ["10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1", "fd12:3456::1", "198.18.0.1"]
)
def test_private_ranges_are_refused_by_default_and_allowed_by_the_flag(address: str) -> None:
    assert "private" in (DEFAULT.refusal(address) or "")
    assert TargetPolicy(allow_private=True).refusal(address) is None


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert DEFAULT.refusal(address) is None


def test_an_explicit_cidr_allows_exactly_its_network() -> None:
    policy = TargetPolicy.from_flags(False, ["127.0.0.0/8", "10.1.0.0/16"])
    assert policy.refusal("127.0.0.1") is None
    assert policy.refusal("10.1.200.3") is None
    assert policy.refusal("10.2.0.1") is not None
    assert policy.refusal("169.254.169.254") is not None
    with pytest.raises(ValueError):
        TargetPolicy.from_flags(False, ["not-a-network"])


@pytest.mark.parametrize(
    "url",
    [
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://METADATA.google.internal./x",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:8080/hook",
        "http://127.0.0.1:9/hook",
        "http://localhost:8080/hook",  # resolves to loopback
        "http://2130706433/hook",  # 127.0.0.1 as one number: a name to the parser
        "http://0x7f.1/hook",
        "http://10.0.0.1/hook",
        "http:///no-host",
    ],
)
def test_urls_refused_at_creation(url: str) -> None:
    assert asyncio.run(DEFAULT.check_url(url)) is not None


def test_a_name_that_does_not_resolve_is_left_to_delivery() -> None:
    assert asyncio.run(DEFAULT.check_url("http://no-such-host.invalid/hook")) is None


class FlippingResolver(AbstractResolver):
    """hooks.example.com: a public address at first, loopback afterwards."""

    def __init__(self, receiver_port: int) -> None:
        self.answers = ["93.184.216.34", "127.0.0.1"]
        self.port = receiver_port
        self.asked = 0

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        address = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=self.port,
                family=socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
        ]

    async def close(self) -> None:
        return None


async def _rebinding_scenario() -> dict[str, Any]:
    received: list[tuple[str, bytes]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append((request.host, await request.read()))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://hooks.example.com:{port}/hook"
    settings = DeliverySettings(max_attempts=1, backoff_s=0, backoff_max_s=0, timeout_s=2)
    outcome: dict[str, Any] = {}
    try:
        resolver = FlippingResolver(port)
        outcome["at_creation"] = await DEFAULT.check_url(url, resolver=resolver)
        session = checked_session(DEFAULT, resolver)
        try:
            outcome["at_delivery"] = await post_once(
                session, DEFAULT, url, b"{}", {"Content-Type": "application/json"}, settings
            )
        finally:
            await session.close()
        outcome["received_when_refused"] = list(received)
        # Control: with loopback allowed, the same connector reaches the
        # receiver at the address it checked, and the URL's name is the Host.
        allowing = TargetPolicy.from_flags(False, ["127.0.0.0/8"])
        loopback = FlippingResolver(port)
        loopback.answers = ["127.0.0.1"]
        session = checked_session(allowing, loopback)
        try:
            outcome["allowed"] = await post_once(session, allowing, url, b"{}", {}, settings)
        finally:
            await session.close()
        outcome["received"] = list(received)
    finally:
        await runner.cleanup()
    return outcome


def test_a_name_rebound_to_loopback_after_creation_is_refused_at_delivery() -> None:
    outcome = asyncio.run(_rebinding_scenario())
    assert outcome["at_creation"] is None  # it resolved to a public address then
    assert outcome["at_delivery"].startswith(REFUSED)
    assert "127.0.0.1 is a loopback address" in outcome["at_delivery"]
    assert outcome["received_when_refused"] == []  # never sent
    assert outcome["allowed"] == ""
    assert len(outcome["received"]) == 1
    assert outcome["received"][0][0].startswith("hooks.example.com:")


def test_an_address_literal_is_refused_at_delivery_without_a_connection() -> None:
    async def attempt() -> str:
        session = checked_session(DEFAULT)
        try:
            return await post_once(
                session, DEFAULT, "http://169.254.169.254/latest", b"{}", {}, DeliverySettings()
            )
        finally:
            await session.close()

    assert asyncio.run(attempt()) == f"{REFUSED}: 169.254.169.254 is a cloud metadata address"
