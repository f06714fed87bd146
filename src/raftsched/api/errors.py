"""HTTP errors with the stable body `{"error": {"code", "message", "details"}}`.

Handlers raise `ApiError`; one middleware renders it. Core rejections map to
statuses through `STATUS_BY_CODE`, so a code always means the same status.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from raftsched.api.jsonbody import json_response
from raftsched.core.kernel.results import Rejected
from raftsched.node.lease_ops import ProposalError
from raftsched.node.proposer import NotCommitted, NotLeader, QueueFull
from raftsched.node.versions import UpgradeRequired

STATUS_BY_CODE: dict[str, int] = {
    "invalid_request": 400,
    "unauthenticated": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "idempotency_conflict": 409,
    "lease_lost": 409,
    "invalid_state": 409,
    "payload_too_large": 413,
    # A node of several shards (docs/shards.md): a request whose keys cannot
    # all be kept in one shard, or place it elsewhere than its header says.
    "ordering_key_shard": 422,
    "batch_spans_shards": 422,
    "wrong_shard": 422,
    # A broker sink whose client library this node lacks (docs/relays.md).
    "sink_unavailable": 422,
    "rate_limited": 429,
    "queue_full": 429,
    "internal_error": 500,
    "no_leader": 503,
    "unavailable": 503,
    # A deposed leader proposed it; the client should retry (it will reach
    # the new leader). Nothing was applied.
    "stale_epoch": 503,
    # The command was handed to Raft but its fate is unknown (leader lost
    # mid-commit, or no answer before the deadline). It may yet commit: retry
    # with the same idempotency key or fencing token, which is safe.
    "outcome_unknown": 504,
}


class ApiError(Exception):
    def __init__(
        self,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return STATUS_BY_CODE.get(self.code, 500)

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}

    def response(self) -> web.Response:
        return json_response(self.body(), status=self.status, headers=self.headers)


def invalid(field: str, message: str) -> ApiError:
    return ApiError("invalid_request", f"{field}: {message}", {"field": field})


# The core names fields as its commands do (milliseconds); requests name them
# in seconds. Translating keeps `details.field` pointing at what the client sent.
_FIELD_NAMES = {
    "delay": "delay_s",
    "lease": "lease_s",
    "deadline": "deadline_s",
    "backoff.initial_ms": "backoff.initial_s",
    "backoff.max_ms": "backoff.max_s",
    "backoff.jitter_ms": "backoff.jitter_s",
    "extend": "extend_s",
    "extend_ms": "extend_s",
    "retry_after": "error.retry_after_s",
    "retry_after_ms": "error.retry_after_s",
}


def from_rejection(rejection: Rejected) -> ApiError:
    retry = rejection.code in ("stale_epoch", "queue_full")
    headers = {"Retry-After": str(rejection.details.get("retry_after_s", 1))} if retry else None
    details = dict(rejection.details)
    field = details.get("field")
    if isinstance(field, str):
        details["field"] = _FIELD_NAMES.get(field, field)
    return ApiError(rejection.code, rejection.message, details, headers=headers)


def from_proposal_error(error: ProposalError) -> ApiError:
    """The answer for a proposal that raised. A whole request that meets
    `NotLeader` is redirected instead (api.app); this is its answer where no
    redirect is possible: inside a batch answer, or for a next claim made
    after the request's own operation committed."""
    if isinstance(error, NotLeader):
        return ApiError("no_leader", "leadership was lost before this was committed")
    if isinstance(error, QueueFull):
        return ApiError(
            "unavailable",
            f"{error}; nothing was committed, retry after Retry-After",
            {
                "reason": "proposal_queue_full",
                "queue_commands_max": error.commands_max,
                "queue_bytes_max": error.bytes_max,
            },
            headers={"Retry-After": "1"},
        )
    if isinstance(error, UpgradeRequired):
        details: dict[str, Any] = {
            "reason": "cluster_version",
            "command": error.command_kind,
            "command_version": error.needed,
            "cluster_version": error.in_force,
        }
        if error.field is not None:
            details["field"] = error.field  # a job spec field (`kind`) needs the version
        return ApiError("invalid_state", str(error), details)
    if isinstance(error, NotCommitted):
        return ApiError(
            "unavailable",
            "the cluster could not take the command now; nothing was committed",
            {"reason": str(error)},
            headers={"Retry-After": "1"},
        )
    return ApiError(
        "outcome_unknown",
        "the command may or may not have committed; retrying with the same "
        "idempotency key or fencing token is safe",
        {"reason": str(error) or "unknown"},
        headers={"Retry-After": "1"},
    )
