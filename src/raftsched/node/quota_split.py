"""How group 0's leader splits the flow limits over the shards (docs/shards.md,
section 4): pure arithmetic, no I/O (`node.shard_settings` does that).

Each limit that is a count or a rate gets a **quota** per shard, and the
quotas of a limit never sum to more than the limit:

- a **count** (a queue's or a tenant's concurrency limit, a tenant's
  `max_queued`) is split into integers that sum to exactly the limit:
  `split_count`. Equally at first (`limit // S` each, the remainder one more
  to as many shards, in a rotation that starts at a shard drawn from the
  limit's name, so that not every limit's extra lands in shard 0); then by
  **demand**: while the shards' demands (runnable and running jobs of that
  queue or tenant, queued jobs for `max_queued`) fit in the limit, each
  shard gets its demand and an equal part of what is left (a shard's next
  job need not wait for a rebalance); beyond, each gets a part in
  proportion to its demand (largest remainders), at least 1 where it has
  demand while the limit allows (else the largest demands get 1 each), and
  shards without demand get 0.
- a queue's **rate** (and its burst) is split in proportion to the same
  weights (`split_rate`): the rate in milli-tokens per second summing to
  exactly the limit, the burst likewise, at least 1 token of burst to every
  shard that gets a rate (a bucket of no capacity never grants), so at most
  `burst` shards share the rate.

A round moves quota from one shard to another, and the shards apply it at
different moments. So a round is proposed in **two phases** (`phases`):
first every quota lowered (each shard's field the lower of its present and
its target quota), and only once every lowered shard has applied that, the
raised ones. Whatever mix of the two a moment sees, the sum stays within the
limit: during the first phase every shard is at its present quota or lower,
during the second at its lowered quota or its target, and the targets sum
to at most the limit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from raftsched.shards import key_hash

# A queue's row: (concurrency_limit, rate_limit_milli_per_s, burst), a
# tenant's: (concurrency_limit, max_queued); None: no quota (the setting).
QueueRow = tuple[int | None, int | None, int | None]
TenantRow = tuple[int | None, int | None]

NO_QUEUE_QUOTA: Final[QueueRow] = (None, None, None)
NO_TENANT_QUOTA: Final[TenantRow] = (None, None)


@dataclass(frozen=True, slots=True)
class ShardQuotas:
    """One shard's quotas of one round: rows by queue and by tenant, each
    with at least one quota (no row: the settings apply)."""

    queues: Mapping[str, QueueRow]
    tenants: Mapping[str, TenantRow]

    def queue_rows(self) -> tuple[tuple[str, int | None, int | None, int | None], ...]:
        """The rows as `SetShardQuotas` takes them, in ascending order of name."""
        return tuple((name, *row) for name, row in sorted(self.queues.items()))

    def tenant_rows(self) -> tuple[tuple[str, int | None, int | None], ...]:
        return tuple((name, *row) for name, row in sorted(self.tenants.items()))


EMPTY: Final = ShardQuotas({}, {})


@dataclass(frozen=True, slots=True)
class QueueLimits:
    concurrency_limit: int | None
    rate_milli: int | None
    burst: int | None  # set exactly when the rate is


@dataclass(frozen=True, slots=True)
class TenantLimits:
    concurrency_limit: int | None
    max_queued: int | None


@dataclass(frozen=True, slots=True)
class QueueDemand:
    runnable: int
    running: int


@dataclass(frozen=True, slots=True)
class TenantDemand:
    runnable: int
    running: int
    queued: int


def first_shard(name: str, shards: int) -> int:
    """Where a limit's remainder starts: drawn from its name, the same on
    every node and in every release (`shards.key_hash`)."""
    return key_hash("", name) % shards


def _rotation(shards: int, start: int) -> list[int]:
    return [(start + step) % shards for step in range(shards)]


def split_equal(limit: int, shards: int, start: int = 0) -> list[int]:
    """`limit` in `shards` integer parts that differ by at most one and sum to
    `limit`: the larger ones from shard `start` on."""
    base, extra = divmod(limit, shards)
    parts = [base] * shards
    for shard in _rotation(shards, start)[:extra]:
        parts[shard] += 1
    return parts


def split_count(limit: int, demands: Sequence[int], start: int = 0) -> list[int]:
    """A count limit split by demand; the parts sum to exactly `limit` (see
    the module's docstring)."""
    shards = len(demands)
    total = sum(demands)
    if total <= limit:
        spare = split_equal(limit - total, shards, start)
        return [demand + part for demand, part in zip(demands, spare, strict=True)]
    return _proportional(limit, demands, start, at_least_one=True)


def _proportional(limit: int, weights: Sequence[int], start: int, at_least_one: bool) -> list[int]:
    """`limit` in parts proportional to `weights` (not all 0), summing to
    `limit`: floors, then the remainder one each by largest fraction (ties
    in the rotation from `start`); with `at_least_one`, every shard of
    positive weight gets 1 first while the limit allows (the heaviest
    first), and the rest is shared in proportion."""
    shards = len(weights)
    order = _rotation(shards, start)
    rank = {shard: index for index, shard in enumerate(order)}
    parts = [0] * shards
    left = limit
    if at_least_one:
        wanting = sorted(
            (shard for shard in range(shards) if weights[shard] > 0),
            key=lambda shard: (-weights[shard], rank[shard]),
        )
        for shard in wanting[:left]:
            parts[shard] = 1
        left -= min(left, len(wanting))
    total = sum(weights)
    if left == 0 or total == 0:
        return parts
    shares = [left * weight for weight in weights]
    floors = [share // total for share in shares]
    remainder = left - sum(floors)
    by_fraction = sorted(range(shards), key=lambda shard: (-(shares[shard] % total), rank[shard]))
    for shard in by_fraction[:remainder]:
        floors[shard] += 1
    return [part + floor for part, floor in zip(parts, floors, strict=True)]


def split_rate(
    rate_milli: int, burst: int, weights: Sequence[int], start: int = 0
) -> list[tuple[int, int]]:
    """A queue's rate and burst split over the shards by `weights` (equal
    when none is positive): (rate, burst) per shard, each summing to exactly
    the limit over the shards that get a burst. A shard gets a rate only with
    at least 1 token of burst, so at most `burst` shards (the heaviest) share
    the rate; the others get (0, 0)."""
    shards = len(weights)
    if not any(weight > 0 for weight in weights):
        weights = [1] * shards
    rank = {shard: index for index, shard in enumerate(_rotation(shards, start))}
    wanting = sorted(
        (shard for shard in range(shards) if weights[shard] > 0),
        key=lambda shard: (-weights[shard], rank[shard]),
    )
    chosen = set(wanting[:burst])
    kept = [weights[shard] if shard in chosen else 0 for shard in range(shards)]
    if not chosen:  # a burst of 0: no shard can grant
        return [(0, 0)] * shards
    rates = _proportional(rate_milli, kept, start, at_least_one=False)
    bursts = _proportional(burst, kept, start, at_least_one=True)
    return list(zip(rates, bursts, strict=True))


# -- a round's targets ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RoundInputs:
    """What a round is computed from: the limits (group 0's settings), each
    shard's demand, and each shard's present quotas (its last plan)."""

    shards: int
    queues: Mapping[str, QueueLimits]
    tenants: Mapping[str, TenantLimits]
    queue_demand: Sequence[Mapping[str, QueueDemand]]  # by shard
    tenant_demand: Sequence[Mapping[str, TenantDemand]]  # by shard
    present: Sequence[ShardQuotas]  # by shard


def targets(inputs: RoundInputs, rebalance: bool) -> list[ShardQuotas]:
    """Every shard's quotas for this round. A limit no shard has a quota of
    yet starts at the equal split; with `rebalance` (every 5 s), and for a
    limit whose quotas no longer sum to it (it changed), the split follows
    demand; otherwise each shard keeps its present quota."""
    shards = inputs.shards
    queues: list[dict[str, QueueRow]] = [{} for _ in range(shards)]
    tenants: list[dict[str, TenantRow]] = [{} for _ in range(shards)]
    for name, limits in inputs.queues.items():
        start = first_shard(name, shards)
        present = [quotas.queues.get(name, NO_QUEUE_QUOTA) for quotas in inputs.present]
        demand = [
            inputs.queue_demand[shard].get(name, QueueDemand(0, 0)) for shard in range(shards)
        ]
        weights = [item.runnable + item.running for item in demand]
        concurrency: list[int | None] = [None] * shards
        if limits.concurrency_limit is not None:
            concurrency = list(
                _count(
                    limits.concurrency_limit,
                    [row[0] for row in present],
                    weights,
                    start,
                    rebalance,
                )
            )
        rates: list[tuple[int | None, int | None]] = [(None, None)] * shards
        if limits.rate_milli is not None and limits.burst is not None:
            rates = list(_rate(limits.rate_milli, limits.burst, present, weights, start, rebalance))
        for shard in range(shards):
            row = (concurrency[shard], *rates[shard])
            if row != NO_QUEUE_QUOTA:
                queues[shard][name] = row
    for name, tenant_limits in inputs.tenants.items():
        start = first_shard(name, shards)
        present_rows = [quotas.tenants.get(name, NO_TENANT_QUOTA) for quotas in inputs.present]
        found = [
            inputs.tenant_demand[shard].get(name, TenantDemand(0, 0, 0)) for shard in range(shards)
        ]
        limit_parts: list[int | None] = [None] * shards
        if tenant_limits.concurrency_limit is not None:
            limit_parts = list(
                _count(
                    tenant_limits.concurrency_limit,
                    [row[0] for row in present_rows],
                    [item.runnable + item.running for item in found],
                    start,
                    rebalance,
                )
            )
        queued_parts: list[int | None] = [None] * shards
        if tenant_limits.max_queued is not None:
            queued_parts = list(
                _count(
                    tenant_limits.max_queued,
                    [row[1] for row in present_rows],
                    [item.queued for item in found],
                    start,
                    rebalance,
                )
            )
        for shard in range(shards):
            tenant_row = (limit_parts[shard], queued_parts[shard])
            if tenant_row != NO_TENANT_QUOTA:
                tenants[shard][name] = tenant_row
    return [ShardQuotas(queues[shard], tenants[shard]) for shard in range(shards)]


def starved(inputs: RoundInputs) -> bool:
    """Whether quota lies idle in one shard while another wants it: a shard
    has runnable jobs of a queue or tenant and runs as many as its
    concurrency quota allows, while another's quota exceeds its runnable and
    running jobs; or a shard has runnable jobs of a queue whose rate quota
    there is 0. Then the next rebalance need not wait its turn (a backlog
    that moved, or drained in one shard, is followed at once)."""
    shards = range(inputs.shards)
    for name, limits in inputs.queues.items():
        rows = [inputs.present[k].queues.get(name, NO_QUEUE_QUOTA) for k in shards]
        demand = [inputs.queue_demand[k].get(name, QueueDemand(0, 0)) for k in shards]
        if limits.concurrency_limit is not None and _idle_and_wanted(
            [row[0] for row in rows], [(d.runnable, d.running) for d in demand]
        ):
            return True
        if limits.rate_milli is not None and any(
            rows[k][2] == 0 and demand[k].runnable > 0 for k in shards
        ):
            return True
    for name, tenant in inputs.tenants.items():
        quotas = [inputs.present[k].tenants.get(name, NO_TENANT_QUOTA)[0] for k in shards]
        found = [inputs.tenant_demand[k].get(name, TenantDemand(0, 0, 0)) for k in shards]
        if tenant.concurrency_limit is not None and _idle_and_wanted(
            quotas, [(d.runnable, d.running) for d in found]
        ):
            return True
    return False


def _idle_and_wanted(quotas: Sequence[int | None], demand: Sequence[tuple[int, int]]) -> bool:
    wanted = idle = False
    for quota, (runnable, running) in zip(quotas, demand, strict=True):
        if quota is None:
            return False  # no round yet: the first one comes anyway
        wanted |= runnable > 0 and running >= quota
        idle |= quota > runnable + running
    return wanted and idle


def _count(
    limit: int,
    present: Sequence[int | None],
    demands: Sequence[int],
    start: int,
    rebalance: bool,
) -> Sequence[int]:
    if all(part is None for part in present):
        return split_equal(limit, len(present), start)
    if not rebalance and None not in present and sum(present) == limit:  # type: ignore[arg-type]
        return present  # type: ignore[return-value]
    return split_count(limit, demands, start)


def _rate(
    rate_milli: int,
    burst: int,
    present: Sequence[QueueRow],
    weights: Sequence[int],
    start: int,
    rebalance: bool,
) -> Sequence[tuple[int | None, int | None]]:
    rates = [row[1] for row in present]
    bursts = [row[2] for row in present]
    if all(rate is None for rate in rates):
        return split_rate(rate_milli, burst, [1] * len(present), start)
    if (
        not rebalance
        and None not in rates
        and None not in bursts
        and sum(rates) == rate_milli  # type: ignore[arg-type]
        and sum(bursts) == burst  # type: ignore[arg-type]
    ):
        return list(zip(rates, bursts, strict=True))
    return split_rate(rate_milli, burst, weights, start)


# -- two phases -------------------------------------------------------------------------


def _lower(present: int | None, target: int | None) -> int | None:
    """The lower of two quotas, where None (no quota) is above any."""
    if present is None:
        return target
    if target is None:
        return present
    return min(present, target)


def lowered(present: ShardQuotas, target: ShardQuotas) -> ShardQuotas:
    """Each of the shard's quotas the lower of its present one and its target:
    what the first phase of a round gives it."""
    queues: dict[str, QueueRow] = {}
    for name in present.queues.keys() | target.queues.keys():
        old = present.queues.get(name, NO_QUEUE_QUOTA)
        new = target.queues.get(name, NO_QUEUE_QUOTA)
        concurrency = _lower(old[0], new[0])
        if old[1] is None or new[1] is None:
            rate, burst = (new[1], new[2]) if old[1] is None else (old[1], old[2])
        else:
            assert old[2] is not None and new[2] is not None
            rate, burst = min(old[1], new[1]), min(old[2], new[2])
        row = (concurrency, rate, burst)
        if row != NO_QUEUE_QUOTA:
            queues[name] = row
    tenants: dict[str, TenantRow] = {}
    for name in present.tenants.keys() | target.tenants.keys():
        was = present.tenants.get(name, NO_TENANT_QUOTA)
        wanted = target.tenants.get(name, NO_TENANT_QUOTA)
        tenant_row = (_lower(was[0], wanted[0]), _lower(was[1], wanted[1]))
        if tenant_row != NO_TENANT_QUOTA:
            tenants[name] = tenant_row
    return ShardQuotas(queues, tenants)


def same(one: ShardQuotas, other: ShardQuotas) -> bool:
    return dict(one.queues) == dict(other.queues) and dict(one.tenants) == dict(other.tenants)


def phases(
    present: Sequence[ShardQuotas], target: Sequence[ShardQuotas]
) -> tuple[dict[int, ShardQuotas], dict[int, ShardQuotas]]:
    """A round's two phases: the shards whose quotas go down (each to the
    lower of its present and its target quotas), to be applied first; then
    the shards whose quotas go up to their target, to be proposed only once
    every shard of the first phase has applied it. A shard in neither keeps
    its quotas."""
    first: dict[int, ShardQuotas] = {}
    second: dict[int, ShardQuotas] = {}
    for shard, (now, wanted) in enumerate(zip(present, target, strict=True)):
        low = lowered(now, wanted)
        if not same(low, now):
            first[shard] = low
        if not same(wanted, low):
            second[shard] = wanted
    return first, second
