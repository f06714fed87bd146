"""raftsched.core: the pure, deterministic job state machine.

Commands in, results out; no I/O, no clock, no randomness. The Raft adapter
calls `apply_encoded` with each committed entry; the node and API read the
state through the query functions. See `state` for the rules and the theory
of operation, `model.TRANSITIONS` for the job life cycle.
"""

from raftsched.core.events import outbox, subscriptions  # noqa: F401  (register sections)
from raftsched.core.jobs import flow  # noqa: F401  (registers its section)
from raftsched.core.jobs.queries import (
    HistoryEvent,
    QueueStats,
    find_by_idempotency_key,
    get_effect,
    get_job,
    job_history,
    list_jobs,
    queue_stats,
    status_counts,
)
from raftsched.core.jobs.tick import next_due_ms
from raftsched.core.kernel import cluster_version  # noqa: F401  (registers its section)
from raftsched.core.kernel.apply import apply_encoded, apply_entry
from raftsched.core.kernel.codec import (
    COMMAND_TAGS,
    CodecError,
    decode_entry,
    decode_state,
    encode_entry,
    encode_state,
    encode_state_pieces,
    state_digest,
)
from raftsched.core.kernel.invariants import check_invariants
from raftsched.core.kernel.model import (
    FINAL_STATUSES,
    JOB_EVENTS,
    JOB_STATUSES,
    TRANSITIONS,
    Attempt,
    Job,
    JobLease,
)
from raftsched.core.kernel.state import DEFAULT_RETENTION_MS, State, new_state
from raftsched.core.schedules import model as schedules_model  # noqa: F401  (registers its section)
from raftsched.core.workflows import handlers as workflows  # noqa: F401  (registers its section)

__all__ = [
    "COMMAND_TAGS",
    "DEFAULT_RETENTION_MS",
    "FINAL_STATUSES",
    "JOB_EVENTS",
    "JOB_STATUSES",
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
    "decode_entry",
    "decode_state",
    "encode_entry",
    "encode_state",
    "encode_state_pieces",
    "find_by_idempotency_key",
    "get_effect",
    "get_job",
    "job_history",
    "list_jobs",
    "new_state",
    "next_due_ms",
    "queue_stats",
    "state_digest",
    "status_counts",
]
