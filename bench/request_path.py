"""CPU per HTTP request of the worker protocol, per request kind (not a test).

A real 3-node cluster per source tree (three `raftsched node` processes on
loopback, `LocalCluster(durability="fsync")`: a 2xx means fsynced on a
majority), driven by separate client processes that use that tree's own
blocking SDK (`raftsched.client.Client`), each sending one request at a time
to the leader. Prints one JSON object as its last line.

    .venv/bin/python bench/request_path.py                       # this tree alone
    .venv/bin/python bench/request_path.py --src /tmp/main/src   # this tree against another
    .venv/bin/python bench/request_path.py --quick               # a smoke run (about 30 s)

The defaults (5 rounds of 2,000 requests per kind, 8 clients, as the
issue's 8 workers) take about three minutes with `--src`.

With `--src`, both trees' clusters run side by side for the whole run, and
their phases alternate, one request kind at a time, in ABBA order (new old,
old new, ...): whatever else the machine does drifts over minutes, and a
phase lasts seconds, so each pair of phases shares the same conditions. The
idle cluster costs the busy one little (its nodes sleep between heartbeats).

One round, for each tree (the jobs of a round flow through all four kinds):
- `submit`: each client submits its share of REQUESTS jobs, one per request
  (`POST /v1/jobs`, a small JSON payload, no idempotency key);
- `claim`: each client claims that many, one per request (`POST /v1/leases`,
  `max_jobs: 1`; the jobs are already pending, so no long-poll waits);
- `start`: each client starts its leases (`POST /v1/leases/{id}/start`);
- `complete`: each client completes them (`POST /v1/leases/{id}/complete`,
  a small result).

Figures, per tree and request kind (keys of `results.<tree>.<kind>`; medians
over the rounds; CPU is user + system time from /proc, in microseconds):
- `leader_us`: the leader process's CPU during the phase / requests;
  `leader_system_us` the part of it spent in the kernel (system calls:
  sockets, fsync, wake-ups between threads);
- `follower_us`: each follower's CPU / requests (the mean of the two);
- `client_us`: the client processes' own CPU (`os.times` around the
  phase, all of them summed) / requests: the SDK's cost, building the
  request, the socket calls and parsing the answer; `client_system_us`
  the part of it spent in the kernel;
- `total_us`: leader + both followers + clients, / requests: all the CPU
  the request kind costs on this machine;
- `requests_per_s`: requests / the phase's wall time (with `--clients`
  clients one request at a time each; informative only, CPU is the figure to compare);
- `entries_per_request`: Raft entries the leader proposed during the phase
  (its `raftsched_raft_entries_proposed_total`) / requests: below 1 when
  group commit put several requests' commands in one entry. Much of the
  CPU is per entry, so compare trees at similar figures.
`results.<tree>.job` sums the four kinds' CPU figures: the cost of one job's
life cycle, one job per request.

`ratios.<kind>.<figure>` (with `--src`): new / old per round, and their
median. "new" is the tree this script belongs to (or `--new DIR`), "old"
the `--src` tree.
`trees` names each tree's source directory, `rounds` keeps every round's
raw figures; `loadavg_before` and `loadavg_after` are /proc/loadavg,
since the machine is shared.

`--py-spy DIR` also records, with py-spy (not a dependency: install it in
the venv to use this), the new tree's leader, a follower and a client for
the whole run (`--gil`: only what holds the interpreter), as raw collapsed
stacks in DIR (open with e.g. speedscope). py-spy stops a process to take
each sample, so figures of such a run are not comparable with others.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("submit", "claim", "start", "complete")
FIGURES = (
    "leader_us",
    "leader_system_us",
    "follower_us",
    "client_us",
    "client_system_us",
    "total_us",
)
PAYLOAD = {"order": "ord_000000000001", "amount": 1200, "currency": "EUR"}
RESULT = {"charged": True, "receipt": "rcpt_000000000001"}
QUEUE = "rp"
THIS_SRC = Path(__file__).resolve().parent.parent / "src"
PHASE_TIMEOUT_S = 120.0


# -- the client processes ------------------------------------------------------------


def driver(url: str, index: int) -> None:
    """One client process: reads a phase per line from stdin, does it one
    request at a time, answers one JSON line with its own CPU and wall time."""
    import raftsched
    from raftsched.client import Client

    client = Client([url], retry_budget_s=30.0)
    leases: list[tuple[str, int]] = []
    print(json.dumps({"ready": raftsched.__file__}), flush=True)
    for line in sys.stdin:
        kind, _, count_text = line.strip().partition(" ")
        if kind == "quit":
            break
        count = int(count_text or 0)
        times_before, wall_before = os.times(), time.monotonic()
        done = 0
        if kind == "submit":
            for _ in range(count):
                client.submit(QUEUE, PAYLOAD)
                done += 1
        elif kind == "claim":
            misses = 0
            while done < count and misses < 20:
                got = client.claim(f"rp-{index}", [QUEUE], max_jobs=1, wait_s=1.0)
                for lease in got:
                    leases.append((lease["job_id"], lease["fencing_token"]))
                done += len(got)
                misses += not got
        elif kind == "start":
            for job_id, token in leases:
                client.start(job_id, token)
                done += 1
        elif kind == "complete":
            for job_id, token in leases:
                client.complete(job_id, token, RESULT)
                done += 1
            leases = []
        times = os.times()
        answer = {
            "kind": kind,
            "done": done,
            "cpu_s": times.user + times.system - times_before.user - times_before.system,
            "system_s": times.system - times_before.system,
            "wall_s": time.monotonic() - wall_before,
        }
        print(json.dumps(answer), flush=True)
    client.close()


# -- the orchestrator ----------------------------------------------------------------


def cpu_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def entries_proposed(url: str, token: str) -> float:
    """The leader's raftsched_raft_entries_proposed_total, from /metrics."""
    request = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("raftsched_raft_entries_proposed_total "):
                return float(line.split()[1])
    return float("nan")


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Tree:
    """One source tree: its cluster and its client processes."""

    name: str
    src: Path
    root: Path
    cluster: Any = None
    leader_pid: int = 0
    leader_url: str = ""
    follower_pids: list[int] = field(default_factory=list)
    clients: list[subprocess.Popen[str]] = field(default_factory=list)
    profilers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, clients: int) -> None:
        from raftsched.testing import LocalCluster

        env = {"PYTHONPATH": str(self.src)}
        self.cluster = LocalCluster(self.root, size=3, durability="fsync", env=env)
        self.cluster.start()
        leader = self.cluster.wait_for_leader(timeout_s=60)
        time.sleep(1.0)  # let the take-over and the token bootstrap settle
        for node_id, node in self.cluster.nodes.items():
            pid = node.process.pid
            if node_id == leader:
                self.leader_pid = pid
            else:
                self.follower_pids.append(pid)
        url = self.leader_url = self.cluster.nodes[leader].http_url
        client_env = {
            **os.environ,
            "PYTHONPATH": str(self.src),
            "RAFTSCHED_TOKEN": self.cluster.admin_token,
        }
        for index in range(clients):
            command = [sys.executable, __file__, "--driver", url, "--index", str(index)]
            process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=client_env
            )
            self.clients.append(process)
        for process in self.clients:
            assert process.stdout is not None
            ready = json.loads(process.stdout.readline())["ready"]
            if not ready.startswith(str(self.src)):
                raise RuntimeError(f"{self.name}'s client imported {ready}, not {self.src}")

    def profile(self, directory: Path) -> None:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        targets = {
            "leader": self.leader_pid,
            "follower": self.follower_pids[0],
            "client": self.clients[0].pid,
        }
        for what, pid in targets.items():
            out = directory / f"{self.name}-{what}.txt"
            command = [py_spy, "record", "--pid", str(pid), "--rate", "400", "--gil"]
            command += ["--format", "raw", "--output", str(out)]
            self.profilers.append(
                subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )

    def phase(self, kind: str, requests: int) -> dict[str, float]:
        """Run one phase on every client at once; the CPU figures per request."""
        share = requests // len(self.clients)
        pids = [self.leader_pid, *self.follower_pids]
        entries_before = entries_proposed(self.leader_url, self.cluster.admin_token)
        before = [cpu_s(pid) for pid in pids]
        wall_before = time.monotonic()
        for process in self.clients:
            assert process.stdin is not None
            process.stdin.write(f"{kind} {share}\n")
            process.stdin.flush()
        answers = []
        for process in self.clients:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.name}: a client died during {kind}")
            answers.append(json.loads(line))
        wall = time.monotonic() - wall_before
        after = [cpu_s(pid) for pid in pids]
        entries = entries_proposed(self.leader_url, self.cluster.admin_token) - entries_before
        if time.monotonic() - wall_before > PHASE_TIMEOUT_S:
            raise RuntimeError(f"{self.name}: {kind} took {wall:.0f} s")
        done = sum(answer["done"] for answer in answers)
        if done < share * len(self.clients):
            raise RuntimeError(f"{self.name}: {kind} did {done} of {share * len(self.clients)}")
        spent = [sum(b) - sum(a) for a, b in zip(before, after, strict=True)]
        leader_system = after[0][1] - before[0][1]
        clients = sum(answer["cpu_s"] for answer in answers)
        clients_system = sum(answer["system_s"] for answer in answers)

        def per(seconds: float) -> float:
            return round(seconds * 1e6 / done, 1)

        return {
            "leader_us": per(spent[0]),
            "leader_system_us": per(leader_system),
            "follower_us": per(statistics.mean(spent[1:])),
            "client_us": per(clients),
            "client_system_us": per(clients_system),
            "total_us": per(sum(spent) + clients),
            "requests_per_s": round(done / wall, 1),
            "entries_per_request": round(entries / done, 3),
        }

    def stop(self) -> None:
        for profiler in self.profilers:
            profiler.send_signal(signal.SIGINT)
        for profiler in self.profilers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                profiler.wait(timeout=30)
        for process in self.clients:
            with contextlib.suppress(OSError):
                assert process.stdin is not None
                process.stdin.write("quit\n")
                process.stdin.close()
        for process in self.clients:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        if self.cluster is not None:
            self.cluster.stop()


