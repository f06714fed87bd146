"""Security headers: which answer gets which policy, and HSTS only over HTTPS."""

from __future__ import annotations

import ssl
from types import SimpleNamespace

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from raftsched.api.headers import API_POLICY, add_security_headers
from raftsched.api.requests import NODE

PEERS = {"n1": "http://10.0.0.1:8701", "n2": "https://n2.example:8702/"}


def answer(response: web.Response, *, secure: bool = False) -> dict[str, str]:
    app = web.Application()
    app[NODE] = SimpleNamespace(http_urls=PEERS)  # type: ignore[assignment]
    context = ssl.create_default_context() if secure else None
    request = make_mocked_request("GET", "/", app=app, sslcontext=context)
    add_security_headers(request, response)
    return dict(response.headers)


def test_the_dashboard_page_gets_the_strict_policy_with_the_cluster_origins() -> None:
    headers = answer(web.Response(text="<!doctype html>", content_type="text/html"))
    assert headers["Content-Security-Policy"] == (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self' http://10.0.0.1:8701 https://n2.example:8702; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    )
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "no-referrer"
    assert headers["X-Frame-Options"] == "DENY"
    assert "Strict-Transport-Security" not in headers


def test_api_answers_load_nothing_and_are_not_stored() -> None:
    headers = answer(web.json_response({"job": {"payload": "card"}}))
    assert headers["Content-Security-Policy"] == API_POLICY
    assert headers["Cache-Control"] == "no-store"


def test_an_answer_with_its_own_cache_control_keeps_it() -> None:
    response = web.Response(
        text="x", content_type="text/css", headers={"Cache-Control": "no-cache"}
    )
    assert answer(response)["Cache-Control"] == "no-cache"


@pytest.mark.parametrize("secure", [False, True])
def test_hsts_only_over_https(secure: bool) -> None:
    headers = answer(web.json_response({}), secure=secure)
    assert ("Strict-Transport-Security" in headers) is secure
    if secure:
        assert headers["Strict-Transport-Security"] == "max-age=31536000"
