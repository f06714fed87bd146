"""Flow control: `raftsched queues|tenants get|set|pause|resume`.

`set` replaces the settings as PUT does: a limit not given is no limit.
`get` without a name lists them all; `--json` prints the API's objects.
"""

from __future__ import annotations

import argparse
from typing import Any

from raftsched.cli._common import EXIT_OK, print_fields, print_json, print_table, with_client
from raftsched.client import Client

QUEUE_COLUMNS = [
    ("QUEUE", "name"),
    ("DEPTH", "depth"),
    ("RUNNING", "running"),
    ("OLDEST S", "oldest_runnable_age_s"),
    ("PAUSED", "paused"),
    ("RATE/S", "rate_limit_per_s"),
    ("BURST", "burst"),
    ("CONCURRENCY", "concurrency_limit"),
    ("THROTTLED", "throttled"),
    ("BLOCKED KEYS", "blocked_keys"),
]
TENANT_COLUMNS = [
    ("TENANT", "name"),
    ("WEIGHT", "weight"),
    ("CONCURRENCY", "concurrency_limit"),
    ("MAX QUEUED", "max_queued"),
    ("QUEUED", "queued"),
    ("RUNNING", "running"),
    ("THROTTLED", "throttled"),
]


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    _register_queues(commands, common)
    _register_tenants(commands, common)


def _register_queues(
    commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser
) -> None:
    queues = commands.add_parser("queues", help="queue limits, pause and figures")
    actions = queues.add_subparsers(dest="action", required=True, metavar="ACTION")
    get = actions.add_parser("get", parents=[common], help="one queue, or all of them")
    get.add_argument("name", nargs="?")
    get.set_defaults(run=with_client(queues_get))
    put = actions.add_parser("set", parents=[common], help="replace a queue's settings")
    put.add_argument("name")
    put.add_argument("--rate-limit-per-s", type=float)
    put.add_argument("--burst", type=int)
    put.add_argument("--concurrency-limit", type=int)
    put.add_argument("--circuit-window", type=int, help="4..64 outcomes; omit: no circuit")
    put.add_argument("--circuit-probe-interval-s", type=float)
    put.add_argument("--paused", action="store_true")
    put.set_defaults(run=with_client(queues_set))
    for action in ("pause", "resume"):
        command = actions.add_parser(action, parents=[common], help=f"{action} claims")
        command.add_argument("name")
        command.set_defaults(run=with_client(queues_pause), paused=action == "pause")


def _register_tenants(
    commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser
) -> None:
    tenants = commands.add_parser("tenants", help="tenant weights and limits")
    actions = tenants.add_subparsers(dest="action", required=True, metavar="ACTION")
    get = actions.add_parser("get", parents=[common], help="one tenant, or all of them")
    get.add_argument("name", nargs="?")
    get.set_defaults(run=with_client(tenants_get))
    put = actions.add_parser("set", parents=[common], help="replace a tenant's settings")
    put.add_argument("name")
    put.add_argument("--weight", type=int)
    put.add_argument("--concurrency-limit", type=int)
    put.add_argument("--max-queued", type=int)
    put.set_defaults(run=with_client(tenants_set))


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def queues_get(args: argparse.Namespace, client: Client) -> int:
    if args.name is None:
        queues = client.list_queues()
        print_json(queues) if args.json else print_table(queues, QUEUE_COLUMNS)
    else:
        queue = client.get_queue(args.name)
        print_json(queue) if args.json else print_fields(queue, list(queue))
    return EXIT_OK


def queues_set(args: argparse.Namespace, client: Client) -> int:
    settings = _given(
        args,
        (
            "rate_limit_per_s",
            "burst",
            "concurrency_limit",
            "circuit_window",
            "circuit_probe_interval_s",
        ),
    )
    queue = client.set_queue(args.name, paused=args.paused, **settings)
    print_fields(queue, list(queue))
    return EXIT_OK


def queues_pause(args: argparse.Namespace, client: Client) -> int:
    queue = client.pause_queue(args.name) if args.paused else client.resume_queue(args.name)
    print_fields(queue, list(queue))
    return EXIT_OK


def tenants_get(args: argparse.Namespace, client: Client) -> int:
    if args.name is None:
        tenants = client.list_tenants()
        print_json(tenants) if args.json else print_table(tenants, TENANT_COLUMNS)
    else:
        tenant = client.get_tenant(args.name)
        print_json(tenant) if args.json else print_fields(tenant, list(tenant))
    return EXIT_OK


def tenants_set(args: argparse.Namespace, client: Client) -> int:
    settings = _given(args, ("weight", "concurrency_limit", "max_queued"))
    tenant = client.set_tenant(args.name, **settings)
    print_fields(tenant, list(tenant))
    return EXIT_OK