def medians(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        out[kind] = {
            figure: round(statistics.median(r[kind][figure] for r in rounds), 1)
            for figure in (*FIGURES, "requests_per_s", "entries_per_request")
        }
    out["job"] = {figure: round(sum(out[kind][figure] for kind in KINDS), 1) for figure in FIGURES}
    return out


def ratios(new: list[dict[str, Any]], old: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in (*KINDS, "job"):
        out[kind] = {}
        for figure in FIGURES:
            per_round = []
            for a, b in zip(new, old, strict=True):
                if kind == "job":
                    num = sum(a[k][figure] for k in KINDS)
                    den = sum(b[k][figure] for k in KINDS)
                else:
                    num, den = a[kind][figure], b[kind][figure]
                per_round.append(round(num / den, 3) if den else float("nan"))
            median = round(statistics.median(per_round), 3)
            out[kind][figure] = {"rounds": per_round, "median": median}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--src", type=Path, help="another source tree to compare with (old)")
    parser.add_argument(
        "--new", type=Path, default=THIS_SRC, help="the new tree (default: this script's)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000, help="per kind and round")
    parser.add_argument("--clients", type=int, default=8, help="client processes per tree")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 400 (a smoke run)")
    parser.add_argument("--py-spy", type=Path, help="record the new tree's leader and a client")
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        driver(args.driver, args.index)
        return
    if args.quick:
        args.rounds, args.requests = 2, 400
    base = Path(tempfile.mkdtemp(prefix="raftsched-reqpath-"))
    trees = [Tree("new", args.new.resolve(), base / "new")]
    if args.src is not None:
        trees.append(Tree("old", args.src.resolve(), base / "old"))
    result: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "durability": "fsync",
        "rounds_run": args.rounds,
        "requests_per_kind": args.requests,
        "clients": args.clients,
        "trees": {tree.name: str(tree.src) for tree in trees},
        "loadavg_before": loadavg(),
    }
    per_tree: dict[str, list[dict[str, dict[str, float]]]] = {tree.name: [] for tree in trees}
    try:
        for tree in trees:
            tree.start(args.clients)
            log(
                f"{tree.name}: cluster of {tree.src} up, leader pid {tree.leader_pid}, "
                f"{args.clients} clients"
            )
        if args.py_spy is not None:
            args.py_spy.mkdir(parents=True, exist_ok=True)
            trees[0].profile(args.py_spy)
        for number in range(args.rounds):
            figures: dict[str, dict[str, dict[str, float]]] = {tree.name: {} for tree in trees}
            order = list(trees)
            for kind in KINDS:
                for tree in order:
                    figures[tree.name][kind] = tree.phase(kind, args.requests)
                order.reverse()  # ABBA: neither tree always goes first
            for tree in trees:
                per_tree[tree.name].append(figures[tree.name])
                summary = " ".join(
                    f"{kind} {figures[tree.name][kind]['leader_us']}/"
                    f"{figures[tree.name][kind]['client_us']}"
                    for kind in KINDS
                )
                log(f"round {number + 1} {tree.name} (leader/client µs): {summary}")
    finally:
        for tree in trees:
            tree.stop()
        shutil.rmtree(base, ignore_errors=True)
    result["loadavg_after"] = loadavg()
    result["results"] = {name: medians(rounds) for name, rounds in per_tree.items()}
    if len(trees) == 2:
        result["ratios"] = ratios(per_tree["new"], per_tree["old"])
    result["rounds"] = per_tree
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
