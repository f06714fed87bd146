"""OpenTelemetry tracing shared by the node, the worker and the client
(docs/observability.md, "Tracing").

Three things live here:

- **Configuration** (`configure`): exporting is off unless a process is
  told where to send spans, by `--otlp-endpoint` (the node's and worker's
  flag, the node's TOML `otlp_endpoint`) or the standard `OTEL_*`
  environment variables (`OTEL_TRACES_EXPORTER`, `OTEL_EXPORTER_OTLP_ENDPOINT`,
  `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; `OTEL_SDK_DISABLED=true` turns it
  off whatever else is set). Until then the OpenTelemetry API's tracer is a
  no-op, and the node does not even install its HTTP span middleware
  (`enabled`). Configured, the process gets the SDK's tracer provider with a
  batch processor and the OTLP/HTTP exporter (the `otlp` extra) or the
  console exporter; the sampler and the batch processor read their own
  `OTEL_*` settings.
- **The W3C headers** a submission may carry (`parse_traceparent`,
  `parse_tracestate`): what a job stores is normalized and bounded, and a
  header that does not parse is ignored, as W3C Trace Context asks of a
  receiver (the request is served, the context is not kept).
- **Names**: the tracer's, and the span attributes every process uses, so a
  search for a job id finds its spans in every process.

A library user of the client or the worker configures OpenTelemetry as
they like; the worker's and client's spans and headers follow the global
tracer provider and propagator, whatever set them.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from opentelemetry import trace

from raftsched.core.kernel.validate import TRACEPARENT_CHARS, TRACESTATE_CHARS_MAX

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("raftsched.tracing")

TRACER_NAME: Final = "raftsched"

TRACEPARENT_HEADER: Final = "traceparent"
TRACESTATE_HEADER: Final = "tracestate"

# Span attributes (docs/observability.md): the names the logs use, under the
# `raftsched.` prefix. Never a payload, a result, a token or a secret.
JOB_ID: Final = "raftsched.job_id"
JOB_COUNT: Final = "raftsched.job_count"
QUEUE: Final = "raftsched.queue"
ATTEMPT: Final = "raftsched.attempt"
EPOCH: Final = "raftsched.epoch"
FENCING_TOKEN: Final = "raftsched.fencing_token"
WORKER_ID: Final = "raftsched.worker_id"
COMMAND: Final = "raftsched.command"
OUTCOME: Final = "raftsched.outcome"
EFFECT_KEY: Final = "raftsched.effect.key"
EFFECT_REPLAYED: Final = "raftsched.effect.replayed"
WORKFLOW_ID: Final = "raftsched.workflow_id"
STEP: Final = "raftsched.step"
SCHEDULE_ID: Final = "raftsched.schedule_id"
RECONCILE_QUEUE: Final = "raftsched.reconcile.queue"

OTLP_TRACES_PATH: Final = "/v1/traces"
EXPORTERS: Final = ("otlp", "console")


class TracingConfigError(ValueError):
    """Tracing was asked for in a way this process cannot do."""


_provider: TracerProvider | None = None


def enabled() -> bool:
    """Whether this process exports spans (`configure` set a provider up)."""
    return _provider is not None


_TRACER: Final = trace.get_tracer(TRACER_NAME)


def tracer() -> trace.Tracer:
    """The tracer of raftsched's own spans: a no-op until a tracer provider
    is set (by `configure`, or the application), the SDK's from then on."""
    return _TRACER


def recording() -> bool:
    """Whether a span made now could be recorded: some tracer provider has
    been set in this process (by `configure`, or by the application that
    runs the client or the worker). Until then the worker skips making its
    spans (a few microseconds each even as no-ops) and only passes the
    job's trace context on."""
    global _provider_set
    if not _provider_set:  # once set, a tracer provider stays (OpenTelemetry's rule)
        _provider_set = not isinstance(
            trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
        )
    return _provider_set


_provider_set = False


def exporters_wanted(otlp_endpoint: str | None, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Which exporters the flag and the environment ask for; () is off.

    `--otlp-endpoint` means OTLP whatever `OTEL_TRACES_EXPORTER` says, since
    it was given on purpose; without it, `OTEL_TRACES_EXPORTER` names the
    exporters (`none` for none), and an OTLP endpoint in the environment
    alone means OTLP. Nothing set means off: the OpenTelemetry default of
    exporting to localhost:4318 would make every node send spans nobody
    asked for."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    if otlp_endpoint:
        return ("otlp",)
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if named:
        wanted = tuple(dict.fromkeys(part.strip() for part in named.split(",") if part.strip()))
        if "none" in wanted:
            return ()
        unknown = [name for name in wanted if name not in EXPORTERS]
        if unknown:
            raise TracingConfigError(
                f"OTEL_TRACES_EXPORTER names {', '.join(unknown)}; raftsched exports to "
                f"{' or '.join(EXPORTERS)} (or none)"
            )
        return wanted
    if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    ):
        return ("otlp",)
    return ()


