"""Settings, subscriptions and quotas in every shard (docs/shards.md, section 4
and "Events and subscriptions").

Group 0 is the record: the API writes queue and tenant settings and webhook
subscriptions there. This duty, which every node process of a sharded
cluster runs, brings the shards in line with it. It writes only into
shards whose leader is on this node, over their local sockets (with the
node's key, `shards.internal_key`), never over the network:

- **Alignment** (every node). For each local shard process that leads its
  shard, the node reads the shard's settings (`node.shard_view`) and
  proposes there the commands that make them its own replica of group 0's:
  `SetQueue`, `SetTenant`, `SetUnknownPolicy`, `CopySubscription` and
  `DeleteSubscription`, at most `COMMANDS_PER_PASS` a pass, a reset where
  group 0 has none. A follower of group 0 first catches its replica up
  with group 0's leader (`Node.catch_up`), so it never writes settings
  older than those it was asked to. And it proposes the shard's planned
  quotas (`SetShardQuotas`, below) when group 0 holds a newer round than the
  shard applied; the node leading group 0 does the same for shard 0.
- **Quotas** (the leader of group 0 only, cluster version 9). Each count
  and rate limit is split over the shards (`node.quota_split`): equally at
  first, then every `REBALANCE_S` by each shard's demand, read from this
  node's own replica of every shard, and `STARVED_REBALANCE_S` after the
  last one when quota lies idle in a shard while another wants it
  (`quota_split.starved`: a backlog that moved or drained is followed
  without waiting the full period). A
  round is recorded in group 0 as one `PlanShardQuotas` per shard whose
  quotas change, in two phases: the
  lowered quotas first, and only once every shard lowered has applied its
  round (seen in this node's replica of it, which applies only what its
  shard committed) the raised ones. No new round starts while a shard has
  not applied the last one: a shard that is down keeps its quotas, and the
  sum of the quotas in force never exceeds a limit.

  A shard enforces a limit's quota where it has one, else its copy of the
  setting: a new limit holds in each shard as the whole limit from its copy
  until its first round applies (well under a second when every shard
  answers), and a shard's quotas always go before the settings of the same
  pass.

A pass runs at every change of group 0's settings, subscriptions or plans
(at most every `PASS_GAP_S`), at least every `PASS_PERIOD_S` (a shard's
leader moved, a process restarted; `LEADER_PASS_PERIOD_S` on group 0's
leader, which follows the demand), and every `WAITING_PERIOD_S` while a
round waits for its shards. A shard process that does not answer is tried
again at the next pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp

from raftsched.core import command_version
from raftsched.core.jobs.quota_book import QUOTA_QUEUES_MAX, QUOTA_TENANTS_MAX
from raftsched.core.kernel import shard as core_shard
from raftsched.core.kernel.cluster_version import cluster_version
from raftsched.core.kernel.commands import Command
from raftsched.core.kernel.results import Rejected
from raftsched.node.proposer import NotCommitted, NotLeader, OutcomeUnknown
from raftsched.node.quota_split import (
    QueueLimits,
    RoundInputs,
    ShardQuotas,
    TenantLimits,
    phases,
    starved,
    targets,
)
from raftsched.node.service import Node
from raftsched.node.shard_view import (
    Settings,
    ShardView,
    SubscriptionSecrets,
    aligning_commands,
    command_json,
    limits_of,
    plan_command,
    plans_in,
    quotas_command,
    read_view,
    secrets_of,
    settings_digest,
    settings_of,
    view,
)
from raftsched.node.versions import UpgradeRequired
from raftsched.shards import INTERNAL_KEY_HEADER, socket_path

log = logging.getLogger("raftsched.shards")

PASS_GAP_S: Final = 0.25
PASS_PERIOD_S: Final = 1.0
# Group 0's leader reads the shards' demand this often (for `starved`).
LEADER_PASS_PERIOD_S: Final = 0.5
WAITING_PERIOD_S: Final = 0.1
WAITING_FAST_S: Final = 5.0
REBALANCE_S: Final = 5.0
# Quota idle in one shard while another wants it (quota_split.starved): a
# rebalance this soon after the last one, not at its turn.
STARVED_REBALANCE_S: Final = 1.0
COMMANDS_PER_PASS: Final = 64
# How long a follower of group 0 waits to catch up before a pass.
CATCH_UP_S: Final = 1.0
# A shard process that does not answer a view this fast is skipped this pass
# (a hung one must not hold the others back); proposals may wait longer.
VIEW_TIMEOUT_S: Final = 2.0
PROPOSE_TIMEOUT_S: Final = 10.0
CONNECT_TIMEOUT_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class GroupZero:
    """What a pass reads of this node's replica of group 0."""

    settings: Settings
    secrets: Mapping[str, SubscriptionSecrets]
    plans: Mapping[int, tuple[int, ShardQuotas]]
    queue_limits: Mapping[str, QueueLimits]
    tenant_limits: Mapping[str, TenantLimits]
    version: int
    identity: tuple[int, int] | None
    now_ms: int

    @property
    def quotas_on(self) -> bool:
        return self.version >= core_shard.SHARD_VERSION and self.identity is not None

    def fingerprint(self) -> tuple[Any, ...]:
        return (
            self.settings,
            tuple(sorted((k, r) for k, (r, _) in self.plans.items())),
            self.version,
            self.identity,
        )


