"""The webhook receiver: the subscriber the cluster delivers outbox events to.

It runs in the harness on the bridge's host address (the nodes live in their
own namespaces and reach the host through the bridge; the nemesis never cuts
that path, like the clients' and the sink's). Every delivery is logged as
JSONL: the time, the event's seq, type and data, the event id header, whether
the HMAC signature verified, and the status answered. With a seeded
probability it answers 503 instead of 200, so the leader's retries and
backoff are part of the campaign; a refused delivery is logged too (with
`answered: 503`) and does not count as received. Checker 11 replays the log
against the final outbox.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SIGNATURE_HEADER = "Raftsched-Signature"
EVENT_ID_HEADER = "Raftsched-Event-Id"


class WebhookReceiver:
    def __init__(
        self, log_path: Path, host: str, secret: str, refuse_p: float = 0.0, seed: int = 0
    ) -> None:
        self.log_path = log_path
        self.secret = secret.encode()
        self.refuse_p = refuse_p
        self._rng = random.Random(f"chaos-receiver-{seed}")
        self._log = log_path.open("a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()
        self.received = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                status = receiver.deliver(raw, dict(self.headers.items()))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def deliver(self, raw: bytes, headers: dict[str, str]) -> int:
        """Log one delivery; the status to answer (200, or 503 on purpose)."""
        expected = "sha256=" + hmac.new(self.secret, raw, hashlib.sha256).hexdigest()
        signature_ok = hmac.compare_digest(expected, headers.get(SIGNATURE_HEADER, ""))
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        with self._lock:
            status = 503 if self._rng.random() < self.refuse_p else 200
            record = {
                "t": time.time(),
                "seq": body.get("seq"),
                "shard": body.get("shard", 0),
                "type": body.get("type"),
                "data": body.get("data"),
                "event_id": headers.get(EVENT_ID_HEADER),
                "body_id": body.get("id"),
                "subscription_id": body.get("subscription_id"),
                "signature_ok": signature_ok,
                "answered": status,
            }
            self._log.write(json.dumps(record) + "\n")
            if status == 200:
                self.received += 1
        return status

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            self._log.close()


def read_receiver_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
