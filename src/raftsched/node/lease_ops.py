"""Lease operations and the claim that may ride on them (`next`, issue 18).

A worker that completes or fails a job can ask, in the same request, for its
next jobs (docs/api.md, "The next claim"). This module is the one place where
such a request becomes proposals, so that how it is proposed can change
without the HTTP layer noticing:

- in turn (every cluster today): the ops are queued together, so group commit
  puts them in one entry as a lease batch always did, and awaited; then the
  claim is made as an ordinary long-polling `ClaimJobs` with what is left of
  its wait. Two commands and two entries, one request.
- as one command (cluster version 6 and later): the core's
  `LeaseBatch(ops, claim)` (core.jobs.lease_batch), one future and one row of
  the entry for the whole request; a claim that finds nothing long-polls on
  afterwards as any claim does. Until every member runs a release that knows
  the command (the cluster-version gate), the path in turn is taken.

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
from raftsched.core.jobs.commands import (
    ClaimJobs,
    ClaimJobsOfKinds,
    CompleteJob,
    FailJob,
    HeartbeatJob,
    LeaseBatch,
    StartJob,
)
from raftsched.core.kernel.commands import Command
from raftsched.core.kernel.results import BatchApplied, Claimed, Lease, Rejected, Result
from raftsched.node.proposer import NotCommitted, NotLeader, OutcomeUnknown, QueueFull
from raftsched.node.versions import UpgradeRequired
from raftsched.node.view import NodeView

# The cluster version from which ops and their claim travel as one core
# command (`LeaseBatch`).
LEASE_BATCH_CLUSTER_VERSION = 6

# What proposing can raise instead of a result. Queuing the ops raises them for
# the whole request (nothing was queued); after that they are per op, or the
# claim's.
PROPOSAL_ERRORS = (NotLeader, NotCommitted, OutcomeUnknown, QueueFull, UpgradeRequired)
ProposalError = NotLeader | NotCommitted | OutcomeUnknown | QueueFull | UpgradeRequired

# A claim's kinds: (kind, at most this many of it), None for jobs without a
# kind (core `ClaimJobsOfKinds`).
ClaimKinds = tuple[tuple[str | None, int], ...]

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
    # Only jobs of these kinds (cluster version 8); None: any job.
    kinds: ClaimKinds | None = None

    def command(self, worker_id: str) -> ClaimJobs:
        return claim_command(worker_id, self.queues, self.max_jobs, self.lease_ms, self.kinds)


def claim_command(
    worker_id: str,
    queues: tuple[str, ...],
    max_jobs: int,
    lease_ms: int | None,
    kinds: ClaimKinds | None,
) -> ClaimJobs:
    """The core command of a claim: of any job, or of `kinds` only."""
    if kinds is None:
        return ClaimJobs(worker_id, queues, max_jobs, lease_ms)
    return ClaimJobsOfKinds(worker_id, queues, max_jobs, lease_ms, kinds)


def kind_quotas(kinds: ClaimKinds | None) -> dict[str | None, int] | None:
    """How many of each kind a claim may take (what waking needs)."""
    return None if kinds is None else dict(kinds)


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
    if claim is not None and claim.kinds is not None:
        refused = node.refused_for_version(claim.command(claim.worker_id or ""))
        if refused is not None:
            return await _ops_with_claim_refused(node, ops, claim, refused, size_bytes)
    if claim is not None or len(ops) > 1:
        together = await _propose_as_one_command(node, ops, claim, deadline, size_bytes)
        if together is not None:
            return together
    if ops:
        node.metrics.lease_requests.labels("in_turn").inc()
    results = await _propose_ops(node, ops, size_bytes)
    if claim is None or (claim.after_success_only and not all(map(_succeeded, results))):
        return LeaseOpsOutcome(results, None)
    if ops and all(isinstance(each, Rejected) for each in results):
        return LeaseOpsOutcome(results, None)  # as the core's LeaseBatch: no claim
    worker_id = claim.worker_id or _lease_holder(node, ops)
    if worker_id is None:  # cannot happen after a successful op; answered, not raised
        return LeaseOpsOutcome(results, Rejected("invalid_state", "no lease holder to claim for"))
    return LeaseOpsOutcome(results, await claim_until(node, claim, worker_id, deadline))


async def _ops_with_claim_refused(
    node: NodeView,
    ops: Sequence[Command],
    claim: ClaimRequest,
    refused: UpgradeRequired,
    size_bytes: int,
) -> LeaseOpsOutcome:
    """A claim of kinds before the cluster takes them (version 8): the ops go
    on as if no claim were asked for (a worker's completions must not wait
    for its claim), and the claim is answered with why it was not made, in
    the cases where it would have been made."""
    outcome = await propose_lease_ops(node, ops, None, size_bytes)
    results = outcome.results
    if claim.after_success_only and not all(map(_succeeded, results)):
        return outcome
    if ops and all(isinstance(each, Rejected) for each in results):
        return outcome
    return LeaseOpsOutcome(results, refused)


async def _propose_as_one_command(
    node: NodeView,
    ops: Sequence[Command],
    claim: ClaimRequest | None,
    deadline: float,
    size_bytes: int,
) -> LeaseOpsOutcome | None:
    """On a cluster of version LEASE_BATCH_CLUSTER_VERSION or later: the ops
    and the claim as one core command (`LeaseBatch`), one future and one row
    in the entry instead of one per op and one for the claim. None: take the
    path in turn, because the cluster is older, the claim names no holder,
    or there is one op and nothing to claim now (the op alone is the
    cheaper command, and the long-poll follows it either way).

    The claim goes into the command only when a claim of its queues would be
    granted a job now; otherwise the long-poll that follows (`claim_until`,
    until `deadline`) is what finds it. The core skips the claim when every
    op was refused, which for the single forms (one op) is
    `after_success_only`."""
    if not ops or node.cluster_version() < LEASE_BATCH_CLUSTER_VERSION:
        return None
    worker_id: str | None = None
    claim_now: ClaimJobs | None = None
    if claim is not None:
        worker_id = claim.worker_id or _lease_holder(node, ops)
        if worker_id is None:  # a stale token: the op will be refused, and no claim made
            return None
        if node.claim_wait_s(claim.queues, kind_quotas(claim.kinds)) == 0:
            claim_now = claim.command(worker_id)
    if claim_now is None and len(ops) == 1:
        return None
    node.metrics.lease_requests.labels("one_command").inc()
    try:
        result = await node.propose(LeaseBatch(tuple(ops), claim_now), size_bytes)
    except QueueFull:  # nothing was queued: the whole request is refused (503)
        raise
    except (NotCommitted, OutcomeUnknown) as error:  # queued, then lost or unknown
        return LeaseOpsOutcome([error] * len(ops), None if claim is None else error)
    if not isinstance(result, BatchApplied):  # refused whole (cannot happen for valid ops)
        return LeaseOpsOutcome([result] * len(ops), None)
    results: list[OpOutcome] = list(result.results)
    if claim is None or all(isinstance(each, Rejected) for each in results):
        return LeaseOpsOutcome(results, None)
    assert worker_id is not None
    claimed = result.claimed
    if isinstance(claimed, Rejected):
        return LeaseOpsOutcome(results, claimed)
    if isinstance(claimed, Claimed) and claimed.leases:
        return LeaseOpsOutcome(results, list(claimed.leases))
    # Nothing to grant yet: long-poll like a claim until the deadline.
    return LeaseOpsOutcome(results, await claim_until(node, claim, worker_id, deadline))


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
        return await node.claim(
            worker_id, claim.queues, claim.max_jobs, wait_s, claim.lease_ms, claim.kinds
        )
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
