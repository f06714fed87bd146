"""raftsched against the replicated Postgres queue it replaces, side by side (not a test).

    .venv/bin/python bench/versus_postgres.py                 # 3 rounds of 15 s phases, ~20 min
    .venv/bin/python bench/versus_postgres.py --quick         # 1 round of 3 s phases, ~3 min
    .venv/bin/python bench/versus_postgres.py --systems raftsched,pg_quorum --protocol next
    .venv/bin/python bench/versus_postgres.py --src /tmp/old/src   # raftsched from another tree

Needs Debian's `postgresql` package (initdb, postgres, pg_basebackup; the
newest /usr/lib/postgresql/*/bin, or --pg-bin) and, when run as root, the
`postgres` user (the servers run as it). Three systems, each set up fresh for
its turn and torn down after it:

- raftsched: a 3-node cluster, `LocalCluster(durability="fsync")` (a 2xx
  means fsynced on a majority), loopback HTTP;
- pg_quorum: a Postgres primary with two streaming standbys,
  `synchronous_standby_names = 'ANY 1 (s1, s2)'`, `synchronous_commit = on`,
  `fsync = on` (a commit is flushed on two disks of three);
- pg_single: one Postgres node, `fsync = on`, `synchronous_commit = on`.

Every data directory is under one temporary directory (under --dir,
default /var/tmp), on one filesystem, which must not be a tmpfs. The rounds
are interleaved: round r runs raftsched, pg_quorum, pg_single one after
another, then round r + 1, so that the machine's drift (2x within a day on
this VM) falls on all three alike.

Within a system's turn, every load process is its own OS process
(bench/versus/agent.py): 2 submitters and 8 workers, raftsched's through the
client SDK's blocking `Client`, Postgres's through psycopg 3 over loopback
TCP. Each job carries the same ~200-byte JSON payload and the same result.
The phases, in order:

1. idle submit: one client, `--idle-submits` single submits one after another
   (5 ms apart) on the otherwise idle system.
2. single life cycle: 2 submitters submit one job per request while 8 workers
   claim with max_jobs 1 and complete one job per request: on raftsched
   claim -> start -> complete (4 HTTP requests per job with the submit;
   with `--protocol next` the completion carries the next claim), on Postgres
   the one-statement claim and the completion UPDATE (3 statements per job
   with the insert). The backlog of submitted, unfinished jobs is capped
   (2,000) so the phase measures a sustained rate.
3. single drain: `--drain-single` jobs preloaded (not measured; the replicas
   then caught up), then the 8 workers alone claim and complete them.
4. batched life cycle: as 2, with 100 jobs per submit and per claim, and the
   completions of a claim in one request: raftsched's POST /v1/leases/batch
   (one for the starts, one for the completions), Postgres's multi-row
   INSERT and UPDATE over arrays (backlog cap 10,000).
5. batched drain: as 3 with `--drain-batched` jobs and 100 per claim.
6. due to lease: 8 workers waiting (raftsched: long-poll claims; Postgres:
   claims every --pg-poll-ms, as it has no long-poll); one job every 20 ms,
   due 200 ms after its submission, --due-jobs of them.

A life cycle phase (2, 4) runs a warm-up (2 s; 0.5 s with --quick), then a
measured window of `--seconds`. A drain's window (3, 5) opens at GO, the
load processes connected, and closes after `--seconds` or once its backlog
is gone, whichever comes first. The figures come from snapshots at the
window's two ends.

Figures, per system and round (`rounds[i][system]`):

- loadavg: /proc/loadavg as the turn began (the machine is shared);
  setup_s: time to set the system up; turn_s: the whole turn.
- idle_submit.p50_ms / p99_ms: client round trip of one submit (an INSERT ...
  RETURNING id on Postgres) on the idle system.
- <phase>.jobs_per_s: jobs completed in the window / the window's length
  (<phase> is single, single_drain, batched, batched_drain); .jobs and
  .window_s are the two.
- <phase>.cpu_ms_per_job: CPU time (user + system, /proc/<pid>/stat of every
  process in each tree, reaped children included) per job completed in the
  window, by role: leader and followers, or primary and standbys; submitters
  and workers (all load processes); `total`, the sum of those (every process
  of the system and its load); `machine`, the whole machine's busy time from
  /proc/stat (other helpers' load and kernel threads included); `other`, the
  difference. .cores_busy: the same totals as cores (CPU s per wall s).
- single.submit_p50_ms / _p99_ms, batched.*: submit round trips inside the
  window, under load (mostly queueing).
- <phase>.protocol_used (raftsched): the workers' completion protocol in
  effect ("next" only if the nodes answered completions with the next
  leases), and `fallbacks`, why a worker fell back to the single forms.
- <phase>.leader_changed (raftsched): the leader moved during the phase, so
  leader/follower CPU figures are mixed.
- *_drain.backlog, .drained (the backlog ran out inside the window),
  .preload_s, .settle_s (replicas catching up after the preload).
- due_to_lease.p50_ms / p99_ms: the wall-clock time a worker received a job's
  lease minus the job's due time (one machine, one clock); .leased of
  .expected jobs.
- error: a phase's or the setup's error; that phase's figures are missing.

Summaries:

- medians[system][figure]: the median over rounds of the FIGURES below.
- ratios["raftsched/pg_quorum"][figure], ratios["raftsched/pg_single"][figure]:
  `rounds`, raftsched's figure over Postgres's, per round (rounds where both
  have it), and their `median`.
- targets (issue 18), each {"median_ratio" (or "median"), "bound", "met"},
  "met" null when a system of it was not run: single_jobs_per_s >= 2.0 x
  pg_quorum and >= 1.0 x pg_single; batched_jobs_per_s >= 5.0 x pg_quorum;
  single_cpu_ms_per_job (the life cycle's total, every process) <= 1.0 x
  pg_quorum; idle_submit_p50_ms <= 2.0 x pg_quorum's; raftsched's
  due_to_lease_p99_ms < 50 (the earlier target, still to be met).
- issue_table[system][figure]: the Postgres figures against the ranges the
  issue measured on this machine (`measured`: low, high): the `median` here
  and whether it is `within` 0.5 x low .. 2 x high, as the issue expects.

The last line of output is one JSON object with all of the above, the
settings, the filesystem, and /proc/loadavg before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cluster import loadavg, log  # bench/cluster.py
from versus import phases, postgres
from versus.common import payload_bytes
from versus.systems import PostgresSystem, RaftschedSystem, System

SYSTEMS = ("raftsched", "pg_quorum", "pg_single")
FIGURES: dict[str, tuple[str, ...]] = {
    "single_jobs_per_s": ("single", "jobs_per_s"),
    "single_drain_jobs_per_s": ("single_drain", "jobs_per_s"),
    "batched_jobs_per_s": ("batched", "jobs_per_s"),
    "batched_drain_jobs_per_s": ("batched_drain", "jobs_per_s"),
    "single_cpu_ms_per_job": ("single", "cpu_ms_per_job", "total"),
    "single_drain_cpu_ms_per_job": ("single_drain", "cpu_ms_per_job", "total"),
    "batched_cpu_ms_per_job": ("batched", "cpu_ms_per_job", "total"),
    "batched_drain_cpu_ms_per_job": ("batched_drain", "cpu_ms_per_job", "total"),
    "idle_submit_p50_ms": ("idle_submit", "p50_ms"),
    "idle_submit_p99_ms": ("idle_submit", "p99_ms"),
    "single_submit_p50_ms": ("single", "submit_p50_ms"),
    "due_to_lease_p99_ms": ("due_to_lease", "p99_ms"),
}
# (figure, opponent, comparison, bound): median of raftsched / opponent.
TARGETS = (
    ("single_jobs_per_s", "pg_quorum", ">=", 2.0),
    ("single_jobs_per_s", "pg_single", ">=", 1.0),
    ("batched_jobs_per_s", "pg_quorum", ">=", 5.0),
    ("single_cpu_ms_per_job", "pg_quorum", "<=", 1.0),
    ("idle_submit_p50_ms", "pg_quorum", "<=", 2.0),
)
DUE_TO_LEASE_P99_MAX_MS = 50.0
# What issue 18 measured for the Postgres queue on this machine (low, high).
ISSUE_TABLE: dict[str, dict[str, tuple[float, float]]] = {
    "pg_quorum": {
        "single_jobs_per_s": (590, 900),
        "single_drain_jobs_per_s": (1150, 1470),
        "idle_submit_p50_ms": (0.69, 0.78),
        "idle_submit_p99_ms": (1.5, 1.9),
        "single_drain_cpu_ms_per_job": (1.1, 1.5),
    },
    "pg_single": {
        "single_jobs_per_s": (1750, 1950),
        "single_drain_jobs_per_s": (2210, 2280),
        "idle_submit_p50_ms": (0.32, 0.35),
        "idle_submit_p99_ms": (0.8, 1.1),
        "single_drain_cpu_ms_per_job": (0.74, 0.77),
    },
}
REFUSED_FILESYSTEMS = ("tmpfs", "ramfs")


def filesystem_of(path: Path) -> dict[str, Any]:
    """The filesystem `path` is on: its mount point and type (/proc/self/mounts)."""
    real = os.path.realpath(path)
    best = ("/", "unknown")
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        mount = fields[1].replace("\\040", " ")
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[0]):
            best = (mount, fields[2])
    return {"path": real, "mount": best[0], "type": best[1], "device": os.stat(real).st_dev}


def make_system(name: str, home: Path, args: argparse.Namespace) -> System:
    if name == "raftsched":
        return RaftschedSystem(home / "cluster", args.src)
    return PostgresSystem(name, home / "pg", args.pg_bin, args.pg_index)


def run_turn(system: System, home: Path, settings: phases.Settings, keep: bool) -> dict[str, Any]:
    """Set the system up, run every phase, tear it down. A failed phase is
    recorded as its `error` and the next one still runs."""
    out: dict[str, Any] = {"loadavg": loadavg()}
    started = time.monotonic()
    try:
        system.start()
        out["setup_s"] = round(time.monotonic() - started, 2)
        steps: list[tuple[str, Any]] = [
            ("idle_submit", lambda: phases.idle_submit(system, home / "idle", settings))
        ]
        for variant in ("single", "batched"):
            steps += [
                (variant, lambda v=variant: phases.life_cycle(system, home / v, settings, v)),
                (
                    f"{variant}_drain",
                    lambda v=variant: phases.drain(system, home / f"{v}_drain", settings, v),
                ),
            ]
        steps.append(("due_to_lease", lambda: phases.due_to_lease(system, home / "due", settings)))
        for name, step in steps:
            try:
                out[name] = step()
            except Exception as error:  # recorded; the other phases still run
                out[name] = {"error": f"{type(error).__name__}: {error}"[:3000]}
            log(f"  {system.name} {name}: {short(out[name])}")
    except Exception as error:
        out["error"] = f"{type(error).__name__}: {error}"[:3000]
        log(f"  {system.name}: {out['error']}")
    finally:
        system.stop()
        if not keep:
            shutil.rmtree(home, ignore_errors=True)
    out["turn_s"] = round(time.monotonic() - started, 1)
    return out


def short(figures: dict[str, Any]) -> str:
    if "error" in figures:
        return "ERROR " + str(figures["error"]).splitlines()[0][:300]
    keys = ("jobs_per_s", "p50_ms", "p99_ms", "submit_p50_ms")
    text = ", ".join(f"{key} {figures[key]}" for key in keys if key in figures)
    if "cpu_ms_per_job" in figures:
        text += f", cpu ms/job {figures['cpu_ms_per_job']['total']}"
    return text


def figure(turn: dict[str, Any] | None, path: tuple[str, ...]) -> float | None:
    value: Any = turn
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    if not isinstance(value, int | float) or value != value:  # missing or NaN
        return None
    return float(value)


def summarize(rounds: list[dict[str, Any]], systems: list[str]) -> dict[str, Any]:
    medians: dict[str, dict[str, float | None]] = {}
    for name in systems:
        medians[name] = {}
        for key, path in FIGURES.items():
            values = [v for r in rounds if (v := figure(r.get(name), path)) is not None]
            medians[name][key] = round(statistics.median(values), 3) if values else None
    ratios: dict[str, dict[str, Any]] = {}
    for opponent in ("pg_quorum", "pg_single"):
        if "raftsched" not in systems or opponent not in systems:
            continue
        per_figure = {}
        for key, path in FIGURES.items():
            values = []
            for r in rounds:
                ours, theirs = figure(r.get("raftsched"), path), figure(r.get(opponent), path)
                if ours is not None and theirs:
                    values.append(round(ours / theirs, 3))
            per_figure[key] = {
                "rounds": values,
                "median": round(statistics.median(values), 3) if values else None,
            }
        ratios[f"raftsched/{opponent}"] = per_figure
    targets: dict[str, Any] = {}
    for key, opponent, comparison, bound in TARGETS:
        median = ratios.get(f"raftsched/{opponent}", {}).get(key, {}).get("median")
        met = None
        if median is not None:
            met = median >= bound if comparison == ">=" else median <= bound
        targets[f"{key} {comparison} {bound} x {opponent}"] = {
            "median_ratio": median,
            "bound": bound,
            "met": met,
        }
    due = medians.get("raftsched", {}).get("due_to_lease_p99_ms")
    targets[f"raftsched due_to_lease_p99_ms < {DUE_TO_LEASE_P99_MAX_MS}"] = {
        "median": due,
        "bound": DUE_TO_LEASE_P99_MAX_MS,
        "met": None if due is None else due < DUE_TO_LEASE_P99_MAX_MS,
    }
    issue_table: dict[str, dict[str, Any]] = {}
    for name in systems:
        for key, (low, high) in ISSUE_TABLE.get(name, {}).items():
            value = medians[name][key]
            within = None if value is None else 0.5 * low <= value <= 2 * high
            entry = {"measured": [low, high], "median": value, "within": within}
            issue_table.setdefault(name, {})[key] = entry
    return {"medians": medians, "ratios": ratios, "targets": targets, "issue_table": issue_table}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s phases (a smoke run)")
    parser.add_argument("--seconds", type=float, help="measured window per phase (default 15)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3)")
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + str(SYSTEMS)
    )
    parser.add_argument("--src", type=Path, help="raftsched's nodes and clients from this tree")
    parser.add_argument(
        "--protocol",
        choices=("single", "next"),
        default="single",
        help="raftsched single-variant workers: complete, or complete carrying the next claim",
    )
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="parent of the data")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the data, the logs of the servers and of the load processes",
    )
    parser.add_argument("--pg-bin", type=Path, default=postgres.default_bin_dir())
    parser.add_argument("--pg-index", choices=tuple(postgres.INDEXES), default="partial")
    parser.add_argument(
        "--no-pg-prepare", action="store_true", help="Postgres statements not prepared"
    )
    parser.add_argument("--pg-poll-ms", type=float, default=10.0, help="an empty claim's sleep")
    parser.add_argument("--drain-single", type=int, help="backlog of the single drain")
    parser.add_argument("--drain-batched", type=int, help="backlog of the batched drain")
    parser.add_argument("--idle-submits", type=int)
    parser.add_argument("--due-jobs", type=int)
    args = parser.parse_args()
    quick = args.quick
    defaults = {
        "seconds": 3.0 if quick else 15.0,
        "rounds": 1 if quick else 3,
        "drain_single": 2_000 if quick else 30_000,
        "drain_batched": 10_000 if quick else 150_000,
        "idle_submits": 50 if quick else 300,
        "due_jobs": 30 if quick else 200,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.systems = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = [name for name in args.systems if name not in SYSTEMS]
    if unknown or not args.systems:
        parser.error(f"--systems: unknown {unknown}; choose from {SYSTEMS}")
    if any(name.startswith("pg_") for name in args.systems) and (
        args.pg_bin is None or not (args.pg_bin / "initdb").exists()
    ):
        parser.error("no Postgres binaries (apt-get install postgresql, or --pg-bin DIR)")
    if not 1 <= args.rounds <= 100 or not 0.5 <= args.seconds <= 3600:
        parser.error("--rounds 1..100, --seconds 0.5..3600")
    return args


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through every cleanup below


def main() -> None:
    args = parse_args()
    settings = phases.Settings(
        seconds=args.seconds,
        warmup_s=0.5 if args.quick else 2.0,
        idle_submits=args.idle_submits,
        due_jobs=args.due_jobs,
        drain_jobs={"single": args.drain_single, "batched": args.drain_batched},
        protocol=args.protocol,
        pg_prepare=not args.no_pg_prepare,
        pg_poll_s=args.pg_poll_ms / 1000,
    )
    args.dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="raftsched-versus-", dir=args.dir))
    root.chmod(0o711)  # the postgres user passes through to its own directories
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    result: dict[str, Any] = {
        "quick": args.quick,
        "cpus": os.cpu_count(),
        "loadavg_before": loadavg(),
        "systems": args.systems,
        "settings": {
            "seconds": args.seconds,
            "rounds": args.rounds,
            "warmup_s": settings.warmup_s,
            "submitters": phases.SUBMITTERS,
            "workers": phases.WORKERS,
            "payload_bytes": payload_bytes(),
            "backlog_max": phases.BACKLOG_MAX,
            "drain_jobs": settings.drain_jobs,
            "idle_submits": settings.idle_submits,
            "due_jobs": settings.due_jobs,
            "protocol": args.protocol,
            "src": str(args.src.resolve()) if args.src else None,
            "pg_bin": str(args.pg_bin) if args.pg_bin else None,
            "pg_index": args.pg_index,
            "pg_prepare": settings.pg_prepare,
            "pg_poll_ms": args.pg_poll_ms,
        },
    }
    rounds: list[dict[str, Any]] = []
    try:
        fs = result["filesystem"] = filesystem_of(root)
        if fs["type"] in REFUSED_FILESYSTEMS:
            raise SystemExit(f"{root} is on a {fs['type']}; give --dir on a disk")
        log(f"data under {root} ({fs['type']} at {fs['mount']})")
        for number in range(1, args.rounds + 1):
            this_round: dict[str, Any] = {"round": number}
            rounds.append(this_round)
            for name in args.systems:
                home = root / f"r{number}" / name
                log(f"round {number}: {name}")
                this_round[name] = run_turn(
                    make_system(name, home, args), home, settings, args.keep
                )
    finally:
        if args.keep:
            log(f"kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    result["rounds"] = rounds
    result.update(summarize(rounds, args.systems))
    result["loadavg_after"] = loadavg()
    print(json.dumps(result), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
