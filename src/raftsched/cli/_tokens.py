"""`raftsched tokens create|list|get|revoke` (admin) and `raftsched whoami`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raftsched.cli._common import EXIT_OK, print_fields, print_json, print_table, with_client
from raftsched.client import Client

ROLES = ("admin", "operator", "submitter", "worker", "viewer")
TOKEN_FIELDS = (
    "id", "name", "role", "tenants", "queues", "created_at", "expires_at", "revoked_at",
    "last_used_at",
)  # fmt: skip
COLUMNS = [
    ("ID", "id"), ("NAME", "name"), ("ROLE", "role"), ("TENANTS", "tenants"),
    ("QUEUES", "queues"), ("EXPIRES", "expires_at"), ("REVOKED", "revoked_at"),
    ("LAST USED", "last_used_at"),
]  # fmt: skip


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    tokens = commands.add_parser("tokens", help="API tokens (admin)")
    actions = tokens.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser(
        "create", parents=[common], help="create a token; prints its secret once"
    )
    create.add_argument("name")
    create.add_argument("--role", required=True, choices=ROLES)
    create.add_argument("--tenant", action="append", help="repeatable (default: all)")
    create.add_argument("--queue", action="append", help="repeatable (default: all)")
    create.add_argument("--expires-at", help="RFC 3339 time (default: never)")
    create.set_defaults(run=with_client(create_token))
    listing = actions.add_parser("list", parents=[common], help="every token, without secrets")
    listing.set_defaults(run=with_client(list_tokens))
    get = actions.add_parser("get", parents=[common], help="one token")
    get.add_argument("token_id")
    get.set_defaults(run=with_client(get_token))
    revoke = actions.add_parser("revoke", parents=[common], help="revoke a token")
    revoke.add_argument("token_id")
    revoke.set_defaults(run=with_client(revoke_token))
    whoami = commands.add_parser("whoami", parents=[common], help="the token this CLI uses")
    whoami.set_defaults(run=with_client(show_whoami))


def create_token(args: argparse.Namespace, client: Client) -> int:
    created = client.create_token(
        args.name,
        args.role,
        tenants=args.tenant or ["*"],
        queues=args.queue or ["*"],
        expires_at=args.expires_at,
    )
    if args.json:
        print_json(created)
        return EXIT_OK
    print_fields(created["token"], TOKEN_FIELDS)
    print(f"secret  {created['secret']}")
    print(
        "(the secret is shown only now; keep it, e.g. export RAFTSCHED_TOKEN=...)", file=sys.stderr
    )
    return EXIT_OK


def list_tokens(args: argparse.Namespace, client: Client) -> int:
    tokens = client.list_tokens()
    if args.json:
        print_json({"tokens": tokens})
    else:
        print_table(tokens, COLUMNS)
    return EXIT_OK


def get_token(args: argparse.Namespace, client: Client) -> int:
    token = client.get_token(args.token_id)
    if args.json:
        print_json({"token": token})
    else:
        print_fields(token, TOKEN_FIELDS)
    return EXIT_OK


def revoke_token(args: argparse.Namespace, client: Client) -> int:
    token = client.revoke_token(args.token_id)
    if args.json:
        print_json({"token": token})
    else:
        print(f"revoked {token['id']} ({token['name']}) at {token['revoked_at']}")
    return EXIT_OK


def show_whoami(args: argparse.Namespace, client: Client) -> int:
    answer = client.whoami()
    if args.json:
        print_json(answer)
    elif answer.get("token") is None:
        print("authentication is off: every request acts as the anonymous admin")
    else:
        print_fields(answer["token"], TOKEN_FIELDS)
    return EXIT_OK
