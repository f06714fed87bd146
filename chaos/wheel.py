"""Far-future jobs in the campaign: the time wheel (issue 19).

Once the cluster version is at least 7 (`WHEEL_VERSION`; at once on a new
cluster, after the last upgrade in a mixed-version run) the harness sets a
short horizon and narrow buckets (`PUT /v1/wheel`, recorded as
`configure_wheel`), so that the clients' far jobs (chaos/workload.py: a
share of the submits carry a `delay_s` in `FAR_DELAY_S`) are packed when
they are submitted and hydrated by the replicated Tick before they come due
within the run. The existing checkers then cover them: every acknowledged
job final, run at most once, fenced.

While it runs it polls every member's `GET /v1/debug/digest` once a second
and notes the most packed jobs any node held (`packed`), for the summary
(`wheel.packed_jobs_max`): a run whose far jobs were never packed shows 0.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from chaos import membership
from chaos.cluster import NsCluster
from chaos.history import Recorder
from chaos.httpops import Session, recorded_call

WHEEL_VERSION = 7
HORIZON_S = 4.0
BUCKET_S = 2.0
"""A job is packed when its bucket starts more than `HORIZON_S` ahead: with
2-second buckets, any delay above 6 s. The minimums the wheel accepts
(horizon 0, bucket 1 s) are below these."""
FAR_DELAY_S = (10.0, 30.0)
"""Beyond the horizon, yet due well within the fault phase or the recovery
bound (60 s by default) even for a job submitted at the phase's end."""
POLL_S = 1.0


class WheelWatch(threading.Thread):
    def __init__(self, cluster: NsCluster, history: Recorder, stop: threading.Event) -> None:
        super().__init__(name="wheel", daemon=True)
        self.cluster, self.history, self.stop_event = cluster, history, stop
        self.configured = False
        self.packed_max = 0

    def run(self) -> None:
        while not self.stop_event.wait(POLL_S):
            if not self.configured:
                self.configured = self._configure()
            self._poll()

    def _configure(self) -> bool:
        version = membership.cluster_version(self.cluster, wait_s=2.0)
        if version is None or version < WHEEL_VERSION:
            return False
        session = Session(self.cluster.member_urls())
        body = {"horizon_s": HORIZON_S, "bucket_s": BUCKET_S}
        outcome = recorded_call(
            self.history, session, "configure_wheel", "PUT", "/v1/wheel", body, idempotent=True
        )
        return outcome.kind == "ok"

    def _poll(self) -> None:
        for url in self.cluster.member_urls():
            outcome = Session([url]).call("GET", "/v1/debug/digest", idempotent=True, budget_s=1.0)
            if outcome.kind != "ok":
                continue
            packed = int(outcome.body.get("packed_jobs") or 0)
            if packed > self.packed_max:
                self.packed_max = packed
                self.history.note("packed", {"url": url, "packed_jobs": packed, "t": time.time()})


def summary(ops: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    """For the campaign's summary: whether the wheel was configured, the far
    jobs acknowledged and the most packed jobs a node held at once."""
    far_acked = sum(
        1
        for op in ops
        if op["f"] == "submit"
        and op["type"] == "ok"
        and "delay_s" in (op["args"].get("body") or {})
    )
    packed = [
        int(event["value"]["packed_jobs"])
        for event in events
        if event["type"] == "note" and event["f"] == "packed"
    ]
    return {
        "configured": any(op["f"] == "configure_wheel" and op["type"] == "ok" for op in ops),
        "far_jobs_acked": far_acked,
        "packed_jobs_max": max(packed, default=0),
    }
