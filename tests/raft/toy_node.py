"""A RaftNode with a toy state machine and a JSON-lines control port, for tests.

The machine is an append-only list of byte strings; a command that starts
with b"raise" makes `apply` raise, to show that the adapter contains it.
Control requests (one JSON object per line on 127.0.0.1:--control-port):

    {"op": "propose", "data": HEX, "timeout_s": 5}  -> {"ok": true, "result": n}
                                                      | {"ok": false, "error": "..."}
    {"op": "state"}   -> {"entries": [HEX, ...], "digest": SHA256, "ever_applied": [HEX, ...]}
    {"op": "status"}  -> RaftStatus as a dict
    {"op": "snapshot_stats"} -> raft.SnapshotStats as a dict
    {"op": "digest"}  -> {"count": n, "digest": SHA256} (the state op without the entries)
    {"op": "bench", "count": n, "size": bytes} -> commit latencies in ms
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import signal
import socketserver
import threading
import time
from pathlib import Path
from typing import Any

import msgpack

from raftsched.child_processes import die_with_parent
from raftsched.logs import configure_logging
from raftsched.raft import RaftNode


class ListMachine:
    def __init__(self) -> None:
        # Named `lock` and re-entrant: the adapter holds it across the fork
        # of its snapshot child (see raftsched.raft.StateMachine.snapshot).
        self.lock = threading.RLock()
        self.entries: list[bytes] = []
        # Everything this process ever applied, in order; a snapshot load
        # replaces `entries` but not this, so a test can see an entry that
        # was applied and later wiped out.
        self.ever_applied: list[bytes] = []

    def apply(self, data: bytes) -> object:
        if data.startswith(b"raise"):
            raise RuntimeError("toy machine told to raise")
        with self.lock:
            self.entries.append(data)
            self.ever_applied.append(data)
            return len(self.entries)

    def snapshot(self) -> list[bytes]:
        with self.lock:
            return [bytes(msgpack.packb(self.entries))]

    def restore(self, data: bytes | memoryview) -> None:
        entries = msgpack.unpackb(data)
        with self.lock:
            self.entries = list(entries)

    def view(self) -> list[bytes]:
        with self.lock:
            return list(self.entries)


class Proposer:
    """One proposal at a time, waiting for its callback (as the node does)."""

    def __init__(self, node: RaftNode) -> None:
        self._node = node
        self._lock = threading.Lock()

    def propose(self, data: bytes, timeout_s: float) -> tuple[object, str | None]:
        with self._lock:
            done = threading.Event()
            outcome: list[tuple[object, str | None]] = []

            def callback(result: object | None, error: str | None) -> None:
                outcome.append((result, error))
                done.set()

            self._node.propose(data, callback)
            if not done.wait(timeout_s):
                # The callback still fires later; wait for it so that the
                # next proposal does not find this one in flight.
                done.wait(30)
                return None, "timeout"
            return outcome[0]


def main() -> None:
    die_with_parent()  # a killed test run leaves no toy node behind
    parser = argparse.ArgumentParser()
    parser.add_argument("--id", required=True)
    parser.add_argument("--raft", required=True)
    parser.add_argument("--peer", action="append", default=[])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--durability", default="fsync")
    parser.add_argument("--compaction", type=int, default=5000)
    parser.add_argument("--compaction-bytes", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--compaction-interval", type=float, default=300.0)
    parser.add_argument("--connection-timeout", type=float, default=3.5)
    args = parser.parse_args()
    # The node's own JSON lines, so that tests check these logs as they check
    # a node's (`raftsched.testing.log_errors`).
    configure_logging("json", node_id=args.id)
    peers = dict(item.split("=", 1) for item in args.peer)
    machine = ListMachine()
    leadership_log: list[tuple[bool, int, float]] = []
    node = RaftNode(
        node_id=args.id,
        raft_address=args.raft,
        peers=peers,
        data_dir=Path(args.data_dir),
        secret=args.secret,
        machine=machine,
        durability=args.durability,
        on_leadership=lambda leader, term: leadership_log.append((leader, term, time.time())),
        log_compaction_entries=args.compaction,
        log_compaction_bytes=args.compaction_bytes,
        log_compaction_interval_s=args.compaction_interval,
        connection_timeout_s=args.connection_timeout,
        leader_fallback_timeout_s=2.0,
    )
    node.start()
    proposer = Proposer(node)

    def handle(request: dict[str, Any]) -> object:
        op = request["op"]
        if op == "propose":
            result, error = proposer.propose(
                bytes.fromhex(request["data"]), float(request.get("timeout_s", 5))
            )
            return {"ok": error is None, "result": result, "error": error}
        if op == "state":
            entries = machine.view()
            digest = hashlib.sha256(msgpack.packb(entries)).hexdigest()
            with machine.lock:
                ever = [e.hex() for e in machine.ever_applied]
            return {"entries": [e.hex() for e in entries], "digest": digest, "ever_applied": ever}
        if op == "status":
            return dataclasses.asdict(node.status())
        if op == "digest":
            entries = machine.view()
            digest = hashlib.sha256(msgpack.packb(entries)).hexdigest()
            return {"count": len(entries), "digest": digest}
        if op == "snapshot_stats":
            return dataclasses.asdict(node.snapshot_stats)
        if op == "leadership":
            return leadership_log
        if op == "bench":
            latencies_ms = []
            errors = 0
            for i in range(int(request["count"])):
                payload = f"bench-{time.time_ns()}-{i}".encode().ljust(int(request["size"]), b".")
                start = time.perf_counter()
                _, error = proposer.propose(payload, 5.0)
                latencies_ms.append((time.perf_counter() - start) * 1e3)
                errors += error is not None
            fsyncs = node.journal_fsync_count()
            return {"latencies_ms": latencies_ms, "errors": errors, "fsyncs": fsyncs}
        raise ValueError(f"unknown op {op!r}")

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            for line in self.rfile:
                try:
                    reply = handle(json.loads(line))
                except Exception as error:  # the test wants to see it, not a dead port
                    reply = {"exception": repr(error)}
                self.wfile.write(json.dumps(reply).encode() + b"\n")
                self.wfile.flush()

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    server = socketserver.ThreadingTCPServer(("127.0.0.1", args.control_port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="control").start()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # The main thread must stay alive: pysyncobj's tick thread stops with it.
    while not stop.wait(1.0):
        pass
    server.shutdown()
    node.close()


if __name__ == "__main__":
    main()
