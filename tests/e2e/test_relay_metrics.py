"""The relays' operations view (docs/relays.md, section 5) on real processes:
a 3-node cluster relays to Debian's `redis-server` and to a webhook
receiver, and its leader's /metrics follows them: `published` grows, the
lag returns to 0; Redis stopped, `connected` drops to 0 while `retried` and
the lag in seconds grow, and nothing is parked; Redis back, `connected` is
1 and the lag 0 again. The subscription views say the same, and the page
passes `promtool check metrics`. Then a node whose Python cannot import the
Redis client (a `sitecustomize` on its PYTHONPATH blocks the module, as on
a host without the `redis` extra) names the subscription on /v1/cluster
(`sinks_unavailable`), relays nothing and parks nothing, until it runs
with the library again (docs/relays.md, section 1)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from e2e_support import cluster_env, webhook_receiver
from prometheus_client.parser import text_string_to_metric_families
from redis_support import RedisServer

from raftsched.client import Client
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.testing import LocalCluster, http_json, metrics_text

PASSWORD = "r3dis-pw"
SECRET = "hook-secret"
STREAM = "ops:events"
RELAY_ENV = {
    "RAFTSCHED_WEBHOOK_TIMEOUT_S": "1",
    "RAFTSCHED_WEBHOOK_BACKOFF_S": "0.05",
    "RAFTSCHED_WEBHOOK_BACKOFF_MAX_S": "0.5",
    "RAFTSCHED_WEBHOOK_MAX_ATTEMPTS": "4",
}
GAUGES = ("raftsched_sink_lag_events", "raftsched_sink_lag_seconds", "raftsched_sink_connected")
COUNTERS = (
    "raftsched_sink_published_total",
    "raftsched_sink_retried_total",
    "raftsched_sink_parked_total",
)
REDIS, HOOK = ("sub_redis", "redis"), ("sub_hook", "webhook")
# A host without the `redis` extra: `import redis` fails (ImportError) and
# importlib finds no such module, in every process this runs in.
NO_REDIS = """import sys

sys.modules["redis"] = None
"""

Key = tuple[str, str]  # (subscription, sink)


@pytest.fixture
def redis_server(redis_server_binary: str, tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(redis_server_binary, tmp_path / "redis", PASSWORD)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Figures:
    """One scrape of every live node: the sink gauges of the node that said
    it leads (in the same page), every node's sink counters summed, and
    which nodes exported any sink gauge."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.gauges: dict[str, dict[Key, float]] = {name: {} for name in GAUGES}
        self.counters: dict[str, dict[Key, float]] = {name: {} for name in COUNTERS}
        self.with_gauges: set[str] = set()
        self.leaders: set[str] = set()
        self.pages: dict[str, str] = {}
        for node_id, node in cluster.nodes.items():
            if not node.alive:
                continue
            page = self.pages[node_id] = metrics_text(node.http_url)
            for family in text_string_to_metric_families(page):
                for sample in family.samples:
                    if sample.name == "raftsched_raft_is_leader" and sample.value == 1:
                        self.leaders.add(node_id)
                    key = (sample.labels.get("subscription", ""), sample.labels.get("sink", ""))
                    if sample.name in self.gauges:
                        self.gauges[sample.name][key] = sample.value
                        self.with_gauges.add(node_id)
                    elif sample.name in self.counters:
                        totals = self.counters[sample.name]
                        totals[key] = totals.get(key, 0.0) + sample.value

    def gauge(self, name: str, key: Key) -> float | None:
        return self.gauges[f"raftsched_sink_{name}"].get(key)

    def count(self, name: str, key: Key) -> float:
        return self.counters[f"raftsched_sink_{name}_total"].get(key, 0.0)


def _until(
    cluster: LocalCluster, holds: Callable[[Figures], bool], what: str, timeout_s: float = 60
) -> Figures:
    deadline = time.monotonic() + timeout_s
    while True:
        figures = Figures(cluster)
        if holds(figures):
            return figures
        assert time.monotonic() < deadline, f"timed out: {what}; last: {figures.gauges}"
        time.sleep(0.3)


def _caught_up(key: Key, published: int) -> Callable[[Figures], bool]:
    def holds(figures: Figures) -> bool:
        return (
            figures.count("published", key) >= published
            and figures.gauge("lag_events", key) == 0
            and figures.gauge("lag_seconds", key) == 0
            and figures.gauge("connected", key) == 1
        )

    return holds


def _cancel_jobs(client: Client, count: int, tag: str) -> None:
    """`count` job.cancelled events."""
    for index in range(count):
        job = client.submit("relay-ops", {"n": index}, idempotency_key=f"{tag}:{index}")
        client.cancel_job(job["id"])


def _wait_for_version(client: Client) -> None:
    deadline = time.monotonic() + 60
    while client.cluster().get("cluster_version") != COMMAND_VERSION_MAX:
        assert time.monotonic() < deadline, "the cluster version gate did not open"
        time.sleep(0.2)


