"""`raftsched dev`: argument parsing for the local cluster launcher."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(commands: argparse._SubParsersAction[Any]) -> None:
    dev = commands.add_parser("dev", help="run a local cluster and a demo worker")
    dev.add_argument("--nodes", type=int, default=3, choices=range(1, 8), metavar="N")
    dev.add_argument("--data-dir", type=Path, default=Path("data/dev"))
    dev.add_argument("--http-port", type=int, default=8701, help="first node's; then +1 each")
    dev.add_argument("--raft-port", type=int, default=9701, help="first node's; then +1 each")
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--no-worker", dest="worker", action="store_false")
    dev.add_argument(
        "--tls", action="store_true",
        help="serve HTTPS: make a local CA and node certificates under DATA_DIR/tls",
    )  # fmt: skip
    dev.add_argument(
        "--insecure-http", action="store_true",
        help="allow plain HTTP on a non-loopback --host",
    )  # fmt: skip
    dev.add_argument(
        "--shards", type=int, default=1, choices=range(1, 65), metavar="S",
        help="data shards (docs/shards.md): every node runs group 0 and S-1 shard processes, "
        "and the demo worker polls every shard; fixed when DATA_DIR is first used",
    )  # fmt: skip
    dev.set_defaults(run=run_dev_command)


def run_dev_command(args: argparse.Namespace) -> int:
    from raftsched.devcluster import run_dev

    return run_dev(
        nodes=args.nodes,
        data_dir=args.data_dir,
        http_port=args.http_port,
        raft_port=args.raft_port,
        worker=args.worker,
        host=args.host,
        tls=args.tls,
        insecure_http=args.insecure_http,
        shards=args.shards,
    )
