"""Field validation: the core never trusts the proposer.

Each check returns None when the value is acceptable and a `Rejected` with
`details={"field": name}` otherwise. Types are checked exactly (`type(x) is
int`), because a bool is an int to isinstance and would slip through.
"""

from __future__ import annotations

import re
from typing import Final

from raftsched.core.kernel.commands import Backoff, JobSpec
from raftsched.core.kernel.results import INVALID_REQUEST, Rejected

NAME_CHARS_MAX: Final = 200
KEY_CHARS_MAX: Final = 256
TEXT_CHARS_MAX: Final = 10_000
PAYLOAD_BYTES_MAX: Final = 1024 * 1024
LABELS_MAX: Final = 64
LABEL_VALUE_CHARS_MAX: Final = 1_000
PRIORITY_MIN: Final = -100
PRIORITY_MAX: Final = 100
MAX_ATTEMPTS_MAX: Final = 1_000
LEASE_MS_MIN: Final = 100  # api.md allows 1 s; tests need shorter leases
LEASE_MS_MAX: Final = 86_400_000
BATCH_MAX: Final = 1_000
CLAIM_JOBS_MAX: Final = 1_000
CLAIM_QUEUES_MAX: Final = 100
TICK_ITEMS_MAX: Final = 1_000_000
TIME_MS_MAX: Final = 2**53  # instants and durations; far beyond any real date
TOKEN_MAX: Final = 2**63 - 1
U32_MAX: Final = 2**32 - 1
U64_MAX: Final = 2**64 - 1
FAILURE_KINDS: Final = frozenset({"transient", "permanent", "unknown", "cancelled"})
KIND_CHARS_MAX: Final = 128
KIND_PATTERN: Final = re.compile(rf"[A-Za-z0-9_.:-]{{1,{KIND_CHARS_MAX}}}")
"""A job kind: 1 to 128 ASCII letters, digits and `_ . : -` (api.md)."""
CLAIM_KINDS_MAX: Final = 100
OTHER_KINDS: Final = "*"
"""In a claim's kinds: every job of the queues that no other entry names
(jobs without a kind too, unless None is named). Never a kind itself."""


def invalid(field: str, message: str) -> Rejected:
    return Rejected(INVALID_REQUEST, message, {"field": field})


def check_name(value: object, field: str, chars_max: int = NAME_CHARS_MAX) -> Rejected | None:
    if type(value) is not str or not value or len(value) > chars_max:
        return invalid(field, f"{field} must be a non-empty string of at most {chars_max} chars")
    return None


def check_optional_name(
    value: object, field: str, chars_max: int = KEY_CHARS_MAX
) -> Rejected | None:
    return None if value is None else check_name(value, field, chars_max)


def check_text(value: object, field: str, chars_max: int = TEXT_CHARS_MAX) -> Rejected | None:
    if type(value) is not str or len(value) > chars_max:
        return invalid(field, f"{field} must be a string of at most {chars_max} chars")
    return None


def check_int(value: object, field: str, low: int, high: int) -> Rejected | None:
    if type(value) is not int or not low <= value <= high:
        return invalid(field, f"{field} must be an integer from {low} to {high}")
    return None


def check_optional_int(value: object, field: str, low: int, high: int) -> Rejected | None:
    return None if value is None else check_int(value, field, low, high)


def check_bytes(value: object, field: str, bytes_max: int = PAYLOAD_BYTES_MAX) -> Rejected | None:
    if type(value) is not bytes or len(value) > bytes_max:
        return invalid(field, f"{field} must be at most {bytes_max} bytes")
    return None


def check_token(value: object) -> Rejected | None:
    return check_int(value, "fencing_token", 0, TOKEN_MAX)


def check_backoff(backoff: object) -> Rejected | None:
    if type(backoff) is not Backoff:
        return invalid("backoff", "backoff must be a Backoff")
    return (
        check_int(backoff.initial_ms, "backoff.initial_ms", 0, TIME_MS_MAX)
        or check_int(backoff.max_ms, "backoff.max_ms", backoff.initial_ms, TIME_MS_MAX)
        or check_int(backoff.jitter_ms, "backoff.jitter_ms", 0, TIME_MS_MAX)
    )


