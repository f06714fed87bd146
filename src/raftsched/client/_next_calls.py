"""The next claim: lease operations that also claim (`next`, docs/api.md).

`complete`, `fail` and `lease_batch` may carry a claim made after them, so a
worker that finishes a job learns its next ones in the same round trip. The
answer is the operation's own plus the leases granted; each of those is
`claimed`, and the worker starts it before running it, as after a claim.

Safe to repeat after an unknown outcome, like the operations themselves: the
repeated operation answers its first outcome, and a repeated claim only picks
more jobs (leases granted to a lost answer lapse unstarted, a free retry).

A node of release 0.5.0 or earlier refuses `next` with `400 invalid_request`
naming the field `next`; `next_refused` tells that answer apart, and the
caller then sends the plain form. A claim of `kinds` before every node takes
them (cluster version 8) is refused too: `kinds_refused` tells that apart,
and the caller then claims without them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from raftsched.client._calls import Call, JsonObject, Response, _json_object, _segment, kinds_body
from raftsched.client._errors import (
    ClusterVersionTooLow,
    InvalidRequest,
    RaftschedError,
    TransportError,
    item_error,
)


@dataclass(frozen=True, slots=True)
class NextClaim:
    """A claim to make after a lease operation; the fields of `POST /v1/leases`.
    `worker_id`: default, on complete and fail, the holder of the lease the
    operation is fenced with; a lease batch needs it."""

    queues: tuple[str, ...]
    max_jobs: int = 1
    wait_s: float = 0.0
    lease_s: float | None = None
    worker_id: str | None = None
    # Only jobs of these kinds (None: jobs without one), at most so many of
    # some (cluster version 8); None: any job.
    kinds: tuple[str | None, ...] | None = None
    kind_max_jobs: Mapping[str, int] | None = None

    def body(self) -> JsonObject:
        body: JsonObject = {"queues": list(self.queues), "max_jobs": self.max_jobs}
        body["wait_s"] = self.wait_s
        if self.lease_s is not None:
            body["lease_s"] = self.lease_s
        if self.worker_id is not None:
            body["worker_id"] = self.worker_id
        body.update(kinds_body(self.kinds, self.kind_max_jobs))
        return body


def next_claim(
    queues: Sequence[str] | str,
    max_jobs: int = 1,
    wait_s: float = 0.0,
    lease_s: float | None = None,
    worker_id: str | None = None,
    kinds: Sequence[str | None] | None = None,
    kind_max_jobs: Mapping[str, int] | None = None,
) -> NextClaim:
    """A next claim from `queues` (a name or a list of names); with `kinds`,
    of those kinds only (None among them: jobs without a kind)."""
    names = (queues,) if isinstance(queues, str) else tuple(queues)
    wanted = None if kinds is None else tuple(kinds)
    return NextClaim(names, max_jobs, wait_s, lease_s, worker_id, wanted, kind_max_jobs)


@dataclass(frozen=True, slots=True)
class NextLeases:
    """What a next claim brought: `leases` (each `claimed`: start it before
    running it), or `error` when the claim could not be made (leadership lost,
    the leader's queue full...). The operation's own outcome stands either way."""

    leases: list[JsonObject] = field(default_factory=list)
    error: RaftschedError | None = None


def next_refused(error: BaseException) -> bool:
    """True for the answer of a node that does not know `next` (0.5.0 and earlier)."""
    return isinstance(error, InvalidRequest) and error.details.get("field") == "next"


_KIND_FIELDS = frozenset({"kinds", "kind_max_jobs", "next.kinds", "next.kind_max_jobs"})


def kinds_refused(error: BaseException | None) -> bool:
    """True for the answer to a claim of `kinds` that the cluster does not
    take yet: `ClusterVersionTooLow` (a cluster below version 8), or a 400
    naming `kinds` (a node of release 0.7.0 or earlier, which knows no such
    field). Either way nothing was claimed; claim without kinds."""
    if isinstance(error, ClusterVersionTooLow):
        return True
    return isinstance(error, InvalidRequest) and error.details.get("field") in _KIND_FIELDS


def _next_leases(response: Response, body: JsonObject) -> NextLeases:
    """`next` of an answer. A malformed one is an error of the claim alone:
    the operation's outcome, in the same answer, stands."""
    answer = body.pop("next", None)
    problem = item_error(answer) if isinstance(answer, dict) else None
    if problem is not None:
        return NextLeases([], problem)
    leases = answer.get("leases") if isinstance(answer, dict) else None
    if not isinstance(leases, list) or not all(isinstance(lease, dict) for lease in leases):
        return NextLeases([], TransportError(f"answer from {response.url} has no next leases"))
    return NextLeases(leases)


def lease_op_then_claim(
    job_id: str, op: str, body: Mapping[str, object], claim: NextClaim
) -> Call[tuple[JsonObject, NextLeases]]:
    """complete or fail with `next`: (the operation's answer, the next leases)."""

    def unwrap(response: Response) -> tuple[JsonObject, NextLeases]:
        answer = _json_object(response)
        return answer, _next_leases(response, answer)

    path = f"/v1/leases/{_segment(job_id)}/{op}"
    request = {**body, "next": claim.body()}
    return Call(
        "POST", path, unwrap, body=request, retry_unknown=True, extra_timeout_s=claim.wait_s
    )


def lease_batch_then_claim(
    ops: Sequence[Mapping[str, object]], claim: NextClaim
) -> Call[tuple[list[JsonObject], NextLeases]]:
    """A lease batch with `next`: (per-op results, the next leases)."""

    def unwrap(response: Response) -> tuple[list[JsonObject], NextLeases]:
        answer = _json_object(response)
        results = answer.get("results")
        if not isinstance(results, list):
            raise TransportError(f"answer from {response.url} lacks 'results'")
        return results, _next_leases(response, answer)

    body = {"ops": [dict(op) for op in ops], "next": claim.body()}
    return Call(
        "POST",
        "/v1/leases/batch",
        unwrap,
        body=body,
        retry_unknown=True,
        extra_timeout_s=claim.wait_s,
    )
