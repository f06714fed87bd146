"""The history: one JSONL record per event, Jepsen-style.

Every operation is an `invoke` record followed by exactly one completion:
`ok` (it happened), `fail` (it certainly did not happen) or `info` (the outcome
is unknown: a timeout, a lost connection, a 504). A record is

    {"t": <host wall time, s>, "process": "client-1", "type": "invoke",
     "f": "submit", "id": "client-1:17", "value": {...}}

All harness processes run on the host, whose clock the nemesis never touches,
so `t` orders events across processes (real-time order for the checkers).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Event = dict[str, Any]


class Recorder:
    def __init__(self, path: Path, process: str) -> None:
        self.process = process
        self._file = path.open("a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def write(self, record: Event) -> None:
        line = json.dumps(record, separators=(",", ":"), default=str)
        with self._lock:
            self._file.write(line + "\n")

    def invoke(self, f: str, value: dict[str, Any]) -> str:
        op_id = f"{self.process}:{next(self._ids)}"
        self._event("invoke", f, op_id, value)
        return op_id

    def complete(self, op_id: str, kind: str, f: str, value: dict[str, Any]) -> None:
        assert kind in ("ok", "fail", "info"), kind
        self._event(kind, f, op_id, value)

    def note(self, f: str, value: dict[str, Any]) -> None:
        """An observation that is not an operation (leader seen, fault started)."""
        self._event("note", f, f"{self.process}:note", value)

    def _event(self, kind: str, f: str, op_id: str, value: dict[str, Any]) -> None:
        record = {"t": time.time(), "process": self.process, "type": kind, "f": f}
        record.update({"id": op_id, "value": value})
        self.write(record)

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_events(paths: list[Path]) -> list[Event]:
    """Merge history files into one list ordered by time."""
    events: list[Event] = []
    for path in paths:
        if path.exists():
            events.extend(_lines(path))
    events.sort(key=lambda event: event["t"])
    return events


def _lines(path: Path) -> Iterator[Event]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue  # a process killed mid-line


def operations(events: list[Event]) -> list[dict[str, Any]]:
    """Pair invokes with completions: {"id", "process", "f", "invoke_t",
    "complete_t", "type", "args", "result"}; an invoke never completed (its
    process died) is `info` with complete_t = None."""
    ops: dict[str, dict[str, Any]] = {}
    for event in events:
        kind = event["type"]
        if kind == "invoke":
            ops[event["id"]] = {
                "id": event["id"],
                "process": event["process"],
                "f": event["f"],
                "invoke_t": event["t"],
                "complete_t": None,
                "type": "info",
                "args": event["value"],
                "result": {},
            }
        elif kind in ("ok", "fail", "info") and event["id"] in ops:
            op = ops[event["id"]]
            op.update(complete_t=event["t"], type=kind, result=event["value"])
    return list(ops.values())
