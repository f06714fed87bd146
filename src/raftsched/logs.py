"""Structured logs: one JSON object a line, or a readable line on a terminal.

Fields passed with `extra=` (request_id, job_id, epoch, fencing_token, ...)
become keys of the JSON object, so log pipelines can filter on them.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar

REQUEST_ID: ContextVar[str | None] = ContextVar("raftsched_request_id", default=None)
"""The HTTP request being handled (set by the API's middleware); every log
line made while handling it gets `request_id`."""

# Attributes every LogRecord has; anything else came from `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
}


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        request_id = REQUEST_ID.get()
        if request_id is not None and not hasattr(record, "request_id"):
            record.request_id = request_id
        return True


class JsonFormatter(logging.Formatter):
    def __init__(self, node_id: str | None) -> None:
        super().__init__()
        self.node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.node_id:
            entry["node_id"] = self.node_id
        entry.update(_extras(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self, node_id: str | None) -> None:
        super().__init__("%(asctime)s %(levelname)-5s %(name)s: %(message)s", "%H:%M:%S")
        self.node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extras = _extras(record)
        if extras:
            text += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return f"[{self.node_id}] {text}" if self.node_id else text


def configure_logging(
    log_format: str = "auto", *, node_id: str | None = None, level: int = logging.INFO
) -> None:
    use_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(node_id) if use_json else TextFormatter(node_id))
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # pysyncobj logs every reconnect attempt at warning level; keep them out
    # of the operator's way unless debugging.
    logging.getLogger("pysyncobj").setLevel(logging.ERROR)
