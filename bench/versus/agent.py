"""One load process of bench/versus_postgres.py (run by it, not by hand).

    python -m versus.agent '<json config>'      (with bench/ on PYTHONPATH)

Roles, the same code for both systems over a `Backend`:

- submitter: submits PAYLOAD jobs (one per request, or BATCH per request)
  while the phase runs, keeping the phase's backlog (submitted less
  completed, summed over every process of the phase) under `backlog_max`;
  records each submit's round trip.
- worker: claims (max_jobs 1, or BATCH), runs nothing, and completes. On
  raftsched: claim -> start -> complete per job with the client SDK, or
  the lease batch endpoint for the starts and then the completions of a
  batched claim; with protocol "next" the completion (or the batch of
  completions) carries the next claim, sent through the client's `request`
  in the wire format of docs/api.md, "The next claim".
  On Postgres: the one-statement claim, then the completion UPDATE (one row,
  or all rows of the claim in one statement). A Postgres claim that finds
  nothing sleeps `poll_s` (Postgres has no long-poll; raftsched's claim
  waits up to WAIT_S on the node). With `record_due`, it records for every
  job whose payload has `due_ms` the wall-clock time it received the lease
  minus that due time.
- idle: `count` single submits one after another, 5 ms apart, nothing else
  running; records each round trip.
- due: `count` single submits of jobs due DUE_AHEAD_MS later, 20 ms apart.
- preload: `count` jobs submitted as fast as it can (not measured).

Every process waits for GO in the control file, runs until STOP (or its
own work is done), and stops by itself after `max_s` whatever happens. It
writes its figures as JSON to `result`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from versus.common import BATCH, GO, PAYLOAD, RESULT, STOP, Control

WAIT_S = 1.0  # raftsched long-poll of a worker's claim
DUE_AHEAD_MS = 200
DUE_INTERVAL_S = 0.02
IDLE_PAUSE_S = 0.005


class Job(NamedTuple):
    id: Any  # raftsched job id, or the Postgres row id
    token: int  # raftsched fencing token, or the Postgres attempt number
    payload: Any


class Backend(Protocol):
    def submit_one(self, queue: str, payload: Any, due_ms: int | None = None) -> None: ...
    def submit_many(self, queue: str, payloads: list[Any]) -> None: ...
    def preload(self, queue: str, count: int) -> None: ...
    def claim(self, queue: str, max_jobs: int) -> list[Job]: ...
    def finish(self, jobs: list[Job]) -> list[Job]: ...
    def idle(self) -> None: ...
    def figures(self) -> dict[str, Any]: ...


# -- raftsched ------------------------------------------------------------------------


class RaftschedBackend:
    """The client SDK's blocking `Client`, as an application would use it."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        from raftsched.client import Client

        target = cfg["target"]
        self.client = Client(target["urls"], timeout_s=10.0 + WAIT_S, retry_budget_s=30.0)
        self.worker_id = cfg.get("worker_id", "versus")
        self.batched = cfg.get("variant") == "batched"
        self.protocol = cfg.get("protocol", "single")
        self.queue = cfg.get("queue", "")
        self.next_answers = 0  # completions answered with a `next`
        self.next_missing = 0  # ... without one, or with its error
        self.fallback: str | None = None

    def submit_one(self, queue: str, payload: Any, due_ms: int | None = None) -> None:
        self.client.submit(queue, payload, run_at=due_ms)

    def submit_many(self, queue: str, payloads: list[Any]) -> None:
        from raftsched.client import item_error

        results = self.client.submit_batch([{"queue": queue, "payload": p} for p in payloads])
        errors = [error for error in map(item_error, results) if error is not None]
        if errors:
            raise RuntimeError(f"batch submit: {len(errors)} errors, first {errors[0]}")

    def preload(self, queue: str, count: int) -> None:
        chunks = [min(1000, count - start) for start in range(0, count, 1000)]
        with ThreadPoolExecutor(4) as pool:
            for future in [pool.submit(self.submit_many, queue, [PAYLOAD] * n) for n in chunks]:
                future.result()

    def claim(self, queue: str, max_jobs: int) -> list[Job]:
        leases = self.client.claim(self.worker_id, [queue], max_jobs=max_jobs, wait_s=WAIT_S)
        return [_job(lease) for lease in leases]

    def finish(self, jobs: list[Job]) -> list[Job]:
        """Start and complete `jobs`; the next jobs a completion claimed."""
        if self.batched:
            self._lease_batch("start", jobs)
            return self._lease_batch("complete", jobs)
        upcoming: list[Job] = []
        for job in jobs:
            self.client.start(job.id, job.token)
            upcoming += self._complete(job)
        return upcoming

    def _next_on(self) -> bool:
        return self.protocol == "next" and self.fallback is None

    def _complete(self, job: Job) -> list[Job]:
        if self._next_on():
            body = {"fencing_token": job.token, "result": RESULT}
            answer = self._with_next(f"/v1/leases/{job.id}/complete", body, 1)
            if answer is not None:
                return self._next_jobs(answer)
        self.client.complete(job.id, job.token, RESULT)
        return []

    def _lease_batch(self, op: str, jobs: list[Job]) -> list[Job]:
        """One POST /v1/leases/batch of `op` for every job; the completions
        carry the next claim with protocol "next"."""
        extra = {"result": RESULT} if op == "complete" else {}
        ops = [{"op": op, "job_id": j.id, "fencing_token": j.token} | extra for j in jobs]
        if op == "complete" and self._next_on():
            answer = self._with_next("/v1/leases/batch", {"ops": ops}, BATCH)
            if answer is not None:
                self._check_results(op, answer.get("results"))
                return self._next_jobs(answer)
        self._check_results(op, self.client.lease_batch(ops))
        return []

    def _check_results(self, op: str, results: Any) -> None:
        from raftsched.client import item_error

        if not isinstance(results, list):
            raise RuntimeError(f"lease batch {op}: no results in the answer")
        errors = [e for e in map(item_error, results) if e is not None]
        if errors:
            raise RuntimeError(f"lease batch {op}: {len(errors)} errors, first {errors[0]}")

    def _with_next(self, path: str, body: dict[str, Any], max_jobs: int) -> Any:
        """POST `body` plus `next` (docs/api.md, "The next claim") through the
        client's request method; the answer, or None when the node refused
        `next` (a node of 0.5.0 or earlier: 400 with field `next`; a closed
        version gate: 409, upgrade first). A refused request applied nothing:
        the caller sends the plain form, and this worker stays with it."""
        from raftsched.client import Conflict, InvalidRequest

        claim: dict[str, Any] = {"queues": [self.queue], "max_jobs": max_jobs, "wait_s": WAIT_S}
        if self.batched:
            claim["worker_id"] = self.worker_id  # a lease batch needs it
        try:
            return self.client.request(
                "POST", path, body=body | {"next": claim}, retry_unknown=True
            ).json()
        except InvalidRequest as error:
            if error.details.get("field") != "next":
                raise
            self.fallback = f"400 {error}"
        except Conflict as error:
            if "upgrade" not in error.message:
                raise
            self.fallback = f"409 {error}"
        return None

    def _next_jobs(self, answer: Any) -> list[Job]:
        """The leases of the answer's `next`; none if the claim failed
        (`"next": {"error": ...}`, the operation stands) or the node left it out."""
        found = answer.get("next") if isinstance(answer, dict) else None
        leases = found.get("leases") if isinstance(found, dict) else None
        if not isinstance(leases, list):
            self.next_missing += 1
            return []
        self.next_answers += 1
        return [_job(lease) for lease in leases]

    def idle(self) -> None:
        pass  # the claim already waited on the node

    def figures(self) -> dict[str, Any]:
        plain = "lease_batch" if self.batched else "single"
        if self.protocol != "next":
            return {"protocol_used": plain}
        used = f"{plain}+next" if self.next_answers and self.fallback is None else plain
        return {
            "protocol_used": used,
            "next_answers": self.next_answers,
            "next_missing": self.next_missing,
            "fallback": self.fallback,
        }


