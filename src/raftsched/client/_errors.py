"""What a call can raise.

`ApiError` and its subclasses are answers from the cluster, with the stable
`code` from api.md. `TransportError` means no usable answer arrived at all;
`OutcomeUnknown` is the case that matters for correctness: a write may or may
not have committed, and the client did not repeat it because repeating it
would not be safe (see `Call.retry_unknown`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class RaftschedError(Exception):
    """Base of everything the client raises on purpose."""


class TransportError(RaftschedError):
    """No node answered usefully within the retry budget."""


class OutcomeUnknown(TransportError):
    """The request may have been applied; it was not retried because it is not
    safe to repeat (no idempotency key or fencing token)."""


class ApiError(RaftschedError):
    """An error answer: `{"error": {"code", "message", "details"}}`."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: Mapping[str, Any] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details: dict[str, Any] = dict(details or {})
        self.retry_after_s = retry_after_s


class InvalidRequest(ApiError):
    """400: bad JSON, wrong type, out of range, unknown field (`details["field"]`)."""


class Unauthenticated(ApiError):
    """401."""


class Forbidden(ApiError):
    """403."""


class NotFound(ApiError):
    """404."""


class Conflict(ApiError):
    """409, any code."""


class IdempotencyConflict(Conflict):
    """Same idempotency key, different request."""


class LeaseLost(Conflict):
    """The fencing token is not the job's current lease token."""


class InvalidState(Conflict):
    """The transition is not allowed from the job's current state."""


class ClusterVersionTooLow(InvalidState):
    """409 `invalid_state` with `details.reason` "cluster_version": the request
    needs a command or field that not every node understands yet ("upgrade
    every node first"); nothing was done. `command_version` is the version
    it needs, `cluster_version` the one in force, `field` the job field
    that needs it (`kind`), if that is what does."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: Mapping[str, Any] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(status, code, message, details, retry_after_s)
        found = self.details
        self.command_version = found.get("command_version")
        self.cluster_version = found.get("cluster_version")
        self.field = found.get("field")
        what = f"the field {self.field!r}" if self.field else found.get("command", "the request")
        self.args = (
            f"{code}: {message}: {what} needs cluster version {self.command_version}, "
            f"the cluster runs {self.cluster_version} (nothing was done)",
        )


class PayloadTooLarge(ApiError):
    """413: the body is over the node's limit, which `max_body_bytes` names
    (None from a node of release 0.7 or earlier, which does not say)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: Mapping[str, Any] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(status, code, message, details, retry_after_s)
        limit = self.details.get("max_body_bytes")
        valid = isinstance(limit, int) and not isinstance(limit, bool) and limit > 0
        self.max_body_bytes: int | None = limit if valid else None


class RateLimited(ApiError):
    """429 `rate_limited` or `queue_full`; `retry_after_s` says when to come back."""


class Unavailable(ApiError):
    """503 that outlasted the retry budget (`unavailable`; nothing was committed)."""


class NoLeader(Unavailable):
    """503 `no_leader` that outlasted the retry budget."""


_BY_CODE: dict[str, type[ApiError]] = {
    "invalid_request": InvalidRequest,
    "unauthenticated": Unauthenticated,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "idempotency_conflict": IdempotencyConflict,
    "lease_lost": LeaseLost,
    "invalid_state": InvalidState,
    "payload_too_large": PayloadTooLarge,
    "rate_limited": RateLimited,
    "queue_full": RateLimited,
    "no_leader": NoLeader,
    "unavailable": Unavailable,
}

_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidRequest,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    429: RateLimited,
    503: Unavailable,
}


_STATUS_BY_CODE: dict[str, int] = {
    "invalid_request": 400,
    "unauthenticated": 401,
    "forbidden": 403,
    "not_found": 404,
    "idempotency_conflict": 409,
    "lease_lost": 409,
    "invalid_state": 409,
    "payload_too_large": 413,
    "rate_limited": 429,
    "queue_full": 429,
    "no_leader": 503,
    "unavailable": 503,
}


def item_error(item: Mapping[str, Any]) -> ApiError | None:
    """The error of one batch result (`{"error": {...}}`), or None if it succeeded.
    Batch items carry no HTTP status, so it is inferred from the code."""
    error = item.get("error")
    if not isinstance(error, dict):
        return None
    status = _STATUS_BY_CODE.get(str(error.get("code")), 400)
    return error_from_body(status, {"error": error})


def error_from_body(status: int, body: object, retry_after_s: float | None = None) -> ApiError:
    """Build the matching ApiError from an error body (or from anything else a
    proxy may have put there). Also used for the per-item errors of batch answers."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        text = body if isinstance(body, str) else ""
        return _BY_STATUS.get(status, ApiError)(
            status, f"http_{status}", text[:200] or "unexpected answer", None, retry_after_s
        )
    code = str(error.get("code", f"http_{status}"))
    message = str(error.get("message", ""))
    details = error.get("details")
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status, ApiError)
    if (
        cls is InvalidState
        and isinstance(details, dict)
        and details.get("reason") == ("cluster_version")
    ):
        cls = ClusterVersionTooLow
    return cls(status, code, message, details if isinstance(details, dict) else None, retry_after_s)
