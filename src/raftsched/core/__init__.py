"""raftsched.core: the pure, deterministic job state machine.

Commands in, results out; no I/O, no clock, no randomness. The Raft adapter
calls `apply_encoded` with each committed entry; the node and API read the
state through the query functions. See `kernel.state` for the rules and the
theory of operation, `kernel.model.TRANSITIONS` for the job life cycle, and
`kernel.feature` for how the features (jobs, schedules, workflows, events)
plug in. The functions below are the kernel's, bound to `registry.REGISTRY`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from raftsched.core.jobs.queries import (
    HistoryEvent,
    QueueStats,
    find_by_idempotency_key,
    get_effect,
    get_job,
    job_effects,
    job_history,
    job_trace,
    list_jobs,
    queue_stats,
    status_counts,
)
from raftsched.core.kernel import apply as _apply
from raftsched.core.kernel import cluster_version as _cluster_version
from raftsched.core.kernel import codec as _codec
from raftsched.core.kernel import invariants as _invariants
from raftsched.core.kernel import state as _state
from raftsched.core.kernel import tick as _tick
from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.commands import Command, Entry
from raftsched.core.kernel.model import (
    FINAL_STATUSES,
    JOB_EVENTS,
    JOB_STATUSES,
    TRANSITIONS,
    Attempt,
    Job,
    JobLease,
)
from raftsched.core.kernel.results import Result
from raftsched.core.kernel.state import DEFAULT_RETENTION_MS, State
from raftsched.core.registry import REGISTRY

COMMAND_TAGS: Final[dict[type[Any], int]] = REGISTRY.command_tags
"""Stable tags by command type. Never renumber; never reuse a retired tag."""
COMMAND_VERSIONS: Final[dict[type[Any], int]] = REGISTRY.command_versions
"""The cluster version that introduced each command kind (`CommandKind.since`)."""
COMMAND_VERSION_MAX: Final[int] = REGISTRY.command_version_max
"""The highest command version this code understands (and reports to its peers)."""


def apply_encoded(state: State, data: bytes) -> list[Result]:
    return _apply.apply_encoded(state, data, REGISTRY)


def apply_entry(state: State, entry: Entry) -> list[Result]:
    return _apply.apply_entry(state, entry, REGISTRY)


def encode_entry(entry: Entry) -> bytes:
    return _codec.encode_entry(entry, REGISTRY)


def decode_entry(data: bytes) -> Entry:
    return _codec.decode_entry(data, REGISTRY)


def encode_state(state: State) -> bytes:
    return _codec.encode_state(state, REGISTRY)


def encode_state_pieces(state: State) -> Iterator[memoryview]:
    return _codec.encode_state_pieces(state, REGISTRY)


def decode_state(data: bytes | memoryview) -> State:
    return _codec.decode_state(data, REGISTRY)


def state_digest(state: State) -> str:
    return _codec.state_digest(state, REGISTRY)


def new_state() -> State:
    return _state.new_state(REGISTRY)


def next_due_ms(state: State) -> int | None:
    return _tick.next_due_ms(state, REGISTRY)


def check_invariants(state: State) -> list[str]:
    return _invariants.check_invariants(state, REGISTRY)


def command_version(command: Command) -> int:
    return _cluster_version.command_version(command, REGISTRY)


def needs_upgrade(state: State, command: Command) -> bool:
    return _cluster_version.needs_upgrade(state, command, REGISTRY)


def newest_kind(command: Command) -> str:
    return _cluster_version.newest_kind(command, REGISTRY)


def newest_spec_field(command: Command) -> str | None:
    return _cluster_version.newest_spec_field(command, REGISTRY)


__all__ = [
    "COMMAND_TAGS",
    "COMMAND_VERSIONS",
    "COMMAND_VERSION_MAX",
    "DEFAULT_RETENTION_MS",
    "FINAL_STATUSES",
    "JOB_EVENTS",
    "JOB_STATUSES",
    "REGISTRY",
    "TRANSITIONS",
    "Attempt",
    "CodecError",
    "HistoryEvent",
    "Job",
    "JobLease",
    "QueueStats",
    "State",
    "apply_encoded",
    "apply_entry",
    "check_invariants",
    "command_version",
    "decode_entry",
    "decode_state",
    "encode_entry",
    "encode_state",
    "encode_state_pieces",
    "find_by_idempotency_key",
    "get_effect",
    "get_job",
    "job_effects",
    "job_history",
    "job_trace",
    "list_jobs",
    "needs_upgrade",
    "new_state",
    "newest_kind",
    "newest_spec_field",
    "next_due_ms",
    "queue_stats",
    "state_digest",
    "status_counts",
]