def _job(lease: dict[str, Any]) -> Job:
    return Job(lease["job_id"], lease["fencing_token"], lease["payload"])


# -- Postgres -----------------------------------------------------------------------


class PostgresBackend:
    """psycopg 3, one autocommit connection: every statement its own transaction."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        import psycopg
        from psycopg.types.json import Jsonb

        from versus import postgres as sql

        self.sql = sql
        self.jsonb = Jsonb
        self.conn = psycopg.connect(cfg["target"]["dsn"], autocommit=True)
        self.prepare = bool(cfg.get("prepare", True))
        self.poll_s = float(cfg.get("poll_s", 0.01))
        self.worker_id = cfg.get("worker_id", "versus")
        self.batched = cfg.get("variant") == "batched"
        self.lost = 0

    def _execute(self, query: str, params: tuple[Any, ...]) -> Any:
        return self.conn.execute(query, params, prepare=self.prepare)

    def submit_one(self, queue: str, payload: Any, due_ms: int | None = None) -> None:
        if due_ms is None:
            self._execute(self.sql.INSERT, (queue, self.jsonb(payload))).fetchone()
        else:
            from datetime import UTC, datetime

            run_at = datetime.fromtimestamp(due_ms / 1000, UTC)
            self._execute(self.sql.INSERT_AT, (queue, self.jsonb(payload), run_at)).fetchone()

    def submit_many(self, queue: str, payloads: list[Any]) -> None:
        rows = self._execute(self.sql.INSERT_MANY, (queue, [self.jsonb(p) for p in payloads]))
        if len(rows.fetchall()) != len(payloads):
            raise RuntimeError("batch insert: rows missing")

    def preload(self, queue: str, count: int) -> None:
        for start in range(0, count, 10_000):
            n = min(10_000, count - start)
            self.conn.execute(self.sql.PRELOAD, (queue, json.dumps(PAYLOAD), n))

    def claim(self, queue: str, max_jobs: int) -> list[Job]:
        rows = self._execute(self.sql.CLAIM, (queue, max_jobs, self.worker_id)).fetchall()
        return [Job(*row) for row in rows]

    def finish(self, jobs: list[Job]) -> list[Job]:
        result = self.jsonb(RESULT)
        if self.batched:
            ids, attempts = [j.id for j in jobs], [j.token for j in jobs]
            done = self._execute(self.sql.COMPLETE_MANY, (result, ids, attempts)).rowcount
        else:
            done = sum(
                self._execute(self.sql.COMPLETE, (result, j.id, j.token)).rowcount for j in jobs
            )
        if done != len(jobs):
            raise RuntimeError(f"complete: {len(jobs) - done} of {len(jobs)} leases lost")
        return []

    def idle(self) -> None:
        time.sleep(self.poll_s)

    def figures(self) -> dict[str, Any]:
        return {}


# -- roles --------------------------------------------------------------------------


class Run:
    def __init__(self, cfg: dict[str, Any], backend: Backend, control: Control) -> None:
        self.cfg = cfg
        self.backend = backend
        self.control = control
        self.me = int(cfg["index"])
        self.deadline = time.monotonic() + float(cfg["max_s"])
        self.count = 0

    def running(self) -> bool:
        return self.control.state == GO and time.monotonic() < self.deadline

    def add(self, jobs: int) -> None:
        self.count += jobs
        self.control.set_count(self.me, self.count)


def submitter(run: Run) -> dict[str, Any]:
    cfg, backend, control = run.cfg, run.backend, run.control
    queue, backlog_max = cfg["queue"], int(cfg["backlog_max"])
    submitters, workers = cfg["submitters"], cfg["workers"]
    batch = [PAYLOAD] * BATCH
    sent_at: list[float] = []
    latency: list[float] = []
    while run.running():
        if control.total(submitters) - control.total(workers) >= backlog_max:
            time.sleep(0.005)  # the backlog is at its cap: let the workers gain
            continue
        sent_at.append(time.monotonic())
        started = time.perf_counter()
        if cfg["variant"] == "batched":
            backend.submit_many(queue, batch)
        else:
            backend.submit_one(queue, PAYLOAD)
        latency.append(time.perf_counter() - started)
        run.add(BATCH if cfg["variant"] == "batched" else 1)
    return {"sent_at": sent_at, "latency_s": latency}


def worker(run: Run) -> dict[str, Any]:
    cfg, backend = run.cfg, run.backend
    queue = cfg["queue"]
    max_jobs = BATCH if cfg["variant"] == "batched" else 1
    record_due = bool(cfg.get("record_due"))
    lags_ms: list[float] = []

    def received(jobs: list[Job]) -> None:
        if record_due:
            now_ms = time.time() * 1000
            for job in jobs:
                if isinstance(job.payload, dict) and "due_ms" in job.payload:
                    lags_ms.append(now_ms - job.payload["due_ms"])

    jobs: list[Job] = []
    while run.running():
        if not jobs:
            jobs = backend.claim(queue, max_jobs)
            if not jobs:
                backend.idle()
                continue
            received(jobs)
        done = len(jobs)
        jobs = backend.finish(jobs)
        run.add(done)
        received(jobs)
    return {"due_lag_ms": lags_ms, **backend.figures()}


def idle(run: Run) -> dict[str, Any]:
    latency: list[float] = []
    for _ in range(int(run.cfg["count"])):
        if not run.running():
            break
        started = time.perf_counter()
        run.backend.submit_one(run.cfg["queue"], PAYLOAD)
        latency.append(time.perf_counter() - started)
        run.add(1)
        time.sleep(IDLE_PAUSE_S)
    return {"latency_s": latency}


def due(run: Run) -> dict[str, Any]:
    time.sleep(0.5)  # the workers are parked in their claims
    for _ in range(int(run.cfg["count"])):
        if not run.running():
            break
        due_ms = int(time.time() * 1000) + DUE_AHEAD_MS
        run.backend.submit_one(run.cfg["queue"], PAYLOAD | {"due_ms": due_ms}, due_ms=due_ms)
        run.add(1)
        time.sleep(DUE_INTERVAL_S)
    return {}


def preload(run: Run) -> dict[str, Any]:
    started = time.monotonic()
    run.backend.preload(run.cfg["queue"], int(run.cfg["count"]))
    run.add(int(run.cfg["count"]))
    return {"preload_s": round(time.monotonic() - started, 2)}


ROLES: dict[str, Callable[[Run], dict[str, Any]]] = {
    "submitter": submitter,
    "worker": worker,
    "idle": idle,
    "due": due,
    "preload": preload,
}


def main() -> None:
    try:  # dies with the benchmark, however it ends (raftsched.child_processes)
        from raftsched.child_processes import die_with_parent
    except ImportError:  # an old source tree (--src) without it
        pass
    else:
        die_with_parent()
    cfg = json.loads(sys.argv[1])
    control = Control(Path(cfg["control"]), int(cfg["agents"]))
    backend: Backend
    if cfg["target"]["system"] == "raftsched":
        backend = RaftschedBackend(cfg)
    else:
        backend = PostgresBackend(cfg)
    run = Run(cfg, backend, control)
    control.set_ready(run.me)
    while control.state != GO and time.monotonic() < run.deadline:
        if control.state == STOP:
            break
        time.sleep(0.002)
    figures = ROLES[cfg["role"]](run)
    figures["count"] = run.count
    Path(cfg["result"]).write_text(json.dumps(figures))


if __name__ == "__main__":
    main()
