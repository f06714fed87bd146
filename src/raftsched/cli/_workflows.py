"""`raftsched workflows submit|get|list|cancel|history`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from raftsched.cli._common import EXIT_OK, EXIT_USAGE, print_json, print_table, with_client
from raftsched.client import Client

WORKFLOW_COLUMNS = [
    ("ID", "id"),
    ("STATUS", "status"),
    ("TENANT", "tenant"),
    ("REASON", "reason"),
    ("UPDATED", "updated_at"),
]
STEP_COLUMNS = [
    ("STEP", "name"),
    ("STATUS", "status"),
    ("JOB", "job_id"),
    ("JOB STATUS", "job_status"),
    ("COMPENSATION", "compensation_status"),
]


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    workflows = commands.add_parser("workflows", help="submit, inspect and cancel workflows")
    actions = workflows.add_subparsers(dest="action", required=True, metavar="ACTION")
    submit = actions.add_parser("submit", parents=[common], help="submit a workflow (JSON)")
    submit.add_argument("file", help="the request body (api.md Workflows) as JSON; - for stdin")
    submit.set_defaults(run=with_client(submit_workflow))
    get = actions.add_parser("get", parents=[common], help="a workflow and its steps")
    get.add_argument("workflow_id")
    get.set_defaults(run=with_client(get_workflow))
    listing = actions.add_parser("list", parents=[common], help="newest first")
    listing.add_argument("--status")
    listing.add_argument("--tenant")
    listing.add_argument("--limit", type=int)
    listing.set_defaults(run=with_client(list_workflows))
    cancel = actions.add_parser("cancel", parents=[common], help="cancel (compensating)")
    cancel.add_argument("workflow_id")
    cancel.add_argument("--reason")
    cancel.set_defaults(run=with_client(cancel_workflow))
    history = actions.add_parser("history", parents=[common], help="the workflow's life")
    history.add_argument("workflow_id")
    history.set_defaults(run=with_client(workflow_history))


def submit_workflow(args: argparse.Namespace, client: Client) -> int:
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    try:
        request = json.loads(text)
    except json.JSONDecodeError as error:
        print(f"error: {args.file} is not JSON: {error}", file=sys.stderr)
        return EXIT_USAGE
    _print_workflow(client.submit_workflow(request))
    return EXIT_OK


def _print_workflow(workflow: dict[str, Any]) -> None:
    print(f"{workflow['id']}  {workflow['status']}  {workflow.get('reason') or ''}".rstrip())
    rows = [
        {
            "name": name,
            **step,
            "compensation_status": (step.get("compensation") or {}).get("status"),
        }
        for name, step in workflow.get("steps", {}).items()
    ]
    print_table(rows, STEP_COLUMNS)


def get_workflow(args: argparse.Namespace, client: Client) -> int:
    workflow = client.get_workflow(args.workflow_id)
    if getattr(args, "json", False):
        print_json(workflow)
    else:
        _print_workflow(workflow)
    return EXIT_OK


def list_workflows(args: argparse.Namespace, client: Client) -> int:
    found = client.list_workflows(status=args.status, tenant=args.tenant, limit=args.limit)
    print_table(found["workflows"], WORKFLOW_COLUMNS)
    return EXIT_OK


def cancel_workflow(args: argparse.Namespace, client: Client) -> int:
    _print_workflow(client.cancel_workflow(args.workflow_id, args.reason))
    return EXIT_OK


def workflow_history(args: argparse.Namespace, client: Client) -> int:
    print_table(
        client.workflow_history(args.workflow_id),
        [("AT", "at"), ("EVENT", "event"), ("DETAIL", "detail")],
    )
    return EXIT_OK
