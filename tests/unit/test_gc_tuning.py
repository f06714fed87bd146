"""The node's collector settings: no automatic full collections, short young
ones, and pauses counted per generation for /metrics."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from raftsched.node import gc_tuning


@pytest.fixture
def tuned() -> Iterator[None]:
    thresholds = gc.get_threshold()
    gc_tuning.configure()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(gc_tuning.pauses.callback)


def test_configure_turns_off_automatic_full_collections(tuned: None) -> None:
    young, middle, full = gc.get_threshold()
    assert (young, middle) == (gc_tuning.GENERATION0_THRESHOLD, gc_tuning.GENERATION1_THRESHOLD)
    assert full >= 1_000_000
    gc_tuning.configure()  # a second call does not register the callback twice
    assert gc.callbacks.count(gc_tuning.pauses.callback) == 1


def test_pauses_are_counted_per_generation(tuned: None) -> None:
    before = list(gc_tuning.pauses.count)
    seconds_before = gc_tuning.pauses.seconds[1]
    gc.collect(1)
    assert gc_tuning.pauses.count[1] == before[1] + 1
    assert gc_tuning.pauses.count[0] == before[0]
    assert gc_tuning.pauses.seconds[1] >= seconds_before
    assert gc_tuning.pauses.longest[1] >= 0.0
