"""Listing jobs with many packed in the time wheel: the latency of one
`list_jobs` call (what GET /v1/jobs and the dashboard ask the state), in
process, with `--jobs` packed future jobs of bench/core.py's shape due over
the next 30 days (default settings: hour-wide buckets, so 720 buckets) and
one live pending job in every 100 submitted.

    .venv/bin/python bench/wheel_list.py [--jobs 1000000] [--cache /tmp/wheel_list.bin]

The state is built once and kept as a snapshot in `--cache` (decoded on
later runs, so that two versions of the code list the very same state).
Figures, milliseconds, median of `--repeat` calls: first_page (limit 50),
next_page (the second page, from the first one's cursor), deep_page (a page
from a cursor in the middle of the jobs' seqs), page_1000 (limit 1000),
tenant_page (tenant filter), queue_missing (a queue no job is in),
dead_letter_page (status=dead_letter, which no packed job can have), and
walk_10_pages (ten consecutive pages of 50 from the start). It prints one
JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from core import FAR_DAYS, T0, shaped_spec  # noqa: E402
from raftsched.core import (  # noqa: E402
    apply_entry,
    decode_state,
    encode_state,
    list_jobs,
    new_state,
)
from raftsched.core.jobs.commands import SubmitJobs  # noqa: E402
from raftsched.core.kernel import wheel  # noqa: E402
from raftsched.core.kernel.commands import Entry, RaiseClusterVersion, TakeOver  # noqa: E402
from raftsched.core.kernel.state import State  # noqa: E402

BATCH = 1_000
LIVE_EVERY = 100


def build(jobs: int) -> State:
    rng = random.Random(19)
    state = new_state()
    apply_entry(state, Entry(1, T0, (TakeOver(), RaiseClusterVersion(7))))
    day_ms = 86_400_000
    for base in range(0, jobs, BATCH):
        n = min(BATCH, jobs - base)
        specs = tuple(
            shaped_spec(
                i,
                rng,
                None if i % LIVE_EVERY == 0 else T0 + 3_600_000 + rng.randrange(FAR_DAYS * day_ms),
            )
            for i in range(base, base + n)
        )
        ids = tuple(f"{rng.getrandbits(130):033x}"[:26] for _ in range(n))
        apply_entry(state, Entry(1, state.now_ms, (SubmitJobs(specs, ids),)))
        if base % 100_000 == 0:
            print(f"built {base + n} jobs", file=sys.stderr)
    return state


def timed(call: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--cache", type=Path, help="a snapshot of the built state")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.cache is not None and args.cache.exists():
        state = decode_state(args.cache.read_bytes())
    else:
        state = build(args.jobs)
        if args.cache is not None:
            args.cache.write_bytes(encode_state(state))
    record = wheel.wheel_of(state)
    first, cursor = list_jobs(state, limit=50)
    assert cursor is not None and len(first) == 50
    middle = str(state.next_seq // 2)

    def walk() -> None:
        at: str | None = None
        for _ in range(10):
            _, at = list_jobs(state, limit=50, cursor=at)

    figures = {
        "packed_jobs": record.size,
        "live_jobs": len(state.jobs),
        "buckets": len(record.order),
        "first_page_ms": timed(lambda: list_jobs(state, limit=50), args.repeat),
        "next_page_ms": timed(lambda: list_jobs(state, limit=50, cursor=cursor), args.repeat),
        "deep_page_ms": timed(lambda: list_jobs(state, limit=50, cursor=middle), args.repeat),
        "page_1000_ms": timed(lambda: list_jobs(state, limit=1000), args.repeat),
        "tenant_page_ms": timed(lambda: list_jobs(state, limit=50, tenant="tenant_3"), args.repeat),
        "queue_missing_ms": timed(lambda: list_jobs(state, limit=50, queue="nothing"), args.repeat),
        "dead_letter_page_ms": timed(
            lambda: list_jobs(state, limit=50, status="dead_letter"), args.repeat
        ),
        "walk_10_pages_ms": timed(walk, args.repeat),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
