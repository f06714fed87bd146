"""`raftsched worker`: run a worker agent with handlers from modules.

`--handler module:function` is the default handler (jobs without a kind);
`--handler KIND=module:function`, repeatable, the handler of a kind. The
worker claims only the kinds it has handlers for (worker._kinds)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, cast

from raftsched import tracing
from raftsched.cli._common import EXIT_USAGE, tls_options, token_from, urls_from
from raftsched.logs import configure_logging
from raftsched.worker import (
    Handler,
    Reconciler,
    WorkerConfig,
    default_worker_id,
    load_handler,
    run_worker,
)
from raftsched.worker._kinds import check_kind


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    worker = commands.add_parser("worker", parents=[common], help="run jobs from queues")
    worker.add_argument("--queue", action="append", required=True, help="repeatable")
    worker.add_argument(
        "--handler",
        action="append",
        required=True,
        metavar="[KIND=]MODULE:FUNCTION",
        help="the handler of KIND's jobs, or without KIND= the default handler (jobs "
        "without a kind); repeatable, one per kind",
    )
    worker.add_argument(
        "--kind-concurrency",
        action="append",
        default=[],
        metavar="KIND=N",
        help="at most N jobs of KIND at once, on top of --concurrency; repeatable",
    )
    worker.add_argument(
        "--reconciler",
        action="append",
        default=[],
        metavar="[QUEUE=]MODULE:FUNCTION",
        help="a reconcile handler for QUEUE's reconciliations (any queue without QUEUE=); "
        "repeatable",
    )
    worker.add_argument(
        "--dead-letter-unknown-kinds",
        action="store_true",
        help="also claim jobs of kinds without a --handler here and dead-letter them "
        "(no_handler_for_kind), rather than leave them to other workers: for a pool that "
        "alone serves its queues",
    )
    worker.add_argument("--concurrency", type=int, default=4)
    worker.add_argument("--worker-id", default=None, help="default: HOSTNAME-PID")
    worker.add_argument("--lease-s", type=float, default=30.0)
    worker.add_argument(
        "--poll-wait-s",
        type=float,
        default=20.0,
        help="long-poll length (at most half of --lease-s)",
    )
    worker.add_argument("--shutdown-grace-s", type=float, default=30.0)
    worker.add_argument(
        "--no-next-claims",
        dest="next_claims",
        action="store_false",
        help="claim only with POST /v1/leases, never with a finished job's report",
    )
    worker.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING"])
    worker.add_argument("--log-format", default="auto", choices=["auto", "json", "text"])
    worker.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="export spans (each attempt, each ctx.effect) over OTLP/HTTP to this collector "
        "(its base URL; spans go to /v1/traces). Default: as the OTEL_* environment says, "
        "else off (docs/observability.md)",
    )
    worker.add_argument(
        "--shard",
        type=int,
        metavar="K",
        help="a cluster of several data shards (docs/shards.md): claim the jobs of shard K "
        "only. Default: every shard the cluster has, sharing --concurrency",
    )
    worker.set_defaults(run=run_worker_command)


def run_worker_command(args: argparse.Namespace) -> int:
    try:
        handlers = _handlers(args.handler)
        reconcilers = dict(_reconciler(spec) for spec in args.reconciler)
        config = WorkerConfig(
            urls=urls_from(args),
            queues=tuple(args.queue),
            concurrency=args.concurrency,
            worker_id=args.worker_id or default_worker_id(),
            lease_s=args.lease_s,
            poll_wait_s=args.poll_wait_s,
            shutdown_grace_s=args.shutdown_grace_s,
            next_claims=args.next_claims,
            kind_concurrency=dict(_kind_limit(spec) for spec in args.kind_concurrency),
            dead_letter_unknown_kinds=args.dead_letter_unknown_kinds,
            shard=args.shard,
            token=token_from(args),
            timeout_s=args.timeout_s,
            **tls_options(args),
        )
        config.validate()
        unserved = sorted(set(config.kind_concurrency) - set(handlers))
        if unserved:
            raise ValueError(f"--kind-concurrency for kinds without a --handler: {unserved}")
    except (ValueError, ImportError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(args.log_format, level=logging.getLevelName(args.log_level))
    try:
        tracing.configure(
            "raftsched-worker", otlp_endpoint=args.otlp_endpoint, instance_id=config.worker_id
        )
    except tracing.TracingConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return run_worker(config, handlers, reconcilers)
    finally:
        tracing.shutdown()  # the spans still buffered go out


def _handlers(specs: list[str]) -> dict[str | None, Handler]:
    """`[KIND=]MODULE:FUNCTION` each; no KIND: the default handler."""
    handlers: dict[str | None, Handler] = {}
    for spec in specs:
        kind, sep, target = spec.partition("=")
        name = check_kind(kind) if sep else None
        if name in handlers:
            what = f"kind {name!r}" if name is not None else "the default handler"
            raise ValueError(f"--handler: {what} given twice")
        handlers[name] = load_handler(target if sep else spec)
    return handlers


def _kind_limit(spec: str) -> tuple[str, int]:
    kind, sep, number = spec.partition("=")
    if not sep or not number.isdigit():
        raise ValueError(f"--kind-concurrency looks like KIND=N, got {spec!r}")
    return check_kind(kind), int(number)


def _reconciler(spec: str) -> tuple[str | None, Reconciler]:
    queue, sep, target = spec.partition("=")
    if not sep:
        return None, cast(Reconciler, load_handler(spec))
    if not queue:
        raise ValueError(f"--reconciler: an empty queue in {spec!r}")
    return queue, cast(Reconciler, load_handler(target))
