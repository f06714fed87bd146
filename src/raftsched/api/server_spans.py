"""The HTTP server span of every request, while tracing is on.

Installed by `app.create_app` only when this process exports spans
(`raftsched.tracing.enabled`), outside the request middleware, so that the
span covers everything the node does for the request: authentication, the
handler, its proposals (each a `raft commit` child, `node.commit_spans`)
and the rendering. The parent is the request's `traceparent`, extracted
with the global propagator (W3C Trace Context by default). The span is
named by the route template, never the raw path (`POST /v1/jobs`,
`GET /v1/jobs/{job_id}`), and says the method, route, status and, on a
route that names one, the job id. The routes that answer monitoring and
the dashboard's files (health, metrics, the clock-skew probe, static
files) get no span: they would be most of the spans and say nothing.
"""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web
from opentelemetry import propagate
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from raftsched import tracing
from raftsched.api.requests import Handler

QUIET_ROUTES: Final = frozenset(
    {
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/time",
        "/",
        "/openapi.json",
        "/static/{name}",
        "/static/vendor/{name}",
    }
)


@web.middleware
async def server_span_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else None
    if route in QUIET_ROUTES:
        return await handler(request)
    method = request.method
    attributes: dict[str, Any] = {"http.request.method": method}
    if route is not None:
        attributes["http.route"] = route
    job_id = request.match_info.get("job_id")
    if job_id is not None:
        attributes[tracing.JOB_ID] = job_id
    with tracing.tracer().start_as_current_span(
        f"{method} {route}" if route is not None else method,
        context=propagate.extract(request.headers),
        kind=SpanKind.SERVER,
        attributes=attributes,
        # A 4xx is the caller's, not the node's error; anything raised is
        # named by its type (a message may quote a request's data).
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            response = await handler(request)
        except web.HTTPException as error:  # the request middleware renders most
            _answered(span, error.status)
            raise
        except BaseException as error:
            span.set_attribute("error.type", type(error).__name__)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            raise
        _answered(span, response.status)
        return response


def _answered(span: Span, status: int) -> None:
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))
