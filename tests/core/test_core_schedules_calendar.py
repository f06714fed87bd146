"""DST and calendar rules, checked against instants written out by hand.

Transitions used (2026, from the tz database):
- America/New_York: 8 Mar 02:00 EST -> 03:00 EDT (07:00Z); 1 Nov 02:00 EDT -> 01:00 EST (06:00Z).
- Europe/London: 29 Mar 01:00 GMT -> 02:00 BST (01:00Z); 25 Oct 02:00 BST -> 01:00 GMT (01:00Z).
- Australia/Lord_Howe (30 minutes): 5 Apr 02:00 +11 -> 01:30 +10:30 (4 Apr 15:00Z);
  4 Oct 02:00 +10:30 -> 02:30 +11 (3 Oct 15:30Z).
"""

from __future__ import annotations

import pytest

from raftsched.core.schedules.calendar import (
    CalendarError,
    check_cron,
    cron_next_ms,
    interval_next_ms,
    zone,
)
from raftsched.timefmt import format_ms, parse_ms


def walk(expression: str, zone_name: str, start: str, count: int) -> list[str]:
    instant_ms = parse_ms(start)
    found = []
    for _ in range(count):
        next_ms = cron_next_ms(expression, zone_name, instant_ms)
        assert next_ms is not None
        found.append(format_ms(next_ms)[:19] + "Z")
        instant_ms = next_ms
    return found


NY, LONDON, LORD_HOWE = "America/New_York", "Europe/London", "Australia/Lord_Howe"


@pytest.mark.parametrize(
    ("expression", "zone_name", "start", "expected"),
    [
        # Spring forward, fixed hour inside the gap: once, at the end of the gap.
        ("30 2 * * *", NY, "2026-03-07T12:00:00Z",
         ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]),
        # Spring forward, wildcard hour: 02:00, 02:30 (gap) collapse into 03:00 EDT.
        ("*/30 * * * *", NY, "2026-03-08T06:00:00Z",
         ["2026-03-08T06:30:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z"]),
        # Fall back, fixed hour in the fold: once, at the first 01:30 (EDT).
        ("30 1 * * *", NY, "2026-10-31T12:00:00Z",
         ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]),
        # Fall back, wildcard hour: 01:30 EDT and 01:30 EST both fire.
        ("30 * * * *", NY, "2026-11-01T04:00:00Z",
         ["2026-11-01T04:30:00Z", "2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z",
          "2026-11-01T07:30:00Z"]),
        # Step hour counts as wildcard: */1 fires in both passes of the fold.
        ("0 */1 * * *", NY, "2026-11-01T04:30:00Z",
         ["2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z"]),
        # London spring: 01:30 does not exist -> 02:00 BST = 01:00Z.
        ("30 1 * * *", LONDON, "2026-03-28T12:00:00Z",
         ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]),
        ("0,30 * * * *", LONDON, "2026-03-29T00:00:00Z",
         ["2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:30:00Z"]),
        # London autumn: fixed 01:15 once (BST), wildcard twice.
        ("15 1 * * *", LONDON, "2026-10-24T12:00:00Z",
         ["2026-10-25T00:15:00Z", "2026-10-26T01:15:00Z"]),
        ("15 * * * *", LONDON, "2026-10-24T23:30:00Z",
         ["2026-10-25T00:15:00Z", "2026-10-25T01:15:00Z", "2026-10-25T02:15:00Z"]),
        # Lord Howe autumn (30-minute fold 01:30-02:00): fixed once, wildcard twice.
        ("45 1 * * *", LORD_HOWE, "2026-04-04T12:00:00Z",
         ["2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"]),
        ("45 * * * *", LORD_HOWE, "2026-04-04T13:00:00Z",
         ["2026-04-04T13:45:00Z", "2026-04-04T14:45:00Z", "2026-04-04T15:15:00Z",
          "2026-04-04T16:15:00Z"]),
        # Lord Howe spring (30-minute gap 02:00-02:30): 02:15 -> 02:30 +11 = 15:30Z.
        ("15 2 * * *", LORD_HOWE, "2026-10-03T12:00:00Z",
         ["2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"]),
        ("*/15 * * * *", LORD_HOWE, "2026-10-03T15:00:00Z",
         ["2026-10-03T15:15:00Z", "2026-10-03T15:30:00Z", "2026-10-03T15:45:00Z"]),
        # Seconds first (6 fields).
        ("*/20 * * * * *", "UTC", "2026-01-01T00:00:00Z",
         ["2026-01-01T00:00:20Z", "2026-01-01T00:00:40Z", "2026-01-01T00:01:00Z"]),
    ],
)  # fmt: skip
def test_expected_instants(
    expression: str, zone_name: str, start: str, expected: list[str]
) -> None:
    assert walk(expression, zone_name, start, len(expected)) == expected


def test_strictly_after_and_milliseconds() -> None:
    at_ms = parse_ms("2026-01-01T00:01:00Z")
    assert cron_next_ms("* * * * *", "UTC", at_ms) == at_ms + 60_000
    assert cron_next_ms("* * * * *", "UTC", at_ms - 1) == at_ms


def test_never_matching_expression_ends() -> None:
    assert cron_next_ms("0 0 30 2 *", "UTC", parse_ms("2026-01-01T00:00:00Z")) is None


def test_intervals_are_elapsed_time() -> None:
    anchor = parse_ms("2026-11-01T05:00:00Z")
    # 1 hour steps straight through the New York fold: no DST involvement.
    assert interval_next_ms(anchor, 3_600_000, anchor) == anchor + 3_600_000
    assert interval_next_ms(anchor, 3_600_000, anchor - 5) == anchor
    assert interval_next_ms(anchor, 1000, anchor + 2500) == anchor + 3000


@pytest.mark.parametrize(
    "expression",
    ["", "* * * *", "* * * * * * *", "61 * * * *", "R * * * *", "H * * * *", "@hourly",
     "* * * foo *", "0 25 * * *"],
)  # fmt: skip
def test_invalid_cron(expression: str) -> None:
    with pytest.raises(CalendarError):
        check_cron(expression)


def test_names_are_accepted() -> None:
    check_cron("0 9 * jan-mar mon-fri")


@pytest.mark.parametrize("name", ["Mars/Olympus", "../etc/passwd", "", "America//New_York"])
def test_unknown_zone(name: str) -> None:
    with pytest.raises(CalendarError):
        zone(name)


def test_zone_comes_from_the_tzdata_package() -> None:
    import tzdata

    assert tzdata.IANA_VERSION == "2026f"
    assert zone(NY).key == NY
