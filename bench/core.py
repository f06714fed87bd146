"""Benchmark of the pure core (not a test). Prints one JSON object as its last line.

    .venv/bin/python bench/core.py            # 1,000,000 jobs (several minutes)
    .venv/bin/python bench/core.py --jobs 20000

Figures:
- commands_per_s: submit -> claim -> start -> complete, one job per command,
  100 commands per Entry (as group commit does), with `--jobs` live pending
  jobs already stored in the same queue. Timed around apply_entry only;
  commands_per_s_encoded times apply_encoded (msgpack decode included).
- bytes_per_pending_job: RSS growth while storing the pending jobs (payload
  ~200 bytes of msgpack each, 30-char ids), divided by their number.
- snapshot_encode_s: what a node's snapshot child does, without the fsync:
  `raft_journal.write_snapshot_file` of `ReplicatedState.snapshot`, which
  encodes the state piece by piece and writes each piece to the file as it
  comes (the file is on disk in a temporary directory).
- snapshot_encode_only_s: the same pieces encoded and dropped, nothing
  written: the encoder's own share of snapshot_encode_s (the rest is the
  kernel taking ~300 MB into its page cache).
- snapshot_encode_bytes_s: `encode_state` of the same state into one bytes
  object (the figure this benchmark reported before snapshots were
  streamed; it pays for ~270 MB of memory touched for the first time).
- snapshot_decode_s: what a node does to load that file, in a fresh
  interpreter: `raft_journal.decode_snapshot` of the file's bytes (CRC
  checks, the body as a view) and `ReplicatedState.restore` of the body
  (decode with the collector paused, result frozen). The state is built
  and encoded in one child process and decoded in another, so nothing else
  is in memory; reading the file is `snapshot_read_s`, not part of it.
- snapshot_decode_beside_state_s: the same decode of `encode_state`'s
  bytes in the building process, with the original state still in memory
  (a follower that installs a snapshot while still serving reads from its
  old state). On this VM memory beyond what a process already touched
  costs about 2 s per GB in page faults, so this figure is mostly the
  machine, not the decoder.
- machine_loop_ns_before / _after / _at_encode / _at_decode: a fixed
  pure-Python loop, ns per iteration, timed at the start and the end, and
  just before the encode and the decode. This VM's speed drifts (by
  1.7 times within one day); compare figures only between runs whose loop
  figures agree.
- tick_s: one Tick making 10,000 due jobs runnable among `--jobs` future
  jobs; tick_s_100k the same among 100,000, to show the cost does not grow
  with the stored jobs.

    .venv/bin/python bench/core.py --far [--jobs 200000]

`--far` measures the time wheel (cluster version 7, default 10-minute
horizon in 60 s buckets): `--jobs` jobs shaped as issue 19 says (this
bench's ~200-byte payload, a tenant, a random 26-character id and a random
30-character idempotency key) due uniformly over the next 30 days, stored
packed, against the same jobs stored pending (live), each in a fresh
interpreter: bytes_per_packed_job and bytes_per_pending_shaped_job (RSS
growth / jobs), snapshot bytes per job and the encode time of each state.
`--traced` gives every job what issue 20 added (cluster version 8): a kind
(one of four) and a W3C traceparent with random ids, no tracestate.

    .venv/bin/python bench/core.py --lease-only [--lease-jobs 20000] [--batch 100]

`--lease-only` measures only the worker protocol's core cost per job, each
entry encoded (`encode_entry`) and applied from its bytes (`apply_encoded`,
msgpack decode included), as a leader and its replicas pay it, and reports
microseconds per job (`*_us_per_job`) and entry bytes per job
(`*_bytes_per_job`) for each form, every job run from pending to succeeded:
- single: `ClaimJobs` (max 1), `StartJob`, `CompleteJob`, each its own entry
  (what one request per operation costs without group commit);
- batch_1: `LeaseBatch((CompleteJob,), ClaimJobs max 1)`, one entry per job
  (a complete that carries the next claim), the start left out;
  batch_1_with_start adds the `StartJob` entry a worker sends before it runs
  the handler;
- batch_n: `LeaseBatch(N CompleteJob, ClaimJobs max N)` per N jobs
  (`--batch`); batch_n_with_start adds a `LeaseBatch` of the N starts.
Each form has its own queue of `--lease-jobs` pending jobs in one state.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack

from raftsched import raft_journal
from raftsched.core import (
    apply_encoded,
    apply_entry,
    encode_entry,
    encode_state,
    encode_state_pieces,
    new_state,
)
from raftsched.core.jobs.commands import (
    ClaimJobs,
    CompleteJob,
    ConfigureWheel,
    LeaseBatch,
    StartJob,
    SubmitJobs,
)
from raftsched.core.kernel import wheel
from raftsched.core.kernel.commands import (
    Command,
    Entry,
    JobSpec,
    RaiseClusterVersion,
    TakeOver,
    Tick,
)
from raftsched.core.kernel.results import BatchApplied, Claimed, Completed, Lease
from raftsched.core.kernel.state import State
from raftsched.node.machine import ReplicatedState
from raftsched.raft_journal import SnapshotHeader

T0 = 1_800_000_000_000
BATCH = 1_000
ENTRY_COMMANDS = 100


def loop_ns() -> float:
    """The machine's speed for plain Python: ns per iteration of a fixed loop
    (best of three)."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for i in range(2_000_000):
            total += i
        best = min(best, time.perf_counter() - started)
    return round(best / 2_000_000 * 1e9, 1)


