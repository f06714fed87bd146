"""What a group tells about itself to bring the shards in line (docs/shards.md,
section 4 and "Events and subscriptions"), and the commands that align one
shard with group 0. Pure functions of a core `State`; `node.shard_settings`
does the I/O.

Group 0 records the queue and tenant settings and the webhook subscriptions;
every data shard keeps a copy, which the node hosting the shard's leader
brings in line with its own replica of group 0:

- a queue's flow settings (`SetQueue`: pause, rate and burst, concurrency
  limit, circuit), a tenant's (`SetTenant`: weight, concurrency limit,
  `max_queued`), the `on_unknown` defaults (`SetUnknownPolicy`), each set
  where it differs and reset to the defaults where group 0 has none;
- the subscriptions (`CopySubscription`: the same id, URL, types, secret
  and creation time, so that the copy delivers the shard's events from the
  subscription's creation on; one that differs is deleted and copied again;
  one group 0 no longer has is deleted), and its broker sink, tenants and
  key field (since cluster version 10). Secrets, and the sink whose URL may
  hold a password, are compared by their SHA-256, so a view carries none.

A shard's view also says whether its replica leads, which shard it recorded
itself as, its quotas (round and rows) and, for the queues and tenants the
leader of group 0 asks about, its demand: runnable and running jobs (and a
tenant's queued jobs, for `max_queued`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from raftsched.core.events.commands import CopySubscription, DeleteSubscription
from raftsched.core.events.sinks import Sink, decode_sink, encode_sink
from raftsched.core.events.subscriptions import Subscription, subscriptions
from raftsched.core.jobs.commands import (
    PlanShardQuotas,
    SetQueue,
    SetShardQuotas,
    SetTenant,
    SetUnknownPolicy,
)
from raftsched.core.jobs.flow import flow_of
from raftsched.core.jobs.quota_book import QUOTA_QUEUES_MAX, QUOTA_TENANTS_MAX, quotas_of
from raftsched.core.jobs.quota_plans import plans_of
from raftsched.core.jobs.reconcile_book import book_of
from raftsched.core.kernel import shard as core_shard
from raftsched.core.kernel.cluster_version import cluster_version
from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.commands import Command
from raftsched.core.kernel.runnable_index import all_lanes, claimable_count
from raftsched.core.kernel.state import State
from raftsched.node.quota_split import (
    QueueDemand,
    QueueLimits,
    ShardQuotas,
    TenantDemand,
    TenantLimits,
)

# The commands a node proposes in its local shard to align it (and nothing
# else: the shard process's internal route refuses any other kind).
ALIGNING: Final[tuple[type[Command], ...]] = (
    SetQueue,
    SetTenant,
    SetUnknownPolicy,
    SetShardQuotas,
    CopySubscription,
    DeleteSubscription,
)
_BY_NAME: Final = {kind.__name__: kind for kind in ALIGNING}

QueueSettings = tuple[bool, int | None, int | None, int | None, int | None, int]
TenantSettings = tuple[int, int | None, int | None]
# url, types, the secret's SHA-256, group 0's created_at_ms, and the SHA-256
# of its sink, tenants and key field ("" without any: a webhook of before).
SubscriptionSettings = tuple[str, tuple[str, ...], str, int, str]
# What a copy needs that a view leaves out: the secret, and the sink,
# tenants and key field.
SubscriptionSecrets = tuple[str, Sink | None, tuple[str, ...] | None, str | None]


@dataclass(frozen=True, slots=True)
class Settings:
    """The settings a shard must share with group 0."""

    queues: Mapping[str, QueueSettings]
    tenants: Mapping[str, TenantSettings]
    on_unknown: Mapping[tuple[str, str], str]  # (scope, name) -> policy
    subscriptions: Mapping[str, SubscriptionSettings]


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def later_hash(sub: Subscription) -> str:
    """The SHA-256 of a subscription's version-10 fields; "" without any."""
    sink, tenants, key_field = sub.later_fields()
    if (sink, tenants, key_field) == (None, None, None):
        return ""
    document = [encode_sink(sink), None if tenants is None else list(tenants), key_field]
    return secret_hash(json.dumps(document, separators=(",", ":")))


