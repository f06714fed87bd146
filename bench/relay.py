"""How fast a relay drains a backlog, per sink (docs/relays.md): a webhook
receiver on loopback, and the real brokers the relay tests start (Debian's
redis-server, nats-server with JetStream, rabbitmq-server, through the test
drivers in tests/e2e).

A 3-node cluster on loopback. For each sink in turn (ROUNDS rounds,
interleaved, so that the machine's drift falls on every sink alike): the
sink is made unavailable (the broker stopped; the webhook receiver answers
503), a subscription to `job.cancelled` is created, EVENTS jobs are
submitted and cancelled (one event each), the sink comes back, and the
time from then until the subscription's replicated cursor reaches the
newest event is the drain. The relay publishes what waited in batches of
up to 64 events, one `AckDelivery` per batch: a broker confirms each
message before the next (order per key), a webhook takes 8 POSTs at once.

    .venv/bin/python bench/relay.py            # about 2 minutes
    .venv/bin/python bench/relay.py --quick    # under a minute

The last line is one JSON object: per sink, `events_per_s` (the median of
its rounds) and `rounds` (each round's events/s), and
`<sink>_over_webhook`, the ratio of its median to the webhook's. A sink
whose server is not installed is left out and named under `skipped`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))  # the brokers' test drivers

from raftsched.client import AsyncClient, Client  # noqa: E402
from raftsched.testing import LocalCluster  # noqa: E402

PASSWORD = "bench-relay-pw"
ENV = {
    "RAFTSCHED_WEBHOOK_TIMEOUT_S": "2",
    "RAFTSCHED_WEBHOOK_BACKOFF_S": "0.05",
    "RAFTSCHED_WEBHOOK_BACKOFF_MAX_S": "0.2",
    # The webhook receiver's 503s while it is "down" must not park anything.
    "RAFTSCHED_WEBHOOK_MAX_ATTEMPTS": "100000",
}


class Receiver:
    """A webhook receiver on loopback that answers 503 while `down`."""

    def __init__(self) -> None:
        self.down = False
        self.received = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        async def hook(request: web.Request) -> web.Response:
            await request.read()
            if self.down:
                return web.Response(status=503)
            self.received += 1
            return web.Response(status=204)

        app = web.Application()
        app.router.add_post("/hook", hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def _brokers(root: Path) -> tuple[dict[str, Callable[[], Any]], list[str]]:
    """sink kind -> a maker of its started driver; and the kinds skipped."""
    found: dict[str, Callable[[], Any]] = {}
    skipped: list[str] = []
    redis_bin = shutil.which("redis-server")
    nats_bin = shutil.which("nats-server") or _exists("/usr/sbin/nats-server")
    rabbit_bin = _exists("/usr/lib/rabbitmq/bin/rabbitmq-server")
    if redis_bin:
        from redis_support import RedisServer

        found["redis"] = lambda: RedisServer(redis_bin, root / "redis", PASSWORD)
    else:
        skipped.append("redis")
    if nats_bin:
        from nats_support import NatsServer

        found["nats"] = lambda: NatsServer(nats_bin, root / "nats", PASSWORD)
    else:
        skipped.append("nats")
    if rabbit_bin and shutil.which("epmd"):
        from rabbitmq_support import RabbitMQServer

        found["rabbitmq"] = lambda: RabbitMQServer(rabbit_bin, root / "rabbitmq", PASSWORD)
    else:
        skipped.append("rabbitmq")
    return found, skipped


def _exists(path: str) -> str | None:
    return path if Path(path).exists() else None


async def _backlog(urls: list[str], token: str, events: int, tag: str) -> None:
    """`events` jobs submitted in batches, then cancelled, 32 at a time."""
    async with AsyncClient(urls, timeout_s=30, retry_budget_s=60, token=token) as client:
        ids: list[str] = []
        for start in range(0, events, 500):
            batch = [
                {"queue": "bench-relay", "payload": {"payment_id": f"p{n % 16}", "n": n}}
                for n in range(start, min(events, start + 500))
            ]
            ids += [item["job"]["id"] for item in await client.submit_batch(batch)]
        gate = asyncio.Semaphore(32)

        async def cancel(job_id: str) -> None:
            async with gate:
                await client.cancel_job(job_id, f"bench {tag}")

        await asyncio.gather(*(cancel(job_id) for job_id in ids))


def _drain(cluster: LocalCluster, sub_id: str, timeout_s: float = 300) -> float:
    """Seconds until the subscription's cursor reaches the newest event."""
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30, token=cluster.admin_token) as client:
        newest = client.events(0, limit=1)["last_seq"]
        began = time.monotonic()
        while True:
            cursor = client.get_subscription(sub_id)["cursor_seq"]
            if cursor >= newest:
                return time.monotonic() - began
            if time.monotonic() - began > timeout_s:
                raise RuntimeError(f"{sub_id}: cursor {cursor} < {newest} after {timeout_s} s")
            time.sleep(0.02)


