"""Which addresses a webhook may be delivered to (server-side request forgery).

A subscription names a URL that the leader connects to, from inside the
cluster's network. Without a check, anyone who may create a subscription
could make the leader POST to its own loopback services, to the cloud
metadata service (credentials) or to hosts on the private network.

Policy (docs/security.md, "Webhook targets (SSRF)"), by address:

- always refused, unless an operator allows the address with an explicit
  CIDR (`--webhook-allow-cidr`): loopback, link-local (169.254.0.0/16,
  fe80::/10, which holds the metadata services), unspecified, multicast,
  reserved (240.0.0.0/4, broadcast) and the cloud metadata addresses
  (169.254.169.254, fd00:ec2::254, 100.100.100.200);
- refused by default, allowed by `--webhook-allow-private`: every other
  address that is not globally routable (RFC 1918, shared 100.64.0.0/10,
  unique-local fc00::/7, benchmarking, documentation ranges, ...);
- allowed: globally routable addresses.

An IPv4 address inside IPv6 (`::ffff:127.0.0.1`) is judged as the IPv4
address. Metadata host names (`metadata.google.internal`, ...) are refused by
name, before any lookup. A name is checked by what it resolves to, every
address of it: one forbidden address refuses the name.

The check runs twice: when a subscription is created (a 400 for the caller)
and at every delivery, because DNS can change between the two. At delivery
the connector resolves the name through `CheckingResolver`, which refuses
forbidden addresses, and connects to the checked address itself (the URL's
name still goes in the Host header and TLS SNI), so a second lookup cannot
slip another address in. URLs with an address literal skip resolvers, so
delivery checks them directly (`refusal_for_url`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_ADDRESSES: Final = frozenset(
    ipaddress.ip_address(text)
    for text in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "169.254.170.2")
)
METADATA_HOST_NAMES: Final = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
# How long a creation-time lookup may take before the name is taken as it is
# (delivery checks it again).
RESOLVE_TIMEOUT_S: Final = 2.0


class ForbiddenTarget(OSError):
    """The webhook target is, or resolves to, an address the policy refuses."""


def _unwrap(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _always_refused(address: IPAddress) -> str | None:
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    for kind, hit in (
        ("a loopback address", address.is_loopback),
        ("a link-local address", address.is_link_local),
        ("the unspecified address", address.is_unspecified),
        ("a multicast address", address.is_multicast),
        ("a reserved address", address.is_reserved),
    ):
        if hit:
            return kind
    if isinstance(address, ipaddress.IPv4Address) and address == ipaddress.IPv4Address(
        "255.255.255.255"
    ):
        return "the broadcast address"
    return None


@dataclass(frozen=True, slots=True)
class TargetPolicy:
    """A node's webhook target policy: its `--webhook-allow-*` flags."""

    allow_private: bool = False
    allow_cidrs: tuple[IPNetwork, ...] = ()

    @staticmethod
    def from_flags(allow_private: bool, allow_cidrs: Iterable[str]) -> TargetPolicy:
        """Raises ValueError for a CIDR that does not parse."""
        networks = tuple(ipaddress.ip_network(text.strip(), strict=False) for text in allow_cidrs)
        return TargetPolicy(allow_private, networks)

    def refusal(self, address: IPAddress | str) -> str | None:
        """Why delivering to `address` is refused, or None if it is allowed."""
        found = _unwrap(ipaddress.ip_address(address))
        if any(found in network for network in self.allow_cidrs):
            return None
        why = _always_refused(found)
        if why is None and not found.is_global and not self.allow_private:
            why = "a private address (allow with --webhook-allow-private)"
        return None if why is None else f"{found} is {why}"

    def refusal_for_host(self, host: str) -> str | None:
        """Why `host` is refused without a lookup: a metadata name or a
        forbidden address literal; None if it may be (resolved and) used."""
        name = host.strip("[]").rstrip(".").lower()
        if name in METADATA_HOST_NAMES:
            return f"{name} is a cloud metadata host"
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return None
        return self.refusal(name)

    def refusal_for_url(self, url: str) -> str | None:
        host = urlsplit(url).hostname
        if not host:
            return "the URL names no host"
        return self.refusal_for_host(host)

    async def check_url(self, url: str, resolver: AbstractResolver | None = None) -> str | None:
        """Why `url` is refused as a target now, or None. A name that does
        not resolve (now) is not refused: delivery checks it again. A given
        `resolver` stays open (the caller's); the default one is closed."""
        host = urlsplit(url).hostname or ""
        why = self.refusal_for_url(url)
        if why is not None or _is_address(host):
            return why
        owned = resolver is None
        inner = resolver or DefaultResolver()
        try:
            await asyncio.wait_for(
                CheckingResolver(self, inner).resolve(host, 0, socket.AF_UNSPEC),
                RESOLVE_TIMEOUT_S,
            )
        except ForbiddenTarget as refused:
            return str(refused)
        except (OSError, TimeoutError, UnicodeError):
            return None
        finally:
            if owned:
                await inner.close()
        return None


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class CheckingResolver(AbstractResolver):
    """An aiohttp resolver that refuses a name resolving to a forbidden address.

    The connector connects to the addresses returned here, so the address
    checked is the address used."""

    def __init__(self, policy: TargetPolicy, inner: AbstractResolver | None = None) -> None:
        self.policy = policy
        self._inner = inner

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        why = self.policy.refusal_for_host(host)
        if why is not None:
            raise ForbiddenTarget(why)
        if self._inner is None:
            self._inner = DefaultResolver()
        found = await self._inner.resolve(host, port, family)
        for result in found:
            why = self.policy.refusal(result["host"].split("%")[0])
            if why is not None:
                raise ForbiddenTarget(f"{host} resolves to {why}")
        return found

    async def close(self) -> None:
        if self._inner is not None:
            await self._inner.close()
