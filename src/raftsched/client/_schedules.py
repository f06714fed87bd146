"""Schedule calls (api.md, Schedules) and the client methods that run them.

Repeated after an unknown outcome: reads; create with an `id` (idempotent by
id: the repeat returns the same schedule); edit, pause, resume and delete
(idempotent in effect; a repeated delete may answer 404). Not repeated:
trigger and backfill, which record a decision each time they run (backfill
never duplicates a job, but the caller should see `OutcomeUnknown`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from raftsched.client._calls import (
    Call,
    Consistency,
    JsonObject,
    _field,
    _json_object,
    _query,
    _segment,
)

T = TypeVar("T")


def _path(schedule_id: str, action: str = "") -> str:
    return f"/v1/schedules/{_segment(schedule_id)}" + (f"/{action}" if action else "")


def create_schedule(body: Mapping[str, Any]) -> Call[JsonObject]:
    keyed = body.get("id") is not None
    return Call("POST", "/v1/schedules", _field("schedule"), body=dict(body), retry_unknown=keyed)


def create_schedules(bodies: Sequence[Mapping[str, Any]]) -> Call[list[JsonObject]]:
    keyed = all(body.get("id") is not None for body in bodies)
    payload = {"schedules": [dict(body) for body in bodies]}
    return Call("POST", "/v1/schedules/batch", _field("results"), body=payload, retry_unknown=keyed)


def get_schedule(schedule_id: str, consistency: Consistency | None) -> Call[JsonObject]:
    return Call(
        "GET", _path(schedule_id), _field("schedule"), _query(consistency), retry_unknown=True
    )


def list_schedules(
    limit: int | None, cursor: str | None, consistency: Consistency | None
) -> Call[JsonObject]:
    query = _query(consistency, limit=limit, cursor=cursor)
    return Call("GET", "/v1/schedules", _json_object, query, retry_unknown=True)


def update_schedule(schedule_id: str, body: Mapping[str, Any]) -> Call[JsonObject]:
    return Call("PUT", _path(schedule_id), _field("schedule"), body=dict(body), retry_unknown=True)


def delete_schedule(schedule_id: str) -> Call[JsonObject]:
    return Call("DELETE", _path(schedule_id), _json_object, retry_unknown=True)


def pause_schedule(schedule_id: str) -> Call[JsonObject]:
    return Call("POST", _path(schedule_id, "pause"), _field("schedule"), retry_unknown=True)


def resume_schedule(schedule_id: str) -> Call[JsonObject]:
    return Call("POST", _path(schedule_id, "resume"), _field("schedule"), retry_unknown=True)


def trigger_schedule(schedule_id: str) -> Call[JsonObject]:
    return Call("POST", _path(schedule_id, "trigger"), _field("occurrence"))


def backfill_schedule(
    schedule_id: str, start: str, end: str, overlap: str | None
) -> Call[list[JsonObject]]:
    body: JsonObject = {"from": start, "to": end}
    if overlap is not None:
        body["overlap"] = overlap
    return Call("POST", _path(schedule_id, "backfill"), _field("occurrences"), body=body)


def schedule_occurrences(
    schedule_id: str, limit: int | None, consistency: Consistency | None
) -> Call[list[JsonObject]]:
    query = _query(consistency, limit=limit)
    path = _path(schedule_id, "occurrences")
    return Call("GET", path, _field("occurrences"), query, retry_unknown=True)


class SchedulesMixin:
    """Schedule methods of the blocking `Client`."""

    def call(self, call: Call[T]) -> T:
        raise NotImplementedError

    def create_schedule(self, body: Mapping[str, Any]) -> JsonObject:
        """Create (or, with an existing id and the same body, return) a schedule."""
        return self.call(create_schedule(body))

    def create_schedules(self, bodies: Sequence[Mapping[str, Any]]) -> list[JsonObject]:
        """Up to 1,000 schedules in one request: `[{"id", "created"} | {"error"}]`."""
        return self.call(create_schedules(bodies))

    def get_schedule(
        self, schedule_id: str, *, consistency: Consistency | None = None
    ) -> JsonObject:
        return self.call(get_schedule(schedule_id, consistency))

    def list_schedules(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        consistency: Consistency | None = None,
    ) -> JsonObject:
        """One page, by id: `{"schedules": [...], "next_cursor"}`."""
        return self.call(list_schedules(limit, cursor, consistency))

    def update_schedule(self, schedule_id: str, body: Mapping[str, Any]) -> JsonObject:
        return self.call(update_schedule(schedule_id, body))

    def delete_schedule(self, schedule_id: str) -> JsonObject:
        return self.call(delete_schedule(schedule_id))

    def pause_schedule(self, schedule_id: str) -> JsonObject:
        return self.call(pause_schedule(schedule_id))

    def resume_schedule(self, schedule_id: str) -> JsonObject:
        return self.call(resume_schedule(schedule_id))

    def trigger_schedule(self, schedule_id: str) -> JsonObject:
        """An occurrence now, under the overlap policy: the decided Occurrence."""
        return self.call(trigger_schedule(schedule_id))

    def backfill_schedule(
        self, schedule_id: str, start: str, end: str, *, overlap: str | None = None
    ) -> list[JsonObject]:
        """The calendar's occurrences in [start, end] (RFC 3339), decided now."""
        return self.call(backfill_schedule(schedule_id, start, end, overlap))

    def schedule_occurrences(
        self, schedule_id: str, *, limit: int | None = None, consistency: Consistency | None = None
    ) -> list[JsonObject]:
        """Decided occurrences, newest first."""
        return self.call(schedule_occurrences(schedule_id, limit, consistency))


class AsyncSchedulesMixin:
    """Schedule methods of `AsyncClient`."""

    async def call(self, call: Call[T]) -> T:
        raise NotImplementedError

    async def create_schedule(self, body: Mapping[str, Any]) -> JsonObject:
        return await self.call(create_schedule(body))

    async def create_schedules(self, bodies: Sequence[Mapping[str, Any]]) -> list[JsonObject]:
        return await self.call(create_schedules(bodies))

    async def get_schedule(
        self, schedule_id: str, *, consistency: Consistency | None = None
    ) -> JsonObject:
        return await self.call(get_schedule(schedule_id, consistency))

    async def list_schedules(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        consistency: Consistency | None = None,
    ) -> JsonObject:
        return await self.call(list_schedules(limit, cursor, consistency))

    async def update_schedule(self, schedule_id: str, body: Mapping[str, Any]) -> JsonObject:
        return await self.call(update_schedule(schedule_id, body))

    async def delete_schedule(self, schedule_id: str) -> JsonObject:
        return await self.call(delete_schedule(schedule_id))

    async def pause_schedule(self, schedule_id: str) -> JsonObject:
        return await self.call(pause_schedule(schedule_id))

    async def resume_schedule(self, schedule_id: str) -> JsonObject:
        return await self.call(resume_schedule(schedule_id))

    async def trigger_schedule(self, schedule_id: str) -> JsonObject:
        return await self.call(trigger_schedule(schedule_id))

    async def backfill_schedule(
        self, schedule_id: str, start: str, end: str, *, overlap: str | None = None
    ) -> list[JsonObject]:
        return await self.call(backfill_schedule(schedule_id, start, end, overlap))

    async def schedule_occurrences(
        self, schedule_id: str, *, limit: int | None = None, consistency: Consistency | None = None
    ) -> list[JsonObject]:
        return await self.call(schedule_occurrences(schedule_id, limit, consistency))
