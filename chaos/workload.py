"""Client threads: submit jobs with idempotency keys (retrying with the same
key while the outcome is unknown) and read jobs back with linearizable reads.

A share of the submits (`flow_p`) go to the tenant with a concurrency limit
(chaos/features.py), half of them with one of a few ordering keys shared by
all clients, so checker 12 can see whether the limit and the keys'
one-at-a-time order held (the unkeyed half keeps the limit binding: three
keys alone would rarely have more than two jobs runnable).

Another share (`far_p`) of the other submits is due later, `delay_s` in
`chaos.wheel.FAR_DELAY_S`: beyond the short horizon the harness gives the
time wheel, so they are stored packed until the Tick hydrates them."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from chaos.features import LIMITED_TENANT, ORDERING_KEYS
from chaos.history import Recorder
from chaos.httpops import Outcome, Session, recorded_call
from chaos.wheel import FAR_DELAY_S
from chaos.worker import QUEUE

SUBMIT_RETRIES_MAX = 5


def job_request(
    key: str,
    number: int,
    limited: bool = False,
    ordering_key: str | None = None,
    delay_s: float | None = None,
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "queue": QUEUE,
        "payload": {"n": number},
        "idempotency_key": key,
        "max_attempts": 100,
        "backoff": {"initial_s": 0.2, "max_s": 1, "jitter_s": 0.2},
    }
    if limited:
        request["tenant"] = LIMITED_TENANT
    if ordering_key is not None:
        request["ordering_key"] = ordering_key
    if delay_s is not None:
        request["delay_s"] = delay_s
    return request


class Client(threading.Thread):
    def __init__(
        self,
        name: str,
        urls: list[str],
        history: Recorder,
        known_jobs: list[str],
        seed: int,
        stop: threading.Event,
        rate_per_s: float = 4.0,
        flow_p: float = 0.0,
        far_p: float = 0.0,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.rng = random.Random(seed)
        self.session = Session(urls, self.rng)
        self.history = history
        self.known_jobs = known_jobs
        self.stop_event = stop
        self.pause_s = 1.0 / rate_per_s
        self.flow_p = flow_p
        self.far_p = far_p
        self.count = 0

    def run(self) -> None:
        while not self.stop_event.is_set():
            if not self.known_jobs or self.rng.random() < 0.5:
                self.submit()
            else:
                self.read(self.rng.choice(self.known_jobs[-50:]))
            time.sleep(self.rng.uniform(0.5, 1.5) * self.pause_s)

    def op(self, f: str, method: str, path: str, body: Any, **kw: Any) -> Outcome:
        return recorded_call(self.history, self.session, f, method, path, body, **kw)

    def submit(self) -> None:
        self.count += 1
        key = f"{self.name}-{self.count}"
        limited = self.rng.random() < self.flow_p
        ordering_key = None
        if limited and self.rng.random() < 0.5:
            ordering_key = self.rng.choice(ORDERING_KEYS)
        delay_s = None
        if not limited and self.rng.random() < self.far_p:
            delay_s = round(self.rng.uniform(*FAR_DELAY_S), 1)
        request = job_request(key, self.count, limited, ordering_key, delay_s)
        for _ in range(SUBMIT_RETRIES_MAX):
            outcome = self.op("submit", "POST", "/v1/jobs", request, idempotent=True)
            if outcome.kind == "ok":
                self.known_jobs.append(outcome.body["job"]["id"])
                return
            if outcome.kind == "fail" or self.stop_event.is_set():
                return
            time.sleep(0.5)  # info: unknown outcome, retry with the same key

    def read(self, job_id: str) -> None:
        self.op("read", "GET", f"/v1/jobs/{job_id}", None, idempotent=True)
