"""A node's TLS contexts (docs/security.md, "TLS"), from its `NodeConfig`.

A node with `--tls-cert`/`--tls-key` serves HTTPS with `server_context`;
with `--tls-client-ca` that context also requires a client certificate that
chains to it (mutual TLS), so a client without one fails the handshake before
any HTTP is read. The node's own calls to its peers (`GET /v1/time`, see
node.service) use `peer_context`: it verifies the peer against `--tls-ca`
(else the client CA, else the system store) and presents the node's own
certificate, which peers that require client certificates then accept. Both
refuse anything older than TLS 1.2.

Files are read when a context is built, at start: a missing or unreadable
file, or a key that does not match its certificate, is a `ConfigError`
before the node binds anything.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from raftsched.config import ConfigError, NodeConfig

TLS_VERSION_MIN = ssl.TLSVersion.TLSv1_2


def server_context(config: NodeConfig) -> ssl.SSLContext | None:
    """The context the HTTP listener serves with, or None for plain HTTP."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = TLS_VERSION_MIN
    _load_chain(context, config.tls_cert_file, config.tls_key_file)
    if config.tls_client_ca_file is not None:
        _load_ca(context, config.tls_client_ca_file, "--tls-client-ca")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def peer_context(config: NodeConfig) -> ssl.SSLContext | None:
    """The context for this node's HTTPS calls to its peers; None when the
    node has no TLS of its own (aiohttp's default verification applies)."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = TLS_VERSION_MIN
    ca_file = config.tls_ca_file or config.tls_client_ca_file
    if ca_file is not None:
        _load_ca(context, ca_file, "--tls-ca" if config.tls_ca_file else "--tls-client-ca")
    _load_chain(context, config.tls_cert_file, config.tls_key_file)
    return context


def _load_chain(context: ssl.SSLContext, cert_file: Path, key_file: Path) -> None:
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(
            f"cannot load --tls-cert {cert_file} with --tls-key {key_file}: {error}"
        ) from error


def _load_ca(context: ssl.SSLContext, ca_file: Path, flag: str) -> None:
    try:
        context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(f"cannot load {flag} {ca_file}: {error}") from error
