"""A small keep-alive HTTP/1.1 transport over http.client, safe to share
between threads: each send borrows an idle connection to the node (or opens
one) and gives it back after reading the whole answer."""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from collections.abc import Mapping
from urllib.parse import urlsplit

from raftsched.client._calls import Response
from raftsched.client._routing import TransportFailure, base_of

# Idle connections older than this are closed instead of reused: the server
# (aiohttp, keep-alive 75 s by default) may have closed them, and a send on a
# connection the server just closed has an unknown outcome.
IDLE_MAX_S = 15.0
IDLE_PER_NODE_MAX = 8


class _Pool:
    def __init__(
        self, base: str, connect_timeout_s: float, ssl_context: ssl.SSLContext | None
    ) -> None:
        parts = urlsplit(base)
        self._https = parts.scheme == "https"
        self._ssl_context = ssl_context
        self._host = parts.hostname or "localhost"
        self._port = parts.port
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        self._lock = threading.Lock()

    def take(self) -> http.client.HTTPConnection:
        now = time.monotonic()
        with self._lock:
            while self._idle:
                connection, idle_since = self._idle.pop()
                if now - idle_since < IDLE_MAX_S:
                    return connection
                connection.close()
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self._connect_timeout_s, context=self._ssl_context
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self._connect_timeout_s)

    def give_back(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < IDLE_PER_NODE_MAX:
                self._idle.append((connection, time.monotonic()))
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection, _ in idle:
            connection.close()


class HttpTransport:
    def __init__(self, connect_timeout_s: float, ssl_context: ssl.SSLContext | None = None) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._ssl_context = ssl_context  # None: the system's trust store
        self._pools: dict[str, _Pool] = {}
        self._lock = threading.Lock()

    def send(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout_s: float,
    ) -> Response:
        pool = self._pool(base_of(url))
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        connection = pool.take()
        try:
            if connection.sock is None:
                _connect(connection)
            connection.sock.settimeout(timeout_s)
            connection.request(method, target, body=body, headers=dict(headers))
            answer = connection.getresponse()
            data = answer.read()
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            raise TransportFailure(error, sent=True) from error
        if answer.will_close:
            connection.close()
        else:
            pool.give_back(connection)
        answer_headers = {name.lower(): value for name, value in answer.getheaders()}
        return Response(answer.status, answer_headers, data, url)

    def _pool(self, base: str) -> _Pool:
        with self._lock:
            pool = self._pools.get(base)
            if pool is None:
                pool = self._pools[base] = _Pool(base, self._connect_timeout_s, self._ssl_context)
            return pool

    def close(self) -> None:
        with self._lock:
            pools = list(self._pools.values())
        for pool in pools:
            pool.close()


def _connect(connection: http.client.HTTPConnection) -> None:
    """Connect, reporting failure as 'not sent': nothing reached the server."""
    try:
        connection.connect()
    except (TimeoutError, OSError) as error:
        connection.close()
        raise TransportFailure(error, sent=False) from error
