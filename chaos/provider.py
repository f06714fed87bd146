"""The fake payment provider: a downstream system that cannot deduplicate.

It stands for the providers issue 17 is about (bank files, legacy payout
APIs): every `POST /charge/<payment>` makes a new charge, whatever the
caller sends, so a blind retry of a payment whose first charge went through
charges it twice. It only records who asked -- the job, fencing token and
worker in the body -- so checker 15 can say which lease made each charge.
`GET /charges/<payment>` answers what a reconciler asks: the charges made
for that payment, oldest first.

For a seeded share of payments (`lookup_unavailable_p`) the lookup answers
503 for good, the way a bank's settlement report may not list a payment
yet: a reconciler then cannot tell, and the job is dead-lettered
`unreconciled` for a human. The choice is a function of the seed and the
payment id, so a run replays it.

Every charge and every lookup is logged as JSONL with the time; the log is
checker 15's record of what the provider did (`read_provider_log`).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CHARGE_PREFIX = "/charge/"
LOOKUP_PREFIX = "/charges/"


class Provider:
    def __init__(self, log_path: Path, seed: int = 0, lookup_unavailable_p: float = 0.0) -> None:
        self.log_path = log_path
        self.seed = seed
        self.lookup_unavailable_p = lookup_unavailable_p
        self._log = log_path.open("a", buffering=1, encoding="utf-8")
        self._charges: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                if not self.path.startswith(CHARGE_PREFIX):
                    self._answer(404, {"error": "no such route"})
                    return
                payment = self.path.removeprefix(CHARGE_PREFIX)
                self._answer(200, provider.charge(payment, body if isinstance(body, dict) else {}))

            def do_GET(self) -> None:  # noqa: N802
                if not self.path.startswith(LOOKUP_PREFIX):
                    self._answer(404, {"error": "no such route"})
                    return
                self._answer(*provider.lookup(self.path.removeprefix(LOOKUP_PREFIX)))

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> Provider:
        self._thread.start()
        return self

    def charge(self, payment: str, body: dict[str, Any]) -> dict[str, Any]:
        """A new charge, always: this provider has no idempotency key."""
        with self._lock:
            made = self._charges.setdefault(payment, [])
            record = {
                "t": time.time(),
                "kind": "charge",
                "payment": payment,
                "charge": f"ch_{payment}_{len(made) + 1}",
                "number": len(made) + 1,
                "job_id": body.get("job_id"),
                "fencing_token": body.get("fencing_token"),
                "worker_id": body.get("worker_id"),
            }
            made.append(record)
            self._log.write(json.dumps(record) + "\n")
        return {"charge": record["charge"], "number": record["number"]}

    def lookup(self, payment: str) -> tuple[int, dict[str, Any]]:
        """(status, body): the payment's charges, or 503 for good if this
        payment is one the provider's lookup does not know."""
        unavailable = self.lookup_unavailable(payment)
        with self._lock:
            charges = [record["charge"] for record in self._charges.get(payment, [])]
            record = {"t": time.time(), "kind": "lookup", "payment": payment}
            record |= {"charges": charges, "answered": 503 if unavailable else 200}
            self._log.write(json.dumps(record) + "\n")
        if unavailable:
            return 503, {"error": "lookup_unavailable", "payment": payment}
        return 200, {"payment": payment, "charges": charges}

    def lookup_unavailable(self, payment: str) -> bool:
        rng = random.Random(f"chaos-provider-{self.seed}-{payment}")
        return rng.random() < self.lookup_unavailable_p

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            self._log.close()


def read_provider_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def charges_per_payment(log: list[dict[str, Any]]) -> Counter[str]:
    return Counter(str(record["payment"]) for record in log if record.get("kind") == "charge")
