"""Commands for jobs, the dead-letter queue and the cluster's status."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from raftsched import timefmt
from raftsched.cli._common import (
    EXIT_OK,
    print_fields,
    print_json,
    print_table,
    with_client,
)
from raftsched.client import Client, JsonObject

JOB_COLUMNS = [
    ("ID", "id"),
    ("QUEUE", "queue"),
    ("KIND", "kind"),
    ("STATUS", "status"),
    ("ATTEMPTS", "attempts_made"),
    ("PRIORITY", "priority"),
    ("NEXT RUN", "next_run_at"),
    ("UPDATED", "updated_at"),
]
JOB_FIELDS = [
    "id", "queue", "kind", "tenant", "status", "priority", "payload", "idempotency_key",
    "ordering_key", "correlation_id", "labels", "created_at", "updated_at", "run_at",
    "next_run_at", "max_attempts", "attempts_made", "cancel_requested", "lease", "result",
    "last_error", "schedule_id", "workflow_id", "step",
]  # fmt: skip
ATTEMPT_COLUMNS = [
    ("#", "number"),
    ("WORKER", "worker_id"),
    ("EPOCH", "epoch"),
    ("TOKEN", "fencing_token"),
    ("CLAIMED", "claimed_at"),
    ("ENDED", "ended_at"),
    ("OUTCOME", "outcome"),
    ("ERROR", "error"),
]
# History events are not spelled out in api.md; show the usual keys first.
EVENT_KEYS = [
    "at", "time", "type", "event", "from_status", "to_status", "actor", "epoch",
    "fencing_token", "detail",
]  # fmt: skip
NODE_COLUMNS = [
    ("ID", "id"),
    ("ROLE", "role"),
    ("REACHABLE", "reachable"),
    ("MATCH", "match_index"),
    ("HTTP", "http_url"),
    ("RAFT", "raft_address"),
    ("RELEASE", "release"),
    ("STATUS", "status"),
]


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    _register_submit(commands, common)
    _register_jobs(commands, common)
    _register_dlq(commands, common)
    cluster = commands.add_parser("cluster", help="cluster membership and leader")
    cluster_commands = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")
    status = cluster_commands.add_parser("status", parents=[common], help="nodes, roles, indexes")
    status.set_defaults(run=with_client(cluster_status))
    add = cluster_commands.add_parser(
        "add-node",
        parents=[common],
        help="add a member (admin); then start it with `raftsched node ... --join URL`",
    )
    add.add_argument("node_id", metavar="ID")
    add.add_argument("--raft", required=True, metavar="HOST:PORT", help="its Raft address")
    add.add_argument("--http-url", required=True, help="its HTTP API's URL")
    add.set_defaults(run=with_client(add_node))
    remove = cluster_commands.add_parser(
        "remove-node", parents=[common], help="remove a member (admin), the leader too"
    )
    remove.add_argument("node_id", metavar="ID")
    remove.set_defaults(run=with_client(remove_node))


def _register_submit(
    commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser
) -> None:
    submit = commands.add_parser("submit", parents=[common], help="submit a job")
    submit.add_argument("queue")
    submit.add_argument("--payload", type=_json_arg, help="JSON (default: none)")
    submit.add_argument("--key", dest="idempotency_key", help="idempotency key")
    when = submit.add_mutually_exclusive_group()
    when.add_argument("--delay-s", type=float)
    when.add_argument("--run-at", type=_time_arg, help="RFC 3339 time, any offset")
    submit.add_argument("--priority", type=int, help="-100..100, higher first")
    submit.add_argument("--max-attempts", type=int)
    submit.add_argument("--lease-s", type=float)
    submit.add_argument("--deadline-s", type=float)
    submit.add_argument("--tenant")
    submit.add_argument("--ordering-key")
    submit.add_argument("--correlation-id")
    submit.add_argument(
        "--kind", help="which worker handler runs it (1-128 of A-Z a-z 0-9 _ . : -)"
    )
    submit.add_argument("--label", action="append", type=_label_arg, metavar="KEY=VALUE")
    submit.set_defaults(run=with_client(submit_job))


def _register_jobs(
    commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser
) -> None:
    jobs = commands.add_parser("jobs", help="list, inspect and cancel jobs")
    actions = jobs.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", parents=[common], help="newest first")
    _add_list_filters(listing)
    listing.add_argument("--status")
    listing.set_defaults(run=with_client(list_jobs))
    get = actions.add_parser(
        "get", aliases=["show"], parents=[common], help="one job with its attempts"
    )
    get.add_argument("job_id")
    get.set_defaults(run=with_client(get_job))
    cancel = actions.add_parser("cancel", parents=[common], help="cancel (or ask a worker to)")
    cancel.add_argument("job_id")
    cancel.add_argument("--reason")
    cancel.set_defaults(run=with_client(cancel_job))
    history = actions.add_parser("history", parents=[common], help="every transition")
    history.add_argument("job_id")
    history.set_defaults(run=with_client(job_history))


def _register_dlq(
    commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser
) -> None:
    dlq = commands.add_parser("dlq", help="the dead-letter queue")
    actions = dlq.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", parents=[common], help="dead-lettered jobs")
    _add_list_filters(listing)
    listing.set_defaults(run=with_client(list_jobs), status="dead_letter")
    replay = actions.add_parser("replay", parents=[common], help="run a dead job again")
    replay.add_argument("job_id")
    replay.add_argument("--reason", required=True)
    replay.set_defaults(run=with_client(replay_job))


def _add_list_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue")
    parser.add_argument("--tenant")
    parser.add_argument("--kind", help="only jobs of this kind")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--cursor", help="continue from a previous page")
    parser.add_argument("--stale", action="store_true", help="read from any node's replica")


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from error


def _time_arg(text: str) -> str:
    try:
        return timefmt.normalize(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def _label_arg(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"labels look like KEY=VALUE, got {text!r}")
    return key, value


def submit_job(args: argparse.Namespace, client: Client) -> int:
    job = client.submit(
        args.queue, args.payload, idempotency_key=args.idempotency_key, run_at=args.run_at,
        delay_s=args.delay_s, priority=args.priority, max_attempts=args.max_attempts,
        lease_s=args.lease_s, deadline_s=args.deadline_s, tenant=args.tenant,
        ordering_key=args.ordering_key, correlation_id=args.correlation_id,
        labels=dict(args.label) if args.label else None, kind=args.kind,
    )  # fmt: skip
    if args.json:
        print_json(job)
    else:
        print(f"{job.get('id')}  {job.get('status')}  queue={job.get('queue')}")
    return EXIT_OK


def list_jobs(args: argparse.Namespace, client: Client) -> int:
    page = client.list_jobs(
        queue=args.queue, status=args.status, tenant=args.tenant, limit=args.limit,
        cursor=args.cursor, consistency="stale" if args.stale else None, kind=args.kind,
    )  # fmt: skip
    if args.json:
        print_json(page)
        return EXIT_OK
    jobs: list[JsonObject] = page.get("jobs", [])
    columns = JOB_COLUMNS
    if args.status == "dead_letter":
        columns = [*JOB_COLUMNS[:5], ("LAST ERROR", "last_error"), ("UPDATED", "updated_at")]
    print_table(jobs, columns)
    if page.get("next_cursor"):
        print(f"(more: --cursor {page['next_cursor']})")
    return EXIT_OK


def get_job(args: argparse.Namespace, client: Client) -> int:
    _show_job(args, client.get_job(args.job_id))
    return EXIT_OK


def cancel_job(args: argparse.Namespace, client: Client) -> int:
    _show_job(args, client.cancel_job(args.job_id, args.reason))
    return EXIT_OK


def replay_job(args: argparse.Namespace, client: Client) -> int:
    _show_job(args, client.replay_job(args.job_id, args.reason))
    return EXIT_OK


def job_history(args: argparse.Namespace, client: Client) -> int:
    events = client.job_history(args.job_id)
    if args.json:
        print_json({"events": events})
        return EXIT_OK
    present = [key for key in EVENT_KEYS if any(key in event for event in events)]
    others = sorted({key for event in events for key in event} - set(present))
    rows = [{**event, "details": {k: event[k] for k in others if k in event}} for event in events]
    columns = [(key.upper(), key) for key in present]
    print_table(rows, columns + ([("DETAILS", "details")] if others else []))
    return EXIT_OK


def cluster_status(args: argparse.Namespace, client: Client) -> int:
    status = client.cluster()
    if args.json:
        print_json(status)
        return EXIT_OK
    leader = status.get("leader") or {}
    print_fields(
        {**status, "leader": f"{leader.get('id')} {leader.get('http_url')}" if leader else None},
        ["node_id", "leader", "term", "commit_index", "applied_index", "cluster_id",
         "cluster_version"],
    )  # fmt: skip
    change = (status.get("membership") or {}).get("change")
    if change:
        print(f"change   {change['kind']} {change['id']} ({change['phase']})")
    print()
    nodes = [{**node, "release": (node.get("version") or {}).get("release")}
             for node in status.get("nodes", [])]  # fmt: skip
    print_table(nodes, NODE_COLUMNS)
    return EXIT_OK


CHANGE_FIELDS = ("kind", "id", "raft_address", "http_url", "status")


def add_node(args: argparse.Namespace, client: Client) -> int:
    change = client.add_node(args.node_id, args.raft, args.http_url.rstrip("/"))
    if args.json:
        print_json(change)
        return EXIT_OK
    print_fields(change, CHANGE_FIELDS)
    print(
        f"now start it: raftsched node --id {args.node_id} --raft {args.raft} ... "
        "--join <URL of any member>",
        file=sys.stderr,
    )
    return EXIT_OK


def remove_node(args: argparse.Namespace, client: Client) -> int:
    change = client.remove_node(args.node_id)
    if args.json:
        print_json(change)
    else:
        print_fields(change, CHANGE_FIELDS)
    return EXIT_OK


def _show_job(args: argparse.Namespace, job: JsonObject) -> None:
    if args.json:
        print_json(job)
        return
    print_fields(job, JOB_FIELDS)
    if job.get("attempts"):
        print()
        print_table(job["attempts"], ATTEMPT_COLUMNS)