def _round(
    cluster: LocalCluster, kind: str, make: Callable[[], Any] | None, events: int, n: int
) -> float:
    sub_id = f"sub_{kind}_{n}"
    with Client(cluster.urls, timeout_s=10, retry_budget_s=30, token=cluster.admin_token) as client:
        if kind == "webhook":
            receiver = Receiver()
            loop = asyncio.new_event_loop()
            loop.run_until_complete(receiver.start())
            import threading

            thread = threading.Thread(target=loop.run_forever, daemon=True)
            thread.start()
            receiver.down = True
            client.create_subscription(
                f"http://127.0.0.1:{receiver.port}/hook",
                "bench-secret",
                ["job.cancelled"],
                subscription_id=sub_id,
            )
            asyncio.run(_backlog(cluster.urls, cluster.admin_token, events, sub_id))
            receiver.down = False
            try:
                return _drain(cluster, sub_id)
            finally:
                client.delete_subscription(sub_id)
                asyncio.run_coroutine_threadsafe(receiver.stop(), loop).result(30)
                loop.call_soon_threadsafe(loop.stop)
                thread.join(10)
        assert make is not None
        broker = make()
        broker.start()
        try:
            destination = f"bench.{kind}.{n}"
            broker.prepare(destination)
            client.create_broker_subscription(
                broker.sink(destination),
                ["job.cancelled"],
                subscription_id=sub_id,
                key_field="payment_id",
            )
            broker.stop()
            asyncio.run(_backlog(cluster.urls, cluster.admin_token, events, sub_id))
            broker.start()
            seconds = _drain(cluster, sub_id)
            kept = {message.id for message in broker.received(destination)}
            assert len(kept) >= events, f"{kind}: {len(kept)} of {events} events kept"
            client.delete_subscription(sub_id)
            return seconds
        finally:
            broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer events and rounds")
    args = parser.parse_args()
    events, rounds = (1000, 1) if args.quick else (3000, 3)
    with tempfile.TemporaryDirectory(prefix="rsbench-relay-") as tmp:
        root = Path(tmp)
        makers, skipped = _brokers(root)
        cluster = LocalCluster(root / "cluster", size=3, env=ENV)
        cluster.start()
        results: dict[str, list[float]] = {"webhook": [], **{kind: [] for kind in makers}}
        try:
            cluster.wait_for_leader(timeout_s=30)
            cluster.wait_for_auth(timeout_s=30)
            for n in range(rounds):
                for kind in results:
                    seconds = _round(cluster, kind, makers.get(kind), events, n)
                    results[kind].append(events / seconds)
                    print(f"round {n} {kind}: {events} events in {seconds:.2f} s", flush=True)
        finally:
            cluster.stop()
    summary: dict[str, Any] = {"events": events, "rounds": rounds, "skipped": skipped}
    for kind, rates in results.items():
        summary[kind] = {
            "events_per_s": round(statistics.median(rates), 1),
            "rounds": [round(rate, 1) for rate in rates],
        }
    base = summary["webhook"]["events_per_s"]
    for kind in makers:
        summary[f"{kind}_over_webhook"] = round(summary[kind]["events_per_s"] / base, 3)
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
