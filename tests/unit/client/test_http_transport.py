"""The blocking client's HTTP/1.1 transport (client._http) against a raw
socket server that answers with scripted bytes: each request in one write,
TCP_NODELAY, the answer's framings, keep-alive and its end, broken answers."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator

import pytest

from raftsched.client._http import HttpTransport, _request_bytes
from raftsched.client._routing import TransportFailure


class RawServer:
    """Accepts connections; answers each request with the next scripted
    bytes (None: close the connection without answering). Records every
    request as received and the number of connections."""

    def __init__(self, answers: list[bytes | None]) -> None:
        self.answers = answers
        self.requests: list[bytes] = []
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.answers:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with sock:
                while self.answers:
                    request = _read_request(sock)
                    if request is None:
                        break
                    self.requests.append(request)
                    answer = self.answers.pop(0)
                    if answer is None:
                        break
                    sock.sendall(answer)
                    framed = b"Content-Length" in answer or b"chunked" in answer
                    if b"Connection: close" in answer or b"HTTP/1.0" in answer or not framed:
                        break

    def close(self) -> None:
        self.listener.close()


def _read_request(sock: socket.socket) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += sock.recv(65536)
    return data


@pytest.fixture
def transport() -> Iterator[HttpTransport]:
    made = HttpTransport(connect_timeout_s=2.0)
    yield made
    made.close()


def ok(body: bytes, *extra: bytes) -> bytes:
    headers = b"".join(header + b"\r\n" for header in extra)
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), headers, body)


def test_a_request_is_one_write_with_its_headers_and_body() -> None:
    request = _request_bytes(
        "POST", "/v1/jobs", "127.0.0.1:8701", {"X-Request-Id": "r1"}, b'{"queue":"q"}'
    )
    assert request == (
        b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1:8701\r\nAccept-Encoding: identity\r\n"
        b'Content-Length: 13\r\nX-Request-Id: r1\r\n\r\n{"queue":"q"}'
    )
    bodyless = _request_bytes("POST", "/v1/x", "h", {}, None)
    assert b"Content-Length: 0\r\n" in bodyless and bodyless.endswith(b"\r\n\r\n")
    assert b"Content-Length" not in _request_bytes("GET", "/v1/x", "h", {}, None)
    with pytest.raises(ValueError, match="line breaks"):
        _request_bytes("GET", "/", "h", {"Authorization": "Bearer a\r\nX-Evil: 1"}, None)
    with pytest.raises(http.client.InvalidURL, match="control characters"):
        _request_bytes("GET", "/a b", "h", {}, None)


def test_keep_alive_reuses_one_connection_with_tcp_nodelay(transport: HttpTransport) -> None:
    server = RawServer([ok(b'{"n":1}'), ok(b'{"n":2}', b"X-Two: yes")])
    try:
        first = transport.send("POST", server.url + "/v1/jobs", b"{}", {}, 5.0)
        second = transport.send("GET", server.url + "/v1/jobs?x=1", None, {}, 5.0)
    finally:
        server.close()
    assert (first.status, first.body, second.body) == (200, b'{"n":1}', b'{"n":2}')
    assert second.headers["x-two"] == "yes" and second.headers["content-length"] == "7"
    assert server.connections == 1
    assert server.requests[1].startswith(b"GET /v1/jobs?x=1 HTTP/1.1\r\n")
    pool = transport._pools[server.url]
    (connection, _), *_ = pool._idle
    assert connection.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_chunked_answers_and_100_continue_are_read_whole(transport: HttpTransport) -> None:
    chunked = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'4;ext=1\r\n{"a"\r\n3\r\n:1}\r\n0\r\nTrailer: x\r\n\r\n'
    )
    server = RawServer([chunked, ok(b"{}")])
    try:
        answer = transport.send("POST", server.url + "/v1/jobs", b"{}", {}, 5.0)
        again = transport.send("POST", server.url + "/v1/jobs", b"{}", {}, 5.0)
    finally:
        server.close()
    assert (answer.status, answer.body) == (201, b'{"a":1}')
    assert again.status == 200 and server.connections == 1


def test_an_answer_that_ends_the_connection_is_not_reused(transport: HttpTransport) -> None:
    until_close = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it"
    closing = ok(b"{}", b"Connection: close")
    old = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    server = RawServer([until_close, closing, old, ok(b"{}")])
    try:
        bodies = [transport.send("GET", server.url + "/", None, {}, 5.0).body for _ in range(4)]
    finally:
        server.close()
    assert bodies == [b"all of it", b"{}", b"{}", b"{}"]
    assert server.connections == 4


@pytest.mark.parametrize(
    "answer",
    [
        None,  # closed without a word
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
def test_a_broken_answer_is_a_failure_after_sending(
    transport: HttpTransport, answer: bytes | None
) -> None:
    server = RawServer([answer])
    try:
        with pytest.raises(TransportFailure) as failure:
            transport.send("POST", server.url + "/v1/jobs", b"{}", {}, 5.0)
    finally:
        server.close()
    assert failure.value.sent is True
    assert transport._pools[server.url]._idle == []


def test_a_node_that_is_not_there_was_not_sent_anything(transport: HttpTransport) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(TransportFailure) as failure:
        transport.send("GET", f"http://127.0.0.1:{port}/healthz", None, {}, 5.0)
    assert failure.value.sent is False
