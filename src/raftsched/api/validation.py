"""Request validation: JSON bodies in, core commands out, or a 400 naming the field.

Everything is checked before anything is proposed, so a bad request never
reaches the log. Unknown fields are rejected so that typos do not pass
silently. JSON payloads become canonical msgpack (keys sorted), which the
core stores opaquely; equal requests therefore encode equally, whatever
order the client wrote the keys in.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any, cast

import msgpack

from raftsched.api.errors import invalid
from raftsched.core.kernel import validate as core_limits
from raftsched.core.kernel.commands import Backoff, FailureKind, JobSpec
from raftsched.limits import (
    BACKOFF_STEP_S_MAX,
    DURATION_S_MAX,
    JSON_DEPTH_MAX,
    MESSAGE_LENGTH_MAX,
    REASON_LENGTH_MAX,
    RETRY_DELAY_S_MAX,
)
from raftsched.timefmt import parse_ms

# The core's limits are the source of truth: checking them here as well means
# a request the API accepts is never rejected by the core after a Raft round trip.
# The shell's own limits are in raftsched/limits.py.
NAME_LENGTH_MAX = core_limits.NAME_CHARS_MAX
KEY_LENGTH_MAX = core_limits.KEY_CHARS_MAX
LABELS_MAX = core_limits.LABELS_MAX
LABEL_VALUE_LENGTH_MAX = core_limits.LABEL_VALUE_CHARS_MAX
BATCH_JOBS_MAX = core_limits.BATCH_MAX
CLAIM_JOBS_MAX = core_limits.CLAIM_JOBS_MAX
CLAIM_QUEUES_MAX = core_limits.CLAIM_QUEUES_MAX
CLAIM_KINDS_MAX = core_limits.CLAIM_KINDS_MAX
KIND_LENGTH_MAX = core_limits.KIND_CHARS_MAX
LEASE_S_MIN = core_limits.LEASE_MS_MIN / 1000
LEASE_S_MAX = core_limits.LEASE_MS_MAX / 1000

ON_UNKNOWN_POLICIES = ("retry", "reconcile")

JOB_FIELDS = frozenset(
    {
        "queue",
        "payload",
        "idempotency_key",
        "run_at",
        "delay_s",
        "priority",
        "max_attempts",
        "backoff",
        "lease_s",
        "deadline_s",
        "tenant",
        "ordering_key",
        "correlation_id",
        "labels",
        "on_unknown",
        "reconcile_queue",
        "kind",
    }
)


def require_object(body: object, where: str = "body") -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise invalid(where, "must be a JSON object")
    return body


def reject_unknown(body: Mapping[str, Any], allowed: frozenset[str], prefix: str = "") -> None:
    for name in body:
        if name not in allowed:
            raise invalid(prefix + name, "unknown field")


def string(
    body: Mapping[str, Any],
    name: str,
    *,
    required: bool = False,
    length_max: int = NAME_LENGTH_MAX,
    prefix: str = "",
) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise invalid(prefix + name, "is required")
        return None
    if not isinstance(value, str):
        raise invalid(prefix + name, "must be a string")
    if not value or len(value) > length_max:
        raise invalid(prefix + name, f"must be 1 to {length_max} characters")
    return value


def choice(
    body: Mapping[str, Any],
    name: str,
    allowed: Collection[str],
    *,
    default: str | None = None,
    prefix: str = "",
) -> str | None:
    """An enum-like field: one of the strings in `allowed` (null or absent: `default`).

    The type is checked before the lookup: an object or a list is unhashable,
    so `value in allowed` would raise instead of answering 400.
    """
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, str) or value not in allowed:
        raise invalid(prefix + name, f"must be one of {', '.join(sorted(allowed))}")
    return value


def is_kind(value: object) -> bool:
    """A job kind: 1 to 128 of A-Z a-z 0-9 _ . : - (core.kernel.validate)."""
    return isinstance(value, str) and core_limits.KIND_PATTERN.fullmatch(value) is not None


KIND_RULE = f"must be 1 to {KIND_LENGTH_MAX} characters of A-Z a-z 0-9 _ . : -"


def kind(body: Mapping[str, Any], name: str = "kind", *, prefix: str = "") -> str | None:
    """An optional job kind (null or absent: None)."""
    value = body.get(name)
    if value is None:
        return None
    if not is_kind(value):
        raise invalid(prefix + name, KIND_RULE)
    return cast(str, value)


def boolean(body: Mapping[str, Any], name: str, default: bool, *, prefix: str = "") -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(prefix + name, "must be true or false")
    return value


def integer(
    body: Mapping[str, Any], name: str, low: int, high: int, *, prefix: str = ""
) -> int | None:
    """An integer field within [low, high] (a bool or a float is not one)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(prefix + name, "must be an integer")
    if not low <= value <= high:
        raise invalid(prefix + name, f"must be between {low} and {high}")
    return value