def rss_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096


def payload(i: int) -> bytes:
    packed: bytes = msgpack.packb(
        {"payment_id": f"pay_{i:012d}", "amount": i % 100_000, "currency": "EUR",
         "note": "n" * 130, "attempt_hint": i % 7}
    )  # fmt: skip
    return packed


def job_id(i: int) -> str:
    return f"job_{i:026d}"


def fill(state: State, count: int, start: int, delay_ms: int | None, queue: str) -> None:
    """Store `count` jobs through SubmitJobs entries of 1,000 specs each."""
    for base in range(start, start + count, BATCH):
        n = min(BATCH, start + count - base)
        specs = tuple(
            JobSpec(queue, payload=payload(i), delay_ms=delay_ms) for i in range(base, base + n)
        )
        ids = tuple(job_id(i) for i in range(base, base + n))
        apply_entry(state, Entry(1, state.now_ms, (SubmitJobs(specs, ids),)))


def cycle(state: State, jobs: int, encoded: bool) -> float:
    """Run `jobs` submit -> claim -> start -> complete cycles; return commands/s."""
    per_entry = ENTRY_COMMANDS // 2  # submits+claims, then starts+completes
    half = per_entry // 2
    elapsed = 0.0
    next_id = 10**9 + (state.next_seq if encoded else 0) * 7
    done = 0
    commands = 0
    while done < jobs:
        first: list[Command] = []
        for _ in range(half):
            next_id += 1
            first.append(
                SubmitJobs((JobSpec("bulk", payload=payload(next_id)),), (job_id(next_id),))
            )
        first.extend(ClaimJobs("w1", ("bulk",), 1) for _ in range(half))
        results = run(state, Entry(1, state.now_ms + 1, tuple(first)), encoded)
        elapsed += results[1]
        second: list[Command] = []
        for result in results[0]:
            if isinstance(result, Claimed):
                for lease in result.leases:
                    second.append(StartJob(lease.job_id, lease.fencing_token))
                    second.append(CompleteJob(lease.job_id, lease.fencing_token, b"\xa2ok"))
        _, seconds = run(state, Entry(1, state.now_ms + 1, tuple(second)), encoded)
        elapsed += seconds
        commands += len(first) + len(second)
        done += half
    return commands / elapsed


def run(state: State, entry: Entry, encoded: bool) -> tuple[list[object], float]:
    if encoded:
        data = encode_entry(entry)
        started = time.perf_counter()
        results: list[object] = list(apply_encoded(state, data))
    else:
        started = time.perf_counter()
        results = list(apply_entry(state, entry))
    return results, time.perf_counter() - started


def tick_cost(future_jobs: int, due_jobs: int) -> float:
    state = new_state()
    apply_entry(state, Entry(1, T0, (TakeOver(),)))
    fill(state, future_jobs, 0, 86_400_000, "later")
    fill(state, due_jobs, future_jobs, 1_000, "soon")
    entry = Entry(1, T0 + 1_000, (Tick(seed=1, max_items=due_jobs),))
    # As a node holds its state (node/gc_tuning.py): frozen, so that the time
    # is the Tick's and not a full collection's that happens to fall in it.
    gc.collect()
    gc.freeze()
    started = time.perf_counter()
    (result,) = apply_entry(state, entry)
    seconds = time.perf_counter() - started
    gc.unfreeze()
    assert result.made_runnable == due_jobs, result  # type: ignore[union-attr]
    return seconds


