"""The workload beyond plain jobs: schedules, workflows, a webhook
subscription and a tenant with a concurrency limit.

Everything is a pure function of the seed and small enough for a 3-node run
on a 2-core machine:

- **Setup** (before the nemesis starts, each call repeated until it is
  answered): the webhook subscription first (so its cursor starts before any
  event of the run), the limited tenant's settings, and two schedules whose
  occurrences are jobs in the chaos queue -- one every 2-5 s (`allow_all`,
  with jitter) and one seconds-cron every 4-6 s (`buffer_one`, so an
  occurrence that falls while the previous job runs is buffered and released).
- **During the run**: a workflow every 20-35 s, a diamond
  reserve -> (charge, notify) -> ship where every step has a compensation;
  the first workflow and every second one after it mark `ship` to fail
  (the chaos workers fail it permanently), so the workflow fails and the
  succeeded steps are compensated in reverse order of completion. Submits
  carry an idempotency key and are repeated with it while the outcome is
  unknown.
- **At healing**: the schedules are paused (no occurrence is decided after
  that), so recovery has a fixed amount of work to finish.

Clients (chaos/workload.py) put some plain jobs under the limited tenant with
ordering keys. Checkers 9-12 (chaos/checkers.py) judge the outcome.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from chaos.cursors import cursor_seqs, shard0_seq
from chaos.history import Recorder
from chaos.httpops import Outcome, Session, recorded_call
from chaos.worker import QUEUE

LIMITED_TENANT = "chaos-limited"
TENANT_CONCURRENCY_LIMIT = 2
ORDERING_KEYS = ("k0", "k1", "k2")
SUBSCRIPTION_ID = "chaos-hook"
INTERVAL_SCHEDULE = "chaos-every"
CRON_SCHEDULE = "chaos-cron"
SCHEDULE_IDS = (INTERVAL_SCHEDULE, CRON_SCHEDULE)
WORKFLOW_PERIOD_S = (20.0, 35.0)
WORKFLOW_FIRST_S = (2.0, 5.0)
SUBMIT_RETRIES_MAX = 5
SETUP_BUDGET_S = 60.0
RETRY = {"initial_s": 0.2, "max_s": 1, "jitter_s": 0.2}
# The diamond: step -> its dependencies, in declaration order.
WORKFLOW_STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reserve", ()),
    ("charge", ("reserve",)),
    ("notify", ("reserve",)),
    ("ship", ("charge", "notify")),
)
FAILING_STEP = "ship"


def job_template(payload: dict[str, Any]) -> dict[str, Any]:
    return {"queue": QUEUE, "payload": payload, "max_attempts": 100, "backoff": RETRY}


def schedule_requests(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(f"chaos-schedules-{seed}")
    interval_s = rng.choice([2, 3, 4, 5])
    cron_every_s = rng.choice([4, 5, 6])
    return [
        {
            "id": INTERVAL_SCHEDULE,
            "interval_s": interval_s,
            "jitter_s": 0.5,
            "overlap": "allow_all",
            "job": job_template({"schedule": INTERVAL_SCHEDULE}),
        },
        {
            "id": CRON_SCHEDULE,
            "cron": f"*/{cron_every_s} * * * * *",
            "overlap": "buffer_one",
            "job": job_template({"schedule": CRON_SCHEDULE}),
        },
    ]


def workflow_request(number: int) -> dict[str, Any]:
    """Workflow `number` (1-based): odd ones fail at `ship` on purpose."""
    key = f"wf-{number}"
    failing = number % 2 == 1
    steps = []
    for name, depends_on in WORKFLOW_STEPS:
        payload: dict[str, Any] = {"workflow": key, "step": name}
        if failing and name == FAILING_STEP:
            payload["fail"] = True
        step = {"name": name, "depends_on": list(depends_on), **job_template(payload)}
        step["compensation"] = job_template({"workflow": key, "undo": name})
        steps.append(step)
    return {"idempotency_key": key, "on_failure": "fail_fast", "steps": steps}


def expected_outcome(workflow_key: str) -> str:
    """What workflow_request's workflow must end as."""
    return "failed" if int(workflow_key.split("-")[1]) % 2 == 1 else "succeeded"