def _bounded(limits: Mapping[str, Any], most: int) -> dict[str, Any]:
    """The first `most` names' limits: a round's rows are bounded (the rest
    keep the setting in every shard, as before quotas)."""
    return {name: limits[name] for name in sorted(limits)[:most]}


def read_group_zero(node: Node) -> GroupZero:
    with node.reading() as state:
        queues, tenants = limits_of(state)
        return GroupZero(
            settings=settings_of(state),
            secrets=secrets_of(state),
            plans=plans_in(state),
            queue_limits=_bounded(queues, QUOTA_QUEUES_MAX),
            tenant_limits=_bounded(tenants, QUOTA_TENANTS_MAX),
            version=cluster_version(state),
            identity=core_shard.identity(state),
            now_ms=state.now_ms,
        )


@dataclass(slots=True)
class Planner:
    """The rounds of quotas (the leader of group 0). `pending` holds a
    round's targets while its lowered quotas apply."""

    shards: int
    pending: tuple[Any, list[ShardQuotas]] | None = None
    rebalanced_at: float = float("-inf")
    waiting: bool = False
    waiting_since: float | None = None

    def forget(self) -> None:
        """Leadership of group 0 moved: the next leader starts from the record."""
        self.pending = None
        self.waiting, self.waiting_since = False, None

    def wait(self, now: float) -> None:
        """A round waits for its shards: passes come every `WAITING_PERIOD_S`
        for `WAITING_FAST_S`, then every `PASS_PERIOD_S` (a shard that is
        down may take long)."""
        if self.waiting_since is None:
            self.waiting_since = now
        self.waiting = now - self.waiting_since < WAITING_FAST_S