def restore(data: bytes | memoryview) -> State:
    """What a node does to load a snapshot: `ReplicatedState.restore` (decode
    with the collector off, freeze the result, collect what is left)."""
    machine = ReplicatedState(on_applied=lambda: None)
    machine.restore(data)
    return machine.state


def run_child(*arguments: str) -> dict[str, float | int]:
    """Run this script in a new interpreter and return its JSON figures
    (its progress lines go to stderr)."""
    output = subprocess.run(
        [sys.executable, __file__, *arguments], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    figures: dict[str, float | int] = json.loads(output.splitlines()[-1])
    return figures


FAR_DAYS = 30


KINDS = ("charge", "refund", "payout", "settle")


def shaped_spec(
    i: int, rng: random.Random, run_at_ms: int | None, *, traced: bool = False
) -> JobSpec:
    """A job as the issue shapes them: bench payload, a tenant and a random
    30-character idempotency key; `traced` adds what issue 20 stores (a kind
    of four, and a W3C traceparent with random trace and span ids)."""
    if not traced:
        return JobSpec(
            "bulk",
            tenant=f"tenant_{i % 10}",
            payload=payload(i),
            run_at_ms=run_at_ms,
            idempotency_key=f"{rng.getrandbits(150):038x}"[:30],
        )
    return JobSpec(
        "bulk",
        tenant=f"tenant_{i % 10}",
        payload=payload(i),
        run_at_ms=run_at_ms,
        idempotency_key=f"{rng.getrandbits(150):038x}"[:30],
        kind=KINDS[i % len(KINDS)],
        traceparent=f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-01",
    )


def far_child(args: argparse.Namespace) -> None:
    """One figure in a fresh interpreter: RSS growth per job of `--jobs`
    shaped jobs, either all far in the future (packed by the time wheel,
    spread over FAR_DAYS days) or all pending (live)."""
    packed = args.far_child == "packed"
    rng = random.Random(19)
    state = new_state()
    setup: tuple[Command, ...] = (TakeOver(), RaiseClusterVersion(8 if args.traced else 7))
    if args.bucket_ms is not None:
        setup += (ConfigureWheel(wheel.HORIZON_MS_DEFAULT, args.bucket_ms),)
    apply_entry(state, Entry(1, T0, setup))
    gc.collect()
    before = rss_bytes()
    started = time.perf_counter()
    day_ms = 86_400_000
    for base in range(0, args.jobs, BATCH):
        n = min(BATCH, args.jobs - base)
        specs = tuple(
            shaped_spec(
                i,
                rng,
                T0 + 3_600_000 + rng.randrange(FAR_DAYS * day_ms) if packed else None,
                traced=args.traced,
            )
            for i in range(base, base + n)
        )
        ids = tuple(f"{rng.getrandbits(130):033x}"[:26] for _ in range(n))
        apply_entry(state, Entry(1, state.now_ms, (SubmitJobs(specs, ids),)))
    fill_s = time.perf_counter() - started
    gc.collect()
    grown = rss_bytes() - before
    record = wheel.wheel_of(state)
    assert record.size == (args.jobs if packed else 0), record.size
    started = time.perf_counter()
    size = sum(len(piece) for piece in encode_state_pieces(state))
    encode_s = time.perf_counter() - started
    name = "packed" if packed else "pending_shaped"
    print(
        json.dumps(
            {
                f"bytes_per_{name}_job": round(grown / args.jobs),
                f"fill_{name}_s": round(fill_s, 2),
                f"snapshot_bytes_per_{name}_job": round(size / args.jobs),
                f"snapshot_encode_{name}_s": round(encode_s, 3),
            }
        )
    )


def far(args: argparse.Namespace) -> None:
    """`--far`: memory per packed future job beside a live pending one of
    the same shape, each in its own interpreter."""
    figures: dict[str, float | int | bool] = {
        "jobs": args.jobs,
        "far_days": FAR_DAYS,
        "traced": args.traced,
    }
    for kind in ("packed", "pending"):
        more = [] if args.bucket_ms is None else ["--bucket-ms", str(args.bucket_ms)]
        more += ["--traced"] if args.traced else []
        figures.update(run_child("--jobs", str(args.jobs), "--far-child", kind, *more))
    print(json.dumps(figures))


def decode_only(path: Path) -> None:
    speed_ns = loop_ns()
    started = time.perf_counter()
    data = path.read_bytes()
    read_s = time.perf_counter() - started
    started = time.perf_counter()
    _, body = raft_journal.decode_snapshot(data)
    state = restore(body)
    seconds = time.perf_counter() - started
    figures = {
        "jobs": len(state.jobs),
        "snapshot_decode_s": round(seconds, 3),
        "snapshot_read_s": round(read_s, 3),
        "machine_loop_ns_at_decode": speed_ns,
    }
    print(json.dumps(figures))


def build(args: argparse.Namespace) -> None:
    """Store the jobs, run the cycle, encode, and write the snapshot to
    `args.build`; figures as JSON on stdout, progress on stderr."""
    figures: dict[str, float | int] = {"jobs": args.jobs}
    state = new_state()
    apply_entry(state, Entry(1, T0, (TakeOver(),)))
    gc.collect()
    before = rss_bytes()
    started = time.perf_counter()
    fill(state, args.jobs, 0, None, "bulk")
    figures["fill_s"] = round(time.perf_counter() - started, 2)
    gc.collect()
    figures["bytes_per_pending_job"] = round((rss_bytes() - before) / args.jobs)
    if not args.no_freeze:
        # What a node does after loading a snapshot: move the long-lived
        # state out of the collector's way.
        gc.freeze()
    print(f"stored {args.jobs} jobs: {figures}", file=sys.stderr, flush=True)

    figures["commands_per_s"] = round(cycle(state, args.cycles, encoded=False))
    figures["commands_per_s_encoded"] = round(cycle(state, args.cycles // 2, encoded=True))
    print(f"cycle: {figures}", file=sys.stderr, flush=True)

    machine = ReplicatedState(on_applied=lambda: None)
    machine.state = state
    header = SnapshotHeader(last_entry=(b"", 2, 1), previous_entry=(b"", 1, 1), cluster=())
    figures["machine_loop_ns_at_encode"] = loop_ns()
    started = time.perf_counter()
    raft_journal.write_snapshot_file(args.build, header, machine.snapshot(), durable=False)
    figures["snapshot_encode_s"] = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    for _ in encode_state_pieces(state):
        pass
    figures["snapshot_encode_only_s"] = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    data = encode_state(state)
    figures["snapshot_encode_bytes_s"] = round(time.perf_counter() - started, 3)
    figures["snapshot_bytes"] = len(data)
    started = time.perf_counter()
    decoded = restore(data)
    figures["snapshot_decode_beside_state_s"] = round(time.perf_counter() - started, 3)
    assert len(decoded.jobs) == len(state.jobs)
    figures["snapshot_jobs"] = len(state.jobs)
    print(json.dumps(figures))


class LeaseClock:
    """Entries of the lease forms, each encoded and applied from its bytes;
    the time and bytes they took."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.seconds = 0.0
        self.bytes = 0
        self.entries = 0

    def run(self, *commands: Command) -> list[object]:
        entry = Entry(1, self.state.now_ms + 1, commands)
        started = time.perf_counter()
        data = encode_entry(entry)
        results: list[object] = list(apply_encoded(self.state, data))
        self.seconds += time.perf_counter() - started
        self.bytes += len(data)
        self.entries += 1
        return results

    def claim(self, queue: str, n: int) -> list[Lease]:
        (claimed,) = self.run(ClaimJobs("w1", (queue,), n))
        assert isinstance(claimed, Claimed), claimed
        return list(claimed.leases)

    def batch(self, ops: tuple[Command, ...], queue: str, n: int) -> list[Lease]:
        """A batch of completes with the next claim; its next leases."""
        (result,) = self.run(LeaseBatch(ops, ClaimJobs("w1", (queue,), n)))
        assert isinstance(result, BatchApplied), result
        assert all(isinstance(each, Completed) for each in result.results), result
        assert isinstance(result.claimed, Claimed), result
        return list(result.claimed.leases)


def _start(lease: Lease) -> StartJob:
    return StartJob(lease.job_id, lease.fencing_token)


def _complete(lease: Lease) -> CompleteJob:
    return CompleteJob(lease.job_id, lease.fencing_token, b"\xa2ok")


def lease_form(state: State, form: str, queue: str, jobs: int, n: int) -> LeaseClock:
    """Run `jobs` jobs of `queue` from pending to succeeded in one form."""
    clock = LeaseClock(state)
    if form == "single":
        for _ in range(jobs):
            (lease,) = clock.claim(queue, 1)
            clock.run(_start(lease))
            (done,) = clock.run(_complete(lease))
            assert isinstance(done, Completed), done
        return clock
    size = 1 if form.startswith("batch_1") else n
    starts = form.endswith("with_start")
    leases = clock.claim(queue, size)
    for _ in range(jobs):  # a bound: each round finishes at least one job
        if not leases:
            break
        if starts and size == 1:
            clock.run(*map(_start, leases))
        elif starts:
            clock.run(LeaseBatch(tuple(map(_start, leases))))
        leases = clock.batch(tuple(map(_complete, leases)), queue, size)
    assert not leases, f"{form}: leases left after {jobs} rounds"
    return clock


LEASE_FORMS = ("single", "batch_1", "batch_1_with_start", "batch_n", "batch_n_with_start")


def lease_only(args: argparse.Namespace) -> None:
    """The worker protocol's apply cost per job, single commands against
    lease batches (see the module's docstring)."""
    jobs, n = args.lease_jobs, args.batch
    figures: dict[str, float | int] = {"lease_jobs": jobs, "batch": n}
    figures["machine_loop_ns_before"] = loop_ns()
    state = new_state()
    apply_entry(state, Entry(1, T0, (TakeOver(),)))
    for index, form in enumerate(LEASE_FORMS):
        fill(state, jobs, index * jobs, None, f"lease-{form}")
    gc.collect()
    gc.freeze()  # as a node holds its state (node/gc_tuning.py)
    for form in LEASE_FORMS:
        queue = f"lease-{form}"
        clock = lease_form(state, form, queue, jobs, n)
        succeeded = sum(
            1 for job in state.jobs.values() if job.queue == queue and job.status == "succeeded"
        )
        assert succeeded == jobs, (form, succeeded)
        figures[f"{form}_us_per_job"] = round(clock.seconds / jobs * 1e6, 2)
        figures[f"{form}_bytes_per_job"] = round(clock.bytes / jobs, 1)
        figures[f"{form}_entries"] = clock.entries
        print(f"{form}: {figures[f'{form}_us_per_job']} us/job", file=sys.stderr, flush=True)
    single = figures["single_us_per_job"]
    for form in LEASE_FORMS[1:]:
        figures[f"{form}_vs_single"] = round(float(figures[f"{form}_us_per_job"]) / single, 3)
    figures["machine_loop_ns_after"] = loop_ns()
    print(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--cycles", type=int, default=50_000, help="jobs run through the cycle")
    parser.add_argument("--no-freeze", action="store_true", help="leave the GC as it is")
    parser.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--decode", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--lease-only", action="store_true", help="only the lease forms' apply cost per job"
    )
    parser.add_argument("--lease-jobs", type=int, default=20_000, help="jobs per lease form")
    parser.add_argument("--batch", type=int, default=100, help="N of the batch_n forms")
    parser.add_argument(
        "--far", action="store_true", help="memory per packed future job (the time wheel)"
    )
    parser.add_argument("--bucket-ms", type=int, help="--far: the wheel's bucket width")
    parser.add_argument(
        "--traced",
        action="store_true",
        help="--far: every job also has a kind and a traceparent (cluster version 8)",
    )
    parser.add_argument("--far-child", choices=("packed", "pending"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.far_child is not None:
        far_child(args)
        return
    if args.far:
        far(args)
        return
    if args.lease_only:
        lease_only(args)
        return
    if args.decode is not None:
        decode_only(args.decode)
        return
    if args.build is not None:
        build(args)
        return
    before_ns = loop_ns()
    # The stored state is built and encoded in one child and decoded in a
    # fresh one, as a node restarting from its snapshot does: the process
    # that held the old state is gone.
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "snapshot"
        more = ["--no-freeze"] if args.no_freeze else []
        figures = run_child("--jobs", str(args.jobs), "--cycles", str(args.cycles), *more,
                            "--build", str(path))  # fmt: skip
        decoded = run_child("--decode", str(path))
        assert decoded["jobs"] == figures["snapshot_jobs"], (decoded, figures)
        figures["snapshot_decode_s"] = decoded["snapshot_decode_s"]
        figures["snapshot_read_s"] = decoded["snapshot_read_s"]
        figures["machine_loop_ns_at_decode"] = decoded["machine_loop_ns_at_decode"]
    print(f"snapshot: {figures}", flush=True)

    figures["tick_s"] = round(tick_cost(args.jobs, 10_000), 4)
    gc.collect()
    figures["tick_s_100k"] = round(tick_cost(100_000, 10_000), 4)
    figures["machine_loop_ns_before"] = before_ns
    figures["machine_loop_ns_after"] = loop_ns()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
