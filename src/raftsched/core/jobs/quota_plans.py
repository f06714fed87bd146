"""The quota_plans section: group 0's record of every shard's quotas.

In a sharded cluster (docs/shards.md, section 4) group 0's leader splits
each flow limit that is a count or a rate over the shards, every round, and
records each shard's part here with `PlanShardQuotas(shard, round, queues,
tenants)` (since cluster version 9). It does not reach the shards itself:
the node that hosts shard k's leader reads shard k's plan from its own
replica of group 0 and proposes it in shard k as `SetShardQuotas` with the
same round and rows (`node.shard_settings`), which `quota_book` then
enforces. So the plan is replicated like any setting, survives a change of
group 0's leader (the next one goes on from the rounds recorded here), and
no node writes into another node's shard over the network.

A plan replaces the shard's previous plan whole. Rounds are checked as
`SetShardQuotas`' are: an older round than the shard's plan is refused (a
deposed leader's proposal arriving late), the same round again is a repeat
when it carries the same rows, a newer one replaces it. A plan is accepted
once the group knows its shard count (`SetShard`), for a shard below it.

The section is optional: a state without plans (every one-shard cluster,
and every data shard, whose leader never plans) keeps the bytes and the
digest of the release before.
"""

from __future__ import annotations

from typing import Any, Final

from raftsched.core.jobs.commands import PlanShardQuotas
from raftsched.core.jobs.flow import check_quota_round
from raftsched.core.jobs.quota_book import QueueQuota, Quotas, TenantQuota
from raftsched.core.kernel import shard
from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.feature import Context
from raftsched.core.kernel.results import INVALID_REQUEST, INVALID_STATE, Ack, Rejected
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import check_int

QUOTA_PLANS: Final = "quota_plans"


def plans_of(state: State) -> dict[int, Quotas]:
    """Each shard's latest plan (round, queues, tenants), by shard."""
    plans: dict[int, Quotas] = state.sections[QUOTA_PLANS]
    return plans


def apply_plan_shard_quotas(
    state: State, command: PlanShardQuotas, context: Context
) -> Ack | Rejected:
    rejected = check_quota_round(command)
    if rejected is not None:
        return rejected
    known = shard.identity(state)
    if known is None:
        return Rejected(
            INVALID_STATE,
            "quotas are planned for the shards of a sharded cluster, and this group has not "
            "recorded its shard",
        )
    rejected = check_int(command.shard, "shard", 0, known[1] - 1)
    if rejected is not None:
        return rejected
    plans = plans_of(state)
    queues = {name: QueueQuota(*rest) for name, *rest in command.queues}
    tenants = {name: TenantQuota(*rest) for name, *rest in command.tenants}
    previous = plans.get(command.shard)
    if previous is not None:
        if command.round < previous.round:
            return Rejected(
                INVALID_STATE,
                f"round {command.round} is older than shard {command.shard}'s plan, of round "
                f"{previous.round}",
                {"round": previous.round, "shard": command.shard},
            )
        if command.round == previous.round:
            if (queues, tenants) == (previous.queues, previous.tenants):
                return Ack()  # a repeated proposal
            return Rejected(
                INVALID_REQUEST,
                f"round {command.round} gave shard {command.shard} other quotas",
                {"field": "round", "shard": command.shard},
            )
    plan = Quotas()
    plan.round, plan.queues, plan.tenants = command.round, queues, tenants
    plans[command.shard] = plan

    def restore() -> None:
        if previous is None:
            plans.pop(command.shard, None)
        else:
            plans[command.shard] = previous

    context.savepoint.on_rollback(restore)
    return Ack()


# -- encoding ------------------------------------------------------------------


def _at_default(state: State) -> bool:
    return not plans_of(state)


def _encode(state: State) -> Any:
    return [
        [
            number,
            plan.round,
            [[name, *quota] for name, quota in sorted(plan.queues.items())],
            [[name, *quota] for name, quota in sorted(plan.tenants.items())],
        ]
        for number, plan in sorted(plans_of(state).items())
    ]


def _decode(state: State, data: Any) -> None:
    if type(data) is not tuple:
        raise CodecError("the quota_plans section is an array of plans")
    plans: dict[int, Quotas] = {}
    for row in data:
        if type(row) is not tuple or len(row) != 4:
            raise CodecError("a quota plan is [shard, round, queues, tenants]")
        number, rounds, queue_rows, tenant_rows = row
        if type(number) is not int or not 0 <= number < shard.SHARDS_MAX or number in plans:
            raise CodecError("a quota plan names a shard once")
        if type(rounds) is not int or rounds < 1:
            raise CodecError("a quota plan's round is a positive integer")
        if type(queue_rows) is not tuple or type(tenant_rows) is not tuple:
            raise CodecError("a quota plan's quotas are arrays")
        plan = Quotas()
        plan.round = rounds
        for quota in queue_rows:
            if not _row(quota, 4):
                raise CodecError("a queue's planned quota is [queue, concurrency, rate, burst]")
            plan.queues[quota[0]] = QueueQuota(*quota[1:])
        for quota in tenant_rows:
            if not _row(quota, 3):
                raise CodecError("a tenant's planned quota is [tenant, concurrency, max_queued]")
            plan.tenants[quota[0]] = TenantQuota(*quota[1:])
        plans[number] = plan
    state.sections[QUOTA_PLANS] = plans


def _row(value: object, width: int) -> bool:
    """A name, then integers or nil."""
    return (
        type(value) is tuple
        and len(value) == width
        and type(value[0]) is str
        and all(item is None or type(item) is int for item in value[1:])
    )


SECTION: Final = Section(QUOTA_PLANS, dict, _encode, _decode, at_default=_at_default)


def check(state: State) -> list[str]:
    """Invariants of the section: plans only in a group that knows its
    shard count, for shards below it, each of a positive round."""
    plans = plans_of(state)
    if not plans:
        return []
    known = shard.identity(state)
    if known is None:
        return ["quota plans in a group without a shard identity"]
    problems: list[str] = []
    for number, plan in plans.items():
        if not 0 <= number < known[1]:
            problems.append(f"quota plans: shard {number} of {known[1]}")
        if plan.round < 1:
            problems.append(f"quota plans: shard {number}'s round {plan.round}")
    return problems
