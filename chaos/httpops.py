"""One logical API operation over several HTTP sends, classified for the
history as ok / fail / info.

Deliberately lean (http.client, one connection per send) instead of
raftsched.client: the harness must see every send's fate to classify the
outcome precisely. The rules:

- 2xx: ok.
- 307: follow `Location` with the same method and body.
- 503 (no_leader, unavailable): nothing was committed; try the next node.
- connect refused / unreachable (nothing sent): try the next node.
- timeout or reset after sending, 504: the outcome is unknown. Repeat only
  if the caller says the operation is idempotent (idempotency key or fencing
  token), else stop with `info`.
- other 4xx: `fail` -- unless an earlier send of this operation had an unknown
  outcome, then `info` (the earlier send may have committed, and e.g. the job
  moved on since, so the later rejection proves nothing).
- budget exhausted: `info` if any send had an unknown outcome, else `fail`.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from chaos.history import Recorder

SEND_TIMEOUT_S = 3.0


@dataclass
class Outcome:
    kind: str  # ok | fail | info
    status: int | None = None
    body: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    node: str | None = None

    @property
    def code(self) -> str | None:
        error = self.body.get("error")
        return str(error.get("code")) if isinstance(error, dict) else None


class _NotSent(Exception):
    pass


class _Unknown(Exception):
    pass


def send(
    method: str,
    url: str,
    body: Any = None,
    timeout_s: float = SEND_TIMEOUT_S,
    extra_headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any], dict[str, str]]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout_s)
    try:
        try:
            connection.connect()
        except OSError as error:
            raise _NotSent(str(error)) from error
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        token = os.environ.get("RAFTSCHED_TOKEN", "").strip()
        if token:  # the cluster's admin token (chaos/run.py sets it)
            headers["Authorization"] = f"Bearer {token}"
        headers |= extra_headers or {}
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            connection.request(method, target, body=data, headers=headers)
            answer = connection.getresponse()
            raw = answer.read()
        except (OSError, http.client.HTTPException) as error:
            raise _Unknown(f"{type(error).__name__}: {error}") from error
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {"raw": raw[:200].decode(errors="replace")}
        headers_out = {k.lower(): v for k, v in answer.getheaders()}
        return answer.status, parsed if isinstance(parsed, dict) else {}, headers_out
    finally:
        connection.close()


class Session:
    """Talks to the cluster through any of its nodes, preferring the last
    one that answered (usually the leader). `headers` go with every send
    (a sharded cluster's `Raftsched-Shard: k`: one session per shard, so
    that each prefers its own shard's leader)."""

    def __init__(
        self,
        urls: list[str],
        rng: random.Random | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.urls = list(urls)
        self.preferred = self.urls[0]
        self.rng = rng or random.Random()
        self.headers = dict(headers or {})

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        idempotent: bool,
        budget_s: float = 8.0,
        send_timeout_s: float = SEND_TIMEOUT_S,
    ) -> Outcome:
        deadline = time.monotonic() + budget_s
        url = self.preferred + path
        unknown: str | None = None
        last_error = "no send"
        hops = 0
        while time.monotonic() < deadline:
            base = _base(url)
            try:
                timeout_s = max(0.2, min(send_timeout_s, deadline - time.monotonic()))
                status, answer, headers = send(method, url, body, timeout_s, self.headers)
            except _NotSent as error:
                last_error = f"not sent: {error}"
                url = self._next(base) + path
                time.sleep(0.05)
                continue
            except _Unknown as error:
                unknown = last_error = f"unknown: {error}"
                if not idempotent:
                    return Outcome("info", error=unknown, node=base)
                url = self._next(base) + path
                continue
            if 200 <= status < 300:
                self.preferred = base
                return Outcome("ok", status, answer, node=base)
            if status in (307, 308) and headers.get("location") and hops < 5:
                hops += 1
                url = headers["location"]
                continue
            hops = 0
            if status in (503, 307, 308):
                last_error = f"HTTP {status}"
                url = self._next(base) + path
                time.sleep(0.1 + self.rng.random() * 0.2)
                continue
            if status in (502, 504):
                unknown = last_error = f"unknown: HTTP {status} {_code(answer)}"
                if not idempotent:
                    return Outcome("info", status, answer, error=unknown, node=base)
                url = self._next(base) + path
                time.sleep(0.1)
                continue
            kind = "info" if unknown else "fail"
            return Outcome(kind, status, answer, error=unknown, node=base)
        return Outcome("info" if unknown else "fail", error=unknown or last_error)

    def _next(self, base: str) -> str:
        known = base if base in self.urls else self.urls[0]
        following = self.urls[(self.urls.index(known) + 1) % len(self.urls)]
        self.preferred = following
        return following


def _base(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _code(answer: dict[str, Any]) -> str:
    error = answer.get("error")
    return str(error.get("code")) if isinstance(error, dict) else ""


def recorded_call(
    history: Recorder, session: Session, f: str, method: str, path: str, body: Any, **kw: Any
) -> Outcome:
    """One call through `session`, recorded as an operation `f` in `history`:
    its invocation, then its outcome (ok, fail or info) with status, body,
    node and any error."""
    op_id = history.invoke(f, {"path": path, "body": body})
    outcome = session.call(method, path, body, **kw)
    value = {"status": outcome.status, "body": outcome.body, "node": outcome.node}
    if outcome.error:
        value["error"] = outcome.error
    history.complete(op_id, outcome.kind, f, value)
    return outcome