class Features(threading.Thread):
    """Sets the features up, then submits workflows until stopped."""

    def __init__(
        self,
        urls: list[str],
        history: Recorder,
        seed: int,
        receiver_url: str,
        secret: str,
        stop: threading.Event,
    ) -> None:
        super().__init__(name="features", daemon=True)
        self.rng = random.Random(f"chaos-features-{seed}")
        self.seed = seed
        self.session = Session(urls, self.rng)
        self.history = history
        self.receiver_url = receiver_url
        self.secret = secret
        self.stop_event = stop
        self.workflows = 0
        self.start_seq = 0  # the subscription's cursor when it was created
        self.start_seqs: list[int] = [0]  # each shard's last seq just after it
        self.retried_parked = False

    def op(self, f: str, method: str, path: str, body: Any, **kw: Any) -> Outcome:
        return recorded_call(self.history, self.session, f, method, path, body, **kw)

    def until_ok(self, f: str, method: str, path: str, body: Any) -> Outcome:
        """An idempotent call repeated until answered (setup, pausing)."""
        deadline = time.monotonic() + SETUP_BUDGET_S
        while True:
            outcome = self.op(f, method, path, body, idempotent=True)
            if outcome.kind == "ok" or time.monotonic() > deadline:
                return outcome
            if outcome.kind == "fail" and outcome.status not in (None, 429):
                raise RuntimeError(f"{f} {path} refused: {outcome.status} {outcome.body}")
            time.sleep(0.5)

    def setup(self) -> None:
        subscription: dict[str, Any] = {"id": SUBSCRIPTION_ID, "url": self.receiver_url}
        subscription |= {"types": [], "secret": self.secret}
        created = self.until_ok("subscribe", "POST", "/v1/subscriptions", subscription)
        self._must(created)
        self.start_seq = shard0_seq(created.body["subscription"]["cursor_seq"])
        # Sharded: each shard's copy delivers its events from the creation on
        # (docs/shards.md); every event after this read must reach us (those
        # between the creation and the read may, and are not required).
        box = _get(self.session, "/v1/events?limit=1", strict=True)
        self.start_seqs = _shard_seqs(box.get("last_seq", 0))
        tenant = {"concurrency_limit": TENANT_CONCURRENCY_LIMIT}
        self._must(self.until_ok("set_tenant", "PUT", f"/v1/tenants/{LIMITED_TENANT}", tenant))
        for request in schedule_requests(self.seed):
            self._must(self.until_ok("create_schedule", "POST", "/v1/schedules", request))

    @staticmethod
    def _must(outcome: Outcome) -> None:
        if outcome.kind != "ok":
            raise RuntimeError(f"chaos feature setup failed: {outcome}")

    def run(self) -> None:
        if self.stop_event.wait(self.rng.uniform(*WORKFLOW_FIRST_S)):
            return
        while not self.stop_event.is_set():
            self.submit_workflow()
            if self.stop_event.wait(self.rng.uniform(*WORKFLOW_PERIOD_S)):
                return

    def submit_workflow(self) -> None:
        self.workflows += 1
        request = workflow_request(self.workflows)
        for _ in range(SUBMIT_RETRIES_MAX):
            outcome = self.op("submit_workflow", "POST", "/v1/workflows", request, idempotent=True)
            if outcome.kind in ("ok", "fail") or self.stop_event.is_set():
                return
            time.sleep(0.5)  # unknown outcome: repeat with the same key

    def pause_schedules(self) -> None:
        """At healing: no occurrence is decided after this."""
        for schedule_id in SCHEDULE_IDS:
            self.until_ok("pause_schedule", "POST", f"/v1/schedules/{schedule_id}/pause", {})

    # -- recovery and the final state ---------------------------------------

    def backlog(self) -> list[str]:
        """What the features still owe after healing: running workflows and
        undelivered events. Parked events are retried once, as an operator
        would (`POST /v1/subscriptions/{id}/retry`, in the history)."""
        owed: list[str] = []
        for status in ("running", "compensating"):
            found = _get(self.session, f"/v1/workflows?status={status}&limit=1000")
            owed += [f"workflow {w['id']} {status}" for w in found.get("workflows", [])]
        undelivered, sub = subscription_backlog(self.session, SUBSCRIPTION_ID)
        owed += undelivered
        if sub is not None and sub["parked_count"] and not self.retried_parked:
            path = f"/v1/subscriptions/{SUBSCRIPTION_ID}/retry"
            self.retried_parked = (
                self.op("retry_parked", "POST", path, {}, idempotent=True).kind == "ok"
            )
        return owed

    def read_state(self) -> dict[str, Any]:
        """The features' part of final.json (linearizable reads)."""
        final: dict[str, Any] = {"schedules": {}, "workflows": {}, "workflow_histories": {}}
        for schedule_id in SCHEDULE_IDS:
            schedule = _get(self.session, f"/v1/schedules/{schedule_id}", strict=True)
            path = f"/v1/schedules/{schedule_id}/occurrences?limit=1000"
            records = _get(self.session, path, strict=True)["occurrences"]
            final["schedules"][schedule_id] = {
                "schedule": schedule["schedule"],
                "occurrences": records,
            }
        listing = _get(self.session, "/v1/workflows?limit=1000", strict=True)["workflows"]
        for summary in listing:
            workflow_id = summary["id"]
            one = _get(self.session, f"/v1/workflows/{workflow_id}", strict=True)["workflow"]
            final["workflows"][workflow_id] = one
            history = _get(self.session, f"/v1/workflows/{workflow_id}/history", strict=True)
            final["workflow_histories"][workflow_id] = history["events"]
        events: list[dict[str, Any]] = []
        box: dict[str, Any] = {}
        after: Any = 0
        for _ in range(100_000):  # bounded: every page moves `after` on
            box = _get(self.session, f"/v1/events?after={after}&limit=1000", strict=True)
            events += box["events"]
            if not box["events"]:
                break
            # Sharded, the answer's `next_after` is the per-shard cursor to
            # go on from; one shard's answer has none (its seqs are the cursor).
            after = box.get("next_after") or events[-1]["seq"]
        final["outbox"] = {
            "events": events,
            "first_seq": box.get("first_seq"),
            "last_seq": box["last_seq"],
        }
        subscription = _get(self.session, f"/v1/subscriptions/{SUBSCRIPTION_ID}", strict=True)
        final["subscription"] = subscription["subscription"]
        final["subscription_start_seq"] = self.start_seq
        final["subscription_start_seqs"] = self.start_seqs
        tenant = _get(self.session, f"/v1/tenants/{LIMITED_TENANT}", strict=True)
        final["tenants"] = {LIMITED_TENANT: tenant.get("tenant", tenant)}
        return final


