"""Security headers on every HTTP response (docs/security.md, "HTTP security headers").

Set when an answer is prepared (`api.app`'s one `on_response_prepare`
hook), so they reach every answer the application makes: handlers',
errors', redirects' and the dashboard's files.

- `Content-Security-Policy`: the dashboard's page gets a strict policy
  (`DASHBOARD_POLICY`): its own script and style files only, no inline
  script, style or event handler, no framing, no forms that submit
  anywhere. `connect-src` names, besides 'self', the origins of the
  cluster's advertised URLs: the page sends its requests straight to the
  leader, which is another origin when it is another node (the same
  origins CORS allows, api/dashboard.py). Every other answer gets
  `default-src 'none'`: a JSON answer opened in a browser loads nothing.
- `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`,
  `X-Frame-Options: DENY` (for browsers without `frame-ancestors`).
- `Cache-Control: no-store` on every answer that did not set its own: API
  answers carry job payloads and must not stay in a browser's or a proxy's
  cache. The dashboard's files keep their `no-cache` (revalidate).
- `Strict-Transport-Security` only on answers served over HTTPS
  (`request.secure`): over plain HTTP it would be ignored, and a node
  behind HTTP must not teach browsers to refuse it.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from raftsched.api.dashboard import allowed_origins
from raftsched.api.requests import node_of

DASHBOARD_POLICY: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'{peers}; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
API_POLICY: Final = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'"
HSTS: Final = "max-age=31536000"
ALWAYS: Final = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def dashboard_policy(request: web.Request) -> str:
    origins = sorted(allowed_origins(node_of(request)))
    return DASHBOARD_POLICY.format(peers="".join(f" {origin}" for origin in origins))


def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    headers = response.headers
    for name, value in ALWAYS.items():
        headers[name] = value
    is_page = response.content_type == "text/html"
    headers["Content-Security-Policy"] = dashboard_policy(request) if is_page else API_POLICY
    headers.setdefault("Cache-Control", "no-store")
    if request.secure:
        headers["Strict-Transport-Security"] = HSTS
