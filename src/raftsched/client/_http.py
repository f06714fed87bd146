"""A small keep-alive HTTP/1.1 transport on plain sockets, safe to share
between threads: each send borrows an idle connection to the node (or opens
one) and gives it back after reading the whole answer.

It speaks just the HTTP the client needs, cheaply (issue 18): http.client
cost the blocking client about 400 us of CPU per request, most of it in
parsing each answer's headers with the `email` package, a new file object
per answer, and the request sent in two writes (headers, then body). Here a
request is one `sendall` (request line, headers and body), the socket has
TCP_NODELAY, the connection keeps one buffered reader for its life, and an
answer's headers are split by hand. What the answer may be is what an
HTTP/1.1 server sends: a `Content-Length` body, a chunked body, or a body
that ends when the server closes the connection (which then is not reused);
no body for HEAD, 1xx, 204 and 304.
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from typing import BinaryIO
from urllib.parse import urlsplit

from raftsched.client._calls import Response
from raftsched.client._routing import TransportFailure

# Idle connections older than this are closed instead of reused: the server
# (aiohttp, keep-alive 75 s by default) may have closed them, and a send on a
# connection the server just closed has an unknown outcome.
IDLE_MAX_S = 15.0
IDLE_PER_NODE_MAX = 8
# As http.client: a longer status or header line, or more header lines, is
# not an answer this client reads.
LINE_MAX = 65536
HEADERS_MAX = 100
_METHODS_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
_NO_BODY_STATUSES = frozenset({204, 304})
# What http.client refuses in a request line (its _validate_path/_method).
_BAD_REQUEST_LINE = re.compile("[\x00-\x20\x7f]")


class _Connection:
    """One keep-alive connection: its socket and the reader of its answers."""

    __slots__ = ("reader", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader: BinaryIO = sock.makefile("rb")

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


class _Pool:
    def __init__(
        self, base: str, connect_timeout_s: float, ssl_context: ssl.SSLContext | None
    ) -> None:
        parts = urlsplit(base)
        https = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if https else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        default_port = 443 if https else 80
        self.host_header = host if self._port == default_port else f"{host}:{self._port}"
        self._ssl_context = _https_context(ssl_context) if https else None
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[tuple[_Connection, float]] = []
        self._lock = threading.Lock()

    def take(self) -> _Connection | None:
        """An idle connection, or None: the caller connects (`connect`)."""
        now = time.monotonic()
        with self._lock:
            while self._idle:
                connection, idle_since = self._idle.pop()
                if now - idle_since < IDLE_MAX_S:
                    return connection
                connection.close()
        return None

    def connect(self) -> _Connection:
        """A new connection; failing, reported as 'not sent': nothing
        reached the server."""
        try:
            sock = socket.create_connection((self._host, self._port), self._connect_timeout_s)
        except OSError as error:
            raise TransportFailure(error, sent=False) from error
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl_context is not None:
                sock = self._ssl_context.wrap_socket(sock, server_hostname=self._host)
        except OSError as error:
            sock.close()
            raise TransportFailure(error, sent=False) from error
        return _Connection(sock)

    def give_back(self, connection: _Connection) -> None:
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


def _https_context(context: ssl.SSLContext | None) -> ssl.SSLContext:
    """The given context (the client's CA or certificate), else the system's
    trust store; speaking HTTP/1.1, as http.client's HTTPS did."""
    if context is None:
        context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    return context


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
        base, target = _split(url)
        pool = self._pool(base)
        connection = pool.take() or pool.connect()
        try:
            # An InvalidURL is an HTTPException, failing the send as with http.client.
            request = _request_bytes(method, target, pool.host_header, headers, body)
            connection.sock.settimeout(timeout_s)
            connection.sock.sendall(request)
            status, answer_headers, data, will_close = _read_answer(connection.reader, method)
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            raise TransportFailure(error, sent=True) from error
        if will_close:
            connection.close()
        else:
            pool.give_back(connection)
        return Response(status, answer_headers, data, url)

    def _pool(self, base: str) -> _Pool:
        pool = self._pools.get(base)
        if pool is not None:
            return pool
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


def _split(url: str) -> tuple[str, str]:
    """'http://h:1/v1/jobs?x=1' -> ('http://h:1', '/v1/jobs?x=1'). The
    client's URLs are a node's base (`_routing.base_of`) and a path."""
    start = url.find("://")
    if start < 0:
        raise ValueError(f"not an http(s) URL: {url!r}")
    slash = url.find("/", start + 3)
    if slash < 0:
        return url, "/"
    target = url[slash:].partition("#")[0]
    return url[:slash], target


def _request_bytes(
    method: str, target: str, host: str, headers: Mapping[str, str], body: bytes | None
) -> bytes:
    """The whole request, to be written at once."""
    if _BAD_REQUEST_LINE.search(method) or _BAD_REQUEST_LINE.search(target):
        raise http.client.InvalidURL(f"cannot send {method!r} {target!r}: control characters")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Accept-Encoding: identity"]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    elif method in _METHODS_WITH_BODY:
        lines.append("Content-Length: 0")
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"invalid HTTP header {name!r}: line breaks or a colon")
        lines.append(f"{name}: {value}")
    lines.append("\r\n")
    head = "\r\n".join(lines).encode("latin-1")
    return head if body is None else head + body


