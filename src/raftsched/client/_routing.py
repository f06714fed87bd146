"""Where to send a call next, shared by the sync and async clients.

Theory of operation: the client knows several node URLs and remembers one it
prefers (the last that answered a write, or the leader a redirect named).
A call starts there and, per answer:

- 2xx: done; that node stays preferred.
- 307/308: go to `Location` with the same method and body (urllib and aiohttp
  would turn a redirected POST into a GET or drop its body), at most
  `max_redirects` hops per call; the target becomes preferred.
- 503 (`no_leader`, `unavailable`): nothing was committed; wait `Retry-After`
  and try the next node.
- connection refused / unreachable (nothing sent): try the next node; after a
  full round of failures, back off.
- timeout or reset after sending, 502, 504 (outcome unknown): like the previous
  case if `call.retry_unknown`, else raise `OutcomeUnknown`.
- anything else: raise the matching `ApiError`.

Every call is bounded by `budget_s` of wall time (monotonic) and by
`max_attempts` sends, so a dead cluster yields an error, not a hang.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urljoin, urlsplit

from raftsched.client._calls import Call, Response
from raftsched.client._errors import (
    ApiError,
    OutcomeUnknown,
    TransportError,
    error_from_body,
)

RETRY_AFTER_DEFAULT_S = 0.5
RETRY_AFTER_MAX_S = 5.0
BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 1.0


class TransportFailure(Exception):
    """Raised by a transport: no HTTP answer. `sent` is False only when the
    request certainly never reached the server (connect failed)."""

    def __init__(self, cause: BaseException, *, sent: bool) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause
        self.sent = sent


def base_of(url: str) -> str:
    """'http://h:1/v1/jobs?x' -> 'http://h:1'."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {url!r}")
    return f"{parts.scheme}://{parts.netloc}"


def split_urls(urls: Sequence[str] | str) -> list[str]:
    """Accept a list, or one string with comma-separated URLs (as in RAFTSCHED_URL)."""
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    bases = [base_of(item.strip()) for item in items if item.strip()]
    if not bases:
        raise ValueError("at least one node URL is required")
    return list(dict.fromkeys(bases))


def urls_from_env() -> str | None:
    """The node URLs in `$RAFTSCHED_URL` (comma-separated), the default of
    every client, the worker and the CLI; None when it is unset or empty."""
    return os.environ.get("RAFTSCHED_URL", "").strip() or None


NO_URLS_MESSAGE = (
    "no node URLs: pass urls (a list, or one comma-separated string) or set "
    "$RAFTSCHED_URL, e.g. RAFTSCHED_URL=http://127.0.0.1:8701,http://127.0.0.1:8702,"
    "http://127.0.0.1:8703 for `raftsched dev`"
)


def urls_or_env(urls: Sequence[str] | str | None) -> Sequence[str] | str:
    """`urls` when given, else `$RAFTSCHED_URL`; ValueError when neither is."""
    if urls is not None:
        return urls
    from_env = urls_from_env()
    if from_env is None:
        raise ValueError(NO_URLS_MESSAGE)
    return from_env


def resolve_urls(urls: Sequence[str] | str | None = None) -> list[str]:
    """The node base URLs a client given `urls` talks to: `urls`, else
    `$RAFTSCHED_URL`, split at commas; ValueError when neither has one."""
    return split_urls(urls_or_env(urls))


class Nodes:
    """The configured nodes and the preferred one. Shared by all calls of one
    client, possibly from several threads."""

    def __init__(self, urls: Sequence[str] | str | None) -> None:
        """`urls`: None takes `$RAFTSCHED_URL` (`resolve_urls`)."""
        self.urls = resolve_urls(urls)
        self._preferred = self.urls[0]
        self._lock = threading.Lock()

    def preferred(self) -> str:
        with self._lock:
            return self._preferred

    def prefer(self, base: str) -> None:
        with self._lock:
            self._preferred = base

    def after(self, base: str) -> str:
        """The configured node that follows `base` (the first one if `base` is
        not configured, e.g. a leader URL learned from a redirect)."""
        if base not in self.urls:
            return self.urls[0]
        return self.urls[(self.urls.index(base) + 1) % len(self.urls)]

    def move_on_from(self, base: str) -> str:
        """`base` failed: stop preferring it and return where to go next."""
        following = self.after(base)
        with self._lock:
            if self._preferred == base:
                self._preferred = following
        return following


