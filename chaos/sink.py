"""The fenced sink: a stand-in for a downstream system that compares tokens.

`POST /write {"job_id", "fencing_token", "worker_id", "value"}` is accepted
(200) unless a higher token was already seen for the job (409). Equal tokens
are accepted again (a worker retrying its own write). Every decision is
logged as JSONL with the time, so checker 4 can replay the sink's life.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class FencedSink:
    def __init__(self, log_path: Path, host: str = "127.0.0.1") -> None:
        self.log_path = log_path
        self._log = log_path.open("a", buffering=1, encoding="utf-8")
        self._highest: dict[str, int] = {}
        self._lock = threading.Lock()
        self.accepted = 0
        self.rejected = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length))
                    status, answer = sink.write(body)
                except (ValueError, KeyError, TypeError) as error:
                    status, answer = 400, {"error": str(error)}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> FencedSink:
        self._thread.start()
        return self

    def write(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        job_id = str(body["job_id"])
        token = int(body["fencing_token"])
        with self._lock:
            highest = self._highest.get(job_id, -1)
            accept = token >= highest
            if accept:
                self._highest[job_id] = token
                self.accepted += 1
            else:
                self.rejected += 1
            record = {
                "t": time.time(),
                "job_id": job_id,
                "fencing_token": token,
                "worker_id": body.get("worker_id"),
                "accepted": accept,
                "highest_before": highest,
            }
            self._log.write(json.dumps(record) + "\n")
        if accept:
            return 200, {"accepted": True}
        return 409, {"accepted": False, "highest": highest}

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            self._log.close()


def read_sink_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
