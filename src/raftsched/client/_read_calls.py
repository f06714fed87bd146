"""Reads with typed answers: a job's effects (`GET /v1/jobs/{id}/effects`)
and the charts' series (`GET /v1/stats/series`).

Their answers are the API's JSON objects, as every other call's are (plain
dicts at run time); the `TypedDict`s only tell a type checker which fields
docs/api.md promises. An answer that lacks one is a `TransportError`, as
for the other calls' unwrapping. Reads are repeated after an unknown
outcome (`raftsched.client._calls`).
"""

from __future__ import annotations

from typing import Any, TypedDict, cast

from raftsched.client._calls import Call, Consistency, Response, _json_object, _query, _segment
from raftsched.client._errors import TransportError


class Effect(TypedDict):
    """An entry of the effects ledger."""

    key: str
    job_id: str
    fencing_token: int
    epoch: int
    result: Any
    recorded_at: str  # RFC 3339, UTC, milliseconds


class JobEffects(TypedDict):
    """The effects a job recorded, oldest first, at most the `limit` asked
    for; `total` is how many it recorded."""

    effects: list[Effect]
    total: int


class StatsSeries(TypedDict):
    """One list per figure, one value per complete 5 s bucket, oldest first,
    aligned with `at`; None where the answering node cannot know the value
    (never a 0 it guessed; docs/observability.md, "Charts")."""

    node_id: str  # the node that answered: each keeps its own series
    queue: str | None  # None: the whole cluster
    period_s: float
    sampling_since: str  # since when it samples depth and oldest runnable age
    queues: list[str]  # the queues with a series of their own on that node
    at: list[str]  # each bucket's start
    succeeded_per_s: list[float | None]
    failed_per_s: list[float | None]
    dead_lettered_per_s: list[float | None]
    depth: list[float | None]
    oldest_runnable_age_s: list[float | None]
    due_to_lease_p99_s: list[float | None]


def job_effects(
    job_id: str, limit: int | None, consistency: Consistency | None
) -> Call[JobEffects]:
    path = f"/v1/jobs/{_segment(job_id)}/effects"
    return Call("GET", path, _job_effects, _query(consistency, limit=limit))


def stats_series(queue: str | None, window_s: int | None) -> Call[StatsSeries]:
    """Answered by the node that receives it, from its own memory (never
    redirected, no `consistency`)."""
    return Call("GET", "/v1/stats/series", _stats_series, _query(queue=queue, window_s=window_s))


def _with_fields(response: Response, names: frozenset[str]) -> dict[str, Any]:
    body = _json_object(response)
    missing = sorted(names - body.keys())
    if missing:
        raise TransportError(f"answer from {response.url} lacks {', '.join(missing)}")
    return body


def _job_effects(response: Response) -> JobEffects:
    body = _with_fields(response, JobEffects.__required_keys__)
    if not isinstance(body["effects"], list):
        raise TransportError(f"answer from {response.url}: 'effects' is not a list")
    return cast(JobEffects, body)


def _stats_series(response: Response) -> StatsSeries:
    return cast(StatsSeries, _with_fields(response, StatsSeries.__required_keys__))
