"""`python -m chaos` / `make chaos`: run one seeded campaign and check it.

Order of events: build the network and start the cluster; start the sink,
the webhook receiver, the relay's redis-server (chaos/broker.py) and the
payment provider; set the features up (subscription, tenant limit,
schedules: chaos/features.py) and, at cluster version 10, the broker
subscription (chaos/relay.py); start the
workers, the clients, the workflow submitter, the payments (which wait
for cluster version 5: chaos/payments.py) and the wheel watch (which gives
the time wheel a short horizon at cluster version 7, so that the clients'
far jobs are packed, and notes how many are: chaos/wheel.py); let the nemesis run its schedule
for `--duration` seconds (and the broker's restarts beside it); then heal
everything (partitions, pauses, dead nodes, clocks, the broker), stop the
clients and payments, pause the schedules, give
the cluster `--recovery-bound-s` to finish every job (payments and their
reconciliations included), workflow, webhook delivery and relay, stop the workers,
read the final state from every node, stop the nodes, run the checkers (the
eighth reads the node logs; the fifteenth, the provider's) and print the
summary -- its JSON is the last line. Checker 16 reads the Redis streams
(in final.json); without redis-server it is skipped, and the summary says so.
Everything is torn down on the way out, even on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from chaos import membership
from chaos import nemesis as nemesis_module
from chaos.broker import (
    BrokerNemesis,
    RedisBroker,
    broker_schedule,
    missing_reason,
    redis_server_binary,
)
from chaos.checkers import (
    FINAL_STATUSES,
    check_all,
    expected_log_errors_by_node,
    expected_log_errors_seen,
    node_logs_clean,
)
from chaos.cluster import REPO_ROOT, NsCluster, NsNode, build_fsync_shim
from chaos.features import Features
from chaos.history import Recorder, operations, read_events
from chaos.httpops import Session
from chaos.net import Network, ensure_tools, faketime_library
from chaos.payments import LOOKUP_UNAVAILABLE_P, PAYMENTS_QUEUE, POLICIES, Payments
from chaos.previous import Release, previous_release
from chaos.provider import Provider, read_provider_log
from chaos.receiver import WebhookReceiver, read_receiver_log
from chaos.relay import Relay, skipped_state
from chaos.sink import FencedSink, read_sink_log
from chaos.summary import render_text, summarize
from chaos.wheel import WheelWatch
from chaos.worker import QUEUE
from chaos.workload import Client
from raftsched import child_processes
from raftsched.core import COMMAND_VERSION_MAX
from raftsched.testing import LogError, read_log_errors

UNSAFE_ENV = "RAFTSCHED_UNSAFE_IGNORE_FENCING"
# Each node's own tmpfs when the schedule fills disks: room for a long
# campaign's journal and snapshots many times over; filled only by a fault.
TMPFS_SIZE = "256m"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    parser.add_argument("--duration", type=float, default=180.0, help="fault phase, seconds")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument(
        "--shards",
        type=int,
        default=1,
        help="data shards per node (`raftsched node --shards`, docs/shards.md); > 1 adds the "
        "shard-process faults to every other kind, membership changes included",
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--client-rate", type=float, default=2.0, help="ops/s per client")
    parser.add_argument(
        "--flow-p", type=float, default=0.15, help="share of submits under the limited tenant"
    )
    parser.add_argument(
        "--far-p",
        type=float,
        default=0.25,
        help="share of the other submits due 10-30 s later, packed by the time wheel",
    )
    parser.add_argument(
        "--webhook-refuse-p", type=float, default=0.1, help="receiver answers 503 on purpose"
    )
    parser.add_argument("--lease-s", type=float, default=2.0)
    parser.add_argument("--stall-p", type=float, default=0.05, help="worker stalls per lease")
    parser.add_argument("--recovery-bound-s", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=None, help="run directory")
    parser.add_argument(
        "--no-relay",
        action="store_true",
        help="no broker relay (redis-server, its subscription, its restarts); checker 16 is "
        "then skipped, as it is when redis-server is not installed",
    )
    parser.add_argument(
        "--mixed-version",
        action="store_true",
        help="a majority of the nodes start on the previous release (v0.10.0, built in its own "
        "virtualenv) and are upgraded one at a time in the first part of the run",
    )
    parser.add_argument(
        "--unsafe-ignore-fencing",
        action="store_true",
        help="NEGATIVE CONTROL: nodes accept stale fencing tokens; the run must fail",
    )
    parser.add_argument(
        "--payments-policy",
        choices=POLICIES,
        default="reconcile",
        help="the payments queue's on_unknown; `retry` is a NEGATIVE CONTROL: payments whose "
        "worker died after charging are charged again, and checker 15 must catch it",
    )
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 1_000_000)
    if args.out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        args.out = REPO_ROOT / "runs" / "chaos" / f"{stamp}-seed{args.seed}"
    return args


class WorkerPool:
    """The chaos worker processes. A worker that exits during the run (a
    payment's crash window makes it SIGKILL itself) is restarted as a new
    incarnation `w<i>-<n>` with a history of its own, so operation ids stay
    unique; each exit is noted (`worker_exit`) in history-workers.jsonl."""

    def __init__(
        self, args: argparse.Namespace, urls: list[str], sink_url: str, provider_url: str
    ) -> None:
        self.args, self.urls = args, urls
        self.sink_url, self.provider_url = sink_url, provider_url
        self.processes: list[subprocess.Popen[bytes]] = []
        self.incarnations: list[int] = []
        self.paused: set[int] = set()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.history = Recorder(Path(args.out) / "history-workers.jsonl", "workers")
        self.supervisor = threading.Thread(target=self._supervise, name="workers", daemon=True)

    @staticmethod
    def name(index: int, incarnation: int) -> str:
        return f"w{index}" if incarnation == 0 else f"w{index}-{incarnation}"

    def start(self) -> None:
        for index in range(self.args.workers):
            self.incarnations.append(0)
            self.processes.append(self._spawn(index, 0))
        self.supervisor.start()

    def _spawn(self, index: int, incarnation: int) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
        name = self.name(index, incarnation)
        out = Path(self.args.out)
        command = [sys.executable, "-m", "chaos.worker", "--id", name]
        command += ["--urls", ",".join(self.urls), "--sink", self.sink_url]
        command += ["--provider", self.provider_url]
        command += ["--history", str(out / f"history-{name}.jsonl")]
        command += ["--lease-s", str(self.args.lease_s), "--stall-p", str(self.args.stall_p)]
        command += ["--seed", str(self.args.seed * 100 + index + 7919 * incarnation)]
        command += ["--shards", str(self.args.shards)]
        log = (out / f"w{index}.log").open("ab")
        try:
            return child_processes.popen(command, env=env, stdout=log, stderr=log)
        finally:
            log.close()

    def _supervise(self) -> None:
        while not self.stopping.wait(0.2):
            with self.lock:
                if self.stopping.is_set():
                    return
                for index, process in enumerate(self.processes):
                    code = process.poll()
                    if code is None:
                        continue
                    name = self.name(index, self.incarnations[index])
                    self.history.note(
                        "worker_exit",
                        {"worker": name, "code": code, "expected": code == -signal.SIGKILL},
                    )
                    self.paused.discard(index)
                    self.incarnations[index] += 1
                    self.processes[index] = self._spawn(index, self.incarnations[index])

    def pause(self, index: int, paused: bool) -> None:
        with self.lock:
            process = self.processes[index]
            if process.poll() is not None:
                return
            process.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)
            (self.paused.add if paused else self.paused.discard)(index)

    def resume_all(self) -> None:
        for index in list(self.paused):
            self.pause(index, False)

    def stop(self) -> None:
        with self.lock:
            self.stopping.set()
        self.resume_all()
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


class Monitor(threading.Thread):
    """Notes the leader and term every half second (for leader changes), and
    every node exit (chaos.nemesis.note_exits)."""

    def __init__(self, cluster: NsCluster, history: Recorder) -> None:
        super().__init__(name="monitor", daemon=True)
        self.cluster, self.history = cluster, history
        self.stop_event = threading.Event()

    def run(self) -> None:
        last: tuple[str, int] | None = None
        shard_leaders: dict[int, str | None] = {}
        while not self.stop_event.wait(0.5):
            nemesis_module.note_exits(self.cluster, self.history)
            if self.cluster.shards > 1:
                self._note_shard_leaders(shard_leaders)
            for node in list(self.cluster.nodes):
                view = self.cluster.cluster_view(node, timeout_s=0.5)
                if view and view.get("leader") and view["leader"]["id"] == node:
                    seen = (node, int(view["term"]))
                    if seen != last:
                        self.history.note("leader", {"node": node, "term": seen[1]})
                        last = seen
                    break

    def _note_shard_leaders(self, last: dict[int, str | None]) -> None:
        """`shard_leader` notes: each shard k >= 1's leader when it changes,
        as the first serving node that names one sees it."""
        for node in self.cluster.members():
            if not node.serving:
                continue
            views = self.cluster.cluster_view(node.id, timeout_s=0.5)
            if views is None:
                continue
            for view in views.get("shards") or []:
                shard, leader = int(view["shard"]), (view.get("leader") or {}).get("id")
                if shard >= 1 and leader is not None and last.get(shard) != leader:
                    self.history.note("shard_leader", {"shard": shard, "node": leader})
                    last[shard] = leader
            return


def list_jobs(base: str, stale: bool) -> list[dict[str, Any]]:
    """Every job of the chaos and payments queues from one node (all pages)."""
    jobs: list[dict[str, Any]] = []
    session = Session([base])
    for queue in (QUEUE, PAYMENTS_QUEUE):
        cursor: str | None = None
        while True:
            query = f"queue={queue}&limit=1000" + (f"&cursor={cursor}" if cursor else "")
            query += "&consistency=stale" if stale else ""
            outcome = session.call("GET", f"/v1/jobs?{query}", idempotent=True, budget_s=20)
            if outcome.kind != "ok":
                raise RuntimeError(f"listing jobs from {base} failed: {outcome}")
            jobs.extend(outcome.body["jobs"])
            cursor = outcome.body.get("next_cursor")
            if not cursor:
                break
    return jobs


def wait_recovered(
    cluster: NsCluster,
    acked: list[str],
    bound_s: float,
    features: Features,
    relay: Relay | None = None,
) -> tuple[float | None, list[str]]:
    """Seconds until every acknowledged job, and every job the cluster made
    (schedule occurrences, workflow steps, submits whose answer was lost), is
    final, every workflow finished and every event delivered, to the webhook
    and by the broker relay (None if not within the bound); and the jobs
    still not final then."""
    started = time.monotonic()
    pending = set(acked)
    while time.monotonic() - started < bound_s:
        try:
            jobs = list_jobs(cluster.member_urls()[0], stale=False)
        except RuntimeError:
            time.sleep(1)
            continue
        status = {job["id"]: job["status"] for job in jobs}
        pending = {job_id for job_id in pending if status.get(job_id) not in FINAL_STATUSES}
        pending |= {job_id for job_id, now in status.items() if now not in FINAL_STATUSES}
        drained = not features.backlog() and not (relay is not None and relay.backlog())
        if not pending and drained and membership.settled(cluster):
            return time.monotonic() - started, []
        time.sleep(1)
    return None, sorted(pending)


def read_final(
    cluster: NsCluster,
    features: Features,
    payments: Payments,
    relay: Relay | None = None,
    relay_skipped: str | None = None,
    settle_s: float = 30.0,
) -> dict[str, Any]:
    """Linearizable reads first (each commits a barrier entry), then the
    replicas' digests once they stopped moving, then their stale listings."""
    final: dict[str, Any] = {"nodes": {}, "unreachable": [], "effects": {}}
    final["jobs"] = list_jobs(cluster.member_urls()[0], stale=False)
    final |= features.read_state()
    # After the outbox: every event the streams hold is in it (nothing
    # makes events once recovery is over).
    final["relay"] = (
        relay.read_state(cluster.shards)
        if relay is not None
        else skipped_state(relay_skipped or "no relay")
    )
    paid = [job["id"] for job in final["jobs"] if job["queue"] == PAYMENTS_QUEUE]
    final["payments"] = payments.read_state(paid)
    session = Session(cluster.member_urls())
    for job in final["jobs"]:
        key = f"effect:{job['id']}"
        outcome = session.call("GET", f"/v1/effects/{key}", idempotent=True)
        final["effects"][key] = outcome.body.get("effect") if outcome.kind == "ok" else None
    digests = _settled_digests(cluster, settle_s)
    final["shards"] = cluster.shards
    if cluster.shards > 1:
        final["shard_digests"] = {
            str(shard): {node: list(pair) for node, pair in by_node.items()}
            for shard, by_node in _settled_shard_digests(cluster, settle_s).items()
        }
    final["membership"] = read_membership(cluster)
    for node in cluster.members():
        if node.id not in digests:
            final["unreachable"].append(node.id)
            continue
        applied_index, digest = digests[node.id]
        try:
            jobs = list_jobs(node.http_url, stale=True)
        except RuntimeError:
            final["unreachable"].append(node.id)
            continue
        final["nodes"][node.id] = {"digest": digest, "applied_index": applied_index, "jobs": jobs}
    return final


def _settled_digests(cluster: NsCluster, settle_s: float) -> dict[str, tuple[int, str]]:
    """node id -> (applied index, digest), polled until every node answers
    with the same pair or `settle_s` passes (then the last, differing, view)."""
    deadline = time.monotonic() + settle_s
    while True:
        digests = cluster.digests(timeout_s=5.0)
        members = len(cluster.members())
        settled = len(digests) == members and len(set(digests.values())) == 1
        if settled or time.monotonic() > deadline:
            return digests
        time.sleep(0.5)


def _settled_shard_digests(
    cluster: NsCluster, settle_s: float
) -> dict[int, dict[str, tuple[int, str]]]:
    """Every group's digests, polled until every group's are equal across
    the members (or `settle_s` passes: the last, differing, view)."""
    deadline = time.monotonic() + settle_s
    while True:
        found = cluster.shard_digests(timeout_s=5.0)
        members = len(cluster.members())
        settled = all(
            len(by_node) == members and len(set(by_node.values())) == 1
            for by_node in found.values()
        )
        if settled or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def wait_cluster_version(cluster: NsCluster, version: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = membership.cluster_version(cluster)
        if found is not None and found >= version:
            return
        time.sleep(0.5)
    print(f"warning: cluster version not {version} after {timeout_s} s", file=sys.stderr)


def read_membership(cluster: NsCluster) -> dict[str, Any]:
    """What each node that runs says of the membership (GET /v1/cluster:
    its nodes, `membership`, term), members and removed nodes alike; and
    which ids the harness holds to be members (for the record: the checker
    derives its own from the history)."""
    views: dict[str, Any] = {}
    shard_views: dict[str, dict[str, Any]] = {}
    for node in cluster.ns_nodes():
        if node.alive and not node.paused:
            if cluster.shards > 1:
                # Sharded, each group's own view too (checker 13 per shard).
                found = cluster.member_views(node.id, timeout_s=5.0)
                views[node.id] = found.pop("0")
                shard_views[node.id] = found
            else:
                views[node.id] = cluster.cluster_view(node.id, timeout_s=5.0)
    return {
        "views": views,
        **({"shard_views": shard_views} if cluster.shards > 1 else {}),
        "members": [node.id for node in cluster.members()],
        "removed": [node.id for node in cluster.ns_nodes() if node.removed],
    }


def wait_converged(cluster: NsCluster, timeout_s: float) -> None:
    try:
        cluster.wait_converged(timeout_s)
    except AssertionError as error:
        print(f"warning: {error}", file=sys.stderr)


def upgrades_for(args: argparse.Namespace) -> int:
    """How many members start on the previous release: a majority."""
    return int(args.nodes) // 2 + 1 if args.mixed_version else 0


def slots_for(args: argparse.Namespace, faults: list[nemesis_module.Fault]) -> int:
    """Every member at the start, and one fresh slot per node the schedule
    may add (ids are never reused)."""
    adds = sum(1 for f in faults if f.kind in nemesis_module.MEMBERSHIP_KINDS)
    return int(args.nodes) + adds + 1


def campaign(args: argparse.Namespace) -> dict[str, Any]:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    faults = nemesis_module.schedule(
        args.seed, args.duration, args.nodes, args.workers, args.lease_s, upgrades_for(args),
        shards=args.shards,
    )  # fmt: skip
    shards = f" x {args.shards} shards" if args.shards > 1 else ""
    print(
        f"chaos: seed {args.seed}, {args.nodes} nodes{shards}, {args.duration:.0f} s, run dir {out}"
    )
    print(f"chaos: fault schedule ({len(faults)} faults):")
    for fault in faults:
        print("  " + fault.describe())
    relay_skipped = "disabled with --no-relay" if args.no_relay else missing_reason()
    broker_faults = [] if relay_skipped else broker_schedule(args.seed, args.duration)
    if relay_skipped:
        message = f"chaos: RELAY SKIPPED: {relay_skipped}; checker 16 will judge nothing"
        print(message)
        print(message, file=sys.stderr)
    else:
        print(f"chaos: broker fault schedule ({len(broker_faults)} faults, beside the others):")
        for fault in broker_faults:
            print("  " + fault.describe())
    schedule_json = nemesis_module.schedule_json(faults + broker_faults)
    (out / "schedule.json").write_text(json.dumps(schedule_json, indent=1))
    sys.stdout.flush()
    ensure_tools()
    previous = previous_release() if args.mixed_version else None
    kinds = {fault.kind for fault in faults}
    fsync_shim = build_fsync_shim(out) if "fsync_fail" in kinds else None
    env = {UNSAFE_ENV: "1"} if args.unsafe_ignore_fencing else {}
    net = Network.create(slots_for(args, faults))
    cluster: NsCluster | None = None
    sink: FencedSink | None = None
    receiver: WebhookReceiver | None = None
    provider: Provider | None = None
    broker: RedisBroker | None = None
    relay: Relay | None = None
    broker_nemesis: BrokerNemesis | None = None
    workers: WorkerPool | None = None
    stop_clients = threading.Event()
    stop_wheel = threading.Event()
    try:
        cluster = NsCluster(
            out / "cluster", args.nodes, net, faketime_library(), env=env,
            fsync_shim=fsync_shim, tmpfs_size=TMPFS_SIZE if "disk_full" in kinds else None,
            shards=args.shards,
        )  # fmt: skip
        if previous is not None:
            for node in cluster.members()[: upgrades_for(args)]:
                run_previous(cluster, node, previous)
        # The cluster bootstraps this admin token; every client, worker and
        # checker of the run authenticates with it (chaos/httpops.py).
        os.environ["RAFTSCHED_TOKEN"] = cluster.admin_token
        urls = cluster.slot_urls()
        cluster.start()
        cluster.wait_for_leader(60)
        if args.shards > 1:
            # Every shard's leader, and every shard's identity recorded.
            cluster.wait_for_shards(120)
        sink = FencedSink(out / "sink.jsonl").start()
        secret = f"chaos-webhook-{args.seed}"
        receiver = WebhookReceiver(
            out / "webhooks.jsonl", net.host_ip, secret, args.webhook_refuse_p, args.seed
        ).start()
        features = Features(
            urls,
            Recorder(out / "history-f.jsonl", "f"),
            args.seed,
            receiver.url,
            secret,
            stop_clients,
        )
        features.setup()
        binary = redis_server_binary()
        if relay_skipped is None and binary is not None:
            # On the bridge's host address, beside the receiver: the nodes
            # reach it from their namespaces.
            password = f"chaos-relay-{args.seed}-{os.urandom(4).hex()}"
            broker = RedisBroker(out / "redis", net.host_ip, password, binary)
            broker.start()
            relay = Relay(
                urls,
                Recorder(out / "history-relay.jsonl", "relay"),
                args.seed,
                broker,
                stop_clients,
            )
        provider = Provider(out / "provider.jsonl", args.seed, LOOKUP_UNAVAILABLE_P).start()
        payments = Payments(
            urls,
            Recorder(out / "history-payments.jsonl", "payments"),
            args.seed,
            args.payments_policy,
            stop_clients,
        )
        if previous is None:
            # A new cluster runs at cluster version 1 until its leader has
            # polled every member (every 5 s) and raised it; membership
            # changes need 4. The fault phase starts on a settled cluster
            # (the mixed-version phase starts below 4 on purpose).
            wait_cluster_version(cluster, COMMAND_VERSION_MAX, 60)
            if relay is not None and not relay.enable() and relay.refused is None:
                relay.refused = {"why": "not created within 60 s on a settled cluster"}
        elif relay is not None:
            relay.start()  # once the last upgrade opened cluster version 10
        workers = WorkerPool(args, urls, sink.url, provider.url)
        workers.start()
        nemesis_history = Recorder(out / "history-nemesis.jsonl", "nemesis")
        monitor = Monitor(cluster, Recorder(out / "history-monitor.jsonl", "monitor"))
        monitor.start()
        known_jobs: list[str] = []
        clients = [
            Client(
                f"c{i}",
                urls,
                Recorder(out / f"history-c{i}.jsonl", f"c{i}"),
                known_jobs,
                args.seed * 1000 + i,
                stop_clients,
                args.client_rate,
                args.flow_p,
                args.far_p,
            )
            for i in range(args.clients)
        ]
        wheel_watch = WheelWatch(
            cluster, Recorder(out / "history-wheel.jsonl", "wheel"), stop_wheel
        )
        wheel_watch.start()
        for client in clients:
            client.start()
        features.start()
        payments.start()
        started = time.time()
        nemesis = nemesis_module.Nemesis(
            cluster, faults, nemesis_history, workers.pause, started,
            upgrade=lambda node: upgrade(cluster, node),
        )  # fmt: skip
        nemesis.start()
        if broker is not None:
            broker_nemesis = BrokerNemesis(
                broker,
                broker_faults,
                Recorder(out / "history-broker.jsonl", "broker"),
                started,
                waiting=relay.lag if relay is not None else None,
            )
            broker_nemesis.start()
        time.sleep(max(0.0, started + args.duration - time.time()))
        nemesis.stop_event.set()
        if broker_nemesis is not None:
            broker_nemesis.stop_event.set()
        nemesis.join(timeout=90)
        nemesis.heal_all()
        if broker_nemesis is not None:
            broker_nemesis.join(timeout=60)
            broker_nemesis.heal()
        workers.resume_all()
        healed_at = time.time()
        nemesis_history.note("healed", {})
        stop_clients.set()
        for client in clients:
            client.join(timeout=30)
        features.join(timeout=30)
        payments.join(timeout=30)
        if relay is not None and relay.is_alive():
            relay.join(timeout=30)  # a mixed-version run's, still waiting for version 10
        cluster.wait_for_leader(60)
        features.pause_schedules()
        acked = _acked_jobs(out)
        recover_s, unfinished = wait_recovered(
            cluster, acked, args.recovery_bound_s, features, relay
        )
        workers.stop()
        monitor.stop_event.set()
        monitor.join(timeout=5)
        stop_wheel.set()
        wheel_watch.join(timeout=10)
        wait_converged(cluster, 30)
        final = read_final(cluster, features, payments, relay, relay_skipped)
        final["unfinished_after_bound"] = unfinished
        (out / "final.json").write_text(json.dumps(final))
        sink.stop()
        receiver.stop()
        provider.stop()
        if broker is not None:
            broker.close()
        nemesis_module.note_exits(cluster, nemesis_history)
        events = read_events(sorted(out.glob("history-*.jsonl")))
        ops = operations(events)
        notes = [event for event in events if event["type"] == "note"]
        deliveries = read_receiver_log(out / "webhooks.jsonl")
        provider_log = read_provider_log(out / "provider.jsonl")
        checks = check_all(
            ops, final, read_sink_log(out / "sink.jsonl"), deliveries, notes, provider_log
        )
        # The nodes' logs are complete only once they have stopped.
        cluster.stop()
        log_errors = node_log_errors(cluster)
        expected = expected_log_errors_by_node(notes)
        checks.insert(7, node_logs_clean(log_errors, expected_by_node=expected))
        applied, errors = list(nemesis.applied), list(nemesis.errors)
        if broker_nemesis is not None:
            applied += broker_nemesis.applied
            errors += broker_nemesis.errors
        return summarize(
            args, ops, events, final, checks, applied, errors,
            recover_s, unfinished, healed_at - started,
            expected_log_errors=expected_log_errors_seen(log_errors, expected_by_node=expected),
            deliveries=deliveries, provider_log=provider_log,
        )  # fmt: skip
    finally:
        stop_clients.set()
        stop_wheel.set()
        if workers is not None:
            workers.stop()
        if sink is not None:
            with contextlib.suppress(Exception):
                sink.stop()
        if receiver is not None:
            with contextlib.suppress(Exception):
                receiver.stop()
        if provider is not None:
            with contextlib.suppress(Exception):
                provider.stop()
        if broker_nemesis is not None:
            broker_nemesis.stop_event.set()
        if broker is not None:
            with contextlib.suppress(Exception):
                broker.close()
        if cluster is not None:
            cluster.stop()
            cluster.unmount_all()
        net.teardown()


def run_previous(cluster: NsCluster, node: NsNode, release: Release) -> None:
    """Run `node` on the previous release, into a log of its own (checker 8
    holds that release's log to what was known of it then)."""
    node.python, node.source_dir = release.python, release.source_dir
    node.release = release.version
    node.log_path = cluster.root / f"{node.id}-v{release.version}.log"
    node.extra_logs.append(node.log_path)


def upgrade(cluster: NsCluster, node: NsNode) -> None:
    """The runbook's step: SIGTERM, then today's code on the same data directory."""
    cluster.kill(node.id, signal.SIGTERM)
    node.python, node.source_dir, node.release = None, None, "current"
    node.log_path = cluster.root / f"{node.id}.log"
    cluster.start(node.id)


def node_log_errors(cluster: NsCluster) -> dict[str, list[LogError]]:
    """Every error-level line of every node's logs, per log: a node that ran
    the previous release has a log of that release under `<id>-v<version>`."""
    found: dict[str, list[LogError]] = {}
    for node in cluster.ns_nodes():
        for path in dict.fromkeys([*node.extra_logs, node.log_path]):
            found[path.stem] = read_log_errors(path)
    return found


def _acked_jobs(out: Path) -> list[str]:
    paths = sorted(out.glob("history-c*.jsonl")) + [out / "history-payments.jsonl"]
    return [
        op["result"]["body"]["job"]["id"]
        for op in operations(read_events(paths))
        if op["f"] in ("submit", "submit_payment") and op["type"] == "ok"
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("chaos: must run as root (network namespaces, iptables)", file=sys.stderr)
        return 2

    def interrupted(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    try:
        summary = campaign(args)
    except BaseException as error:
        print(f"chaos: FAILED to run: {error!r}", file=sys.stderr)
        print(f"chaos: seed {args.seed}; history in {args.out}", file=sys.stderr)
        raise
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=1))
    print(render_text(summary))
    if not summary["valid"] or summary["stale_token_rejections"] == 0:
        print(f"chaos: INVALID run: seed {args.seed}; history in {args.out}", file=sys.stderr)
    print(json.dumps(summary, separators=(",", ":")))
    return 0 if summary["valid"] and summary["stale_token_rejections"] > 0 else 1