def subscription_backlog(session: Session, sub_id: str) -> tuple[list[str], dict[str, Any] | None]:
    """What subscription `sub_id` still owes (its cursor short of the
    outbox's last event in any shard, parked events), and its view (None:
    unreadable, which is owed too)."""
    subscription = _get(session, f"/v1/subscriptions/{sub_id}")
    sub = subscription.get("subscription")
    if sub is None:
        return [f"subscription {sub_id} unreadable"], None
    owed: list[str] = []
    box = _get(session, f"/v1/events?after={sub['cursor_seq']}&limit=1")
    # Sharded: `last_seq` and the subscription's `cursor_seq` are cursors
    # of every shard's own seq (`v1.<seq0>.<seq1>...`); each shard's copy
    # delivers its own events (docs/shards.md), so every shard's cursor
    # must have reached its last event.
    last = cursor_seqs(box["last_seq"]) if "last_seq" in box else None
    at = cursor_seqs(sub["cursor_seq"])
    at += [None] * (len(last or ()) - len(at))
    if last is None or any(
        each is not None and (seen is None or each > seen)
        for each, seen in zip(last, at, strict=False)
    ):
        owed.append(f"subscription {sub_id} at {sub['cursor_seq']} of {box.get('last_seq')}")
    if sub["parked_count"]:
        owed.append(f"{sub['parked_count']} parked in {sub_id}")
    return owed, sub


def _shard_seqs(cursor: Any) -> list[int]:
    """Every shard's seq in an events cursor: plain digits (one shard), or
    `v1.<seq0>.<seq1>...`."""
    text = str(cursor)
    if text.startswith("v1."):
        return [int(part or 0) for part in text.split(".")[1:]]
    return [int(text or 0)]


def _get(session: Session, path: str, strict: bool = False) -> dict[str, Any]:
    outcome = session.call("GET", path, idempotent=True, budget_s=20)
    if outcome.kind != "ok":
        if strict:
            raise RuntimeError(f"reading {path} failed: {outcome}")
        return {}
    return outcome.body
