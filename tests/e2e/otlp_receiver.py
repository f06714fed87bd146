"""A tiny OTLP/HTTP trace receiver in the test process: what a collector
is to the nodes, workers and clients the tests start.

It takes `POST /v1/traces` with a protobuf `ExportTraceServiceRequest`
(gzip or not), the format the OTLP/HTTP exporter (the `otlp` extra) sends
by default, decodes it with the protobuf classes that exporter ships
(`opentelemetry-proto`), keeps every span in memory and answers an empty
`ExportTraceServiceResponse`. The processes under test export exactly as
they would to a real collector: no test-only exporter in them.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from raftsched.testing import wait_for

BODY_BYTES_MAX = 16 * 1024 * 1024


@dataclass(frozen=True)
class ExportedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root
    kind: int  # the OTLP enum: 2 server, 3 client, 5 consumer, 1 internal
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error

    def describe(self) -> str:
        return (
            f"{self.service}: {self.name} {self.trace_id}/{self.span_id} "
            f"<- {self.parent_span_id or 'root'} {self.attributes}"
        )


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def _attributes(pairs: Iterator[KeyValue] | Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ExportedSpan] = []
        self.requests = 0
        self.refused: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                receiver._receive(self)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The base URL, as `--otlp-endpoint` and OTEL_EXPORTER_OTLP_ENDPOINT take it."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def _receive(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        if request.path != "/v1/traces" or not 0 < length <= BODY_BYTES_MAX:
            with self._lock:
                self.refused.append(f"{request.path} ({length} bytes)")
            request.send_response(404 if request.path != "/v1/traces" else 400)
            request.end_headers()
            return
        body = request.rfile.read(length)
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        spans = list(_decode(ExportTraceServiceRequest.FromString(body)))
        with self._lock:
            self.requests += 1
            self.spans.extend(spans)
        answer = ExportTraceServiceResponse().SerializeToString()
        request.send_response(200)
        request.send_header("Content-Type", "application/x-protobuf")
        request.send_header("Content-Length", str(len(answer)))
        request.end_headers()
        request.wfile.write(answer)

    def received(self) -> list[ExportedSpan]:
        with self._lock:
            return list(self.spans)

    def wait_for(self, found: Callable[[list[ExportedSpan]], bool], timeout_s: float) -> bool:
        return wait_for(lambda: found(self.received()), timeout_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _decode(request: ExportTraceServiceRequest) -> Iterator[ExportedSpan]:
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield ExportedSpan(
                    service=service,
                    name=span.name,
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex(),
                    kind=span.kind,
                    attributes=_attributes(span.attributes),
                    status_code=span.status.code,
                )


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()
