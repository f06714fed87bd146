"""What this leader's relays are doing, for /metrics and the subscription views
(docs/relays.md, section 5): one set of figures for every sink, webhooks
included (`sink="webhook"`).

The relays (node/webhooks.py) tell a `RelayStatus` what happens as it
happens: a message published, an attempt that failed and is tried again, an
event parked, whether an attempt reached its broker or receiver. The
counters are the node's (`raftsched_sink_*_total`, moved by the leader that
relayed, as every counter of the node is); the gauges are read at scrape
time, and only while this node leads: the lag from the replicated cursor and
outbox and the leader's clock, the connection from the relay's memory. A
follower exports none (as `raftsched_jobs_stuck`), so each group's gauges
come from one node, its leader.

In memory only: nothing here is proposed or stored. Label values are
subscription ids (at most `SUBSCRIPTIONS_MAX` per group) and sink kinds.
"""

from __future__ import annotations

from typing import Final

from raftsched.core.events.sinks import Sink
from raftsched.core.events.subscriptions import (
    Subscription,
    oldest_undelivered_at_ms,
    subscriptions,
)
from raftsched.core.kernel import outbox
from raftsched.core.kernel.state import State
from raftsched.node import metrics as families
from raftsched.node.metrics import LabelValues, Samples
from raftsched.node.view import StateView

WEBHOOK: Final = "webhook"


def sink_kind(sink: Sink | None) -> str:
    """The `sink` label: a broker's kind, or `webhook`."""
    return WEBHOOK if sink is None else sink.kind


def lag_events(state: State, sub: Subscription) -> int:
    """Committed events after the cursor, those the filters leave out
    included: the cursor passes them once the relay has looked, so this is 0
    when the relay has caught up (and cheap: no event is read)."""
    return max(0, outbox.last_seq(state) - sub.cursor)


def lag_s(state: State, sub: Subscription, now_ms: int) -> float:
    """Age at `now_ms` of the oldest event the subscription takes that is
    not yet published (or parked); 0 when there is none."""
    return age_s(oldest_undelivered_at_ms(state, sub), now_ms)


def age_s(oldest_ms: int | None, now_ms: int) -> float:
    """Seconds from `oldest_ms` to `now_ms`, never negative; 0 for none."""
    return 0.0 if oldest_ms is None else max(0.0, (now_ms - oldest_ms) / 1000)


class RelayStatus:
    """The relays' in-memory figures while this node leads."""

    def __init__(self, node: StateView) -> None:
        self.node = node
        self.metrics = node.metrics
        # subscription id -> whether its relay's last attempt reached the
        # broker or receiver; none until it tried in this term.
        self._reached: dict[str, bool] = {}
        node.metrics.sample_together(
            (families.SINK_LAG_EVENTS, families.SINK_LAG_SECONDS, families.SINK_CONNECTED),
            self._samples,
        )

    # -- told by the relays -------------------------------------------------------

    def attempted(self, sub_id: str, reached: bool) -> None:
        self._reached[sub_id] = reached

    def published(self, sub_id: str, kind: str, count: int = 1) -> None:
        self.metrics.sink_published.labels(sub_id, kind).inc(count)

    def retried(self, sub_id: str, kind: str) -> None:
        self.metrics.sink_retried.labels(sub_id, kind).inc()

    def parked(self, sub_id: str, kind: str) -> None:
        self.metrics.sink_parked.labels(sub_id, kind).inc()

    def forget(self, sub_id: str | None = None) -> None:
        """One subscription's (deleted), or every one's (leadership lost)."""
        if sub_id is None:
            self._reached.clear()
        else:
            self._reached.pop(sub_id, None)

    # -- read -------------------------------------------------------------------

    def connected(self, sub_id: str) -> bool | None:
        """Whether the relay's last attempt reached its broker or receiver;
        None while this node does not lead or its relay has not tried yet."""
        if not self.node.is_leader:
            return None
        return self._reached.get(sub_id)

    def _samples(self) -> dict[str, Samples]:
        if not self.node.is_leader:
            return {}
        now_ms = self.node.now_ms()
        events: list[tuple[LabelValues, float]] = []
        ages: list[tuple[LabelValues, float]] = []
        connected: list[tuple[LabelValues, float]] = []
        with self.node.reading() as state:
            for sub in subscriptions(state).values():
                labels = (sub.id, sink_kind(sub.sink))
                events.append((labels, float(lag_events(state, sub))))
                ages.append((labels, lag_s(state, sub, now_ms)))
                reached = self._reached.get(sub.id)
                if reached is not None:
                    connected.append((labels, 1.0 if reached else 0.0))
        return {
            families.SINK_LAG_EVENTS.name: events,
            families.SINK_LAG_SECONDS.name: ages,
            families.SINK_CONNECTED.name: connected,
        }
