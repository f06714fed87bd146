"""Spans made in the test process, kept in memory (the SDK's in-memory
exporter behind a simple processor, so a span is there once it ends).

OpenTelemetry lets a process set its tracer provider once: the first test
that asks sets it, and every later one reads the same exporter (cleared
for it). The provider stays for the rest of the session; raftsched's own
switch (`raftsched.tracing.enabled`) stays off, so in-process nodes
install no span middleware unless a test asks for it.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_exporter: InMemorySpanExporter | None = None


def in_memory_spans() -> InMemorySpanExporter:
    """The session's exporter, emptied."""
    global _exporter
    if _exporter is None:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        assert trace.get_tracer_provider() is provider, "another tracer provider was set first"
        _exporter = exporter
    _exporter.clear()
    return _exporter


def named(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]