class ShardSettings:
    """The duty (see the module's docstring); started with the node's
    application, closed with it."""

    def __init__(self, node: Node, shards: int, data_dir: Path, key: str) -> None:
        self.node = node
        self.shards = shards
        self._key = key
        self._sockets = {k: socket_path(data_dir, k) for k in range(1, shards)}
        self._sessions: dict[int, aiohttp.ClientSession] = {}
        self._task: asyncio.Task[None] | None = None
        self.planner = Planner(shards)
        self._fingerprint: tuple[Any, ...] | None = None
        self._passed_at = float("-inf")
        self._was_leader = False
        self._warned: dict[str, float] = {}

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        for shard, path in self._sockets.items():
            self._sessions[shard] = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(path)),
                timeout=aiohttp.ClientTimeout(
                    total=PROPOSE_TIMEOUT_S, sock_connect=CONNECT_TIMEOUT_S
                ),
            )
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for session in self._sessions.values():
            await session.close()
        self._sessions = {}

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            changed = self.node.changed()
            try:
                group_zero = read_group_zero(self.node)
                leader = self.node.is_leader
                if leader != self._was_leader:
                    self._was_leader = leader
                    self.planner.forget()
                    self._fingerprint = None
                every_s = LEADER_PASS_PERIOD_S if leader else PASS_PERIOD_S
                due = (
                    group_zero.fingerprint() != self._fingerprint
                    or loop.time() - self._passed_at >= every_s
                    or self.planner.waiting
                )
                if due:
                    self._passed_at = loop.time()
                    if await self._pass(group_zero, leader):
                        self._fingerprint = group_zero.fingerprint()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("bringing the shards in line with group 0 failed; trying again")
                await asyncio.sleep(PASS_PERIOD_S)
            if self.planner.waiting:
                period = WAITING_PERIOD_S
            else:
                period = LEADER_PASS_PERIOD_S if self._was_leader else PASS_PERIOD_S
            await changed.wait_s(period)
            await asyncio.sleep(WAITING_PERIOD_S if self.planner.waiting else PASS_GAP_S)

    # -- a pass ------------------------------------------------------------------

    async def _pass(self, group_zero: GroupZero, leader: bool) -> bool:
        """One pass; True when every local shard that leads is in line."""
        if not leader and not await self.node.catch_up(CATCH_UP_S):
            return False  # an older replica of group 0 than its leader's: not now
        if not leader:
            group_zero = read_group_zero(self.node)  # as caught up
        planning = leader and group_zero.quotas_on
        ask_queues = list(group_zero.queue_limits) if planning else []
        ask_tenants = list(group_zero.tenant_limits) if planning else []
        shards = list(self._sockets)
        digest = settings_digest(group_zero.settings)
        found = await asyncio.gather(
            *(self._view(shard, ask_queues, ask_tenants, digest) for shard in shards)
        )
        views: dict[int, ShardView | None] = dict(zip(shards, found, strict=True))
        with self.node.reading() as state:
            views[0] = read_view(view(state, leader=leader, queues=ask_queues, tenants=ask_tenants))
        leading = [(k, seen) for k in shards if (seen := views[k]) is not None and seen.leader]
        aligned = await asyncio.gather(*(self._align(k, seen, group_zero) for k, seen in leading))
        in_line = all(aligned)
        if leader:
            in_line &= await self._own_quotas(group_zero, views[0])
        if planning:
            await self._plan(group_zero, views)
        return in_line

    async def _align(self, shard: int, seen: ShardView, group_zero: GroupZero) -> bool:
        """Propose in shard `shard` (which leads on this node) what makes it
        group 0's: its planned quotas first, then the settings. True when it
        needed nothing."""
        commands: list[Command] = []
        plan = group_zero.plans.get(shard)
        if plan is not None and plan[0] > seen.round and seen.identity is not None:
            commands.append(quotas_command(plan[0], plan[1]))
        if seen.settings is not None:  # None: the same digest as group 0's
            commands += aligning_commands(
                group_zero.settings, seen.settings, group_zero.secrets, COMMANDS_PER_PASS
            )
        # What the shard's cluster version does not take yet waits for it
        # (a subscription's copy, before version 9).
        ready = [c for c in commands if command_version(c) <= seen.cluster_version]
        if ready:
            await self._propose(shard, ready)
        return not commands

    async def _own_quotas(self, group_zero: GroupZero, own: ShardView | None) -> bool:
        """As leader of group 0: apply shard 0's planned quotas here."""
        plan = group_zero.plans.get(0)
        if own is None or plan is None or plan[0] <= own.round:
            return True
        await self._propose_here([quotas_command(plan[0], plan[1])], "shard 0's quotas")
        return False

    # -- quotas (the leader of group 0) ----------------------------------------------

    async def _plan(self, group_zero: GroupZero, views: Mapping[int, ShardView | None]) -> None:
        planner = self.planner
        loop = asyncio.get_running_loop()
        seen: list[ShardView] = []
        for shard in range(self.shards):
            one = views.get(shard)
            if one is None or one.identity is None:
                planner.waiting = False
                return  # a shard unheard of, or not named yet: its quotas stay, no round
            seen.append(one)
        behind = [
            shard
            for shard, (number, _) in group_zero.plans.items()
            if shard < self.shards and seen[shard].round < number
        ]
        if behind:
            planner.wait(loop.time())
            return
        planner.waiting, planner.waiting_since = False, None
        present = [one.quotas for one in seen]
        limits_key = (dict(group_zero.queue_limits), dict(group_zero.tenant_limits))
        if planner.pending is not None:
            key, wanted = planner.pending
            planner.pending = None
            if key == limits_key:
                first, second = phases(present, wanted)
                if not first:
                    if second:
                        await self._propose_plans(group_zero, second, "raised")
                    return
            # The limits changed, or a shard's quotas did: compute again.
        inputs = RoundInputs(
            self.shards,
            group_zero.queue_limits,
            group_zero.tenant_limits,
            [one.queue_demand for one in seen],
            [one.tenant_demand for one in seen],
            present,
        )
        since = loop.time() - planner.rebalanced_at
        rebalance = since >= REBALANCE_S or (since >= STARVED_REBALANCE_S and starved(inputs))
        wanted = targets(inputs, rebalance)
        if rebalance:
            planner.rebalanced_at = loop.time()
        first, second = phases(present, wanted)
        if first:
            if await self._propose_plans(group_zero, first, "lowered") and second:
                planner.pending = (limits_key, wanted)
                planner.wait(loop.time())
        elif second:
            await self._propose_plans(group_zero, second, "raised")

    async def _propose_plans(
        self, group_zero: GroupZero, parts: Mapping[int, ShardQuotas], phase: str
    ) -> bool:
        """Record `parts` in group 0 as one round; True once every plan is."""
        latest = max((number for number, _ in group_zero.plans.values()), default=0)
        round_ = max(group_zero.now_ms, latest + 1)
        commands = [plan_command(shard, round_, parts[shard]) for shard in sorted(parts)]
        ok = await self._propose_here(commands, f"round {round_} ({phase})")
        if ok:
            log.debug(
                "quota round %d (%s) planned for shards %s",
                round_,
                phase,
                sorted(parts),
                extra={"round": round_, "phase": phase},
            )
        return ok

    # -- proposing ---------------------------------------------------------------------

    async def _propose_here(self, commands: Sequence[Command], what: str) -> bool:
        """Propose in group 0 (this node leads it); True if all were accepted."""
        try:
            results = await asyncio.gather(
                *(self.node.propose(command, bounded=False) for command in commands)
            )
        except (NotLeader, NotCommitted, OutcomeUnknown, UpgradeRequired) as error:
            log.info("%s not recorded yet: %r", what, error)
            return False
        refused = [result for result in results if isinstance(result, Rejected)]
        for result in refused:
            self._warn(f"{what} was refused: {result.code}: {result.message}")
        return not refused

    async def _propose(self, shard: int, commands: Sequence[Command]) -> None:
        """Propose `commands` in local shard `shard`, which leads (its process
        answers 503 if it no longer does: the next pass sees)."""
        body = {"commands": [command_json(command) for command in commands]}
        answer = await self._post(shard, "/v1/internal/shard/propose", body)
        if answer is None:
            return
        for command, outcome in zip(commands, answer.get("outcomes", []), strict=False):
            if isinstance(outcome, dict) and not outcome.get("ok"):
                self._warn(
                    f"shard {shard} refused {type(command).__name__}: "
                    f"{outcome.get('code')}: {outcome.get('message')}"
                )

    async def _view(
        self, shard: int, queues: Sequence[str], tenants: Sequence[str], digest: str
    ) -> ShardView | None:
        body = {"queues": queues, "tenants": tenants, "digest": digest}
        answer = await self._post(shard, "/v1/internal/shard/view", body, VIEW_TIMEOUT_S)
        if answer is None:
            return None
        try:
            return read_view(answer)
        except ValueError as error:
            self._warn(f"shard {shard}'s view could not be read: {error}")
            return None

    async def _post(
        self, shard: int, path: str, body: Any, timeout_s: float = PROPOSE_TIMEOUT_S
    ) -> dict[str, Any] | None:
        session = self._sessions.get(shard)
        if session is None:
            return None
        try:
            async with session.post(
                "http://shard" + path,
                json=body,
                headers={INTERNAL_KEY_HEADER: self._key},
                timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=CONNECT_TIMEOUT_S),
            ) as response:
                answer = await response.json(content_type=None)
                status = response.status
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return None  # down or restarting: the next pass tries again
        if status != 200 or not isinstance(answer, dict):
            if status != 503:  # 503: it stopped leading
                self._warn(f"shard {shard} answered {path} with {status}: {answer}")
            return None
        return answer

    def _warn(self, message: str) -> None:
        """A warning, at most once a minute for the same text."""
        now = time.monotonic()
        if now - self._warned.get(message, float("-inf")) < 60:
            return
        self._warned[message] = now
        if len(self._warned) > 1_000:
            self._warned.clear()
        log.warning(message)
