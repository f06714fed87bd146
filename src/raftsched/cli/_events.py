"""`raftsched events tail`: follow the outbox, one JSON event per line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from raftsched.cli._common import EXIT_OK, with_client
from raftsched.client import Client


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    events = commands.add_parser("events", help="the event stream (outbox)")
    actions = events.add_subparsers(dest="action", required=True, metavar="ACTION")
    tail = actions.add_parser("tail", parents=[common], help="print events as they happen")
    tail.add_argument(
        "--after",
        default=None,
        help="start after this seq (a cluster of several shards: the cursor v1.<seq0>.<seq1>...)",
    )
    tail.add_argument("--types", help="comma-separated types; job.* matches a prefix")
    tail.add_argument("--no-follow", action="store_true", help="print what is there and stop")
    tail.set_defaults(run=with_client(tail_events))


def tail_events(args: argparse.Namespace, client: Client) -> int:
    types = [t for t in (args.types or "").split(",") if t] or None
    after: int | str = args.after
    if args.after is None:  # like `tail -f`: only what happens from now on
        after = 0 if args.no_follow else client.events(0, limit=1)["last_seq"]
    while True:
        page = client.events(after, types=types, wait_s=0 if args.no_follow else 20, limit=500)
        for event in page["events"]:
            sys.stdout.write(json.dumps(event) + "\n")
            after = event["seq"]
        # Several shards: each event's seq is its shard's; the page says
        # where every shard's stream continues.
        after = page.get("next_after", after)
        sys.stdout.flush()
        if args.no_follow and not page["events"]:
            return EXIT_OK