def number(
    body: Mapping[str, Any],
    name: str,
    low: float,
    high: float,
    *,
    prefix: str = "",
    unit: str = "",
) -> float | None:
    """A number field (int or float, not bool) within [low, high].

    Every number has a finite range, checked before any arithmetic, so that
    scaling it (seconds to milliseconds, rates to milli-rates) cannot overflow.
    """
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise invalid(prefix + name, f"must be a number of {unit}" if unit else "must be a number")
    if not low <= value <= high:
        in_unit = f" {unit}" if unit else ""
        raise invalid(prefix + name, f"must be between {_plain(low)} and {_plain(high)}{in_unit}")
    return value


def _plain(bound: float) -> str:
    """A bound as people write it: 2592000, not 2.592e+06."""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def query_integer(
    query: Mapping[str, str], name: str, low: int, high: int, default: int | None = None
) -> int | None:
    """A query parameter of ASCII digits within [low, high].

    `str.isdigit` alone is not enough: it accepts digits such as "²" that
    `int` refuses, and a string of thousands of digits that `int` will not
    convert; both would otherwise escape as a 500.
    """
    raw = query.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > len(str(high)):
        raise invalid(name, f"must be an integer from {low} to {high}")
    value = int(raw)
    if not low <= value <= high:
        raise invalid(name, f"must be an integer from {low} to {high}")
    return value


def query_number(query: Mapping[str, str], name: str, low: float, high: float) -> float | None:
    """A query parameter that `float` reads, within [low, high]."""
    raw = query.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise invalid(name, "must be a number") from None
    if not low <= value <= high:
        raise invalid(name, f"must be between {low:g} and {high:g}")
    return value


def seconds_ms(
    body: Mapping[str, Any], name: str, low_s: float, high_s: float, *, prefix: str = ""
) -> int | None:
    """A duration in seconds (int or float) as integer milliseconds."""
    value = number(body, name, low_s, high_s, prefix=prefix, unit="seconds")
    return None if value is None else round(value * 1000)


def instant_ms(body: Mapping[str, Any], name: str, *, prefix: str = "") -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(prefix + name, "must be an RFC 3339 time string")
    try:
        instant = parse_ms(value)
    except ValueError:
        raise invalid(prefix + name, "must be an RFC 3339 time with an offset") from None
    if instant < 0:
        raise invalid(prefix + name, "must not be before 1970")
    return instant


