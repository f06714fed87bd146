"""The `raftsched` command line: node, dev, submit, jobs, dlq, cluster, worker,
audit, reconciliation, tokens, whoami, backup, restore.

Exit codes: 0 success, 1 an error from the cluster or the network
(`error: <code>: <message>` on stderr), 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from raftsched.child_processes import die_with_parent
from raftsched.cli import (
    _audit,
    _backup,
    _dev,
    _events,
    _flow,
    _jobs,
    _node,
    _reconciliation,
    _schedules,
    _tokens,
    _top,
    _worker,
    _workflows,
)
from raftsched.cli._common import EXIT_ERROR, client_options


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftsched",
        description="A distributed job scheduler on Raft.",
        parents=[client_options(defaults=True)],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = client_options(defaults=False)
    _node.register(commands)
    _dev.register(commands)
    _jobs.register(commands, common)
    _worker.register(commands, common)
    _workflows.register(commands, common)
    _events.register(commands, common)
    _top.register(commands, common)
    _flow.register(commands, common)
    _schedules.register(commands, common)
    _audit.register(commands, common)
    _reconciliation.register(commands, common)
    _tokens.register(commands, common)
    _backup.register(commands, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # A node or worker started by `raftsched dev`, raftsched.testing or the
    # chaos harness dies with it, however it ends (see child_processes).
    die_with_parent()
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except BrokenPipeError:
        # `raftsched jobs list | head`: the reader left; say nothing more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    return code
