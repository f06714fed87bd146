"""A small Prometheus text-format registry.

Counters, gauges and histograms with bounded label sets. We keep our own
instead of a client library because the node needs only a few families,
gauges are mostly computed at scrape time from the replicated state, and the
exposition format is short. Label values must come from bounded sets (queue
names, statuses, routes), never job ids.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

LabelValues = tuple[str, ...]
F = TypeVar("F", bound="_Family")

DEFAULT_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels_text(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    pairs = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True))
    return "{" + pairs + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


class _Family:
    kind = "untyped"

    def __init__(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> None:
        self.name = name
        self.help_text = help_text
        self.label_names = tuple(label_names)
        self._lock = threading.Lock()

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} {self.kind}"]

    def render(self) -> list[str]:
        raise NotImplementedError


class Counter(_Family):
    """A counter incremented directly, or read at scrape time from a callback
    that returns totals kept elsewhere (they must never decrease)."""

    kind = "counter"

    def __init__(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str] = (),
        collect: Callable[[], Iterable[tuple[LabelValues, float]]] | None = None,
    ) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"counter {name!r}: Prometheus counter names end in _total")
        super().__init__(name, help_text, label_names)
        self._values: dict[LabelValues, float] = {}
        self._collect = collect

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + amount

    def value(self, *labels: str) -> float:
        return self._values.get(labels, 0.0)

    def items(self) -> list[tuple[LabelValues, float]]:
        with self._lock:
            return sorted(self._values.items())

    def render(self) -> list[str]:
        if self._collect is not None:
            items = sorted(self._collect())
        else:
            with self._lock:
                items = sorted(self._values.items())
        return [f"{self.name}{_labels_text(self.label_names, k)} {_number(v)}" for k, v in items]


class Gauge(_Family):
    """A gauge whose samples are set directly or computed by a callback at scrape time."""

    kind = "gauge"

    def __init__(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str] = (),
        collect: Callable[[], Iterable[tuple[LabelValues, float]]] | None = None,
    ) -> None:
        if name.endswith("_total"):
            raise ValueError(f"gauge {name!r}: a name ending in _total is a counter's")
        super().__init__(name, help_text, label_names)
        self._values: dict[LabelValues, float] = {}
        self._collect = collect

    def set(self, value: float, *labels: str) -> None:
        with self._lock:
            self._values[labels] = value

    def render(self) -> list[str]:
        if self._collect is not None:
            items = sorted(self._collect())
        else:
            with self._lock:
                items = sorted(self._values.items())
        return [f"{self.name}{_labels_text(self.label_names, k)} {_number(v)}" for k, v in items]


class Histogram(_Family):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_LATENCY_BUCKETS_S,
    ) -> None:
        super().__init__(name, help_text, label_names)
        self.buckets = tuple(sorted(buckets))
        # Per label set: counts per bucket (non-cumulative), sum, count.
        self._series: dict[LabelValues, tuple[list[int], list[float]]] = {}

    def observe(self, value: float, *labels: str) -> None:
        index = bisect.bisect_left(self.buckets, value)
        with self._lock:
            series = self._series.get(labels)
            if series is None:
                series = ([0] * (len(self.buckets) + 1), [0.0, 0.0])
                self._series[labels] = series
            series[0][index] += 1
            series[1][0] += value
            series[1][1] += 1

    def render(self) -> list[str]:
        lines: list[str] = []
        with self._lock:
            items = sorted((k, (list(c), list(s))) for k, (c, s) in self._series.items())
        names = (*self.label_names, "le")
        for labels, (counts, (total, count)) in items:
            cumulative = 0
            for bound, bucket_count in zip((*self.buckets, math.inf), counts, strict=True):
                cumulative += bucket_count
                text = _labels_text(names, (*labels, _number(bound)))
                lines.append(f"{self.name}_bucket{text} {cumulative}")
            base = _labels_text(self.label_names, labels)
            lines.append(f"{self.name}_sum{base} {_number(total)}")
            lines.append(f"{self.name}_count{base} {_number(count)}")
        return lines


class Registry:
    def __init__(self) -> None:
        self._families: list[_Family] = []

    def register(self, family: F) -> F:
        self._families.append(family)
        return family

    def counter(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str] = (),
        collect: Callable[[], Iterable[tuple[LabelValues, float]]] | None = None,
    ) -> Counter:
        return self.register(Counter(name, help_text, labels, collect))

    def gauge(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str] = (),
        collect: Callable[[], Iterable[tuple[LabelValues, float]]] | None = None,
    ) -> Gauge:
        return self.register(Gauge(name, help_text, labels, collect))

    def histogram(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_LATENCY_BUCKETS_S,
    ) -> Histogram:
        return self.register(Histogram(name, help_text, labels, buckets))

    def render(self) -> str:
        lines: list[str] = []
        for family in self._families:
            lines.extend(family.header())
            lines.extend(family.render())
        return "\n".join(lines) + "\n"
