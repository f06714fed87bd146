"""The shard this Raft group is, and the fencing tokens it hands out.

Theory of operation. A sharded cluster (docs/shards.md) runs one Raft group
per data shard; each group's state is a whole state of its own, with its own
token counter (`State.last_fencing_token`). For every token to be unique
across the cluster, shard `k` of `S` hands out `counter * S + k`: the
counter goes on exactly as before, one step per lease, and the token it
makes is that step's slot among the shards. So within a shard tokens still
increase strictly with the counter (for any one job in particular, which
never leaves its shard), and two shards never hand out the same one. A
token minted before the identity was set (the counter itself) is at most
`counter <= counter * S + k`, so the order holds across `SetShard` too.

Every token comes from `next_fencing_token` (a job's lease in
`jobs.leases`, a reconciliation lease in `jobs.reconcile`); every check
compares a token with the stored one of the same job or task, never with
the counter, so what is stored and what is compared agree. The bound the
invariants check is `last_fencing_token(state)`, the counter's token.

The section is optional: a state without an identity (a one-shard cluster,
and every state before cluster version 9) encodes as before, and its tokens
are the counter, exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.commands import SetShard
from raftsched.core.kernel.results import INVALID_REQUEST, Ack, Rejected
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State

if TYPE_CHECKING:
    from raftsched.core.kernel.feature import Context

SHARD: Final = "shard"
SHARD_VERSION: Final = 9
"""The cluster version that added shards (`SetShard`, `SetShardQuotas`)."""
SHARDS_MAX: Final = 64
"""The most data shards a cluster may have (docs/shards.md)."""


@dataclass(slots=True)
class ShardIdentity:
    """Shard `index` of `count`; unset, (0, 1) with `assigned` False, which
    makes every token the counter itself."""

    index: int = 0
    count: int = 1
    assigned: bool = False


def shard_of(state: State) -> ShardIdentity:
    record: ShardIdentity = state.sections[SHARD]
    return record


def identity(state: State) -> tuple[int, int] | None:
    """(index, count) once `SetShard` named the shard; None before."""
    record = shard_of(state)
    return (record.index, record.count) if record.assigned else None


def next_fencing_token(state: State) -> int:
    """Step the token counter and return this shard's token for the step.
    The caller's savepoint restores the counter (a kernel scalar)."""
    counter = state.last_fencing_token + 1
    state.last_fencing_token = counter
    record: ShardIdentity = state.sections[SHARD]
    return counter * record.count + record.index


def last_fencing_token(state: State) -> int:
    """The token of the counter's present step: no token this shard handed
    out is above it."""
    record = shard_of(state)
    return state.last_fencing_token * record.count + record.index


def apply_set_shard(state: State, command: SetShard, context: Context) -> Ack | Rejected:
    index, count = command.index, command.count
    if type(count) is not int or not 1 <= count <= SHARDS_MAX:
        return _invalid("count", f"count must be an integer from 1 to {SHARDS_MAX}")
    if type(index) is not int or not 0 <= index < count:
        return _invalid("index", "index must be an integer from 0 to count - 1")
    record = shard_of(state)
    if record.assigned:
        if (record.index, record.count) == (index, count):
            return Ack()  # a repeated proposal
        field = "count" if record.count != count else "index"
        return Rejected(
            INVALID_REQUEST,
            f"this group is shard {record.index} of {record.count}, fixed when it was created",
            {"field": field, "index": record.index, "count": record.count},
        )

    def undo() -> None:
        record.index, record.count, record.assigned = 0, 1, False

    context.savepoint.on_rollback(undo)
    record.index, record.count, record.assigned = index, count, True
    return Ack()


def _invalid(field: str, message: str) -> Rejected:
    return Rejected(INVALID_REQUEST, message, {"field": field})


def check(state: State) -> list[str]:
    """Invariants of the section."""
    record = shard_of(state)
    if not record.assigned:
        if (record.index, record.count) != (0, 1):
            return [f"shard: unset but {record.index} of {record.count}"]
        return []
    if not (type(record.count) is int and 1 <= record.count <= SHARDS_MAX):
        return [f"shard: count {record.count!r}"]
    if not (type(record.index) is int and 0 <= record.index < record.count):
        return [f"shard: index {record.index!r} of {record.count}"]
    return []


def _at_default(state: State) -> bool:
    return not shard_of(state).assigned


def _encode(state: State) -> Any:
    record = shard_of(state)
    return [record.index, record.count]


def _decode(state: State, data: Any) -> None:
    if type(data) is not tuple or len(data) != 2:
        raise CodecError("the shard section is [index, count]")
    index, count = data
    if type(count) is not int or not 1 <= count <= SHARDS_MAX:
        raise CodecError(f"a shard count is from 1 to {SHARDS_MAX}")
    if type(index) is not int or not 0 <= index < count:
        raise CodecError("a shard index is from 0 to its count - 1")
    state.sections[SHARD] = ShardIdentity(index, count, True)


SECTION: Final = Section(SHARD, ShardIdentity, _encode, _decode, at_default=_at_default)
