"""Authentication: bearer tokens in, a `Principal` on the request out.

Once the replicated state holds an admin token (node.auth), every route but
the public ones (`permissions.ROUTE_PERMISSIONS`) needs `Authorization:
Bearer <secret>`. The secret's SHA-256 is looked up in this replica's own
state, so a revocation is in force here as soon as this node applies it.

- no token, or one that is malformed, unknown, expired or revoked: 401
  `unauthenticated` with `WWW-Authenticate: Bearer`;
- a valid token whose role does not allow the route: 403 `forbidden`;
- repeated failures from one address within a minute: 429 `rate_limited`
  with `Retry-After` instead of 401. Only failing requests are refused: a
  caller with a valid secret behind the same address is never locked out by
  someone else's failures (secrets are 256 random bits; the limiter bounds
  the cost of failures, guessing is hopeless anyway).

A token created a moment ago may not be applied yet on the replica that is
presented it. So before a well-formed secret is called unknown, `authorize`
raises `CatchUpFirst`; the middleware (api.app) then awaits `catch_up`,
which waits (at most TOKEN_CATCH_UP_S) until this replica has applied what
the leader had committed when the request arrived (node.read_index), and
authorizes the request again: a secret still unknown is a 401, counted
like any other failure. Bounded on every side: an address that the limiter
refuses is answered 429 at once, without a wait; a request waits at most
once; at most TOKEN_CATCH_UPS_MAX requests wait at a time (the rest are
answered at once); the leader is never behind what it acknowledged, and a
follower that is not behind answers after one round trip to the leader,
which concurrent waiters share.

Failures are counted in `raftsched_http_auth_failures_total{reason}`. The
secret itself never reaches a log line, an error, a metric or the history:
it is hashed here and dropped.
"""

from __future__ import annotations

import hmac
import logging
import math
import time
from collections import OrderedDict, deque
from typing import Final

from aiohttp import web

from raftsched.api.errors import ApiError
from raftsched.api.permissions import Permission, allows, permission_for
from raftsched.api.principal import ALL, ANONYMOUS, Principal, Role, principal_of, set_principal
from raftsched.api.requests import node_of
from raftsched.core.auth.tokens import Token, find_by_hash
from raftsched.limits import AUTH_FAILURES_PER_MINUTE
from raftsched.node.auth import hash_secret, looks_like_secret

log = logging.getLogger("raftsched.api")

# More failures than `limits.AUTH_FAILURES_PER_MINUTE` (a node's
# `--auth-failures-per-minute`) from one address within the window: 429.
AUTH_FAILURE_WINDOW_S: Final = 60.0
# Addresses remembered at most (the oldest are forgotten first).
AUTH_ADDRESSES_MAX: Final = 10_000
# How long a request with a secret this replica does not know may wait for
# the replica to catch up with the leader (a replica that is applying gets
# there in milliseconds), and how many such requests wait at once.
TOKEN_CATCH_UP_S: Final = 1.0
TOKEN_CATCH_UPS_MAX: Final = 64


class FailureLimiter:
    """Failed authentications per remote address, in a sliding minute."""

    def __init__(
        self,
        failures_max: int = AUTH_FAILURES_PER_MINUTE,
        window_s: float = AUTH_FAILURE_WINDOW_S,
        addresses_max: int = AUTH_ADDRESSES_MAX,
    ) -> None:
        self.failures_max = failures_max
        self.window_s = window_s
        self.addresses_max = addresses_max
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str, now: float) -> deque[float] | None:
        times = self._failures.get(address)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        return times

    def retry_after_s(self, address: str, now: float) -> int | None:
        """Seconds until `address` may fail again, or None when it may now."""
        times = self._recent(address, now)
        if times is None or len(times) < self.failures_max:
            return None
        return max(1, math.ceil(times[0] + self.window_s - now))

    def failed(self, address: str, now: float) -> None:
        times = self._recent(address, now)
        if times is None:
            times = self._failures[address] = deque(maxlen=self.failures_max)
            while len(self._failures) > self.addresses_max:
                self._failures.popitem(last=False)
        else:
            self._failures.move_to_end(address)
        times.append(now)


LIMITER: web.AppKey[FailureLimiter] = web.AppKey("auth_limiter")


class CatchUpFirst(Exception):
    """The presented secret is unknown to this replica, which may not have
    applied its creation yet: await `catch_up`, then `authorize` again."""


class CatchUps:
    """The requests waiting in `catch_up` now (at most `waiting_max`)."""

    __slots__ = ("waiting", "waiting_max")

    def __init__(self, waiting_max: int = TOKEN_CATCH_UPS_MAX) -> None:
        self.waiting = 0
        self.waiting_max = waiting_max


CATCH_UPS: web.AppKey[CatchUps] = web.AppKey("auth_catch_ups")
# Set on a request once it has waited: it waits at most once.
_CAUGHT_UP: Final = web.RequestKey("auth_caught_up", bool)


