"""`raftsched reconciliation report`: unknown outcomes and what became of them.

The periodic reconciliation report (docs/reconciliation.md) as four tables:
the jobs waiting for a reconcile decision, unknown outcomes per queue, how
reconciliations ended per queue, and the jobs reconciliation completed.
`--json` prints the API's answer as it is (with the hourly counts).
"""

from __future__ import annotations

import argparse
from typing import Any

from raftsched.cli._common import EXIT_OK, print_json, print_table, with_client
from raftsched.client import Client

RECONCILING_COLUMNS = [
    ("JOB", "job_id"),
    ("QUEUE", "queue"),
    ("TENANT", "tenant"),
    ("ATTEMPT", "attempt"),
    ("SINCE", "since"),
    ("TRIES", "tries"),
    ("RECONCILE QUEUE", "reconcile_queue"),
    ("LEASED TO", "leased_to"),
]
UNKNOWN_COLUMNS = [
    ("QUEUE", "queue"),
    ("TOTAL", "total"),
    ("LAST HOUR", "last_hour"),
    ("PEAK HOUR", "peak_hour"),
    ("PEAK", "peak"),
]
DECISION_COLUMNS = [
    ("QUEUE", "queue"),
    ("HAPPENED", "happened"),
    ("DID NOT HAPPEN", "did_not_happen"),
    ("CANNOT TELL", "cannot_tell"),
    ("UNANSWERED", "unanswered"),
]
COMPLETED_COLUMNS = [
    ("JOB", "job_id"),
    ("QUEUE", "queue"),
    ("TENANT", "tenant"),
    ("COMPLETED", "completed_at"),
    ("RECONCILER", "worker_id"),
    ("TOKEN", "fencing_token"),
    ("EVIDENCE", "evidence"),
]


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "reconciliation", help="unknown outcomes: reconciling jobs, decisions, completions"
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    report = actions.add_parser("report", parents=[common], help="the reconciliation report")
    report.add_argument("--hours", type=int, help="the window: 1 to 168 hours (default 24)")
    report.add_argument("--limit", type=int, help="jobs listed per table (default 100)")
    report.add_argument("--stale", action="store_true", help="read this node's replica")
    report.set_defaults(run=with_client(show_report))


def show_report(args: argparse.Namespace, client: Client) -> int:
    report = client.reconciliation(
        hours=args.hours, limit=args.limit, consistency="stale" if args.stale else None
    )
    if args.json:
        print_json(report)
        return EXIT_OK
    print(f"Reconciliation report, {report['hours']} h since {report['since']}")
    waiting = report["reconciling"]
    print(f"\nWaiting for a reconcile decision: {_count(waiting)}")
    rows = [{**job, "leased_to": (job["lease"] or {}).get("worker_id")} for job in waiting["jobs"]]
    print_table(rows, RECONCILING_COLUMNS)
    unknown = report["unknown_outcomes"]
    print("\nUnknown outcomes per queue")
    print_table([_unknown_row(unknown["buckets"], queue) for queue in unknown["queues"]],
                UNKNOWN_COLUMNS)  # fmt: skip
    print("\nReconciliations ended")
    print_table(report["decisions"], DECISION_COLUMNS)
    completed = report["completed"]
    print(f"\nCompleted by reconciliation: {_count(completed)}")
    print_table(completed["jobs"], COMPLETED_COLUMNS)
    return EXIT_OK


def _count(listed: dict[str, Any]) -> str:
    total = listed["total"]
    return f"{total} (showing {len(listed['jobs'])})" if listed["truncated"] else str(total)


def _unknown_row(buckets: list[str], queue: dict[str, Any]) -> dict[str, Any]:
    counts: list[int] = queue["counts"]
    peak = max(range(len(counts)), key=lambda hour: (counts[hour], hour))
    return {
        "queue": queue["queue"],
        "total": queue["total"],
        "last_hour": counts[-1],
        "peak_hour": buckets[peak],
        "peak": counts[peak],
    }
