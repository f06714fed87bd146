"""Calendar math for schedules: cron expressions and intervals, in IANA time zones.

Everything here is a pure function of (expression, zone name, instant in Unix
milliseconds) -> instant in Unix milliseconds. That is why this one file of the
core may import `datetime` and `zoneinfo` (see the ruff exemption in
pyproject.toml) and still keeps the core deterministic:

- Zones are loaded from the pinned `tzdata` *package* (never the host's
  /usr/share/zoneinfo, which differs between machines), so every replica reads
  the same transition table. Unknown names are rejected.
- croniter (pinned) is used only on *naive* wall-clock datetimes, where it is
  plain calendar arithmetic; it never sees a time zone. The mapping between
  wall-clock times and instants, including DST, is done here, by rules written
  out below, not by croniter's own DST handling.
- No clock is read: "now" is always an argument.

DST rules (design.md, Recurring schedules):

- A wall-clock time that does not exist (spring-forward gap) fires once, at the
  first valid instant after the gap (the transition itself). Several matches
  inside one gap collapse into that one instant.
- A wall-clock time that exists twice (fall-back fold) fires once, at the first
  instant, for a fixed-hour expression; an expression whose hour field is `*`
  or a step (`*/2`, `1-23/3`) fires at both instants.
- Intervals are elapsed time and ignore the zone altogether.

Cron syntax: 5 fields (minute hour day month weekday) or 6 fields with the
seconds field FIRST (as in Quartz and Spring). croniter's random (`R`) and
hashed (`H`) forms and `@` nicknames are refused: they are not plain calendars.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from importlib import resources
from typing import Final
from zoneinfo import ZoneInfo

from croniter import croniter

SECOND_MS: Final = 1000
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MONTHS: Final = (
    "jan",
    "feb",
    "mar",
    "apr",
    "may",
    "jun",
    "jul",
    "aug",
    "sep",
    "oct",
    "nov",
    "dec",
)
_DAYS: Final = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_NAMES: Final = frozenset((*_MONTHS, *_DAYS, "l", "w", "lw"))
_FIELD_CHARS: Final = re.compile(r"^[0-9A-Za-z*,/\-?#]+$")
_LETTERS: Final = re.compile(r"[A-Za-z]+")
_ZONE_NAME: Final = re.compile(r"^[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*$")
# How far the scan for the next match may look ahead: cron expressions such as
# "0 0 30 2 *" never match, and must not loop forever.
_SCAN_STEPS_MAX: Final = 5_000
_YEARS_AHEAD_MAX: Final = 10


class CalendarError(ValueError):
    """An expression or zone name that is not acceptable."""


@lru_cache(maxsize=512)
def zone(name: str) -> ZoneInfo:
    """The zone `name` from the pinned tzdata package. Raises CalendarError."""
    if not _ZONE_NAME.match(name) or ".." in name or len(name) > 100:
        raise CalendarError(f"unknown time zone {name!r}")
    try:
        source = resources.files("tzdata.zoneinfo").joinpath(*name.split("/"))
        with source.open("rb") as data:
            return ZoneInfo.from_file(data, key=name)
    except (OSError, ValueError) as error:
        raise CalendarError(f"unknown time zone {name!r}") from error


def cron_fields(expression: str) -> list[str]:
    """The fields of a valid expression, seconds first (added as "0" if absent)."""
    fields = expression.split()
    if len(fields) not in (5, 6):
        raise CalendarError("a cron expression has 5 fields, or 6 with seconds first")
    for field in fields:
        if not _FIELD_CHARS.match(field):
            raise CalendarError(f"invalid cron field {field!r}")
        for word in _LETTERS.findall(field):
            if word.lower() not in _NAMES:
                raise CalendarError(f"invalid cron field {field!r}")
    if len(fields) == 5:
        fields = ["0", *fields]
    if not croniter.is_valid(" ".join(fields), second_at_beginning=True):
        raise CalendarError(f"invalid cron expression {expression!r}")
    return fields


def check_cron(expression: str) -> None:
    _cron(expression)


@lru_cache(maxsize=4096)
def _cron(expression: str) -> tuple[str, bool]:
    """(croniter expression, hour field is a wildcard or a step)."""
    fields = cron_fields(expression)
    hour = fields[2]
    wildcard_hour = hour == "*" or "/" in hour
    return " ".join(fields), wildcard_hour


def _wall(instant_s: int, tz: ZoneInfo) -> datetime:
    """The wall-clock time of an instant, aware, with `fold` set on a repeat."""
    return (_EPOCH + timedelta(seconds=instant_s)).astimezone(tz)


def _instant_s(naive: datetime, tz: ZoneInfo, fold: int) -> int:
    aware = naive.replace(tzinfo=tz, fold=fold)
    delta = aware - _EPOCH  # aware subtraction uses the fold-specific offset
    return delta.days * 86_400 + delta.seconds


def _gap_end_s(tz: ZoneInfo, low_s: int, high_s: int) -> int:
    """The transition instant in (low_s, high_s]: the first valid instant after a gap."""
    offset = _wall(low_s, tz).utcoffset()
    while high_s - low_s > 1:
        middle = (low_s + high_s) // 2
        if _wall(middle, tz).utcoffset() == offset:
            low_s = middle
        else:
            high_s = middle
    return high_s


def _instants(naive: datetime, tz: ZoneInfo, wildcard_hour: bool) -> tuple[int, ...]:
    """The instants (seconds) at which a matching wall-clock time fires."""
    first = _instant_s(naive, tz, 0)
    second = _instant_s(naive, tz, 1)
    if first == second:
        return (first,)
    if first > second:  # a gap: fold=0 reads it with the offset before
        return (_gap_end_s(tz, second, first),)
    return (first, second) if wildcard_hour else (first,)


def _fold_length_s(naive: datetime, tz: ZoneInfo) -> int:
    return _instant_s(naive, tz, 1) - _instant_s(naive, tz, 0)


def _naive_matches(expression: str, start: datetime) -> croniter:
    return croniter(expression, start, ret_type=datetime, second_at_beginning=True)


def cron_next_ms(expression: str, zone_name: str, after_ms: int) -> int | None:
    """The first instant strictly after `after_ms` at which the expression fires
    in the zone, or None if it never does within the next ten years.

    Cron instants are whole seconds. Results are memoised: in a hot minute,
    thousands of schedules share one expression and one previous occurrence.
    """
    found = _cron_next_cached(expression, zone_name, after_ms // SECOND_MS)
    return None if found is None else found * SECOND_MS


def interval_next_ms(anchor_ms: int, interval_ms: int, after_ms: int) -> int:
    """The first of anchor + k * interval (k >= 0) strictly after `after_ms`."""
    if after_ms < anchor_ms:
        return anchor_ms
    return anchor_ms + ((after_ms - anchor_ms) // interval_ms + 1) * interval_ms


@lru_cache(maxsize=65_536)
def _cron_next_cached(expression: str, zone_name: str, after_s: int) -> int | None:
    tz = zone(zone_name)
    cron_expression, wildcard_hour = _cron(expression)
    wall = _wall(after_s, tz)
    naive = wall.replace(tzinfo=None)
    best = _scan(cron_expression, tz, wildcard_hour, naive, after_s)
    if wildcard_hour:
        fold_s = _fold_length_s(naive, tz)
        if fold_s > 0 and wall.fold == 0:
            # `after` is in the first pass of a fold: wall times already passed
            # in this pass come again in the second pass, at later instants.
            start = naive - timedelta(seconds=fold_s + 1)
            again = _scan(cron_expression, tz, wildcard_hour, start, after_s)
            if again is not None and (best is None or again < best):
                best = again
    return best


def _scan(
    expression: str, tz: ZoneInfo, wildcard_hour: bool, start: datetime, after_s: int
) -> int | None:
    matches = _naive_matches(expression, start)
    limit = start + timedelta(days=366 * _YEARS_AHEAD_MAX)
    for _ in range(_SCAN_STEPS_MAX):
        try:
            match: datetime = matches.get_next(datetime)
        except (StopIteration, ValueError, OverflowError):
            return None
        if match > limit:
            return None
        later = [instant for instant in _instants(match, tz, wildcard_hour) if instant > after_s]
        if later:
            return min(later)
    return None
