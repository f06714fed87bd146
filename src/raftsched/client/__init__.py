"""Typed clients for the raftsched HTTP API.

`Client` blocks (HTTP/1.1 on plain sockets, keep-alive, thread-safe); `AsyncClient` uses
aiohttp. Both follow redirects to the leader keeping method and body, fail
over between nodes, wait out 503s, and repeat a request whose outcome is
unknown only when it is safe (idempotency key, fencing token, or a read); the
full rule is in `raftsched.client._calls`. Answers are the API's JSON objects
(dicts), unwrapped: `submit` returns the Job, `claim` the list of Leases.

Where to connect: `Client(urls)` with node URLs (a list, or one
comma-separated string), or `Client()` to take them from `$RAFTSCHED_URL`;
the token is `token=`, else `$RAFTSCHED_TOKEN`. The worker's `WorkerConfig`
takes the same defaults; the `raftsched` CLI reads the same variables.

`complete`, `fail` and `lease_batch` may also claim the next jobs
(`next_claim=next_claim(["payments"], max_jobs=4)`); they then return the
answer and a `NextLeases` (raftsched.client._next_calls).
"""

from raftsched.client._aio import AsyncClient
from raftsched.client._calls import (
    Call,
    Consistency,
    FailureKind,
    JsonObject,
    ReconcileDecision,
    Response,
    body_size_bytes,
    job_request,
    token_from_env,
)
from raftsched.client._errors import (
    ApiError,
    ClusterVersionTooLow,
    Conflict,
    Forbidden,
    IdempotencyConflict,
    InvalidRequest,
    InvalidState,
    LeaseLost,
    NoLeader,
    NotFound,
    OutcomeUnknown,
    PayloadTooLarge,
    RaftschedError,
    RateLimited,
    TransportError,
    Unauthenticated,
    Unavailable,
    error_from_body,
    item_error,
)
from raftsched.client._next_calls import (
    NextClaim,
    NextLeases,
    kinds_refused,
    next_claim,
    next_refused,
)
from raftsched.client._read_calls import Effect, JobEffects, StatsSeries
from raftsched.client._routing import resolve_urls, urls_from_env
from raftsched.client._sync import DEFAULT_URLS, Client
from raftsched.client._tls import client_ssl_context

__all__ = [
    "DEFAULT_URLS",
    "ApiError",
    "AsyncClient",
    "Call",
    "Client",
    "ClusterVersionTooLow",
    "Conflict",
    "Consistency",
    "Effect",
    "FailureKind",
    "ReconcileDecision",
    "Forbidden",
    "IdempotencyConflict",
    "InvalidRequest",
    "InvalidState",
    "JobEffects",
    "JsonObject",
    "LeaseLost",
    "NextClaim",
    "NextLeases",
    "NoLeader",
    "NotFound",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "RaftschedError",
    "RateLimited",
    "Response",
    "StatsSeries",
    "TransportError",
    "Unauthenticated",
    "Unavailable",
    "body_size_bytes",
    "client_ssl_context",
    "error_from_body",
    "item_error",
    "job_request",
    "kinds_refused",
    "next_claim",
    "next_refused",
    "resolve_urls",
    "token_from_env",
    "urls_from_env",
]
