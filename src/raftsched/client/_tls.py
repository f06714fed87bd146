"""The client's TLS context: which CA to trust, which certificate to show.

Plain `https://` URLs work with the system's trust store and no context at
all. A cluster with its own CA (`raftsched dev --tls`, docs/security.md)
needs `ca_file`; one that requires client certificates (mutual TLS) needs
`client_cert` and `client_key` too. TLS 1.2 is the oldest version spoken.

Each file not given is taken from the environment the CLI reads too
(`$RAFTSCHED_CA_FILE`, `$RAFTSCHED_CLIENT_CERT`, `$RAFTSCHED_CLIENT_KEY`),
so a `Client()`, an `AsyncClient()` or a worker configured like the CLI
needs no code of its own; `""` means none, whatever the environment says.
"""

from __future__ import annotations

import os
import ssl
from os import PathLike
from typing import Final

StrPath = str | PathLike[str]

ENVIRONMENT: Final = {
    "ca_file": "RAFTSCHED_CA_FILE",
    "client_cert": "RAFTSCHED_CLIENT_CERT",
    "client_key": "RAFTSCHED_CLIENT_KEY",
}


def _given_or_env(value: StrPath | None, name: str) -> StrPath | None:
    if value is None:
        value = os.environ.get(ENVIRONMENT[name], "").strip()
    return None if value == "" else value


def client_ssl_context(
    ca_file: StrPath | None = None,
    client_cert: StrPath | None = None,
    client_key: StrPath | None = None,
) -> ssl.SSLContext | None:
    """None when nothing is given, here or in the environment (the
    transport's defaults apply). Raises ValueError for a key without a
    certificate or a file that does not load."""
    ca_file = _given_or_env(ca_file, "ca_file")
    client_cert = _given_or_env(client_cert, "client_cert")
    client_key = _given_or_env(client_key, "client_key")
    if client_key is not None and client_cert is None:
        raise ValueError("a client key needs its client certificate (client_cert)")
    if ca_file is None and client_cert is None:
        return None
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if client_cert is not None:
            context.load_cert_chain(client_cert, client_key)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"cannot load TLS files: {error}") from error
    return context