def settings_of(state: State) -> Settings:
    flow = flow_of(state)
    book = book_of(state)
    on_unknown = {("queue", name): policy for name, policy in book.queues.items()}
    on_unknown.update({("tenant", name): policy for name, policy in book.tenants.items()})
    return Settings(
        queues={
            name: record.settings()
            for name, record in flow.queues.items()
            if not record.is_default()
        },
        tenants={
            name: (record.weight, record.concurrency_limit, record.max_queued)
            for name, record in flow.tenants.items()
        },
        on_unknown=on_unknown,
        subscriptions={
            sub.id: (
                sub.url,
                sub.types,
                secret_hash(sub.secret),
                sub.created_at_ms,
                later_hash(sub),
            )
            for sub in subscriptions(state).values()
        },
    )


def settings_digest(settings: Settings) -> str:
    """A digest of `settings` (SHA-256 of their canonical JSON): a shard is in
    line with group 0 when the two are equal (`GET /v1/cluster`)."""
    document = [
        sorted([name, *row] for name, row in settings.queues.items()),
        sorted([name, *row] for name, row in settings.tenants.items()),
        sorted([*key, policy] for key, policy in settings.on_unknown.items()),
        sorted(
            [sub_id, url, list(types), digest, created_at_ms, *([later] if later else [])]
            for sub_id, (url, types, digest, created_at_ms, later) in settings.subscriptions.items()
        ),
    ]
    return hashlib.sha256(json.dumps(document, separators=(",", ":")).encode()).hexdigest()


def secrets_of(state: State) -> dict[str, SubscriptionSecrets]:
    """Group 0's subscriptions' secrets, sinks, tenants and key fields, by id
    (to create the copies)."""
    return {sub.id: (sub.secret, *sub.later_fields()) for sub in subscriptions(state).values()}


def limits_of(state: State) -> tuple[dict[str, QueueLimits], dict[str, TenantLimits]]:
    """Group 0's limits that shards get quotas of: counts and rates."""
    flow = flow_of(state)
    queues = {
        name: QueueLimits(record.concurrency_limit, record.rate_milli, record.burst)
        for name, record in flow.queues.items()
        if record.concurrency_limit is not None or record.rate_milli is not None
    }
    tenants = {
        name: TenantLimits(record.concurrency_limit, record.max_queued)
        for name, record in flow.tenants.items()
        if record.concurrency_limit is not None or record.max_queued is not None
    }
    return queues, tenants


def plans_in(state: State) -> dict[int, tuple[int, ShardQuotas]]:
    """Group 0's plans: each shard's latest round and quotas."""
    return {
        number: (plan.round, ShardQuotas(dict(plan.queues), dict(plan.tenants)))
        for number, plan in plans_of(state).items()
    }


def quotas_in_line(state: State, shard: int, applied_round: int) -> bool:
    """Whether shard `shard`, which applied quota round `applied_round`,
    enforces its quota of every limit group 0 (`state`) records: group 0's
    plan for it has a quota of each (of the first QUOTA_*_MAX queues and
    tenants, as rounds hold), and the shard applied that plan."""
    queues, tenants = limits_of(state)
    plan = plans_of(state).get(shard)
    if plan is None:
        return not queues and not tenants
    if applied_round < plan.round:
        return False
    for name in sorted(queues)[:QUOTA_QUEUES_MAX]:
        limits, row = queues[name], plan.queues.get(name)
        if row is None:
            return False
        if limits.concurrency_limit is not None and row.concurrency_limit is None:
            return False
        if limits.rate_milli is not None and row.rate_milli is None:
            return False
    for name in sorted(tenants)[:QUOTA_TENANTS_MAX]:
        tenant, quota = tenants[name], plan.tenants.get(name)
        if quota is None:
            return False
        if tenant.concurrency_limit is not None and quota.concurrency_limit is None:
            return False
        if tenant.max_queued is not None and quota.max_queued is None:
            return False
    return True


def plan_command(shard: int, round_: int, quotas: ShardQuotas) -> PlanShardQuotas:
    return PlanShardQuotas(shard, round_, quotas.queue_rows(), quotas.tenant_rows())


def quotas_command(round_: int, quotas: ShardQuotas) -> SetShardQuotas:
    return SetShardQuotas(round_, quotas.queue_rows(), quotas.tenant_rows())


