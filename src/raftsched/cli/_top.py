"""`raftsched top`: a live terminal view of the cluster and its queues.

It polls `GET /v1/overview` (from the leader when there is one: stuck jobs,
recent errors and clock skew are its knowledge) and redraws the screen with
plain ANSI escapes, so it works in any terminal and over ssh without curses.
`--once` prints one frame without escapes and exits (scripts and tests).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from typing import Any

from raftsched.cli._common import EXIT_OK, Command, tls_options, token_from, with_client
from raftsched.client import Client

CLEAR_SCREEN = "\x1b[H\x1b[2J"
ROWS_SHOWN = 8

Overview = Mapping[str, Any]


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    top = commands.add_parser("top", parents=[common], help="live view of the cluster and queues")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--interval-s", type=float, default=2.0, help="refresh period (default 2)")
    top.set_defaults(run=_run)


def fetch_overview(client: Client, args: argparse.Namespace) -> Overview:
    """This node's overview, or the leader's when this node is not it."""
    overview: Overview = client.request("GET", "/v1/overview").json()
    node = overview.get("node", {})
    leader = node.get("leader") or {}
    if node.get("role") != "leader" and leader.get("http_url"):
        try:
            with Client(
                [leader["http_url"]],
                timeout_s=args.timeout_s,
                retry_budget_s=0,
                token=token_from(args),
                **tls_options(args),
            ) as direct:
                leader_view: Overview = direct.request("GET", "/v1/overview").json()
                return leader_view
        except Exception:  # the leader is unreachable from here: show this node's view
            return overview
    return overview


def _table(rows: list[list[str]], headers: list[str]) -> list[str]:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [headers, *rows]
    ]


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def render(overview: Overview, rates: Mapping[str, float] | None = None) -> str:
    node = overview["node"]
    leader = (node.get("leader") or {}).get("id", "none")
    skew = {s["node_id"]: s["skew_ms"] for s in overview.get("clock_skew", [])}
    lines = [
        f"raftsched top · leader {leader} · term {node['term']} · commit {node['commit_index']}"
        f" · applied {node['applied_index']} · seen from {node['id']}"
        f" · {overview.get('now') or '-'}",
        "",
    ]
    nodes = [[node["id"], node["role"], "yes", str(node["applied_index"]), _skew(skew, node["id"])]]
    for peer in node.get("peers", []):
        role = peer["role"] if peer["reachable"] else "unreachable"
        match = "-" if peer.get("match_index") is None else str(peer["match_index"])
        nodes.append(
            [peer["id"], role, "yes" if peer["reachable"] else "NO", match, _skew(skew, peer["id"])]
        )
    lines += _table(nodes, ["NODE", "ROLE", "REACHABLE", "APPLIED/MATCH", "SKEW"]) + [""]
    queues = [
        [
            q["name"],
            str(q["depth"]),
            str(q["running"]),
            _age(q.get("oldest_runnable_age_s")),
            "-" if rates is None else f"{rates.get(q['name'], 0.0):.1f}",
        ]
        for q in overview.get("queues", [])
    ]
    lines += _table(queues, ["QUEUE", "DEPTH", "RUNNING", "OLDEST", "DONE/MIN"]) + [""]
    counts = overview.get("status_counts", {})
    stuck = overview.get("stuck_jobs", [])
    lines.append(
        "jobs: "
        + " ".join(f"{status}={n}" for status, n in counts.items() if n)
        + f" · stuck={len(stuck)} · dead_letter={counts.get('dead_letter', 0)}"
    )
    for job in stuck[:ROWS_SHOWN]:
        lines.append(f"  stuck {job['job_id']} {job['queue']} quiet {_age(job['quiet_s'])}")
    errors = overview.get("recent_errors", [])[:ROWS_SHOWN]
    if errors:
        lines += ["", "recent errors:"]
        for error in errors:
            at = time.strftime("%H:%M:%S", time.localtime(error["at_ms"] / 1000))
            job = error.get("job_id") or ""
            lines.append(f"  {at} {error['source']} {error['kind']} {job} {error['message'][:60]}")
    return "\n".join(lines) + "\n"


def _skew(skew: Mapping[str, float], node_id: str) -> str:
    return f"{skew[node_id]:+.1f}ms" if node_id in skew else "-"


def _done(overview: Overview) -> dict[str, float]:
    return {
        q: c.get("succeeded", 0.0) + c.get("failed", 0.0)
        for q, c in overview.get("counters", {}).items()
    }


def _top(args: argparse.Namespace, client: Client) -> int:
    if args.once:
        sys.stdout.write(render(fetch_overview(client, args)))
        return EXIT_OK
    before: tuple[float, dict[str, float]] | None = None
    try:
        while True:
            overview = fetch_overview(client, args)
            now, done = time.monotonic(), _done(overview)
            rates = None
            if before is not None and now > before[0]:
                per_min = 60 / (now - before[0])
                rates = {q: max(0.0, n - before[1].get(q, 0.0)) * per_min for q, n in done.items()}
            before = (now, done)
            sys.stdout.write(CLEAR_SCREEN + render(overview, rates))
            sys.stdout.flush()
            time.sleep(max(0.2, args.interval_s))
    except KeyboardInterrupt:
        return EXIT_OK


_run: Command = with_client(_top)
__all__ = ["register", "render"]
