"""The broker relay of the campaign: a subscription whose sink is the
harness's Redis (chaos/broker.py), beside the webhook one (docs/relays.md).

`chaos-relay` takes every event type and tenant, publishes to the stream
`chaos:{shard}` (one stream per shard: `chaos:0` in a one-shard cluster),
and keys each message by the job payload's `n` (the clients' jobs carry
one; every other job falls back to its idempotency key, workflow id or id).
Broker subscriptions need cluster version 10 (core/events/sinks.py): the
subscription is created once the cluster runs at that version (at once on a
new cluster, before the workload starts; after the last upgrade in a
mixed-version run), repeated while the answer is unknown or the gate still
closed, and noted `relay_enabled` with the version. Then:

- **recovery** waits for it as for the webhook (`backlog`): every shard's
  cursor at its outbox's last event, nothing parked (parked events are
  retried once, as an operator would: `retry_parked_relay` in the history,
  and their (shard, seq) kept, since a retried event arrives after later
  ones by design, docs/relays.md section 3);
- **the final state** (`read_state`) holds the subscription's view (every
  shard's cursor and parked events), its starting points, and every entry
  of every shard's stream, read from Redis after recovery; checker 16
  (chaos/relay_checkers.py) judges them against the outbox.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from chaos.broker import RedisBroker
from chaos.cursors import cursor_seqs
from chaos.features import _get, _shard_seqs, subscription_backlog
from chaos.history import Recorder
from chaos.httpops import Outcome, Session, recorded_call
from raftsched.core.events.sinks import SINK_VERSION

RELAY_SUBSCRIPTION_ID = "chaos-relay"
RELAY_STREAM = "chaos:{shard}"
RELAY_KEY_FIELD = "n"  # the clients' payload (chaos/workload.py)
GATE_POLL_S = 1.0
ENABLE_BUDGET_S = 60.0


def stream_name(template: str, shard: int) -> str:
    return template.replace("{shard}", str(shard))


class Relay(threading.Thread):
    """Creates the broker subscription once the cluster version allows it
    (run as a thread in a mixed-version run, called at once otherwise)."""

    def __init__(
        self,
        urls: list[str],
        history: Recorder,
        seed: int,
        broker: RedisBroker,
        stop: threading.Event,
    ) -> None:
        super().__init__(name="relay", daemon=True)
        self.urls = urls
        self.session = Session(urls, random.Random(f"chaos-relay-{seed}"))
        self.history = history
        self.broker = broker
        self.stop_event = stop
        self.enabled = False
        self.refused: dict[str, Any] | None = None
        self.start_seq = 0  # shard 0's cursor when it was created
        self.start_seqs: list[int] = [0]  # each shard's last seq just after it
        self.parked_retried: list[tuple[int, int]] = []
        self.retried_parked = False

    def op(self, f: str, method: str, path: str, body: Any, **kw: Any) -> Outcome:
        return recorded_call(self.history, self.session, f, method, path, body, **kw)

    def request(self) -> dict[str, Any]:
        sink = {"kind": "redis", "url": self.broker.url, "stream": RELAY_STREAM}
        return {
            "id": RELAY_SUBSCRIPTION_ID,
            "types": [],
            "sink": sink,
            "key_field": RELAY_KEY_FIELD,
        }

    def run(self) -> None:
        self.enable(budget_s=None)

    def enable(self, budget_s: float | None = ENABLE_BUDGET_S) -> bool:
        """Create the subscription once the cluster runs at version 10;
        False when refused for another reason (kept in `refused`), when the
        budget ran out or the run stopped first."""
        deadline = None if budget_s is None else time.monotonic() + budget_s
        while not self.stop_event.is_set():
            if deadline is not None and time.monotonic() > deadline:
                return False
            version = self._cluster_version()
            if version is not None and version >= SINK_VERSION:
                outcome = self.op(
                    "subscribe_relay", "POST", "/v1/subscriptions", self.request(), idempotent=True
                )
                if outcome.kind == "ok":
                    self._created(outcome, version)
                    return True
                if outcome.kind == "fail" and not _retryable(outcome):
                    self.refused = {"status": outcome.status, "body": outcome.body}
                    self.history.note("relay_refused", self.refused)
                    return False
            self.stop_event.wait(GATE_POLL_S)
        return False

    def _created(self, created: Outcome, version: int) -> None:
        cursor = str(created.body["subscription"]["cursor_seq"])
        self.start_seq = _shard_seqs(cursor)[0]
        # Sharded: each shard's copy publishes its events from the creation
        # on (docs/shards.md); every event after this read must arrive.
        box = _get(self.session, "/v1/events?limit=1", strict=True)
        self.start_seqs = _shard_seqs(box.get("last_seq", 0))
        self.enabled = True
        self.history.note(
            "relay_enabled",
            {"cluster_version": version, "cursor_seq": cursor, "start_seqs": self.start_seqs},
        )

    def _cluster_version(self) -> int | None:
        outcome = self.session.call("GET", "/v1/cluster", idempotent=True, budget_s=3)
        version = outcome.body.get("cluster_version") if outcome.kind == "ok" else None
        return int(version) if isinstance(version, int) else None

    def lag(self) -> int | None:
        """Events committed and not yet published, over every shard (None:
        not created yet, or unreadable). Called from the broker's nemesis
        (a session of its own): how many events an outage held back."""
        if not self.enabled:
            return None
        session = Session(self.urls)
        path = f"/v1/subscriptions/{RELAY_SUBSCRIPTION_ID}"
        view = session.call("GET", path, idempotent=True, budget_s=0.7)
        box = session.call("GET", "/v1/events?limit=1", idempotent=True, budget_s=0.7)
        if view.kind != "ok" or box.kind != "ok":
            return None
        at = cursor_seqs(view.body["subscription"]["cursor_seq"])
        last = _shard_seqs(box.body.get("last_seq", 0))
        at += [None] * (len(last) - len(at))
        return sum(max(0, each - (seen or 0)) for each, seen in zip(last, at, strict=False))

    # -- recovery and the final state ---------------------------------------

    def backlog(self) -> list[str]:
        """What the relay still owes after healing (nothing before it was
        created). Parked events are retried once, as an operator would."""
        if not self.enabled:
            return []
        owed, sub = subscription_backlog(self.session, RELAY_SUBSCRIPTION_ID)
        if sub is not None and sub["parked_count"] and not self.retried_parked:
            self.parked_retried += [
                (int(item.get("shard", 0)), int(item["event"]["seq"]))
                for item in sub.get("parked", [])
            ]
            path = f"/v1/subscriptions/{RELAY_SUBSCRIPTION_ID}/retry"
            self.retried_parked = (
                self.op("retry_parked_relay", "POST", path, {}, idempotent=True).kind == "ok"
            )
        return owed

    def read_state(self, shards: int) -> dict[str, Any]:
        """The relay's part of final.json: `relay` (chaos/relay_checkers.py)."""
        state: dict[str, Any] = {
            "subscription_id": RELAY_SUBSCRIPTION_ID,
            "stream": RELAY_STREAM,
            "key_field": RELAY_KEY_FIELD,
            "enabled": self.enabled,
            "refused": self.refused,
            "start_seq": self.start_seq,
            "start_seqs": self.start_seqs,
            "parked_retried": [list(pair) for pair in self.parked_retried],
            "broker": {"url": self.broker.url.replace(self.broker.password, "***")},
        }
        if not self.enabled:
            return state
        view = _get(self.session, f"/v1/subscriptions/{RELAY_SUBSCRIPTION_ID}", strict=True)
        state["subscription"] = view["subscription"]
        streams: dict[str, list[dict[str, Any]]] = {}
        try:
            for shard in range(shards):
                name = stream_name(RELAY_STREAM, shard)
                streams[name] = self.broker.entries(name)
            state["broker"]["dropped_repeats_at_least"] = self.broker.dropped_repeats()
        except Exception as error:
            state["read_error"] = repr(error)
        state["streams"] = streams
        state["broker"]["restarts"] = self.broker.restarts
        state["broker"]["outages"] = list(self.broker.outages)
        return state


def skipped_state(reason: str) -> dict[str, Any]:
    """final.json's `relay` when the relay could not run (checker 16 skipped)."""
    return {"subscription_id": RELAY_SUBSCRIPTION_ID, "enabled": False, "skipped": reason}


def _retryable(outcome: Outcome) -> bool:
    """A refusal that a later try may not meet: the version gate still
    closed (409 invalid_state, reason cluster_version), or a rate limit."""
    if outcome.status == 429:
        return True
    error = outcome.body.get("error")
    details = error.get("details") if isinstance(error, dict) else None
    reason = details.get("reason") if isinstance(details, dict) else None
    return outcome.status == 409 and reason == "cluster_version"
