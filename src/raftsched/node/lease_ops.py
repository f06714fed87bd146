"""Lease operations and the claim that may ride on them (`next`, issue 18).

A worker that completes or fails a job can ask, in the same request, for its
next jobs (docs/api.md, "The next claim"). This module is the one place where
such a request becomes proposals, so that how it is proposed can change
without the HTTP layer noticing:

- in turn (every cluster today): the ops are queued together, so group commit
  puts them in one entry as a lease batch always did, and awaited; then the
  claim is made as an ordinary long-polling `ClaimJobs` with what is left of
  its wait. Two commands and two entries, one request.
- as one command (cluster version 6): the core's `LeaseBatch(ops, claim)` is
  being built on branch leasecore. Its place is `_propose_as_one_command`;
  until it is wired in there, that returns None and the path in turn is taken.

Either way the outcomes are those of the single forms: each op its own result,
and the claim the leases `POST /v1/leases` would have granted. A granted lease
is `claimed`, not `running`: the worker still starts it, because the start is
what tells a lost claim answer (nothing ran, a free retry) from a lost worker
(an unknown outcome that reconciliation must settle).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from raftsched import core
from raftsched.core.jobs.commands import CompleteJob, FailJob, HeartbeatJob, StartJob
from raftsched.core.kernel.commands import Command
from raftsched.core.kernel.results import Lease, Rejected, Result
from raftsched.node.proposer import NotCommitted, NotLeader, OutcomeUnknown, QueueFull
from raftsched.node.versions import UpgradeRequired
from raftsched.node.view import NodeView

# The cluster version from which ops and their claim can travel as one core
# command (`LeaseBatch`, branch leasecore).
LEASE_BATCH_CLUSTER_VERSION = 6

# What proposing can raise instead of a result. Queuing the ops raises them for
# the whole request (nothing was queued); after that they are per op, or the
# claim's.
PROPOSAL_ERRORS = (NotLeader, NotCommitted, OutcomeUnknown, QueueFull, UpgradeRequired)
ProposalError = NotLeader | NotCommitted | OutcomeUnknown | QueueFull | UpgradeRequired

# One op's outcome: the core's result (a Rejected included), or why there is none.
OpOutcome = Result | ProposalError
# The claim's: the leases (possibly none), the core's rejection, or why it has none.
ClaimOutcome = list[Lease] | Rejected | ProposalError


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """A claim that rides on lease operations, validated (api.leases)."""

    queues: tuple[str, ...]
    max_jobs: int
    wait_s: float
    lease_ms: int | None
    # None: whoever holds the lease of the first op (the single forms).
    worker_id: str | None
    # Claim only when every op succeeded (the single forms: a worker whose op
    # was rejected may not be the lease holder it would claim for).
    after_success_only: bool


@dataclass(frozen=True, slots=True)
class LeaseOpsOutcome:
    results: list[OpOutcome]
    # None: no claim was asked for, or it was skipped (`after_success_only`).
    claim: ClaimOutcome | None


async def propose_lease_ops(
    node: NodeView, ops: Sequence[Command], claim: ClaimRequest | None, size_bytes: int = 0
) -> LeaseOpsOutcome:
    """Propose `ops` and then, if asked, the claim. Raises what queuing the
    ops raises (NotLeader, QueueFull, UpgradeRequired), before anything is
    queued; every later failure is in the outcome."""
    deadline = asyncio.get_running_loop().time() + (claim.wait_s if claim is not None else 0.0)
    if claim is not None:
        together = await _propose_as_one_command(node, ops, claim, size_bytes)
        if together is not None:
            return together
    results = await _propose_ops(node, ops, size_bytes)
    if claim is None or (claim.after_success_only and not all(map(_succeeded, results))):
        return LeaseOpsOutcome(results, None)
    worker_id = claim.worker_id or _lease_holder(node, ops)
    if worker_id is None:  # cannot happen after a successful op; answered, not raised
        return LeaseOpsOutcome(results, Rejected("invalid_state", "no lease holder to claim for"))
    return LeaseOpsOutcome(results, await claim_until(node, claim, worker_id, deadline))


async def _propose_as_one_command(
    node: NodeView, ops: Sequence[Command], claim: ClaimRequest, size_bytes: int
) -> LeaseOpsOutcome | None:
    """THE PLACE FOR `LeaseBatch`: on a cluster of version
    LEASE_BATCH_CLUSTER_VERSION or later, propose ops and claim as one core
    command and map its per-op results and leases to a LeaseOpsOutcome; a
    claim that granted nothing then long-polls for the rest of its wait
    through `claim_until`. None: not available, take the path in turn.

    The command is built on branch leasecore and wired in here after merging;
    until then every cluster takes the path in turn."""
    return None


async def _propose_ops(node: NodeView, ops: Sequence[Command], size_bytes: int) -> list[OpOutcome]:
    if not ops:
        return []
    futures = node.submit_all(ops, size_bytes)  # one entry, all or none
    results: list[OpOutcome] = []
    for future in futures:
        try:
            results.append(await future)
        except PROPOSAL_ERRORS as error:
            results.append(error)
    return results


async def claim_until(
    node: NodeView, claim: ClaimRequest, worker_id: str, deadline: float
) -> ClaimOutcome:
    """The claim, long-polling until `deadline` (loop time) at the latest."""
    wait_s = max(0.0, deadline - asyncio.get_running_loop().time())
    try:
        return await node.claim(worker_id, claim.queues, claim.max_jobs, wait_s, claim.lease_ms)
    except PROPOSAL_ERRORS as error:
        return error


def _succeeded(outcome: OpOutcome) -> bool:
    return not isinstance(outcome, Rejected | Exception)


def _lease_holder(node: NodeView, ops: Sequence[Command]) -> str | None:
    """The worker that held the lease the first op was fenced with. Read after
    the op succeeded, so the attempt that token names is in the replica."""
    op = ops[0] if ops else None
    if not isinstance(op, StartJob | HeartbeatJob | CompleteJob | FailJob):
        return None
    token = op.fencing_token
    with node.reading() as state:
        job = core.get_job(state, op.job_id)
        if job is None:
            return None
        if job.lease is not None and job.lease.fencing_token == token:
            return job.lease.worker_id
        # The op ended the attempt (complete, fail): its record keeps the worker.
        return next((a.worker_id for a in reversed(job.attempts) if a.fencing_token == token), None)
