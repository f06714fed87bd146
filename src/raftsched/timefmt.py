"""RFC 3339 times as the API writes them, and integer milliseconds as we keep them.

Responses carry UTC with milliseconds and `Z` ("2026-12-01T09:00:00.000Z");
requests may use any offset. Everything inside the client and the worker works
in integer Unix milliseconds, so conversions happen only here.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from functools import lru_cache

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def now_ms() -> int:
    """The wall clock in Unix milliseconds (for display and `run_at`, never for leases)."""
    return time.time_ns() // 1_000_000


@lru_cache(maxsize=4096)
def format_ms(ms: int) -> str:
    """Unix milliseconds -> "YYYY-MM-DDTHH:MM:SS.mmmZ".

    Cached: the jobs of one Raft entry share their instants, so a claim of
    a thousand leases or a page of jobs formats a handful of distinct ones."""
    moment = _EPOCH + timedelta(milliseconds=ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def format_datetime(moment: datetime) -> str:
    """An aware datetime -> the API's UTC form; naive datetimes are refused."""
    return format_ms(datetime_to_ms(moment))


def datetime_to_ms(moment: datetime) -> int:
    if moment.tzinfo is None:
        raise ValueError("a naive datetime has no offset; attach a time zone")
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def parse_ms(text: str) -> int:
    """RFC 3339 with any offset (or `Z`) -> Unix milliseconds.

    Raises ValueError for anything without an explicit offset: a local time
    would mean different instants on different machines.
    """
    cleaned = text.strip()
    if cleaned[-1:] in ("z", "Z"):
        cleaned = cleaned[:-1] + "+00:00"
    moment = datetime.fromisoformat(cleaned.replace("t", "T", 1))
    if moment.tzinfo is None:
        raise ValueError(f"time {text!r} has no offset (add Z or +HH:MM)")
    return datetime_to_ms(moment)


def normalize(text: str) -> str:
    """Any RFC 3339 time -> the API's canonical UTC form."""
    return format_ms(parse_ms(text))
