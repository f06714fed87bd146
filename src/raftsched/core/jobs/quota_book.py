"""The shard_quotas section: this shard's share of the cluster-wide flow limits.

In a sharded cluster (docs/shards.md, section 4) the queue and tenant
settings (`flow`) are recorded once, in group 0, and every shard enforces
its **quota** of each limit that is a count or a rate: per queue the
concurrency limit and the token bucket's rate and burst, per tenant the
concurrency limit and the maximum of queued jobs. Group 0's leader splits
the limits and sends each shard all of its quotas of one rebalance round as
one command, `SetShardQuotas` (since cluster version 9; applied by
`flow.apply_set_shard_quotas`), which replaces the shard's quotas whole.

Flow control enforces the quota of a limit where this section has one, and
the setting as before where it has none (`flow.queue_gates`,
`flow.tenant_concurrency_limit`, `flow.tenant_max_queued`). Weights, pauses
and circuits are not split: each shard keeps its own rotation and circuit.

A queue keeps one token bucket per shard, its flow record's: it refills at
the quota's rate up to the quota's burst while a rate quota is set, else at
the setting's. A new round that changes a queue's bucket settles the tokens
at the old rate and keeps at most the new burst, so a rebalance never adds
tokens (a bucket that did not exist starts full, as `SetQueue` starts it).

`round` orders the rounds: a round older than the shard's is refused (a
proposal of a deposed leader of group 0 arriving late), the same round again
is a repeat (accepted when it carries the same quotas), a newer one replaces
them. The section is optional: a shard that never had quotas, and every
one-shard cluster, keeps the bytes and the digest of the release before.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import NAME_CHARS_MAX, TIME_MS_MAX

SHARD_QUOTAS: Final = "shard_quotas"
QUOTA_QUEUES_MAX: Final = 4_096
QUOTA_TENANTS_MAX: Final = 4_096
"""How many queues and tenants one round may give quotas of: a command of at
most about 1.8 MB (names of 200 characters), well within an entry's 8 MiB."""
ROUND_MAX: Final = TIME_MS_MAX
"""A round may be group 0's replicated time in milliseconds."""


class QueueQuota(NamedTuple):
    """A queue's quotas in this shard; None: the setting applies."""

    concurrency_limit: int | None
    rate_milli: int | None  # the bucket's refill, tokens per 1,000 s (as `SetQueue`'s)
    burst: int | None  # its capacity in tokens; set exactly when the rate is


class TenantQuota(NamedTuple):
    """A tenant's quotas in this shard; None: the setting applies."""

    concurrency_limit: int | None
    max_queued: int | None


class Quotas:
    __slots__ = ("round", "queues", "tenants")

    def __init__(self) -> None:
        self.round = 0  # no round yet
        self.queues: dict[str, QueueQuota] = {}
        self.tenants: dict[str, TenantQuota] = {}


def quotas_of(state: State) -> Quotas:
    section: Quotas = state.sections[SHARD_QUOTAS]
    return section


def queue_quota(state: State, queue: str) -> QueueQuota | None:
    queues: dict[str, QueueQuota] = state.sections[SHARD_QUOTAS].queues
    return queues.get(queue) if queues else None


def tenant_quota(state: State, tenant: str) -> TenantQuota | None:
    tenants: dict[str, TenantQuota] = state.sections[SHARD_QUOTAS].tenants
    return tenants.get(tenant) if tenants else None


# -- encoding ------------------------------------------------------------------


def _at_default(state: State) -> bool:
    quotas = quotas_of(state)
    return quotas.round == 0 and not quotas.queues and not quotas.tenants


def _encode(state: State) -> Any:
    quotas = quotas_of(state)
    return [
        quotas.round,
        [[name, *quota] for name, quota in sorted(quotas.queues.items())],
        [[name, *quota] for name, quota in sorted(quotas.tenants.items())],
    ]


def _optional_int(value: object) -> bool:
    return value is None or type(value) is int


def _decode(state: State, data: Any) -> None:
    if type(data) is not tuple or len(data) != 3:
        raise CodecError("the shard_quotas section is [round, queues, tenants]")
    number, queue_rows, tenant_rows = data
    if type(number) is not int or not 1 <= number <= ROUND_MAX:
        raise CodecError("a quota round is a positive integer")
    if type(queue_rows) is not tuple or type(tenant_rows) is not tuple:
        raise CodecError("quotas are arrays")
    quotas = Quotas()
    quotas.round = number
    for row in queue_rows:
        if type(row) is not tuple or len(row) != 4 or type(row[0]) is not str:
            raise CodecError("a queue's quota is [queue, concurrency, rate, burst]")
        if not all(map(_optional_int, row[1:])):
            raise CodecError("a queue's quotas are integers or nil")
        quotas.queues[row[0]] = QueueQuota(*row[1:])
    for row in tenant_rows:
        if type(row) is not tuple or len(row) != 3 or type(row[0]) is not str:
            raise CodecError("a tenant's quota is [tenant, concurrency, max_queued]")
        if not all(map(_optional_int, row[1:])):
            raise CodecError("a tenant's quotas are integers or nil")
        quotas.tenants[row[0]] = TenantQuota(*row[1:])
    state.sections[SHARD_QUOTAS] = quotas


SECTION: Final = Section(SHARD_QUOTAS, Quotas, _encode, _decode, at_default=_at_default)


def check(state: State) -> list[str]:
    """Invariants of the section (the flow records it needs: `flow.check_flow`)."""
    quotas = quotas_of(state)
    problems: list[str] = []
    if type(quotas.round) is not int or not 0 <= quotas.round <= ROUND_MAX:
        problems.append(f"shard quotas: round {quotas.round!r}")
    if quotas.round == 0 and (quotas.queues or quotas.tenants):
        problems.append("shard quotas without a round")
    for name, queue in quotas.queues.items():
        if not 0 < len(name) <= NAME_CHARS_MAX:
            problems.append(f"shard quotas: a queue named {name!r}")
        if queue == QueueQuota(None, None, None):
            problems.append(f"shard quotas: queue {name} has none")
        if (queue.rate_milli is None) != (queue.burst is None):
            problems.append(f"shard quotas: queue {name} has a rate without a burst or back")
        if any(value is not None and value < 0 for value in queue):
            problems.append(f"shard quotas: queue {name} has a negative quota")
    for name, tenant in quotas.tenants.items():
        if not 0 < len(name) <= NAME_CHARS_MAX:
            problems.append(f"shard quotas: a tenant named {name!r}")
        if tenant == TenantQuota(None, None):
            problems.append(f"shard quotas: tenant {name} has none")
        if any(value is not None and value < 0 for value in tenant):
            problems.append(f"shard quotas: tenant {name} has a negative quota")
    return problems
