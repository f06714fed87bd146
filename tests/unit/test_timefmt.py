from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from raftsched import timefmt


def test_format_has_milliseconds_and_z() -> None:
    assert timefmt.format_ms(0) == "1970-01-01T00:00:00.000Z"
    assert timefmt.format_ms(1_796_115_600_123) == "2026-12-01T09:00:00.123Z"


@pytest.mark.parametrize(
    "text",
    [
        "2026-12-01T09:00:00.123Z",
        "2026-12-01T09:00:00.123z",
        "2026-12-01T10:00:00.123+01:00",
        "2026-12-01T04:00:00.123-05:00",
        "2026-12-01t09:00:00.123+00:00",
    ],
)
def test_parse_any_offset(text: str) -> None:
    assert timefmt.parse_ms(text) == 1_796_115_600_123
    assert timefmt.normalize(text) == "2026-12-01T09:00:00.123Z"


def test_parse_refuses_local_time() -> None:
    with pytest.raises(ValueError, match="offset"):
        timefmt.parse_ms("2026-12-01T09:00:00")


def test_datetime_round_trip() -> None:
    moment = datetime(2026, 12, 1, 4, 0, tzinfo=timezone(timedelta(hours=-5)))
    assert timefmt.format_datetime(moment) == "2026-12-01T09:00:00.000Z"
    assert timefmt.datetime_to_ms(datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)) == 1000
    with pytest.raises(ValueError):
        timefmt.datetime_to_ms(datetime(2026, 1, 1))


def test_round_trip_many() -> None:
    for ms in (1, 999, 1_000, 86_399_999, 1_796_115_600_000):
        assert timefmt.parse_ms(timefmt.format_ms(ms)) == ms
