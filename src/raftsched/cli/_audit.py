"""`raftsched audit list`: the replicated audit trail of operator actions."""

from __future__ import annotations

import argparse
from typing import Any

from raftsched.cli._common import EXIT_OK, print_json, print_table, with_client
from raftsched.client import Client

AUDIT_COLUMNS = [
    ("SEQ", "seq"),
    ("AT", "at"),
    ("ACTOR", "actor"),
    ("KIND", "kind"),
    ("TARGET", "target"),
    ("TENANT", "tenant"),
    ("DETAIL", "detail"),
]


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    audit = commands.add_parser("audit", help="who did which operator action")
    actions = audit.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", parents=[common], help="newest first")
    listing.add_argument("--actor", help="only this actor (a token's 'name (id)')")
    listing.add_argument("--kind", help="only this kind, e.g. job.replay")
    listing.add_argument("--limit", type=int)
    listing.add_argument("--cursor", help="continue where the last page ended")
    listing.add_argument("--stale", action="store_true", help="read this node's replica")
    listing.set_defaults(run=with_client(list_audit))


def list_audit(args: argparse.Namespace, client: Client) -> int:
    page = client.audit(
        actor=args.actor,
        kind=args.kind,
        limit=args.limit,
        cursor=args.cursor,
        consistency="stale" if args.stale else None,
    )
    if args.json:
        print_json(page)
        return EXIT_OK
    print_table(page.get("entries", []), AUDIT_COLUMNS)
    if page.get("next_cursor"):
        print(f"(more: --cursor {page['next_cursor']})")
    return EXIT_OK