class Attempts:
    """The state of one call across its sends. `url` is where to send next;
    `on_response`/`on_failure` return the final Response or a delay to wait
    before sending again, or raise."""

    def __init__(
        self,
        nodes: Nodes,
        call: Call[Any],
        *,
        budget_s: float,
        max_redirects: int = 5,
        max_attempts: int = 30,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nodes = nodes
        self._call = call
        self._clock = clock
        self._deadline = clock() + budget_s
        self._max_redirects = max_redirects
        self._redirects_left = max_redirects
        self._attempts_left = max_attempts
        self._failed_in_round: set[str] = set()
        self._backoff_s = BACKOFF_INITIAL_S
        self._base = nodes.preferred()  # a base already (split_urls)
        self.url = self._base + call.path_and_query
        self._base_of = self.url

    @property
    def base(self) -> str:
        """The node `url` goes to (worked out again only when `url` moved:
        `urlsplit` of a URL never seen before costs microseconds per call)."""
        url = self.url
        if url is not self._base_of:
            self._base, self._base_of = base_of(url), url
        return self._base

    def on_response(self, response: Response) -> Response | float:
        status = response.status
        if 200 <= status < 300:
            self._nodes.prefer(self.base)
            return response
        if status in (307, 308):
            return self._follow(response)
        if status == 503:
            error = _api_error(response)
            return self._next_node(_retry_after_s(response), error)
        if status in (502, 504):
            return self._unknown(TransportError(f"HTTP {status} from {response.url}"))
        raise _api_error(response)

    def on_failure(self, failure: TransportFailure) -> float:
        if failure.sent:
            return self._unknown(failure)
        return self._unreachable(failure)

    def _follow(self, response: Response) -> float:
        location = response.headers.get("location")
        if not location:
            raise TransportError(f"redirect without Location from {response.url}")
        self._redirects_left -= 1
        if self._redirects_left < 0:
            # Redirects that go round in circles happen while an election is
            # settling (nodes still name the old leader): wait, then start
            # again from a configured node, within the call's budget.
            self._redirects_left = self._max_redirects
            delay_s = self._backoff_s
            self._backoff_s = min(self._backoff_s * 2, BACKOFF_MAX_S)
            self.url = self._nodes.move_on_from(self.base) + self._call.path_and_query
            return self._spend(delay_s, TransportError(f"too many redirects, last to {location}"))
        self.url = urljoin(response.url, location)
        self._nodes.prefer(self.base)
        return self._spend(0.0, TransportError(f"gave up after a redirect to {location}"))

    def _unknown(self, cause: BaseException) -> float:
        # Reads change nothing, so repeating one is always safe.
        is_read = self._call.method in ("GET", "HEAD")
        if not (self._call.retry_unknown or is_read):
            raise OutcomeUnknown(
                f"{self._call.method} {self._call.path} to {self.base}: outcome unknown "
                f"({cause}); not repeated because it is not idempotent"
            ) from cause
        return self._unreachable(cause)

    def _unreachable(self, cause: BaseException) -> float:
        self._failed_in_round.add(self.base)
        delay_s = 0.0
        if self._failed_in_round.issuperset(self._nodes.urls):
            # Every node failed once: the cluster may be restarting; back off.
            self._failed_in_round.clear()
            delay_s = self._backoff_s
            self._backoff_s = min(self._backoff_s * 2, BACKOFF_MAX_S)
        self.url = self._nodes.move_on_from(self.base) + self._call.path_and_query
        return self._spend(delay_s, TransportError(f"no node answered; last: {cause}"))

    def _next_node(self, delay_s: float, error: ApiError) -> float:
        self.url = self._nodes.move_on_from(self.base) + self._call.path_and_query
        return self._spend(delay_s, error)

    def _spend(self, delay_s: float, error: Exception) -> float:
        """Account for one more send after `delay_s`, or raise `error` if the
        budget does not allow it."""
        self._attempts_left -= 1
        remaining_s = self._deadline - self._clock()
        if self._attempts_left <= 0 or remaining_s <= delay_s:
            raise error
        return delay_s


def _api_error(response: Response) -> ApiError:
    try:
        body: object = response.json()
    except ValueError:
        body = response.text()
    return error_from_body(response.status, body, _retry_after_s(response))


def _retry_after_s(response: Response) -> float:
    text = response.headers.get("retry-after", "")
    try:
        value = float(text)
    except ValueError:
        return RETRY_AFTER_DEFAULT_S
    return min(max(value, 0.0), RETRY_AFTER_MAX_S)