async def catch_up(request: web.Request) -> None:
    """Wait until this replica has applied what the leader had committed
    when the request arrived, or TOKEN_CATCH_UP_S passed (see the module's
    docstring); the caller then authorizes the request again."""
    request[_CAUGHT_UP] = True
    catch_ups = request.app[CATCH_UPS]
    catch_ups.waiting += 1
    try:
        await node_of(request).catch_up(TOKEN_CATCH_UP_S)
    finally:
        catch_ups.waiting -= 1


def _may_catch_up(request: web.Request) -> bool:
    catch_ups = request.app[CATCH_UPS]
    return _CAUGHT_UP not in request and catch_ups.waiting < catch_ups.waiting_max


def principal_for(token: Token) -> Principal:
    """The principal of a token, made once per token rather than once per
    request: a memo keyed by everything the principal is made of."""
    key = (token.id, token.name, token.role, token.tenants, token.queues)
    principal = _PRINCIPALS.get(key)
    if principal is None:
        if len(_PRINCIPALS) >= _PRINCIPALS_MAX:
            _PRINCIPALS.clear()
        principal = _PRINCIPALS[key] = _principal_of_token(token)
    return principal


# Tokens are few (each is an admin's deliberate act); bounded all the same.
_PRINCIPALS_MAX: Final = 10_000
_PRINCIPALS: dict[tuple[str, str, str, tuple[str, ...], tuple[str, ...]], Principal] = {}


def _principal_of_token(token: Token) -> Principal:
    return Principal(
        token_id=token.id,
        name=token.name,
        role=Role(token.role),
        tenants=None if token.tenants == (ALL,) else frozenset(token.tenants),
        queues=None if token.queues == (ALL,) else frozenset(token.queues),
    )


def _unauthenticated(message: str) -> ApiError:
    return ApiError("unauthenticated", message, headers={"WWW-Authenticate": "Bearer"})


def _bearer(request: web.Request) -> tuple[str | None, str]:
    """The presented secret, or None and why not."""
    header = request.headers.get("Authorization")
    if header is None:
        return None, "missing"
    scheme, _, secret = header.strip().partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not looks_like_secret(secret):
        return None, "malformed"
    return secret, ""


def _authenticate(request: web.Request) -> Principal:
    """The caller of a request that needs a token (raises 401 or 429)."""
    node = node_of(request)
    secret, reason = _bearer(request)
    token: Token | None = None
    if secret is not None:
        presented = hash_secret(secret)
        del secret
        with node.reading() as state:
            found = find_by_hash(state, presented)
            if found is not None and hmac.compare_digest(found.secret_hash, presented):
                token = found
        if token is None:
            reason = "unknown"
        elif token.revoked_at_ms is not None:
            reason = "revoked"
        elif not token.valid_at(node.now_ms()):
            reason = "expired"
        else:
            node.note_token_use(token.id)
            return principal_for(token)
    limiter = request.app[LIMITER]
    address = request.remote or "unknown"
    now = time.monotonic()
    retry_after = limiter.retry_after_s(address, now)
    if retry_after is not None:
        node.metrics.http_auth_failures.labels("rate_limited").inc()
        raise ApiError(
            "rate_limited",
            "too many failed authentications from this address; retry after Retry-After",
            {"retry_after_s": retry_after},
            headers={"Retry-After": str(retry_after), "WWW-Authenticate": "Bearer"},
        )
    if reason == "unknown" and _may_catch_up(request):
        raise CatchUpFirst()
    limiter.failed(address, now)
    node.metrics.http_auth_failures.labels(reason).inc()
    messages = {
        "missing": "a bearer token is required (Authorization: Bearer <secret>)",
        "malformed": "the Authorization header is not a bearer token",
        "unknown": "the token is not valid",
        "revoked": "the token was revoked",
        "expired": "the token has expired",
    }
    raise _unauthenticated(messages[reason])


def authorize(request: web.Request) -> None:
    """Let the request through to its handler or raise its 401, 403, 404 or
    429, or `CatchUpFirst`; on the way, put its principal on it. Called for
    every request by the application's one middleware
    (`api.app.request_middleware`)."""
    resource = request.match_info.route.resource
    if resource is None:  # no such route: 404 or 405, for anyone
        return
    permission = permission_for(request.method, resource.canonical)
    if permission is Permission.PUBLIC:
        return
    if not node_of(request).auth_enabled():
        set_principal(request, ANONYMOUS)
        return
    principal = _authenticate(request)
    if permission is None or not allows(principal, permission):
        raise ApiError(
            "forbidden",
            f"a {principal.role} token may not call {request.method} {resource.canonical}",
            {"role": str(principal.role)},
        )
    set_principal(request, principal)
    if permission is Permission.READ_JOB and not worker_may_read_job(
        request, request.match_info.get("job_id", "")
    ):
        job_id = request.match_info.get("job_id", "")
        raise ApiError("not_found", f"no job {job_id}", {"job_id": job_id})


# -- what a worker may read ---------------------------------------------------------


def worker_may_read_job(request: web.Request, job_id: str) -> bool:
    """A worker reads a job only while it is leased and on its queues."""
    principal = principal_of(request)
    if principal.role is not Role.WORKER:
        return True
    with node_of(request).reading() as state:
        job = state.jobs.get(job_id)
        return job is not None and job.lease is not None and principal.may_use_queue(job.queue)