def traces_url(otlp_endpoint: str) -> str:
    """`--otlp-endpoint` is the collector's base URL, as
    OTEL_EXPORTER_OTLP_ENDPOINT is (`http://collector:4318`); spans go to its
    `/v1/traces`. A URL that already ends so is taken as it is."""
    url = otlp_endpoint.rstrip("/")
    if not re.match(r"https?://[^/]", url):
        raise TracingConfigError(f"--otlp-endpoint must be an http(s) URL, got {otlp_endpoint!r}")
    return url if url.endswith(OTLP_TRACES_PATH) else url + OTLP_TRACES_PATH


def configure(
    service_name: str,
    *,
    otlp_endpoint: str | None = None,
    instance_id: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> bool:
    """Set this process's tracer provider up if exporting is asked for
    (`exporters_wanted`); returns whether it is. Raises TracingConfigError
    for what cannot be done (an unknown exporter, the OTLP exporter not
    installed), before anything is set. Call once, at start."""
    global _provider
    environ = os.environ if environ is None else environ
    wanted = exporters_wanted(otlp_endpoint, environ)
    if not wanted:
        return False
    exporters = [_exporter(name, otlp_endpoint, environ) for name in wanted]
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from raftsched import __version__

    attributes: dict[str, str] = {"service.version": __version__}
    # The environment's service name wins over ours (Resource.create lets
    # the attributes given win over the environment's).
    named_in_env = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    if not named_in_env:
        attributes["service.name"] = service_name
    if instance_id is not None:
        attributes["service.instance.id"] = instance_id
    provider = TracerProvider(resource=Resource.create(attributes))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _provider = provider
    log.info(
        "tracing on",
        extra={"exporters": ",".join(wanted), "otlp_endpoint": otlp_endpoint or None},
    )
    return True


def _exporter(name: str, otlp_endpoint: str | None, environ: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    if protocol and protocol != "http/protobuf":
        raise TracingConfigError(
            f"OTLP protocol {protocol!r}: raftsched exports OTLP over HTTP (http/protobuf)"
        )
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as error:
        raise TracingConfigError(
            "exporting spans over OTLP needs the OTLP exporter: pip install 'raftsched[otlp]'"
        ) from error
    if otlp_endpoint:
        return OTLPSpanExporter(endpoint=traces_url(otlp_endpoint))
    return OTLPSpanExporter()  # its endpoint from OTEL_EXPORTER_OTLP_*


def shutdown() -> None:
    """Export what is still buffered and stop (at the process's end)."""
    global _provider
    provider, _provider = _provider, None
    if provider is not None:
        provider.shutdown()


# -- the W3C headers ---------------------------------------------------------------

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_KEY = r"[a-z0-9][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13}"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER = re.compile(rf"({_KEY})=({_VALUE})")
TRACESTATE_MEMBERS_MAX: Final = 32
_MEMBER_CHARS_LONG: Final = 128
"""W3C: a tracestate cut to size loses its members longer than this first."""


def parse_traceparent(value: str | None) -> str | None:
    """A `traceparent` header as a job stores it: W3C version 00, 55
    characters; None if it does not parse (W3C Trace Context, "traceparent
    header"). A later version's header is read for its first four fields,
    as the recommendation asks, and stored as version 00; version ff and
    all-zero ids are invalid."""
    if value is None:
        return None
    found = _TRACEPARENT.fullmatch(value.strip(" \t"))
    if found is None:
        return None
    version, trace_id, parent_id, flags, rest = found.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if not trace_id.strip("0") or not parent_id.strip("0"):
        return None
    stored = f"00-{trace_id}-{parent_id}-{flags}"
    assert len(stored) == TRACEPARENT_CHARS
    return stored


def parse_tracestate(value: str | None) -> str | None:
    """A `tracestate` header (or several, joined with commas) as a job
    stores it: its list members in order, without empty ones, at most 256
    characters (W3C allows 512: members are dropped to fit, long ones
    first, then from the end, as W3C asks of a vendor that truncates).
    None when there is nothing left, or when any member is malformed, a key
    repeats or there are more than 32 members: W3C lets a receiver discard
    a tracestate it cannot parse, and the traceparent is kept without it."""
    if value is None:
        return None
    members: list[str] = []
    keys: set[str] = set()
    for part in value.split(","):
        member = part.strip(" \t")
        if not member:
            continue
        found = _MEMBER.fullmatch(member)
        if found is None or found[1] in keys:
            return None
        keys.add(found[1])
        members.append(member)
    if not members or len(members) > TRACESTATE_MEMBERS_MAX:
        return None
    while len(",".join(members)) > TRACESTATE_CHARS_MAX:
        long_ones = [i for i, member in enumerate(members) if len(member) > _MEMBER_CHARS_LONG]
        del members[long_ones[-1] if long_ones else -1]
    return ",".join(members) or None
