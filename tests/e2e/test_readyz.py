"""`/readyz` under load: a healthy replica stays ready.

The leader announces a commit before it applies the entry, and a follower
applies just after it hears of one, so under a steady write load a replica's
applied index trails the commit index it knows by an entry for a few
milliseconds at a time. Readiness that compared the two at one instant
flapped to 503 on a perfectly healthy leader (the API fuzzer caught it); a
probe or load balancer would then take the node out. `/readyz` waits up to
`READY_CATCH_UP_S` for the replica to apply what was committed when the
request arrived, and only a replica that cannot is not ready.
"""

from __future__ import annotations

import threading
import time

from raftsched.client import Client
from raftsched.testing import LocalCluster, http_json

BATCHES = 12
BATCH_JOBS = 500


def test_every_node_stays_ready_under_a_batch_load(cluster: LocalCluster) -> None:
    cluster.wait_for_leader(timeout_s=30)
    deadline = time.monotonic() + 30
    for node in cluster.nodes.values():  # every follower has heard of the leader
        while http_json("GET", node.http_url + "/readyz")[0] != 200:
            assert time.monotonic() < deadline, f"{node.id} never became ready"
            time.sleep(0.05)
    stop = threading.Event()

    def load() -> None:
        with Client(cluster.urls, timeout_s=30, retry_budget_s=30) as client:
            for _ in range(BATCHES):
                if stop.is_set():
                    return
                jobs = [
                    {"queue": "ready-load", "payload": {"pad": "x" * 400, "n": n}}
                    for n in range(BATCH_JOBS)
                ]
                client.submit_batch(jobs)

    loaders = [threading.Thread(target=load) for _ in range(2)]
    for thread in loaders:
        thread.start()
    answers: list[tuple[str, int, dict[str, object]]] = []
    try:
        deadline = time.monotonic() + 60
        while any(t.is_alive() for t in loaders) and time.monotonic() < deadline:
            for node in cluster.nodes.values():
                status, body, _ = http_json("GET", node.http_url + "/readyz", timeout_s=5)
                answers.append((node.id, status, body))
    finally:
        stop.set()
        for thread in loaders:
            thread.join(timeout=60)
    not_ready = [answer for answer in answers if answer[1] != 200]
    assert len(answers) > 30, "the load ended before readiness was probed"
    assert not_ready == [], f"{len(not_ready)} of {len(answers)} probes not ready: {not_ready[:5]}"
