"""What every client-side command shares: connection options, output in
tables or JSON, and the mapping of errors to exit codes (1 for errors from
the cluster or the network, 2 for bad usage)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

from raftsched.client import DEFAULT_URLS, ApiError, Client, RaftschedError, urls_from_env
from raftsched.client._calls import token_from_env

Command = Callable[[argparse.Namespace], int]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
CLI_RETRY_BUDGET_MAX_S = 10.0


def client_options(*, defaults: bool) -> argparse.ArgumentParser:
    """Connection and output options. They are accepted both before the
    command (`raftsched --json jobs list`) and after it; the copy after the
    command has no defaults, so that it does not overwrite a value given
    before the command (an argparse quirk)."""

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("connection")
    group.add_argument(
        "--url",
        action="append",
        default=default(None),
        help="node URL, repeatable or comma-separated "
        "(default: $RAFTSCHED_URL or the three local dev nodes)",
    )
    group.add_argument(
        "--token",
        default=default(None),
        help="API token secret (default: $RAFTSCHED_TOKEN, else data/dev/admin.token "
        "under the current directory, which `raftsched dev` writes)",
    )
    group.add_argument(
        "--timeout-s", type=float, default=default(10.0), help="per request (default 10)"
    )
    group.add_argument(
        "--ca-file",
        default=default(os.environ.get("RAFTSCHED_CA_FILE")),
        help="CA bundle to verify https:// nodes with (default: $RAFTSCHED_CA_FILE, "
        "else the system store)",
    )
    group.add_argument(
        "--client-cert",
        default=default(os.environ.get("RAFTSCHED_CLIENT_CERT")),
        help="client certificate (PEM) for a cluster that requires one "
        "(default: $RAFTSCHED_CLIENT_CERT)",
    )
    group.add_argument(
        "--client-key",
        default=default(os.environ.get("RAFTSCHED_CLIENT_KEY")),
        help="the client certificate's key (default: $RAFTSCHED_CLIENT_KEY)",
    )
    parent.add_argument(
        "--json", action="store_true", default=default(False), help="print the API's JSON"
    )
    return parent


def urls_from(args: argparse.Namespace) -> list[str]:
    given: Sequence[str] = args.url or [urls_from_env() or ",".join(DEFAULT_URLS)]
    return [url.strip() for item in given for url in item.split(",") if url.strip()]


class TlsOptions(TypedDict):
    """The client's (and the worker's) TLS keyword arguments."""

    ca_file: str | None
    client_cert: str | None
    client_key: str | None


def tls_options(args: argparse.Namespace) -> TlsOptions:
    return {"ca_file": args.ca_file, "client_cert": args.client_cert, "client_key": args.client_key}


DEV_TOKEN_FILE = Path("data/dev/admin.token")


def token_from(args: argparse.Namespace) -> str:
    """`--token`, else `$RAFTSCHED_TOKEN`, else `data/dev/admin.token` under
    the current directory; "" (no token) when none of them has one."""
    given = getattr(args, "token", None) or token_from_env()
    if given:
        return str(given)
    try:
        return DEV_TOKEN_FILE.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def make_client(args: argparse.Namespace) -> Client:
    # A person is waiting: give up on a dead cluster sooner than programs do.
    budget_s = min(CLI_RETRY_BUDGET_MAX_S, 2 * args.timeout_s)
    return Client(
        urls_from(args),
        timeout_s=args.timeout_s,
        retry_budget_s=budget_s,
        token=token_from(args),
        **tls_options(args),
    )


def with_client(command: Callable[[argparse.Namespace, Client], int]) -> Command:
    """Run `command` with a client; API and network errors become exit 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            with make_client(args) as client:
                return command(args, client)
        except ApiError as error:
            field = error.details.get("field")
            suffix = f" (field: {field})" if field else ""
            print(f"error: {error.code}: {error.message}{suffix}", file=sys.stderr)
        except RaftschedError as error:
            print(f"error: {error}", file=sys.stderr)
        except ValueError as error:  # a bad URL
            print(f"error: {error}", file=sys.stderr)
            return EXIT_USAGE
        return EXIT_ERROR

    return run


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) <= {"kind", "message", "retry_after_s"}:
        return f"{value.get('kind')}: {value.get('message')}"  # a job's error
    return json.dumps(value, separators=(",", ":"))


def print_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> None:
    """`columns`: (header, key) pairs; missing values print as '-'."""
    cells = [[cell(row.get(key)) for _, key in columns] for row in rows]
    headers = [header for header, _ in columns]
    widths = [max(len(text) for text in column) for column in zip(headers, *cells, strict=False)]
    for line in [headers, *cells]:
        padded = (text.ljust(width) for text, width in zip(line, widths, strict=True))
        print("  ".join(padded).rstrip())


def print_fields(item: Mapping[str, Any], keys: Sequence[str]) -> None:
    """`key: value` lines for the given keys that are present."""
    present = [key for key in keys if key in item]
    width = max((len(key) for key in present), default=0)
    for key in present:
        print(f"{key.ljust(width)}  {cell(item[key])}")