def check_labels(labels: object) -> Rejected | None:
    if type(labels) is not tuple or len(labels) > LABELS_MAX:
        return invalid("labels", f"labels must be at most {LABELS_MAX} pairs")
    keys = set()
    for pair in labels:
        if (
            type(pair) is not tuple
            or len(pair) != 2
            or check_name(pair[0], "labels")
            or check_text(pair[1], "labels", LABEL_VALUE_CHARS_MAX)
        ):
            return invalid("labels", "each label is a (key, value) pair of strings")
        keys.add(pair[0])
    if len(keys) != len(labels):
        return invalid("labels", "label keys must be unique")
    return None


def check_spec(spec: object) -> Rejected | None:
    """Everything a JobSpec must satisfy before a job is created from it."""
    if type(spec) is not JobSpec:
        return invalid("specs", "each spec must be a JobSpec")
    if spec.run_at_ms is not None and spec.delay_ms is not None:
        return invalid("run_at", "run_at and delay exclude each other")
    return (
        check_name(spec.queue, "queue")
        or check_name(spec.tenant, "tenant")
        or check_bytes(spec.payload, "payload")
        or check_int(spec.priority, "priority", PRIORITY_MIN, PRIORITY_MAX)
        or check_optional_int(spec.run_at_ms, "run_at", 0, TIME_MS_MAX)
        or check_optional_int(spec.delay_ms, "delay", 0, TIME_MS_MAX)
        or check_int(spec.max_attempts, "max_attempts", 1, MAX_ATTEMPTS_MAX)
        or check_backoff(spec.backoff)
        or check_int(spec.lease_ms, "lease", LEASE_MS_MIN, LEASE_MS_MAX)
        or check_optional_int(spec.deadline_ms, "deadline", 1, TIME_MS_MAX)
        or check_optional_name(spec.idempotency_key, "idempotency_key")
        or check_optional_name(spec.ordering_key, "ordering_key")
        or check_optional_name(spec.correlation_id, "correlation_id")
        or check_labels(spec.labels)
        or check_on_unknown(spec.on_unknown, optional=True)
        or check_optional_name(spec.reconcile_queue, "reconcile_queue")
        or (None if spec.kind is None else check_kind(spec.kind))
        or check_trace_context(spec.traceparent, spec.tracestate)
    )


def check_kind(value: object, field: str = "kind") -> Rejected | None:
    if type(value) is str and KIND_PATTERN.fullmatch(value) is not None:
        return None
    return invalid(field, f"{field} must be 1 to {KIND_CHARS_MAX} of A-Z a-z 0-9 _ . : -")


TRACEPARENT_CHARS: Final = 55
TRACESTATE_CHARS_MAX: Final = 256
"""A stored trace context's bounds: a version-00 W3C `traceparent` is
exactly 55 characters; a `tracestate` is kept to 256 (W3C allows 512)."""
TRACEPARENT_PATTERN: Final = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
"""The one form a job stores (`api` normalizes what a request carries to it)."""
_TRACESTATE_CHARS: Final = re.compile(r"[\x20-\x7e]+")


def check_trace_context(traceparent: object, tracestate: object) -> Rejected | None:
    """A job's trace context (cluster version 8): none, or a version-00
    `traceparent` whose trace and parent ids are not all zeros, with an
    optional `tracestate` of 1 to 256 printable ASCII characters. The API
    checks a `tracestate` against the W3C grammar; the core only bounds it."""
    if traceparent is None:
        if tracestate is None:
            return None
        return invalid("tracestate", "a tracestate needs a traceparent")
    match = TRACEPARENT_PATTERN.fullmatch(traceparent) if type(traceparent) is str else None
    if match is None or not match[1].strip("0") or not match[2].strip("0"):
        return invalid("traceparent", "traceparent must be a W3C version-00 traceparent")
    if tracestate is not None and (
        type(tracestate) is not str
        or len(tracestate) > TRACESTATE_CHARS_MAX
        or _TRACESTATE_CHARS.fullmatch(tracestate) is None
    ):
        return invalid(
            "tracestate", f"tracestate must be 1 to {TRACESTATE_CHARS_MAX} printable ASCII chars"
        )
    return None


ON_UNKNOWN_POLICIES: Final = ("retry", "reconcile")


def check_on_unknown(value: object, optional: bool = False) -> Rejected | None:
    if (value is None and optional) or (type(value) is str and value in ON_UNKNOWN_POLICIES):
        return None
    return invalid("on_unknown", "on_unknown is retry or reconcile")