@pytest.mark.slow
def test_the_sink_metrics_follow_a_redis_relay_and_a_webhook(
    tmp_path: Path, redis_server: RedisServer, promtool: str
) -> None:
    cluster = LocalCluster(tmp_path / "cluster", size=3, env={**cluster_env(), **RELAY_ENV})
    cluster.start()
    try:
        cluster.wait_for_leader(timeout_s=30)
        with (
            Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client,
            webhook_receiver(SECRET) as receiver,
        ):
            _wait_for_version(client)
            sink = {"kind": "redis", "url": redis_server.url, "stream": STREAM}
            client.create_broker_subscription(sink, ["job.cancelled"], subscription_id="sub_redis")
            client.create_subscription(
                receiver.url, SECRET, ["job.cancelled"], subscription_id="sub_hook"
            )
            _cancel_jobs(client, 10, "up")
            figures = _until(
                cluster,
                lambda f: _caught_up(REDIS, 10)(f) and _caught_up(HOOK, 10)(f),
                "both relays caught up",
            )
            # The gauges are the leader's alone; nothing was retried or parked.
            assert figures.with_gauges == figures.leaders and len(figures.leaders) == 1
            assert figures.count("retried", REDIS) == figures.count("parked", REDIS) == 0
            assert len(redis_server.client().xrange(STREAM)) >= 10
            leader = figures.leaders.pop()
            checked = subprocess.run(
                [promtool, "check", "metrics"],
                input=figures.pages[leader].encode(),
                capture_output=True,
                timeout=30,
            )
            findings = (checked.stdout + checked.stderr).decode()
            assert checked.returncode == 0 and findings == "", findings

            redis_server.stop()  # the broker goes away; the webhook stays
            _cancel_jobs(client, 3, "down")
            down = _until(
                cluster,
                lambda f: (
                    f.gauge("connected", REDIS) == 0
                    and f.count("retried", REDIS) > 0
                    and (f.gauge("lag_events", REDIS) or 0) >= 3
                    and (f.gauge("lag_seconds", REDIS) or 0) > 0
                    and _caught_up(HOOK, 13)(f)
                ),
                "the redis relay to see its broker gone",
            )
            time.sleep(1.5)
            later = Figures(cluster)
            assert later.count("retried", REDIS) > down.count("retried", REDIS)
            assert (later.gauge("lag_seconds", REDIS) or 0) > (
                down.gauge("lag_seconds", REDIS) or 0
            )
            assert later.gauge("connected", REDIS) == 0
            assert later.count("parked", REDIS) == 0  # unreachable never parks
            views = {sub["id"]: sub for sub in client.list_subscriptions()}
            assert views["sub_redis"]["connected"] is False
            assert views["sub_redis"]["lag_events"] >= 3 and views["sub_redis"]["lag_s"] > 0
            assert views["sub_redis"]["sink"]["url"].endswith(
                f"***@127.0.0.1:{redis_server.port}/0"
            )
            assert views["sub_hook"]["connected"] is True
            assert views["sub_hook"]["lag_events"] == 0 and views["sub_hook"]["lag_s"] == 0
            assert PASSWORD not in json.dumps(views)

            redis_server.start()  # back: the relay reconnects and catches up
            _until(cluster, _caught_up(REDIS, 13), "the redis relay to catch up", 90)
            view = client.get_subscription("sub_redis")
            assert view["connected"] is True and view["lag_events"] == 0
            assert view["parked_count"] == 0
        assert len(receiver.arrivals) >= 13
    finally:
        cluster.stop()


@pytest.mark.slow
@pytest.mark.expect_log_errors(
    "relay cannot publish: this node lacks the sink's client library",
    reason="the node is run without the redis client library on purpose",
)
def test_a_node_without_the_sinks_library_names_it_on_the_cluster_view(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    cluster = LocalCluster(tmp_path / "cluster", size=1, env={**cluster_env(), **RELAY_ENV})
    cluster.start()
    try:
        cluster.wait_for_leader(timeout_s=30)
        url = cluster.nodes["n1"].http_url
        with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
            _wait_for_version(client)
            sink = {"kind": "redis", "url": redis_server.url, "stream": STREAM}
            client.create_broker_subscription(sink, ["job.cancelled"], subscription_id="sub_redis")
            assert client.cluster()["sinks_unavailable"] == []

        blocker = tmp_path / "no-redis"
        blocker.mkdir()
        (blocker / "sitecustomize.py").write_text(NO_REDIS)
        paths = [str(blocker), cluster.env["PYTHONPATH"]]
        cluster.nodes["n1"].env["PYTHONPATH"] = os.pathsep.join(paths)
        cluster.kill("n1", signal.SIGTERM)
        cluster.start("n1")
        cluster.wait_for_leader(timeout_s=30)
        with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
            assert client.cluster()["sinks_unavailable"] == [
                {"subscription": "sub_redis", "kind": "redis", "extra": "redis"}
            ]
            status, refused, _ = http_json(
                "POST", f"{url}/v1/subscriptions", {"id": "sub_more", "sink": sink}, 10
            )
            assert status == 422 and refused["error"]["code"] == "sink_unavailable", refused
            _cancel_jobs(client, 2, "blocked")
            figures = _until(
                cluster,
                lambda f: f.gauge("connected", REDIS) == 0 and f.gauge("lag_events", REDIS) == 2,
                "the relay to report its broker out of reach",
            )
            assert figures.count("retried", REDIS) == figures.count("parked", REDIS) == 0
            view = client.get_subscription("sub_redis")
            assert view["connected"] is False and view["parked_count"] == 0
        assert redis_server.client().xrange(STREAM) == []
        told = cluster.nodes["n1"].log_path.read_text().count("lacks the sink's client library")
        assert told == 1  # once, at error level (expected above), however long it waits

        del cluster.nodes["n1"].env["PYTHONPATH"]  # the library installed again
        cluster.kill("n1", signal.SIGTERM)
        cluster.start("n1")
        cluster.wait_for_leader(timeout_s=30)
        _until(cluster, _caught_up(REDIS, 2), "the relay to publish with its library")
        with Client(cluster.urls, timeout_s=10, retry_budget_s=30) as client:
            assert client.cluster()["sinks_unavailable"] == []
        entries = redis_server.client().xrange(STREAM)
        assert [fields[b"type"] for _, fields in entries] == [b"job.cancelled"] * 2
    finally:
        cluster.stop()
