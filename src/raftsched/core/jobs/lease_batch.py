"""A lease batch: a worker's lease operations and its next claim, one command.

Theory of operation. A worker finishes jobs, reports each outcome and asks
for more. As single commands every report and every claim is its own
msgpack record, future and result on the leader, and its own row in the
Raft entry; `LeaseBatch` carries a whole request's worth as one (issue 18).
It changes what is stored per request, never what the operations do: each
op goes through the kernel's per-command path (`kernel.apply.apply_command`),
so it gets its own savepoint, hooks, events and result, exactly as if it
had been the next command of the entry. Applying a batch and applying its
ops, then its claim, one by one give the same state, byte for byte, and the
same results (tests/core/test_core_lease_batch.py).

Rules
-----
1. The ops are the lease operations: `StartJob`, `HeartbeatJob`,
   `CompleteJob`, `FailJob`, `ReconcileJob`. Anything else (a claim, an
   operator command, another batch) is `Rejected(invalid_request)` in its
   slot, with `{"field": "ops", "index": i}`, and never applied; the other
   ops are applied as usual.
2. The ops are applied in order; then the claim, if any, so that jobs just
   completed free their concurrency slots and ordering keys for it. A claim
   slot that holds anything but a `ClaimJobs` (or a `ClaimJobsOfKinds`,
   since cluster version 8) is rejected in its slot
   (`{"field": "claim"}`). When the batch has ops and every one of them was
   rejected, the claim is not applied (`claimed` is None): a worker whose
   tokens are all stale may not be the holder it would claim for, and its
   request is answered with the ops' errors, which would strand the leases.
3. A batch that is not a tuple of at most `BATCH_MAX` ops, or that carries
   neither an op nor a claim, is rejected whole: nothing is applied.
4. Nesting is one level: the codec refuses a command that holds commands
   inside another (kernel.codec, `NESTING_KINDS`), and rule 1 refuses it
   when a batch is built in memory.
5. Since cluster version 6: older replicas cannot decode it, so the node
   refuses to propose it until every member runs a release that can.
"""

from __future__ import annotations

from typing import Final

from raftsched.core.jobs.commands import (
    ClaimJobs,
    ClaimJobsOfKinds,
    CompleteJob,
    FailJob,
    HeartbeatJob,
    LeaseBatch,
    ReconcileJob,
    StartJob,
)
from raftsched.core.kernel.apply import apply_command
from raftsched.core.kernel.feature import Context
from raftsched.core.kernel.results import INVALID_REQUEST, BatchApplied, Rejected, Result
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import BATCH_MAX, invalid

__all__ = ["LEASE_OPS", "LeaseBatch", "apply_lease_batch", "batch_size"]

# The operations a batch may carry.
LEASE_OPS: Final = frozenset({StartJob, HeartbeatJob, CompleteJob, FailJob, ReconcileJob})

# What a batch's claim may be.
_CLAIMS: Final = frozenset({ClaimJobs, ClaimJobsOfKinds})
_NOT_A_LEASE_OP: Final = (
    "a lease batch carries only start, heartbeat, complete, fail and reconcile operations"
)


def apply_lease_batch(
    state: State, command: LeaseBatch, context: Context
) -> BatchApplied | Rejected:
    ops, claim = command.ops, command.claim
    if type(ops) is not tuple or len(ops) > BATCH_MAX:
        return invalid("ops", f"a lease batch carries at most {BATCH_MAX} operations")
    if not ops and claim is None:
        return invalid("ops", "a lease batch carries an operation or a claim")
    results = [
        apply_command(state, op, context) if type(op) in LEASE_OPS else _not_a_lease_op(index)
        for index, op in enumerate(ops)
    ]
    claimed: Result | None = None
    if results and all(type(result) is Rejected for result in results):
        claim = None
    if claim is not None:
        if type(claim) in _CLAIMS:
            claimed = apply_command(state, claim, context)
        else:
            claimed = invalid("claim", "a lease batch's claim is a claim")
    return BatchApplied(tuple(results), claimed)


def _not_a_lease_op(index: int) -> Rejected:
    return Rejected(INVALID_REQUEST, _NOT_A_LEASE_OP, {"field": "ops", "index": index})


def batch_size(command: LeaseBatch) -> int:
    """How many jobs a batch may change: one per op, one per job its claim
    may grant (what the proposer weighs an entry by)."""
    ops = len(command.ops) if type(command.ops) is tuple else 0
    claim = command.claim
    if claim is None or type(claim) not in _CLAIMS or type(claim.max_jobs) is not int:
        return ops
    return ops + claim.max_jobs
