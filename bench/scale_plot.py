"""Draw how the cost grows with stored jobs, from bench/ten_million.py results.

    .venv/bin/python bench/scale_plot.py bench-1m.json bench-3m.json bench-10m.json \\
        --out docs/scale.png
    make bench-scale-plot PLOT_ARGS="bench-1m.json bench-3m.json bench-10m.json"

Each file holds one result object of bench/ten_million.py (its last stdout
line, or what --out wrote). The x axis is the `jobs` of each run (log
scale); each panel draws one family of figures against it: resident memory
per node after the load and its growth per job, the load rate, the snapshot
figures (encode, the fork pause, the load on a restart, restart-to-ready),
the snapshot's size on disk, and the latencies (submit and claim p50/p99,
due-to-lease p99). A figure a run does not have (null, an aborted run) is
left out of its line; an aborted run is marked in the title. Also prints the
table of docs/scale.md (Markdown) on stdout.

Needs matplotlib: `pip install -e '.[bench]'` (the `bench` extra).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

GIB = 2**30
MIB = 2**20

Figure = Callable[[dict[str, Any]], float | None]


def _get(result: dict[str, Any], *path: str) -> Any:
    value: Any = result
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return float(value)


def _max_of(result: dict[str, Any], key: str, scale: float = 1.0) -> float | None:
    values = [_number(v) for v in (result.get(key) or {}).values()]
    present = [v for v in values if v is not None]
    return max(present) / scale if present else None


def _median_of(result: dict[str, Any], key: str) -> float | None:
    values = [_number(v) for v in (result.get(key) or {}).values()]
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _scaled(result: dict[str, Any], key: str, scale: float) -> float | None:
    value = _number(result.get(key))
    return None if value is None else value / scale


# (panel title, y label, [(line label, figure)])
PANELS: list[tuple[str, str, list[tuple[str, Figure]]]] = [
    (
        "Memory per node after the load",
        "GiB",
        [
            ("RSS, largest node", lambda r: _max_of(r, "rss_bytes", GIB)),
            ("peak RSS, largest node", lambda r: _max_of(r, "peak_node_rss_bytes", GIB)),
            ("peak, all processes", lambda r: _scaled(r, "peak_total_bytes", GIB)),
        ],
    ),
    (
        "Memory growth per stored job",
        "bytes per job",
        [("median over nodes", lambda r: _median_of(r, "rss_growth_bytes_per_job"))],
    ),
    (
        "Load rate (batch submit, 1,000 per request)",
        "jobs/s",
        [("load", lambda r: _number(r.get("load_jobs_per_s")))],
    ),
    (
        "Snapshots and restart",
        "seconds",
        [
            ("encode (largest)", lambda r: _number(r.get("snapshot_encode_s_max"))),
            ("fork pause (largest)", lambda r: _number(r.get("snapshot_fork_pause_s_max"))),
            ("load on restart", lambda r: _number(r.get("restart_load_s"))),
            ("restart to ready", lambda r: _number(r.get("restart_to_ready_s"))),
            ("failover", lambda r: _number(r.get("failover_s"))),
        ],
    ),
    (
        "Snapshot on disk",
        "MiB",
        [("largest node", lambda r: _scaled(r, "snapshot_bytes_max", MIB))],
    ),
    (
        "Latency with N jobs stored",
        "ms",
        [
            ("submit p50", lambda r: _number(r.get("submit_p50_ms"))),
            ("submit p99", lambda r: _number(r.get("submit_p99_ms"))),
            ("claim p50", lambda r: _number(r.get("claim_p50_ms"))),
            ("claim p99", lambda r: _number(r.get("claim_p99_ms"))),
            ("due-to-lease p99", lambda r: _number(r.get("due_to_lease_p99_ms"))),
        ],
    ),
]

# docs/scale.md's table: (row, figure, format)
TABLE: list[tuple[str, Figure, str]] = [
    ("load rate (jobs/s)", lambda r: _number(r.get("load_jobs_per_s")), "{:,.0f}"),
    (
        "leader CPU per job during the load (ms)",
        lambda r: _number(_get(r, "load_cpu_ms_per_job", "leader")),
        "{:.3f}",
    ),
    (
        "RSS per node after the load, largest (GiB)",
        lambda r: _max_of(r, "rss_bytes", GIB),
        "{:.2f}",
    ),
    (
        "RSS growth per job, median of nodes (bytes)",
        lambda r: _median_of(r, "rss_growth_bytes_per_job"),
        "{:,.0f}",
    ),
    (
        "snapshot writer's private memory, largest (GiB)",
        lambda r: _max_of(r, "peak_writer_private_bytes_by_node", GIB),
        "{:.2f}",
    ),
    (
        "peak memory, all processes (fraction of machine)",
        lambda r: _number(r.get("peak_fraction")),
        "{:.3f}",
    ),
    ("snapshot encode, largest (s)", lambda r: _number(r.get("snapshot_encode_s_max")), "{:.2f}"),
    ("fork pause, largest (s)", lambda r: _number(r.get("snapshot_fork_pause_s_max")), "{:.4f}"),
    ("snapshot on disk (MiB)", lambda r: _scaled(r, "snapshot_bytes_max", MIB), "{:,.1f}"),
    ("submit p50 / p99 (ms)", lambda r: _number(r.get("submit_p50_ms")), "{:.1f}"),
    ("", lambda r: _number(r.get("submit_p99_ms")), "{:.1f}"),
    ("claim p50 / p99 (ms)", lambda r: _number(r.get("claim_p50_ms")), "{:.1f}"),
    ("", lambda r: _number(r.get("claim_p99_ms")), "{:.1f}"),
    ("due-to-lease p99 (ms)", lambda r: _number(r.get("due_to_lease_p99_ms")), "{:.1f}"),
    ("failover (s)", lambda r: _number(r.get("failover_s")), "{:.2f}"),
    ("restart to ready, catch-up (s)", lambda r: _number(r.get("restart_to_ready_s")), "{:.2f}"),
    ("snapshot load on restart (s)", lambda r: _number(r.get("restart_load_s")), "{:.2f}"),
]


def table(results: list[dict[str, Any]]) -> str:
    """The Markdown table of docs/scale.md, one column per run."""
    header = "| figure | " + " | ".join(f"{r['jobs']:,} jobs" for r in results) + " |"
    lines = [header, "|---" * (len(results) + 1) + "|"]
    merged: list[tuple[str, list[str]]] = []
    for row, figure, fmt in TABLE:
        cells = []
        for r in results:
            value = figure(r)
            cells.append("n/a" if value is None else fmt.format(value))
        if row == "" and merged:
            label, previous = merged[-1]
            merged[-1] = (label, [f"{a} / {b}" for a, b in zip(previous, cells, strict=True)])
        else:
            merged.append((row, cells))
    for row, cells in merged:
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = sorted(results, key=lambda r: r["jobs"])
    jobs = [r["jobs"] for r in results]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for ax, (panel, unit, lines) in zip(axes.flat, PANELS, strict=True):
        for label, figure in lines:
            points = [
                (n, v) for n, r in zip(jobs, results, strict=True) if (v := figure(r)) is not None
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", label=label)
        ax.set_title(panel, fontsize=10)
        ax.set_ylabel(unit)
        ax.set_xscale("log")
        ax.set_xlabel("stored jobs")
        ax.set_xticks(jobs)
        ax.set_xticklabels([_short(n) for n in jobs])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    aborted = [_short(r["jobs"]) for r in results if r.get("aborted") or r.get("error")]
    note = f" (aborted or failed: {', '.join(aborted)})" if aborted else ""
    fig.suptitle(f"{title}{note}", fontsize=12)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def _short(n: int) -> str:
    if n >= 1_000_000 and n % 100_000 == 0:
        return f"{n / 1_000_000:g}M"
    if n >= 1_000 and n % 100 == 0:
        return f"{n / 1_000:g}k"
    return str(n)


def load_result(path: Path) -> dict[str, Any]:
    """The result object of a file: the last line that parses as a JSON object."""
    for line in reversed(path.read_text().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            result = json.loads(line)
            if isinstance(result, dict) and "jobs" in result:
                return result
    raise SystemExit(f"{path}: no result object of bench/ten_million.py")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", nargs="+", type=Path, help="result JSON files")
    parser.add_argument("--out", type=Path, default=Path("docs/scale.png"))
    parser.add_argument(
        "--title",
        default="raftsched, 3 nodes with fsync on one 2-core machine (bench/ten_million.py)",
    )
    args = parser.parse_args()
    results = sorted((load_result(path) for path in args.results), key=lambda r: r["jobs"])
    plot(results, args.out, args.title)
    print(table(results))


if __name__ == "__main__":
    main()