# -- a shard's view -----------------------------------------------------------------


def view(
    state: State,
    *,
    leader: bool,
    queues: Collection[str] = (),
    tenants: Collection[str] = (),
    known_digest: str | None = None,
) -> dict[str, Any]:
    """A group's view as JSON: what `node.shard_settings` reads of a shard
    (over its socket for shards 1..S-1, in process for group 0). Its
    settings are left out (null) when their digest is `known_digest`, the
    asker's: a shard in line answers little however many settings there are."""
    quotas = quotas_of(state)
    settings = settings_of(state)
    digest = settings_digest(settings)
    identity = core_shard.identity(state)
    return {
        "leader": leader,
        "digest": digest,
        "identity": None if identity is None else list(identity),
        "cluster_version": cluster_version(state),
        "quotas": {
            "round": quotas.round,
            "queues": [[name, *row] for name, row in sorted(quotas.queues.items())],
            "tenants": [[name, *row] for name, row in sorted(quotas.tenants.items())],
        },
        "settings": None
        if digest == known_digest
        else {
            "queues": {name: list(row) for name, row in settings.queues.items()},
            "tenants": {name: list(row) for name, row in settings.tenants.items()},
            "on_unknown": [
                [scope, name, policy] for (scope, name), policy in settings.on_unknown.items()
            ],
            "subscriptions": {
                sub_id: [url, list(types), digest, created_at_ms, *([later] if later else [])]
                for sub_id, (url, types, digest, created_at_ms, later) in (
                    settings.subscriptions.items()
                )
            },
        },
        "demand": _demand(state, queues, tenants),
    }


def _demand(state: State, queues: Collection[str], tenants: Collection[str]) -> dict[str, Any]:
    index = state.runnable
    queue_demand = {}
    for name in queues:
        counts = state.queue_counts.get(name)
        running = 0 if counts is None else counts[1]
        runnable = claimable_count(index, name)
        if runnable or running:
            queue_demand[name] = [runnable, running]
    wanted = set(tenants)
    runnable_of: dict[str, int] = {}
    if wanted:
        for _, lanes in all_lanes(index):
            for tenant, count in lanes.counts.items():
                if tenant in wanted:
                    runnable_of[tenant] = runnable_of.get(tenant, 0) + count
    tenant_demand = {}
    for name in wanted:
        queued, running = index.tenants.get(name, (0, 0))
        runnable = runnable_of.get(name, 0)
        if queued or running or runnable:
            tenant_demand[name] = [runnable, running, queued]
    return {"queues": queue_demand, "tenants": tenant_demand}


@dataclass(frozen=True, slots=True)
class ShardView:
    """A shard's view as `view` wrote it, read back (ValueError if it is not one)."""

    leader: bool
    identity: tuple[int, int] | None
    cluster_version: int
    round: int
    quotas: ShardQuotas
    settings: Settings | None  # None: those whose digest the asker knew
    queue_demand: Mapping[str, QueueDemand]
    tenant_demand: Mapping[str, TenantDemand]


def read_view(raw: Mapping[str, Any]) -> ShardView:
    try:
        identity = raw["identity"]
        quotas = raw["quotas"]
        settings = raw["settings"]
        demand = raw["demand"]
        return ShardView(
            leader=bool(raw["leader"]),
            identity=None if identity is None else (int(identity[0]), int(identity[1])),
            cluster_version=int(raw["cluster_version"]),
            round=int(quotas["round"]),
            quotas=ShardQuotas(
                {row[0]: (row[1], row[2], row[3]) for row in quotas["queues"]},
                {row[0]: (row[1], row[2]) for row in quotas["tenants"]},
            ),
            settings=None if settings is None else _settings(settings),
            queue_demand={
                name: QueueDemand(int(row[0]), int(row[1]))
                for name, row in demand["queues"].items()
            },
            tenant_demand={
                name: TenantDemand(int(row[0]), int(row[1]), int(row[2]))
                for name, row in demand["tenants"].items()
            },
        )
    except (KeyError, IndexError, TypeError, AttributeError) as error:
        raise ValueError(f"not a shard's view: {error!r}") from None


