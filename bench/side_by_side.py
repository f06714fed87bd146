"""Two source trees measured at the same time, round after round (not a test).

    .venv/bin/python bench/side_by_side.py --old /tmp/v0.1.0/src --new src --rounds 5
    .venv/bin/python bench/side_by_side.py --old A --new B -- --quick --no-failover

Each round starts two `bench/cluster.py` processes together, one whose
nodes run the `--old` tree and one whose nodes run the `--new` tree (its
`--src`), and waits for both. Arguments after `--` go to both. Running the
pair at once, rather than one after the other, puts both through whatever
else the machine does in that minute: this VM's speed drifts by up to 2x
within minutes, and alternating runs mistook that drift for differences of
10% and more. Each side also slows the other, so absolute figures are
lower than a lone run's; compare the ratios.

Run the same tree on both sides (an A/A run) to see what the method
resolves on the day: on 2026-12-02 it was about ±5% for the leader's CPU
per job in the single-request phase.

Prints each round's figures and, as the last line, one JSON object: for
each compared figure, the new/old ratio of every round and their median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).with_name("cluster.py")
FIGURES = (
    "leader_cpu_ms_per_job_single",
    "leader_cpu_ms_per_job_batched",
    "jobs_per_s_single",
    "jobs_per_s_batched",
    "submit_p50_ms",
    "due_to_lease_p99_ms",
)


def start(source: Path, extra: list[str]) -> subprocess.Popen[str]:
    command = [sys.executable, str(BENCH), "--src", str(source), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def last_json(process: subprocess.Popen[str]) -> dict[str, Any] | None:
    output, _ = process.communicate()
    lines = [line for line in output.splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        return None
    found: dict[str, Any] = json.loads(lines[-1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--old", type=Path, required=True, help="the `src` directory before")
    parser.add_argument("--new", type=Path, required=True, help="the `src` directory after")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("extra", nargs="*", help="after --: arguments for bench/cluster.py")
    args = parser.parse_args()
    extra = args.extra or ["--quick", "--no-failover"]
    ratios: dict[str, list[float]] = {figure: [] for figure in FIGURES}
    rounds: list[dict[str, Any]] = []
    for number in range(1, args.rounds + 1):
        old, new = start(args.old.resolve(), extra), start(args.new.resolve(), extra)
        before, after = last_json(old), last_json(new)
        rounds.append({"round": number, "old": before, "new": after})
        print(json.dumps(rounds[-1]), flush=True)
        if before is None or after is None:
            continue  # a side failed (an election under load): the round is dropped
        for figure in FIGURES:
            if before.get(figure) and after.get(figure):
                ratios[figure].append(round(after[figure] / before[figure], 3))
    summary = {
        figure: {"ratios": values, "median": statistics.median(values) if values else None}
        for figure, values in ratios.items()
    }
    print(json.dumps({"rounds": len(rounds), "new_over_old": summary}), flush=True)


if __name__ == "__main__":
    main()
