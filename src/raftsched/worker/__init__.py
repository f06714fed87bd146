"""The raftsched worker agent.

    from raftsched.worker import JobContext, PermanentError

    def handle(ctx: JobContext) -> dict:
        receipt = ctx.effect(f"charge:{ctx.payload['id']}", lambda: charge(ctx.payload))
        return {"receipt": receipt}

Run it with `raftsched worker --queue payments --handler mymodule:handle`, or
from Python with `run_worker(WorkerConfig(...), handle)` / `await Worker(...).run()`.
Sync handlers run in their own threads (cancellation is cooperative: check
`ctx.cancelled` or call `ctx.check_cancelled()`); `async def` handlers run on
the worker's loop and are cancelled at their next await. A handler's return
value (JSON) completes the job; `PermanentError` dead-letters it; any other
exception is a transient failure that is retried with backoff.

Jobs of a kind run with that kind's handler: `worker.handler("charge")` as a
decorator, or `Worker(config, {"charge": charge, None: default})`; a worker
claims only the kinds it has handlers for, at most `max_concurrency` of a
kind at once, and dead-letters a job it has no handler for
(`no_handler_for_kind`, see `_kinds`). `--handler kind=module:fn` on the CLI.

Jobs with `on_unknown: reconcile` need a reconcile handler on their
reconcile queue (`@worker.reconciler("payments")`, see `_reconcile`): it
answers `Happened(result)`, `DidNotHappen()` or `CannotTell(reason)` about
an attempt whose outcome is unknown.

Test a handler without a cluster with `raftsched.testing.run_handler` (and
`run_reconciler`): docs/testing-handlers.md.
"""

from raftsched.worker._agent import (
    Worker,
    WorkerConfig,
    default_worker_id,
    load_handler,
    run_worker,
)
from raftsched.worker._batcher import LeaseBatcher
from raftsched.worker._context import (
    CancelReason,
    JobCancelled,
    JobContext,
    Lease,
    PermanentError,
    TransientError,
)
from raftsched.worker._job import Handler
from raftsched.worker._kinds import NO_HANDLER_FOR_KIND, NoHandlerForKind
from raftsched.worker._reconcile import (
    CannotTell,
    Decision,
    DidNotHappen,
    Happened,
    ReconcileContext,
    Reconciler,
    UnknownAttempt,
)

__all__ = [
    "NO_HANDLER_FOR_KIND",
    "NoHandlerForKind",
    "CancelReason",
    "CannotTell",
    "Decision",
    "DidNotHappen",
    "Happened",
    "ReconcileContext",
    "Reconciler",
    "UnknownAttempt",
    "Handler",
    "JobCancelled",
    "JobContext",
    "Lease",
    "LeaseBatcher",
    "PermanentError",
    "TransientError",
    "Worker",
    "WorkerConfig",
    "default_worker_id",
    "load_handler",
    "run_worker",
]