def _line(reader: BinaryIO) -> bytes:
    line = reader.readline(LINE_MAX + 1)
    if len(line) > LINE_MAX:
        raise http.client.LineTooLong("header line")
    return line


_END_OF_HEADERS = frozenset({b"\r\n", b"\n", b""})


def _read_answer(reader: BinaryIO, method: str) -> tuple[int, dict[str, str], bytes, bool]:
    """(status, headers with lower-case names, body, whether the server
    closes the connection after it)."""
    readline = reader.readline
    while True:
        line = _line(reader)
        if not line:
            raise http.client.RemoteDisconnected("the server closed the connection")
        version, _, rest = line.partition(b" ")
        status_text = rest[:3]
        if not version.startswith(b"HTTP/") or not status_text.isdigit() or len(status_text) != 3:
            raise http.client.BadStatusLine(line.decode("latin-1", "replace"))
        status = int(status_text)
        headers: dict[str, str] = {}
        for _ in range(HEADERS_MAX + 1):
            header = readline(LINE_MAX + 1)
            if header in _END_OF_HEADERS:
                break
            if len(header) > LINE_MAX:
                raise http.client.LineTooLong("header line")
            name, colon, value = header.decode("latin-1").partition(":")
            if colon:
                headers[name.strip().lower()] = value.strip()
        else:
            raise http.client.HTTPException(f"got more than {HEADERS_MAX} headers")
        if status != 100:
            break  # 100 Continue comes before the answer proper; skip it
    connection = headers.get("connection", "").lower()
    if version == b"HTTP/1.0":
        will_close = "keep-alive" not in connection and "keep-alive" not in headers
    else:
        will_close = "close" in connection
    if method == "HEAD" or status in _NO_BODY_STATUSES or status < 200:
        return status, headers, b"", will_close
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return status, headers, _read_chunked(reader), will_close
    length_text = headers.get("content-length")
    length = int(length_text) if length_text is not None and length_text.isdigit() else None
    if length is None:
        return status, headers, reader.read(), True  # the body ends with the connection
    body = reader.read(length)
    if len(body) < length:
        raise http.client.IncompleteRead(body, length - len(body))
    return status, headers, body, will_close


def _read_chunked(reader: BinaryIO) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = _line(reader).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise http.client.IncompleteRead(b"".join(parts)) from None
        if size == 0:
            while _line(reader) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(parts)
        chunk = reader.read(size)
        if len(chunk) < size:
            raise http.client.IncompleteRead(b"".join(parts) + chunk, size - len(chunk))
        parts.append(chunk)
        reader.read(2)  # the CRLF after the chunk
