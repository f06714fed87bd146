"""The text-format registry: types as Prometheus reads them."""

from __future__ import annotations

import pytest

from raftsched.metrics import Registry


def test_a_counter_read_at_scrape_time_renders_as_a_counter() -> None:
    totals = {"0": 3.0, "1": 1.0}
    registry = Registry()
    registry.counter(
        "demo_collections_total",
        "Collections, by generation.",
        ["generation"],
        collect=lambda: [((g,), n) for g, n in totals.items()],
    )
    totals["0"] = 4.0
    assert registry.render().splitlines() == [
        "# HELP demo_collections_total Collections, by generation.",
        "# TYPE demo_collections_total counter",
        'demo_collections_total{generation="0"} 4',
        'demo_collections_total{generation="1"} 1',
    ]


def test_a_gauge_named_like_a_counter_is_refused() -> None:
    with pytest.raises(ValueError, match="_total"):
        Registry().gauge("demo_pause_seconds_total", "Pauses.")


def test_a_counter_without_the_total_suffix_is_refused() -> None:
    with pytest.raises(ValueError, match="_total"):
        Registry().counter("demo_pause_seconds", "Pauses.")
