"""The kernel's own feature record: what every registry has.

`Tick` (whose work the features supply), `TakeOver`, `Barrier` and
`RaiseClusterVersion`, the outbox that every feature appends its events to,
the optional `cluster_version` section, the audit trail (`Audited` and its
optional `audit` section), the cluster's identity (`SetClusterId`,
`RecordIncarnation`, `ForgetIncarnation` and the optional `identity`
section), the shard this group is (`SetShard` and the optional `shard`
section, whose identity makes the fencing tokens), and the invariants of
the jobs and their indexes. `raftsched.core.registry` lists it first.
"""

from __future__ import annotations

from typing import Final

from raftsched.core.kernel import audit, cluster_version, identity, invariants, outbox, shard
from raftsched.core.kernel.commands import (
    Audited,
    Barrier,
    Command,
    ForgetIncarnation,
    RaiseClusterVersion,
    RecordIncarnation,
    SetClusterId,
    SetShard,
    TakeOver,
    Tick,
)
from raftsched.core.kernel.feature import CommandKind, Context, Feature
from raftsched.core.kernel.results import Ack
from raftsched.core.kernel.state import State
from raftsched.core.kernel.tick import apply_tick


def acknowledge(state: State, command: Command, context: Context) -> Ack:
    """TakeOver and Barrier: applying the entry was the point."""
    return Ack()


def _check(state: State) -> list[str]:
    return (
        invariants.check_kernel(state)
        + audit.check(state)
        + identity.check(state)
        + shard.check(state)
    )


FEATURE: Final = Feature(
    name="kernel",
    sections=(
        outbox.SECTION,
        cluster_version.SECTION,
        audit.SECTION,
        identity.SECTION,
        shard.SECTION,
    ),
    commands=(
        CommandKind(Tick, 10, ("int", "int"), apply_tick),
        CommandKind(TakeOver, 11, (), acknowledge),
        CommandKind(Barrier, 12, (), acknowledge),
        CommandKind(
            RaiseClusterVersion, 14, ("int",), cluster_version.apply_raise_cluster_version, since=2
        ),
        CommandKind(Audited, 80, ("str", "command"), audit.apply_audited, since=3),
        # The cluster's identity (issue 16): tags 90-92, cluster version 4
        # (membership, core.membership, has 93-99).
        CommandKind(SetClusterId, 90, ("str", "str?"), identity.apply_set_cluster_id, since=4),
        CommandKind(
            RecordIncarnation, 91, ("str", "str"), identity.apply_record_incarnation, since=4
        ),
        CommandKind(ForgetIncarnation, 92, ("str",), identity.apply_forget_incarnation, since=4),
        # Shards (issue 21): 140-149, cluster version 9 (SetShardQuotas, the
        # shard's share of the flow limits, is the jobs feature's 141, and
        # PlanShardQuotas, group 0's record of every shard's share, its 142).
        CommandKind(
            SetShard, 140, ("int", "int"), shard.apply_set_shard, since=shard.SHARD_VERSION
        ),
    ),
    check=_check,
)