def _settings(raw: Mapping[str, Any]) -> Settings:
    return Settings(
        queues={name: _queue_settings(row) for name, row in raw["queues"].items()},
        tenants={name: (row[0], row[1], row[2]) for name, row in raw["tenants"].items()},
        on_unknown={(row[0], row[1]): row[2] for row in raw["on_unknown"]},
        subscriptions={
            sub_id: (
                row[0],
                tuple(row[1]),
                row[2],
                int(row[3]),
                str(row[4]) if len(row) > 4 else "",
            )
            for sub_id, row in raw["subscriptions"].items()
        },
    )


def _queue_settings(row: list[Any]) -> QueueSettings:
    paused, rate, burst, concurrency, window, probe_ms = row
    return (bool(paused), rate, burst, concurrency, window, int(probe_ms))


# -- aligning a shard -----------------------------------------------------------------


def aligning_commands(
    wanted: Settings, shard: Settings, secrets: Mapping[str, SubscriptionSecrets], most: int
) -> list[Command]:
    """At most `most` commands that make `shard`'s settings `wanted`'s (group
    0's): queues and tenants first, then the `on_unknown` defaults, then the
    subscriptions, each in order of name, so that the work of one pass is
    bounded and the next pass goes on where this one stopped."""
    commands: list[Command] = []
    for name in sorted(wanted.queues.keys() | shard.queues.keys()):
        row = wanted.queues.get(name)
        if row != shard.queues.get(name):
            commands.append(SetQueue(name) if row is None else SetQueue(name, *row))
    for name in sorted(wanted.tenants.keys() | shard.tenants.keys()):
        tenant = wanted.tenants.get(name)
        if tenant != shard.tenants.get(name):
            commands.append(SetTenant(name) if tenant is None else SetTenant(name, *tenant))
    for key in sorted(wanted.on_unknown.keys() | shard.on_unknown.keys()):
        policy = wanted.on_unknown.get(key, "retry")
        if policy != shard.on_unknown.get(key, "retry"):
            commands.append(SetUnknownPolicy(key[0], key[1], policy))
    for sub_id in sorted(wanted.subscriptions.keys() | shard.subscriptions.keys()):
        sub = wanted.subscriptions.get(sub_id)
        copy = shard.subscriptions.get(sub_id)
        if sub == copy:
            continue
        if copy is not None:
            commands.append(DeleteSubscription(sub_id))
        if sub is not None and sub_id in secrets:
            secret, sink, tenants, key_field = secrets[sub_id]
            commands.append(
                CopySubscription(sub_id, sub[0], sub[1], secret, sub[3], sink, tenants, key_field)
            )
    return commands[:most]


# -- commands as JSON, between a node and its shard process ------------------------------


def command_json(command: Command) -> dict[str, Any]:
    if type(command) not in ALIGNING:
        raise ValueError(f"{type(command).__name__} is not proposed in a shard by its node")
    return {
        "kind": type(command).__name__,
        "fields": [_plain(getattr(command, name)) for name in _field_names(type(command))],
    }


def command_from_json(raw: object) -> Command:
    """`command_json`'s command; ValueError for anything else (the core
    checks each field's type and range when it applies it)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("fields"), list):
        raise ValueError("a command is {kind, fields}")
    kind = _BY_NAME.get(raw.get("kind"))  # type: ignore[arg-type]
    if kind is None:
        raise ValueError(f"a node proposes only {sorted(_BY_NAME)} in its shard")
    values = [_tupled(value) for value in raw["fields"]]
    expected = len(_field_names(kind))
    if len(values) != expected:
        raise ValueError(f"{kind.__name__} has {expected} fields")
    return kind(*values)


def _field_names(kind: type[Command]) -> tuple[str, ...]:
    return tuple(item.name for item in fields(kind))  # type: ignore[arg-type]


def _plain(value: Any) -> Any:
    if isinstance(value, Sink):
        return {"sink": encode_sink(value)}
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def _tupled(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"sink"}:
        try:
            return decode_sink(value["sink"])
        except CodecError as error:
            raise ValueError(str(error)) from None
    if isinstance(value, list):
        return tuple(_tupled(item) for item in value)
    return value


def names(items: Iterable[str], most: int) -> list[str]:
    """At most `most` names, the first in order (a round's bound)."""
    return sorted(items)[:most]
