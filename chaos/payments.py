"""The payments scenario: the crash window after a provider call (issue 17).

A payment job charges the fake provider (chaos/provider.py), which cannot
deduplicate, then records the charge in the effects ledger and completes.
A worker that dies or stalls between the charge and the record leaves an
attempt whose outcome is unknown. On the payments queue, set to
`on_unknown: reconcile`, such a job is reconciled: a chaos worker leased
the question asks the provider and answers `happened`, `did_not_happen` or
`cannot_tell` (chaos/worker.py). Checker 15 (chaos/payment_checkers.py)
then holds every payment to at most one charge.

The crash window is exercised on purpose, as a function of the seed: each
payment carries a choice the worker reads (`crash_window`: `kill` -- the
worker SIGKILLs itself right after the payment's first charge, and the
harness restarts it; `stall` -- it sleeps past its lease after that charge,
so the lease expires mid-call and it wakes a zombie; or none). The nemesis
adds its own: node faults that lose a record or a completion, worker
SIGSTOPs. A choice is honoured only after the payment's *first* charge, so
the negative control (`--payments-policy retry`) shows exactly the double
charges reconciliation prevents: a retried payment is charged again and
then completes.

The queue's policy needs cluster version 5 (`SPEC_RECONCILE_VERSION`).
Payments start only once the cluster runs at that version and the queue's
policy is committed: at once in a fresh cluster (the run waits for the
version before the fault phase), after the last upgrade in the
mixed-version phase (a cluster with a previous-release node refuses the
setting). The time and version are noted (`payments_enabled`).
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Final

from chaos.history import Recorder
from chaos.httpops import Outcome, Session, recorded_call
from raftsched.core.kernel.cluster_version import SPEC_RECONCILE_VERSION

PAYMENTS_QUEUE: Final = "chaos-pay"
POLICIES: Final = ("reconcile", "retry")
PAYMENT_PERIOD_S: Final = (1.5, 3.0)
# The share of payments whose worker dies, or stalls past its lease, right
# after the first charge.
CRASH_WINDOW_P: Final = {"kill": 0.25, "stall": 0.15}
# The share of payments the provider's lookup never knows (cannot_tell).
LOOKUP_UNAVAILABLE_P: Final = 0.1
SUBMIT_RETRIES_MAX: Final = 5
GATE_POLL_S: Final = 1.0
RETRY: Final = {"initial_s": 0.2, "max_s": 1, "jitter_s": 0.2}
MAX_ATTEMPTS: Final = 20


def payment_id(number: int) -> str:
    return f"pay-{number}"


def crash_window(seed: int, number: int) -> str | None:
    """What the worker does right after payment `number`'s first charge."""
    draw = random.Random(f"chaos-payment-{seed}-{number}").random()
    for how, share in CRASH_WINDOW_P.items():
        if draw < share:
            return how
        draw -= share
    return None


def payment_request(seed: int, number: int) -> dict[str, Any]:
    payload: dict[str, Any] = {"payment": payment_id(number)}
    how = crash_window(seed, number)
    if how is not None:
        payload["crash_window"] = how
    return {
        "queue": PAYMENTS_QUEUE,
        "payload": payload,
        "idempotency_key": payment_id(number),
        "max_attempts": MAX_ATTEMPTS,
        "backoff": RETRY,
    }


class Payments(threading.Thread):
    """Opens the scenario once the cluster version allows it, then submits a
    payment every 1.5-3 s until stopped."""

    def __init__(
        self,
        urls: list[str],
        history: Recorder,
        seed: int,
        policy: str,
        stop: threading.Event,
    ) -> None:
        super().__init__(name="payments", daemon=True)
        assert policy in POLICIES, policy
        self.rng = random.Random(f"chaos-payments-{seed}")
        self.seed = seed
        self.session = Session(urls, self.rng)
        self.history = history
        self.policy = policy
        self.stop_event = stop
        self.enabled = False
        self.submitted = 0

    def op(self, f: str, method: str, path: str, body: Any, **kw: Any) -> Outcome:
        return recorded_call(self.history, self.session, f, method, path, body, **kw)

    def run(self) -> None:
        if not self.open_queue():
            return
        while not self.stop_event.is_set():
            self.submit()
            if self.stop_event.wait(self.rng.uniform(*PAYMENT_PERIOD_S)):
                return

    def open_queue(self) -> bool:
        """Wait for cluster version 5, then set the queue's policy (repeated
        until answered; 409 while the leader still runs below the version)."""
        while not self.stop_event.is_set():
            version = self.cluster_version()
            if version is not None and version >= SPEC_RECONCILE_VERSION:
                body = {"on_unknown": self.policy}
                path = f"/v1/queues/{PAYMENTS_QUEUE}"
                outcome = self.op("set_payments_queue", "PUT", path, body, idempotent=True)
                if outcome.kind == "ok":
                    self.enabled = True
                    self.history.note(
                        "payments_enabled", {"policy": self.policy, "cluster_version": version}
                    )
                    return True
            self.stop_event.wait(GATE_POLL_S)
        return False

    def cluster_version(self) -> int | None:
        outcome = self.session.call("GET", "/v1/cluster", idempotent=True, budget_s=3)
        version = outcome.body.get("cluster_version") if outcome.kind == "ok" else None
        return int(version) if isinstance(version, int) else None

    def submit(self) -> None:
        self.submitted += 1
        request = payment_request(self.seed, self.submitted)
        for _ in range(SUBMIT_RETRIES_MAX):
            outcome = self.op("submit_payment", "POST", "/v1/jobs", request, idempotent=True)
            if outcome.kind in ("ok", "fail") or self.stop_event.is_set():
                return
            time.sleep(0.5)  # unknown outcome: repeat with the same key

    def read_state(self, job_ids: list[str]) -> dict[str, Any]:
        """The scenario's part of final.json: the policy asked for, the
        queue as the cluster holds it, and every payment job's history (the
        reconciliation decisions are in it)."""
        state: dict[str, Any] = {"policy": self.policy, "enabled": self.enabled}
        queue = self.session.call(
            "GET", f"/v1/queues/{PAYMENTS_QUEUE}", idempotent=True, budget_s=20
        )
        state["queue"] = queue.body.get("queue") if queue.kind == "ok" else None
        histories: dict[str, Any] = {}
        for job_id in job_ids:
            path = f"/v1/jobs/{job_id}/history"
            found = self.session.call("GET", path, idempotent=True, budget_s=20)
            if found.kind != "ok":
                raise RuntimeError(f"reading {path} failed: {found}")
            histories[job_id] = found.body["events"]
        state["histories"] = histories
        return state