def _canonical(value: Any, where: str, depth: int = 0) -> Any:
    if depth > JSON_DEPTH_MAX:
        raise invalid(where, "is nested too deeply")
    if isinstance(value, dict):
        return {k: _canonical(value[k], where, depth + 1) for k in sorted(value)}
    if isinstance(value, list):
        return [_canonical(item, where, depth + 1) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        raise invalid(where, "integers must fit in 64 bits")
    return value


def pack_json(value: Any, where: str) -> bytes:
    """Canonical msgpack of a JSON value (object keys sorted)."""
    return bytes(msgpack.packb(_canonical(value, where), use_bin_type=True))


def unpack_json(data: bytes | None) -> Any:
    if data is None:
        return None
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def parse_backoff(value: object, prefix: str) -> Backoff:
    body = require_object(value, prefix.rstrip("."))
    reject_unknown(body, frozenset({"initial_s", "max_s", "jitter_s"}), prefix)
    default = Backoff()
    initial = seconds_ms(body, "initial_s", 0, BACKOFF_STEP_S_MAX, prefix=prefix)
    maximum = seconds_ms(body, "max_s", 0, RETRY_DELAY_S_MAX, prefix=prefix)
    jitter = seconds_ms(body, "jitter_s", 0, BACKOFF_STEP_S_MAX, prefix=prefix)
    backoff = Backoff(
        initial_ms=default.initial_ms if initial is None else initial,
        max_ms=default.max_ms if maximum is None else maximum,
        jitter_ms=default.jitter_ms if jitter is None else jitter,
    )
    if backoff.max_ms < backoff.initial_ms:
        raise invalid(prefix + "max_s", "must not be less than initial_s")
    return backoff


def parse_job(value: object, prefix: str = "") -> JobSpec:
    body = require_object(value, prefix.rstrip(".") or "body")
    reject_unknown(body, JOB_FIELDS, prefix)
    queue = string(body, "queue", required=True, prefix=prefix)
    assert queue is not None
    if body.get("run_at") is not None and body.get("delay_s") is not None:
        raise invalid(prefix + "delay_s", "run_at and delay_s exclude each other")
    labels = body.get("labels")
    label_pairs: tuple[tuple[str, str], ...] = ()
    if labels is not None:
        labels_obj = require_object(labels, prefix + "labels")
        if len(labels_obj) > LABELS_MAX:
            raise invalid(prefix + "labels", f"at most {LABELS_MAX} labels")
        for key, item in labels_obj.items():
            if not key or len(key) > NAME_LENGTH_MAX:
                raise invalid(prefix + "labels", f"keys must be 1 to {NAME_LENGTH_MAX} characters")
            if not isinstance(item, str) or len(item) > LABEL_VALUE_LENGTH_MAX:
                raise invalid(
                    prefix + "labels", f"values must be strings of at most {LABEL_VALUE_LENGTH_MAX}"
                )
        label_pairs = tuple(sorted(labels_obj.items()))
    spec_fields: dict[str, Any] = {
        "queue": queue,
        "payload": pack_json(body.get("payload"), prefix + "payload"),
        "labels": label_pairs,
    }
    optional: dict[str, Any] = {
        "tenant": string(body, "tenant", prefix=prefix),
        "priority": integer(
            body, "priority", core_limits.PRIORITY_MIN, core_limits.PRIORITY_MAX, prefix=prefix
        ),
        "run_at_ms": instant_ms(body, "run_at", prefix=prefix),
        "delay_ms": seconds_ms(body, "delay_s", 0, DURATION_S_MAX, prefix=prefix),
        "max_attempts": integer(
            body, "max_attempts", 1, core_limits.MAX_ATTEMPTS_MAX, prefix=prefix
        ),
        "lease_ms": seconds_ms(body, "lease_s", LEASE_S_MIN, LEASE_S_MAX, prefix=prefix),
        "deadline_ms": seconds_ms(body, "deadline_s", 0.001, DURATION_S_MAX, prefix=prefix),
        "idempotency_key": string(
            body, "idempotency_key", length_max=KEY_LENGTH_MAX, prefix=prefix
        ),
        "ordering_key": string(body, "ordering_key", length_max=KEY_LENGTH_MAX, prefix=prefix),
        "correlation_id": string(body, "correlation_id", length_max=KEY_LENGTH_MAX, prefix=prefix),
        # Since cluster version 5 (core.jobs.reconcile); absent keeps the
        # spec's encoding, so older clusters still accept it.
        "on_unknown": choice(body, "on_unknown", ON_UNKNOWN_POLICIES, prefix=prefix),
        "reconcile_queue": string(body, "reconcile_queue", prefix=prefix),
        # Since cluster version 8 (job kinds), likewise sent only when set.
        "kind": kind(body, prefix=prefix),
    }
    if body.get("backoff") is not None:
        optional["backoff"] = parse_backoff(body["backoff"], prefix + "backoff.")
    spec_fields.update({k: v for k, v in optional.items() if v is not None})
    return JobSpec(**spec_fields)


def fencing_token(body: Mapping[str, Any], prefix: str = "") -> int:
    token = integer(body, "fencing_token", 0, 2**63 - 1, prefix=prefix)
    if token is None:
        raise invalid(prefix + "fencing_token", "is required")
    return token


def failure(body: Mapping[str, Any], prefix: str = "") -> tuple[FailureKind, str, int | None]:
    error = require_object(body.get("error"), prefix + "error")
    reject_unknown(error, frozenset({"kind", "message", "retry_after_s"}), prefix + "error.")
    kind = choice(error, "kind", core_limits.FAILURE_KINDS, prefix=prefix + "error.")
    if kind is None:
        raise invalid(prefix + "error.kind", "is required")
    message = error.get("message")
    if message is None:
        message = ""
    if not isinstance(message, str):
        raise invalid(prefix + "error.message", "must be a string")
    retry_after = seconds_ms(error, "retry_after_s", 0, RETRY_DELAY_S_MAX, prefix=prefix + "error.")
    return cast(FailureKind, kind), message[:MESSAGE_LENGTH_MAX], retry_after


RECONCILE_DECISIONS = ("happened", "did_not_happen", "cannot_tell")
RECONCILE_EFFECTS_MAX = 100


def reconcile_decision(
    body: Mapping[str, Any], prefix: str = ""
) -> tuple[str, bytes, tuple[tuple[str, bytes], ...], str]:
    """A reconcile handler's answer: (decision, result, effects, reason)."""
    decision = choice(body, "decision", RECONCILE_DECISIONS, prefix=prefix)
    if decision is None:
        raise invalid(prefix + "decision", "is required")
    raw = body.get("effects")
    effects: list[tuple[str, bytes]] = []
    if raw is not None:
        if not isinstance(raw, list) or len(raw) > RECONCILE_EFFECTS_MAX:
            raise invalid(prefix + "effects", f"must be a list of at most {RECONCILE_EFFECTS_MAX}")
        for index, item in enumerate(raw):
            where = f"{prefix}effects[{index}]"
            effect = require_object(item, where)
            reject_unknown(effect, frozenset({"key", "result"}), where + ".")
            key = string(
                effect, "key", required=True, length_max=KEY_LENGTH_MAX, prefix=where + "."
            )
            assert key is not None
            effects.append((key, pack_json(effect.get("result"), where + ".result")))
    text = body.get("reason")
    if text is None:
        text = ""
    if not isinstance(text, str) or len(text) > REASON_LENGTH_MAX:
        raise invalid(
            prefix + "reason", f"must be a string of at most {REASON_LENGTH_MAX} characters"
        )
    return decision, pack_json(body.get("result"), prefix + "result"), tuple(effects), text


def reason(body: Mapping[str, Any]) -> str:
    """An optional free-text reason (may be empty)."""
    value = body.get("reason", "")
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > REASON_LENGTH_MAX:
        raise invalid("reason", f"must be a string of at most {REASON_LENGTH_MAX} characters")
    return value


def path_id(value: str, name: str = "job_id") -> str:
    if not value or len(value) > NAME_LENGTH_MAX:
        raise invalid(name, f"must be 1 to {NAME_LENGTH_MAX} characters")
    return value
