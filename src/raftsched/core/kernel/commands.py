"""Commands: what the leader proposes and every replica applies, in log order.

Commands are frozen, slotted dataclasses with imperative names. They carry
everything the core needs that is not already in the state: identifiers,
random draws and request data. Time and epoch are stamped once per Raft entry
by the leader (see `Entry`), so that a group-committed batch of commands shares
one clock reading and one term.

Durations are integer milliseconds (`*_ms`), instants are integer
milliseconds since the Unix epoch (`*_at_ms`). Opaque user data (payloads,
results, progress) is canonical msgpack bytes: the core stores and returns it
but never looks inside, which keeps memory per job small and the encoding
exact.

Each command has a stable integer tag, declared with its handler and field
kinds in its feature's record (`<feature>/feature.py`); a tag is never reused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FailureKind = Literal["transient", "permanent", "unknown", "cancelled"]


class Command:
    """The base of every command: a frozen, slotted dataclass of a feature.

    Each concrete command type is declared by one feature, with its tag,
    field schema, handler and the version that introduced it."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry delay `d_n = min(max_ms, initial_ms * 2**n) + U(0, jitter_ms)`."""

    initial_ms: int = 1_000
    max_ms: int = 300_000
    jitter_ms: int = 1_000


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job as a client asked for it (already validated for types by the API).

    `run_at_ms` and `delay_ms` exclude each other; neither means "now".
    `deadline_ms` is a duration from submission bounding the job's whole life.
    `labels` is a tuple of (key, value) pairs sorted by key, so equal requests
    encode equally.
    """

    queue: str
    tenant: str = "default"
    payload: bytes = b"\xc0"  # msgpack nil
    priority: int = 0
    run_at_ms: int | None = None
    delay_ms: int | None = None
    max_attempts: int = 5
    backoff: Backoff = Backoff()
    lease_ms: int = 30_000
    deadline_ms: int | None = None
    idempotency_key: str | None = None
    ordering_key: str | None = None
    correlation_id: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    # Since cluster version 5 (jobs.reconcile): what an unknown outcome
    # leads to, "retry" or "reconcile" (None: the queue's or the tenant's
    # default, else retry), and the queue whose workers reconcile it (None:
    # the job's own). Encoded only when set, so older specs keep their bytes.
    on_unknown: str | None = None
    reconcile_queue: str | None = None
    # Since cluster version 8: which handler a worker runs the job with
    # (`worker.handler(kind)`); None: the worker's default handler. Encoded
    # only when set, as the version-5 fields are.
    kind: str | None = None
    # Since cluster version 8 (jobs.trace_book): the W3C trace context the
    # submission carried (its `traceparent` and `tracestate` headers), kept
    # beside the job and handed to every lease of it, so that a worker's
    # attempt joins the submitter's trace. Not part of the request's
    # identity: an idempotent repeat from another span is the same request
    # (`submit.spec_fingerprint` leaves them out). Encoded only when set.
    traceparent: str | None = None
    tracestate: str | None = None


@dataclass(frozen=True, slots=True)
class Tick(Command):
    """Let time pass: due jobs become runnable, leases expire, deadlines and
    retention are enforced. Proposed by the leader only when the core says
    something is due. `seed` feeds the jitter of retries this tick causes.
    `max_items` bounds the work one tick does; the rest waits for the next.
    """

    seed: int = 0
    max_items: int = 10_000


@dataclass(frozen=True, slots=True)
class TakeOver(Command):
    """The first command a new leader proposes. Applying any entry of a higher
    epoch performs the takeover; this command exists so that a new leader
    commits an entry of its term at once (and learns its commit index)."""


@dataclass(frozen=True, slots=True)
class Barrier(Command):
    """A no-op entry: once applied, every read that arrived before it was
    proposed can be answered linearizably from the local state."""


@dataclass(frozen=True, slots=True)
class RaiseClusterVersion(Command):
    """Let commands up to `version` be proposed: the leader proposes it once
    every member runs code that understands them (see kernel.cluster_version)."""

    version: int


@dataclass(frozen=True, slots=True)
class Entry:
    """One Raft log entry: a batch of commands stamped by the leader that
    proposed it. `now_ms` is that leader's clock; the core never lets
    replicated time run backwards. `epoch` is that leader's Raft term."""

    epoch: int
    now_ms: int
    commands: tuple[Command, ...]


@dataclass(frozen=True, slots=True)
class Audited(Command):
    """An operator command and who asked for it (kernel.audit).

    The core applies `command` as if it had come alone and, unless it was
    rejected, appends an entry naming `actor` to the replicated audit trail
    in the same command, so the action and its record commit together. Only
    command kinds that declare how they are audited (`CommandKind.audit`)
    may be wrapped, and never an `Audited` itself."""

    actor: str
    command: Command


@dataclass(frozen=True, slots=True)
class SetClusterId(Command):
    """Name the cluster (kernel.identity): proposed once by the first leader
    that finds the state without a name (`previous` None), with an id it drew
    at random; or by the first leader of a cluster restored from a backup,
    which renames the restored state (`previous` is the backed-up cluster's
    id, so a late or repeated proposal changes nothing)."""

    cluster_id: str
    previous: str | None = None


@dataclass(frozen=True, slots=True)
class RecordIncarnation(Command):
    """Record the incarnation (the random id made with its data directory)
    that a member runs under; peers refuse a node of that id that comes back
    with another one (its votes were lost with its data)."""

    node_id: str
    incarnation: str


@dataclass(frozen=True, slots=True)
class ForgetIncarnation(Command):
    """Drop a member's recorded incarnation: a node removed from the cluster
    may be added again later with a new data directory."""

    node_id: str


@dataclass(frozen=True, slots=True)
class SetShard(Command):
    """Name this Raft group's shard (kernel.shard; since cluster version 9):
    shard `index` of `count` data shards (0 <= index < count <= 64), set once
    when a sharded cluster creates the group. Setting the same again changes
    nothing; another shard or count is refused (a cluster's count never
    changes). Its fencing tokens are then `counter * count + index`."""

    index: int
    count: int
