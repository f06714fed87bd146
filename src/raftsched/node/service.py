"""The node: Raft, the replicated state, and the leader's duties.

Theory of operation. Every node applies the same log to its own copy of the
core state. Only the leader proposes: it stamps each entry with its epoch
(Raft term) and its clock, group-commits client commands, proposes a
`TakeOver` as soon as it is elected, and runs the dispatch loop that proposes
`Tick` only when the core says something is due, so an idle cluster writes
nothing. When it loses leadership it stops at once: queued commands fail with
`NotLeader`, the dispatch loop ends, and long-polls on it return to be
redirected. A follower redirects writes and linearizable reads to the leader
and answers stale reads from its replica.

Threads: pysyncobj applies entries and calls back on its own thread; the
node lives on the asyncio loop of the main thread and receives those events
through `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from raftsched import core, tls
from raftsched.config import NodeConfig
from raftsched.core import command_version
from raftsched.core.auth.commands import BootstrapAdmin, TouchTokens
from raftsched.core.auth.tokens import auth_enabled
from raftsched.core.jobs.flow_claim import claimable_at_ms
from raftsched.core.jobs.reconcile_report import reconciling_per_queue
from raftsched.core.kernel import identity as core_identity
from raftsched.core.kernel import shard as core_shard
from raftsched.core.kernel.cluster_version import CLUSTER_VERSION_DEFAULT, cluster_version
from raftsched.core.kernel.commands import (
    Barrier,
    Command,
    RaiseClusterVersion,
    SetShard,
    TakeOver,
    Tick,
)
from raftsched.core.kernel.results import Claimed, Lease, Rejected, Result, Ticked
from raftsched.core.membership.commands import Member
from raftsched.identity import EXIT_FOREIGN_DATA, NodeIdentity, open_identity, write_identity
from raftsched.node import commit_spans
from raftsched.node import identity as node_identity
from raftsched.node import metrics as families
from raftsched.node.auth import (
    ADMIN_TOKEN_NAME,
    AdminTokenFileError,
    TokenUses,
    hash_secret,
    read_or_create_admin_secret,
)
from raftsched.node.backup import Backups
from raftsched.node.change import Change
from raftsched.node.clock import LeaderClock
from raftsched.node.draws import Draws
from raftsched.node.identity import (
    FOREIGN_RUNBOOK,
    IdentityGate,
    PeerIdentity,
    Refusal,
    from_answer,
    leader_duties,
    refusal,
)
from raftsched.node.lease_ops import claim_command, kind_quotas
from raftsched.node.machine import ReplicatedState
from raftsched.node.membership import Directory, Driver
from raftsched.node.metrics import NodeMetrics, Samples
from raftsched.node.observability import SKEW_PERIOD_S, Observer, sample_forever
from raftsched.node.proposer import NotCommitted, NotLeader, OutcomeUnknown, Proposer
from raftsched.node.read_index import ReadIndex
from raftsched.node.series import SeriesRing
from raftsched.node.series import sample_forever as sample_series
from raftsched.node.versions import (
    POLL_PERIOD_S,
    NodeVersion,
    PeerVersions,
    UpgradeRequired,
    check_allowed,
    gated,
)
from raftsched.node.view import LeaderInfo
from raftsched.raft import Halt, RaftNode, RaftStatus
from raftsched.raft_journal import SNAPSHOT_NAME
from raftsched.shards import SHARD_HEADER

log = logging.getLogger("raftsched.node")

# Small Ticks interleave with claims and heartbeats: a million jobs falling
# due at once are made runnable a thousand at a time, each Tick one entry
# among the others rather than one long stall (see proposer.ENTRY_WORK_MAX).
TICK_ITEMS_MAX = 1_000
# A Tick that found nothing to do although the core said something was due
# would otherwise spin; this bounds how fast the dispatch loop can retry.
IDLE_TICK_PAUSE_S = 0.05
# A peer whose TLS certificate does not verify is reported this often.
PEER_TLS_WARNING_PERIOD_S = 60.0
# The cluster version that brings the identity commands (core.kernel.identity).
IDENTITY_CLUSTER_VERSION = 4
# How long a follower waits for the leader to tell it its commit index
# (node.read_index); the caller's own bound (`catch_up`) is usually shorter.
READ_INDEX_ASK_TIMEOUT_S = 2.0


class LeaderDuty(Protocol):
    """Work that runs only while this node leads (the webhook deliverer): started
    with the term on election, stopped on stepping down, closed with the node."""

    def start(self, term: int) -> None: ...

    def stop(self) -> None: ...

    async def close(self) -> None: ...


class Node:
    """One coordinator. The API and the webhook deliverer see it through
    `node.view.NodeView` and `StateView`."""

    def __init__(self, config: NodeConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.loop = loop
        self.metrics = NodeMetrics()
        self.clock = LeaderClock()
        self.draws = Draws(self.clock.now_ms, config.shard)  # every id and random number proposed
        # The dashboard's charts (node.series): every replica counts what it applies.
        self.series = SeriesRing()
        self.replica = ReplicatedState(
            self._applied_threadsafe,
            lambda: self.raft.applying_index,
            self._directory_is_ours,
            on_results=self.series.count_applied,
            on_restored=self.series.note_restored,
        )
        # Who this data directory belongs to (raftsched.identity); raises
        # ForeignDataDirectory if it is another node's.
        self._raft_dir = config.data_dir / "raft"
        self.gate = IdentityGate(
            open_identity(self._raft_dir, config.node_id, durable=config.durability == "fsync"),
            lambda: self.replica.state,
            self.metrics,
        )
        # Set when the cluster refuses this node (node.identity): the process
        # stops with its exit status.
        self.refused: Refusal | None = None
        self._refusal_seen: Refusal | None = None  # by the last poll
        self.refused_event = asyncio.Event()
        self.backups = Backups(self.replica, config.node_id)  # GET /v1/backup
        # Peers' identities from their last GET /v1/time answers, by URL.
        self._peer_identities: dict[str, PeerIdentity | None] = {}
        self._changed = Change()
        self._notify_scheduled = False
        # What the Raft thread hands the loop (from_raft), in order.
        self._from_raft_queue: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._from_raft_scheduled = False
        # Who the members are (node.membership): the start-up flags until the
        # replicated directory has a record, which then wins.
        self.directory = Directory(
            Member(config.node_id, config.raft_address, config.advertised_http_url), config.peers
        )
        self._http_urls = self.directory.http_urls()
        self.raft = RaftNode(
            node_id=config.node_id,
            raft_address=config.raft_address,
            bind_address=config.raft_bind_address,
            peers={p.id: p.raft_address for p in config.peers},
            data_dir=config.data_dir / "raft",
            secret=config.secret,
            accepted_secrets=config.accepted_secrets,
            machine=self.replica,
            durability=config.durability,
            on_leadership=self._leadership_threadsafe,
            leader_fallback_timeout_s=config.leader_fallback_timeout_s,
            election_timeout_min_s=config.election_timeout_min_s,
            election_timeout_max_s=config.election_timeout_max_s,
            log_compaction_entries=config.log_compaction_entries,
            log_compaction_bytes=config.log_compaction_bytes,
            log_compaction_interval_s=config.log_compaction_interval_s,
            gate=self.gate,
            on_fork_pause=self.metrics.snapshot_fork_pause.observe,
        )
        self._dispatch_task: asyncio.Task[None] | None = None
        self._leader_term: int | None = None
        self.observer = Observer(config.node_id, self.metrics, self.reading, self.status)
        self._leader_duties: list[LeaderDuty] = []  # see add_leader_duty
        self.membership = Driver(self.raft, self.directory, loop)
        self._leader_duties.append(self.membership)
        self.observer.is_leader = lambda: self.is_leader
        self.proposer = Proposer(
            loop,
            self.raft,
            self.clock.now_ms,
            queue_commands_max=config.proposal_queue_commands_max,
            queue_bytes_max=config.proposal_queue_bytes_max,
            on_entry=self._entry_done,
            on_results=self.observer.observe,
            from_raft=self.from_raft,
        )
        self._init_metrics()
        self._sampler_task: asyncio.Task[None] | None = None
        self._series_task: asyncio.Task[None] | None = None
        self._http_session: aiohttp.ClientSession | None = None
        # Peers' /v1/time over HTTPS: verified against the node's CA, with the
        # node's certificate for peers that require one (raftsched.tls).
        self._peer_ssl = tls.peer_context(config)
        self._peer_tls_warned_at: dict[str, float] = {}
        # A follower's asks for the leader's commit index (catch_up).
        self.read_index = ReadIndex(self._ask_leader_commit_index)
        # A shard process asks its peers' shard processes, through their
        # nodes, which route the header to them (docs/shards.md).
        self._peer_headers = {SHARD_HEADER: str(config.shard)} if config.shard else None
        self._skew_measured_at = 0.0
        self.peer_versions = PeerVersions({p.id: p.http_url for p in config.peers})
        # The cluster version this replica last read (it only goes up).
        self._version_allowing = CLUSTER_VERSION_DEFAULT
        self._versions_polled_at = 0.0
        self.token_uses = TokenUses()
        self._auth_logged = False
        self._bootstrap_refused_logged = False

    # -- lifecycle ------------------------------------------------------------

    def add_leader_duty(self, duty: LeaderDuty) -> None:
        """Run `duty` while this node leads; added before `start`."""
        self._leader_duties.append(duty)

    def start(self) -> None:
        """Start Raft. Must run on the main thread (see raftsched.raft)."""
        self.raft.start()
        self._sampler_task = self.loop.create_task(sample_forever(self.observer, self._sample))
        self._series_task = self.loop.create_task(sample_series(self.series, self.reading))

    async def close(self) -> None:
        self.proposer.step_down()
        for duty in self._leader_duties:
            await duty.close()
        if self._dispatch_task is not None:
            self._dispatch_task.cancel()
        if self._sampler_task is not None:
            self._sampler_task.cancel()
        if self._series_task is not None:
            self._series_task.cancel()
        self.read_index.close()
        if self._http_session is not None:
            await self._http_session.close()
        self.raft.close()

    # -- events from the Raft thread -----------------------------------------

    def from_raft(self, callback: Callable[..., None], *args: Any) -> None:
        """Run `callback(*args)` on the loop, called from the Raft thread.

        Each entry the leader proposes comes back as two events, its apply
        (`_applied_threadsafe`) and its answer (the proposer's callback), one
        right after the other. `call_soon_threadsafe` writes to the loop's
        wake-up socket every time: a system call, and with it the
        interpreter lock handed over to the loop thread. Here events queue
        up and only the first of a run wakes the loop: one write per entry
        instead of two."""
        self._from_raft_queue.append((callback, args))
        if not self._from_raft_scheduled:
            self._from_raft_scheduled = True
            self.loop.call_soon_threadsafe(self._run_from_raft)

    def _run_from_raft(self) -> None:
        # Cleared before the queue is emptied: an event queued meanwhile
        # either is taken below or schedules another run.
        self._from_raft_scheduled = False
        queue = self._from_raft_queue
        while queue:
            callback, args = queue.popleft()
            try:
                callback(*args)
            except Exception:
                log.exception("handling an event from the Raft thread failed")

    def _applied_threadsafe(self) -> None:
        # Coalesce: one wake-up per loop iteration, however many entries applied.
        if not self._notify_scheduled:
            self._notify_scheduled = True
            self.from_raft(self._notify_changed)

    def _notify_changed(self) -> None:
        self._notify_scheduled = False
        self._refresh_membership()
        changed, self._changed = self._changed, Change()
        changed.set()

    def _leadership_threadsafe(self, is_leader: bool, term: int) -> None:
        self.from_raft(self._leadership_changed, is_leader, term)

    def _leadership_changed(self, is_leader: bool, term: int) -> None:
        if is_leader and self._leader_term == term:
            return
        if self._leader_term is not None:
            log.info("stepping down", extra={"epoch": self._leader_term, "term": term})
            self.proposer.step_down()
            if self._dispatch_task is not None:
                self._dispatch_task.cancel()
                self._dispatch_task = None
            self._leader_term = None
            for duty in self._leader_duties:
                duty.stop()
            self.metrics.leader_changes.inc()
        if is_leader:
            log.info("became leader", extra={"epoch": term})
            self._leader_term = term
            self._versions_polled_at = 0.0  # learn the members' versions now
            self.clock.restart()
            self.proposer.become_leader(term)
            self.observer.on_became_leader()
            self._dispatch_task = self.loop.create_task(self._dispatch(term))
            for duty in self._leader_duties:
                duty.start(term)
        self._notify_changed()

    def _refresh_membership(self) -> None:
        """Follow the replicated directory: peers' URLs and ids, the removed
        addresses whose votes are refused, and whether this node was removed.

        Every applied entry comes here, on every replica, and membership
        changes are rare. Whether there was one is first read without the
        state lock (a counter, which the tick thread moves under the lock
        before it reports the entry); waiting for the lock the applier holds
        was 4-5% of a follower's interpreter time under single-request load."""
        if self.gate.identity.restored_from is None and not self.directory.moved(
            self.replica.state
        ):
            return
        with self.reading() as state:
            if not self.directory.refresh(state, ours=self._directory_is_ours(state)):
                return
        self._http_urls = self.directory.http_urls()
        self.raft.set_peer_ids(self.directory.names_by_address())
        self.raft.refuse_votes_from(self.directory.refused)
        self.peer_versions.set_peers(self.directory.peer_urls())
        if self.directory.removed_here and not self.raft.retired:
            log.warning(
                "this node was removed from the cluster: it stops serving and never stands "
                "for election again (add it back as a new member to use it again)"
            )
        self.raft.set_retired(self.directory.removed_here)
        self.membership.wake()

    @property
    def removed(self) -> bool:
        """This node was removed from the cluster (node.membership)."""
        return self.directory.removed_here

    # -- who this node is -----------------------------------------------------

    @property
    def node_id(self) -> str:
        return self.config.node_id

    @property
    def http_url(self) -> str:
        return self.config.advertised_http_url

    @property
    def raft_address(self) -> str:
        return self.config.raft_address

    @property
    def http_urls(self) -> Mapping[str, str]:
        return self._http_urls

    @property
    def identity(self) -> NodeIdentity:
        return self.gate.identity

    @property
    def shards(self) -> int:
        return self.config.shards

    def cluster_id(self) -> str | None:
        """The cluster this node belongs to: its data directory's, else (not
        written there yet) the one its replica applied."""
        mine = self.gate.identity.cluster_id
        if mine is not None:
            return mine
        with self.reading() as state:
            return core_identity.cluster_id(state)

    def identity_json(self) -> dict[str, Any]:
        """What `GET /v1/time` tells the peers about this node (node.identity)."""
        with self.reading() as state:
            return node_identity.as_json(self.gate.identity, state)

    # -- what proposers draw (the leader clock, identifiers) -------------------

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def new_id(self, prefix: str) -> str:
        return self.draws.new_id(prefix)

    def new_ids(self, prefix: str, count: int) -> tuple[str, ...]:
        return self.draws.new_ids(prefix, count)

    def random_u32(self) -> int:
        return self.draws.u32()

    # -- leadership and reads -------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._leader_term is not None and self.raft.is_leader()

    def leader(self) -> LeaderInfo | None:
        leader_id = self.raft.leader_id()
        if leader_id is None:
            return None
        return LeaderInfo(leader_id, self._http_urls.get(leader_id))

    def peer_reachable(self, node_id: str) -> bool:
        return any(p.id == node_id and p.reachable for p in self.status().peers)

    def reading(self) -> AbstractContextManager[core.State]:
        """Hold the state still while a handler reads and renders it."""
        return self.replica.reading()

    def digest(self) -> tuple[str, int]:
        """The state digest and the applied index it was taken at."""
        with self.reading():
            return self.replica.digest(), self.status().applied_index

    async def catch_up(self, timeout_s: float) -> bool:
        """Wait, at most `timeout_s`, until this replica has applied every
        entry that the leader had committed when the call was made: on the
        leader its own commit index; on a follower the leader's, asked for
        over HTTP (node.read_index), or the one it last heard when the
        leader does not answer. True once it has, False if not in time.

        What a follower that does not know a presented token does before it
        answers 401 (api.auth): the token may have been created a moment ago."""
        deadline = self.loop.time() + timeout_s
        status = self.status()
        target = max(status.commit_index, status.leader_commit_index or 0)
        if not self.is_leader and status.leader_id is not None:
            asked = self.read_index.leader_commit_index()
            try:
                leaders = await asyncio.wait_for(asyncio.shield(asked), timeout_s)
            except TimeoutError:
                leaders = None
            target = max(target, leaders or 0)
        while True:
            change = self.changed()  # before the status: an entry applied meanwhile sets it
            if self.status().applied_index >= target:
                return True
            remaining_s = deadline - self.loop.time()
            if remaining_s <= 0:
                return False
            await change.wait_s(remaining_s)

    async def _ask_leader_commit_index(self) -> int | None:
        """The commit index of the leader as it answers `GET /v1/time`, or
        None when none is known or the node that answers leads no more."""
        leader = self.leader()
        if leader is None or leader.id == self.node_id or leader.http_url is None:
            return None
        body = await self._peer_get(leader.http_url, "/v1/time", READ_INDEX_ASK_TIMEOUT_S)
        commit_index = body.get("commit_index")
        if body.get("node_id") != leader.id or body.get("role") != "leader":
            return None
        if not isinstance(commit_index, int) or isinstance(commit_index, bool):
            return None  # a node of an earlier release says nothing of it
        return commit_index

    async def barrier(self) -> None:
        """Wait until every write committed before this call is applied here,
        and this node was still leader after the call arrived."""
        if not self.is_leader:
            raise NotLeader()
        result = await self.proposer.propose(Barrier(), bounded=False)  # shared by reads
        if isinstance(result, Rejected):
            raise OutcomeUnknown(result.message)

    async def propose(
        self, command: Command, size_bytes: int = 0, *, bounded: bool = True
    ) -> Result:
        """Propose one command and wait for its result. A request's commands
        are `bounded` by the proposer's queue (QueueFull: 503 unavailable);
        the leader's own duties pass False (see node.proposer). A command
        newer than the cluster version raises UpgradeRequired (node.versions)."""
        if not self.is_leader:
            raise NotLeader()
        self._check_allowed((command,))
        span = commit_spans.start((command,), self.proposer.term)  # None unless traced
        if span is not None:
            return await commit_spans.traced(
                span, self.proposer.propose(command, size_bytes, bounded=bounded)
            )
        return await self.proposer.propose(command, size_bytes, bounded=bounded)

    def submit_all(
        self, commands: Sequence[Command], size_bytes: int = 0
    ) -> list[asyncio.Future[Result]]:
        """Queue a request's commands together, all or none (QueueFull,
        UpgradeRequired)."""
        if not self.is_leader:
            raise NotLeader()
        self._check_allowed(commands)
        futures = self.proposer.submit_all(commands, size_bytes)
        span = commit_spans.start(commands, self.proposer.term)  # None unless traced
        if span is not None:
            commit_spans.end_when_done(span, futures)
        return futures

    def refused_for_version(self, command: Command) -> UpgradeRequired | None:
        """Why `command` may not be proposed yet (the gate), or None."""
        try:
            self._check_allowed((command,))
        except UpgradeRequired as refused:
            return refused
        return None

    def _check_allowed(self, commands: Sequence[Command]) -> None:
        # Most commands pass any cluster version, so the common case never
        # takes the replica's lock from the event loop; nor does a newer one
        # (every claim of kinds) once this replica has seen a version that
        # allows it: the cluster version never goes down.
        newer = gated(commands)
        if newer and max(map(command_version, newer)) > self._version_allowing:
            with self.reading() as state:
                self._version_allowing = cluster_version(state)
                check_allowed(state, newer)

    def peer_version(self, node_id: str) -> NodeVersion | None:
        return self.peer_versions.heard.get(node_id)

    @property
    def halted(self) -> Halt | None:
        return self.raft.halted

    @property
    def disk_full(self) -> str | None:
        full = self.raft.disk_full
        return None if full is None else str(full)

    def cluster_version(self) -> int:
        """The cluster version in force on this replica (core.kernel.cluster_version)."""
        with self.reading() as state:
            return cluster_version(state)

    def status(self) -> RaftStatus:
        return self.raft.status()

    def changed(self) -> Change:
        """Set at the next applied entry or leadership change (node.change)."""
        return self._changed

    # -- claims (long-poll) ---------------------------------------------------

    async def claim(
        self,
        worker_id: str,
        queues: tuple[str, ...],
        max_jobs: int,
        wait_s: float,
        lease_ms: int | None,
        kinds: tuple[tuple[str | None, int], ...] | None = None,
        gone: Callable[[], bool] = lambda: False,
    ) -> list[Lease] | Rejected:
        """Long-poll for up to `wait_s`; with `kinds`, only jobs of those
        kinds (`ClaimJobsOfKinds`), refused at once with UpgradeRequired while
        the cluster version is below it. `gone()` says the asker has stopped
        listening (its connection closed): then the poll ends with nothing,
        at the latest when the next change wakes it, rather than be granted
        jobs nobody will start. (A grant already proposed stands: those leases
        expire unstarted and the jobs are retried.)"""
        deadline = self.loop.time() + wait_s
        command = claim_command(worker_id, queues, max_jobs, lease_ms, kinds)
        refused = self.refused_for_version(command)
        if refused is not None:
            raise refused  # now, not when something is first claimable
        quotas = kind_quotas(kinds)
        while True:
            changed = self._changed
            if gone():
                return []
            # Flow control may hold pending jobs back (a paused queue, a limit,
            # an empty token bucket): propose only when something is claimable,
            # else wait for a change or for the moment tokens refill.
            wait_more_s = self.claim_wait_s(queues, quotas)
            if wait_more_s == 0:
                result = await self.propose(command)
                if isinstance(result, Rejected):
                    return result
                assert isinstance(result, Claimed)
                if result.leases:
                    return list(result.leases)
            elif not self.is_leader:
                raise NotLeader()
            remaining = deadline - self.loop.time()
            if remaining <= 0:
                return []
            woken = await changed.wait_s(min(remaining, wait_more_s or remaining))
            if not woken and self.loop.time() >= deadline:
                return []

    def claim_wait_s(
        self, queues: tuple[str, ...], kinds: Mapping[str | None, int] | None = None
    ) -> float | None:
        """0 when a claim of `queues` (of `kinds` only, None: any job) would
        be granted a job now, the seconds until only time stands in the way
        no more, or None (wait for a change)."""
        now_ms = self.clock.now_ms()
        with self.reading() as state:
            at_ms = claimable_at_ms(state, queues, now_ms, kinds)
        if at_ms is None:
            return None
        return max(0.0, (at_ms - now_ms) / 1000)

    # -- the leader's dispatch loop -------------------------------------------

    async def _dispatch(self, term: int) -> None:
        try:
            await self._take_over(term)
            while self._leader_term == term:
                changed = self._changed
                with self.reading() as state:
                    due_ms = core.next_due_ms(state)
                now_ms = self.clock.now_ms()
                if due_ms is not None and due_ms <= now_ms:
                    await self._tick(now_ms)
                    continue
                timeout = None if due_ms is None else (due_ms - now_ms) / 1000
                await changed.wait_s(timeout)
        except asyncio.CancelledError:
            raise
        except NotLeader:
            log.info("dispatch stopped: no longer leader", extra={"epoch": term})
        except Exception:
            log.exception("dispatch loop failed", extra={"epoch": term})

    async def _take_over(self, term: int) -> None:
        while self._leader_term == term:
            try:
                await self.propose(TakeOver(), bounded=False)
                return
            except OutcomeUnknown:
                await asyncio.sleep(0.1)

    async def _tick(self, now_ms: int) -> None:
        try:
            tick = Tick(seed=self.draws.u64(), max_items=TICK_ITEMS_MAX)
            result = await self.propose(tick, bounded=False)
        except OutcomeUnknown:
            await asyncio.sleep(IDLE_TICK_PAUSE_S)
            return
        if isinstance(result, Ticked):
            self.metrics.ticks.inc()
            self.metrics.leases_expired.inc(result.leases_expired)
            did_work = result.made_runnable or result.leases_expired or result.dead_lettered
            if not (did_work or result.purged or result.more):
                await asyncio.sleep(IDLE_TICK_PAUSE_S)
        else:
            log.warning("tick rejected: %r", result)
            await asyncio.sleep(IDLE_TICK_PAUSE_S)

    # -- observation (see node.observability) ---------------------------------

    async def _sample(self) -> None:
        """Once a second: learn the peers' versions every POLL_PERIOD_S (and
        as leader raise the cluster version), measure their clocks every
        SKEW_PERIOD_S while leader."""
        if self.loop.time() - self._versions_polled_at >= POLL_PERIOD_S:
            self._versions_polled_at = self.loop.time()
            self._peer_identities = {}
            await self.peer_versions.poll(self._peer_time)
            self._check_peers_accept_me()
            await self._raise_cluster_version()
            await self._name_shard()
        await self._identity_duties()
        await self._auth_duties()
        if not self.is_leader:
            self.observer.forget_skew()
            return
        if self.loop.time() - self._skew_measured_at < SKEW_PERIOD_S:
            return
        self._skew_measured_at = self.loop.time()
        peers = self.directory.peer_urls()
        await self.observer.measure_skew(peers, self._peer_wall_ms)

    async def _peer_wall_ms(self, url: str) -> float:
        body = await self._peer_time(url)
        return float(body["wall_ms"])

    async def _peer_time(self, url: str) -> dict[str, Any]:
        """A peer's answer to `GET /v1/time`: its clock and its version."""
        body = await self._peer_get(url, "/v1/time")
        self._peer_identities[url] = from_answer(body)
        return body

    async def _peer_get(
        self, url: str, path: str, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """A peer's JSON object answer to `GET path` (raises if it is not one)."""
        if self._http_session is None:
            self._http_session = aiohttp.ClientSession()
        peer_ssl = True if self._peer_ssl is None else self._peer_ssl  # True: aiohttp's default
        options: dict[str, Any] = {"ssl": peer_ssl}
        if timeout_s is not None:  # else the session's own
            options["timeout"] = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self._http_session.get(
                url.rstrip("/") + path, headers=self._peer_headers, **options
            ) as response:
                body = await response.json()
        except aiohttp.ClientSSLError as error:
            self._warn_peer_tls(url, error)
            raise
        if not isinstance(body, dict):
            raise ValueError(f"GET {path} did not answer an object")
        return body

    def _warn_peer_tls(self, url: str, error: Exception) -> None:
        """A peer whose certificate does not verify stays unknown (no version,
        no skew) until an operator fixes it: say so, once a minute per peer."""
        now = self.loop.time()
        last = self._peer_tls_warned_at.get(url)
        if last is not None and now - last < PEER_TLS_WARNING_PERIOD_S:
            return
        self._peer_tls_warned_at[url] = now
        log.warning("TLS with peer %s failed (check --tls-ca and its certificate): %s", url, error)

    async def _raise_cluster_version(self) -> None:
        """As leader, once every member understands a higher cluster version
        than the one in force, propose it (node.versions)."""
        if not self.is_leader:
            return
        version = self.peer_versions.version_to_raise(self.cluster_version())
        if version is None:
            return
        try:
            result = await self.propose(RaiseClusterVersion(version), bounded=False)
        except (NotLeader, NotCommitted, OutcomeUnknown) as error:
            # The next poll tries again; raising twice is harmless.
            log.info("cluster version %d not raised yet: %r", version, error)
            return
        if isinstance(result, Rejected):
            log.warning("raising the cluster version to %d was rejected: %r", version, result)
        else:
            log.info("cluster version raised to %d: every member understands it", version)

    async def _name_shard(self) -> None:
        """As leader of a group of a sharded cluster, once the cluster version
        has shards (9), record which shard the group is (`SetShard`), so its
        fencing tokens and the ids it makes name it (docs/shards.md). Once
        recorded, nothing more: S never changes."""
        if not self.is_leader or self.config.shards <= 1:
            return
        if self.cluster_version() < core_shard.SHARD_VERSION:
            return
        with self.reading() as state:
            if core_shard.identity(state) is not None:
                return
        command = SetShard(self.config.shard, self.config.shards)
        try:
            result = await self.propose(command, bounded=False)
        except (NotLeader, NotCommitted, OutcomeUnknown) as error:
            log.info("shard identity not recorded yet: %r", error)  # the next poll tries again
            return
        if isinstance(result, Rejected):
            # Another index or count than this process's: a data directory
            # moved between shards. The core refuses a second identity.
            log.error(
                "the group refused shard identity %d of %d: %r",
                command.index,
                command.count,
                result,
            )
        else:
            log.info("shard identity recorded: shard %d of %d", command.index, command.count)

    # -- identity (node.identity) -------------------------------------------------

    def _directory_is_ours(self, state: core.State) -> bool:
        """False while a restored state still names the cluster it was backed
        up from: its member directory lists that cluster's machines."""
        gate = getattr(self, "gate", None)
        restored_from = None if gate is None else gate.identity.restored_from
        return restored_from is None or core_identity.cluster_id(state) != restored_from

    def _check_peers_accept_me(self) -> None:
        """After a poll of the peers: stop if a majority of the cluster refuses
        this node (another cluster's data, or a lost data directory)."""
        peers = {url: self._peer_identities.get(url) for url in self.peer_versions.peer_urls}
        verdict = refusal(self.gate.identity, peers, len(self._http_urls))
        # Stopping the process is acted on only when two polls in a row
        # (POLL_PERIOD_S apart) agree; meanwhile the peers drop its messages.
        if verdict is not None and verdict == self._refusal_seen:
            self._refuse(verdict)
        elif verdict is not None:
            log.warning("%s; stopping if the next poll of the peers agrees", verdict.message)
        self._refusal_seen = verdict

    def _refuse(self, verdict: Refusal) -> None:
        if self.refused is None:
            self.refused = verdict
            log.critical("%s; stopping (exit status %d)", verdict.message, verdict.exit_status)
            self.refused_event.set()

    async def _identity_duties(self) -> None:
        """Once a second: write the cluster id into the data directory once the
        replica knows it; as leader, name the cluster and record the members'
        incarnations (cluster version 4)."""
        mine = self.gate.identity
        with self.reading() as state:
            cluster = core_identity.cluster_id(state)
        if cluster is not None and mine.cluster_id is None:
            learned = mine.with_cluster(cluster)
            durable = self.config.durability == "fsync"
            await asyncio.to_thread(write_identity, self._raft_dir, learned, durable=durable)
            self.gate.identity = mine = learned
            log.info("this data directory now belongs to cluster %s", cluster)
        elif cluster is not None and cluster not in (mine.cluster_id, mine.restored_from):
            self._refuse(
                Refusal(
                    EXIT_FOREIGN_DATA,
                    f"this replica's state is cluster {cluster}'s, but its data directory "
                    f"belongs to cluster {mine.cluster_id} ({FOREIGN_RUNBOOK})",
                )
            )
            return
        if not self.is_leader or self.cluster_version() < IDENTITY_CLUSTER_VERSION:
            return
        with self.reading() as state:
            commands = leader_duties(state, mine, dict(self.gate.heard), self._http_urls)
        for command in commands:
            try:
                result = await self.propose(command, bounded=False)
            except (NotLeader, NotCommitted, OutcomeUnknown) as error:
                log.info("identity duties deferred: %r", error)
                return
            if isinstance(result, Rejected):
                log.warning("%r was rejected: %s", command, result.message)
            else:
                log.info("recorded %r", command)

    # -- API tokens (node.auth) -------------------------------------------------

    def auth_enabled(self) -> bool:
        """Whether requests must carry a token: the replica holds an admin token.
        The first time it finds authentication on, the node says so.

        Once on, it stays on: the last unrevoked admin token cannot be revoked
        (core.auth), and a replica's state only moves forward. So after that
        no request takes the replica's lock to ask again."""
        if self._auth_logged:
            return True
        with self.reading() as state:
            enabled = auth_enabled(state)
        if enabled and not self._auth_logged:
            self._auth_logged = True
            log.info("authentication is on: the cluster has an admin token")
        return enabled

    def note_token_use(self, token_id: str) -> None:
        if self.is_leader:
            self.token_uses.note(token_id, self.clock.now_ms())

    async def _auth_duties(self) -> None:
        """Once a second: say when authentication turns on; as leader,
        bootstrap the first admin token and record token use (node.auth)."""
        enabled = self.auth_enabled()
        version = self.cluster_version()
        if not self.is_leader or version < 3:
            return
        try:
            if not enabled and self.config.admin_token_file is not None:
                await self._bootstrap_admin(self.config.admin_token_file)
            await self._touch_tokens()
        except (NotLeader, NotCommitted, OutcomeUnknown) as error:
            log.info("token duties deferred: %r", error)

    async def _bootstrap_admin(self, path: Path) -> None:
        try:
            secret, written = await asyncio.to_thread(read_or_create_admin_secret, path)
        except AdminTokenFileError as error:
            if not self._bootstrap_refused_logged:
                self._bootstrap_refused_logged = True
                log.warning("no admin token bootstrapped: %s", error)
            return
        if written:
            log.info("wrote a new admin token secret to %s (mode 0600)", path)
        secret_hash = hash_secret(secret)
        del secret
        command = BootstrapAdmin(self.draws.new_id("tok"), ADMIN_TOKEN_NAME, secret_hash)
        result = await self.propose(command, bounded=False)
        if isinstance(result, Rejected):
            if not self._bootstrap_refused_logged:
                self._bootstrap_refused_logged = True
                log.warning("the admin token of %s was not bootstrapped: %s", path, result.message)
            return
        log.info("bootstrapped the first admin token from %s", path)

    async def _touch_tokens(self) -> None:
        now_ms = self.clock.now_ms()
        due = self.token_uses.due(now_ms)
        if due is None:
            return
        token_ids, used_at_ms = due
        self.token_uses.proposed(token_ids, now_ms)
        result = await self.propose(TouchTokens(token_ids, used_at_ms), bounded=False)
        if isinstance(result, Rejected):
            log.warning("recording token use was rejected: %s", result.message)

    # -- metrics --------------------------------------------------------------

    def _entry_done(self, commands: int, elapsed_s: float) -> None:
        self.metrics.entries_proposed.inc()
        self.metrics.entry_commands.observe(commands)
        self.metrics.commit_seconds.observe(elapsed_s)

    def _init_metrics(self) -> None:
        """Bind the families read from Raft, the replica and the proposer."""
        sample = self.metrics.sample
        sample(families.RAFT_IS_LEADER, self._m_role)
        sample(families.RAFT_TERM, lambda: [((), self.status().term)])
        sample(families.RAFT_COMMIT_INDEX, lambda: [((), self.status().commit_index)])
        sample(families.RAFT_APPLIED_INDEX, lambda: [((), self.status().applied_index)])
        sample(families.APPLY_HALTED, lambda: [((), 0.0 if self.raft.halted is None else 1.0)])
        sample(families.RAFT_DISK_FULL, lambda: [((), 0.0 if self.raft.disk_full is None else 1.0)])
        sample(families.JOBS, self._m_jobs)
        sample(families.SNAPSHOT_AGE, self._m_snapshot_age)
        sample(families.SNAPSHOT_DURATION, self._m_snapshot_duration)
        stats = self.raft.snapshot_stats
        sample(families.SNAPSHOT_COW_BYTES, lambda: _present(stats.cow_bytes))
        sample(families.SNAPSHOT_BYTES, lambda: _present(stats.size_bytes))
        sample(families.SNAPSHOT_LOAD_SECONDS, lambda: _present(stats.load_s))
        sample(
            families.SNAPSHOTS,
            lambda: [(("loaded",), float(stats.loads)), (("written",), float(stats.taken))],
        )
        self.metrics.sample_together(
            (
                families.QUEUE_DEPTH,
                families.QUEUE_RUNNING,
                families.QUEUE_RECONCILING,
                families.QUEUE_OLDEST_AGE,
            ),
            self._m_queues,
        )
        proposer = self.proposer
        sample(families.PROPOSER_QUEUED_COMMANDS, lambda: [((), float(proposer.queued))])
        sample(families.PROPOSER_QUEUED_BYTES, lambda: [((), float(proposer.queued_bytes))])
        sample(families.PROPOSER_REFUSED, lambda: [((), float(proposer.refused_commands))])

    def _m_snapshot_duration(self) -> Samples:
        duration_s = self.raft.last_snapshot_duration_s
        return [] if duration_s is None else [((), duration_s)]

    def _m_snapshot_age(self) -> Samples:
        try:
            written_s = (self.config.data_dir / "raft" / SNAPSHOT_NAME).stat().st_mtime
        except OSError:
            return []
        return [((), max(0.0, time.time() - written_s))]

    def _m_role(self) -> Samples:
        return [((), 1.0 if self.is_leader else 0.0)]

    def _m_jobs(self) -> Samples:
        with self.reading() as state:
            counts = core.status_counts(state)
        return [((status,), float(count)) for status, count in counts.items()]

    def _m_queues(self) -> dict[str, Samples]:
        with self.reading() as state:
            stats = core.queue_stats(state)
            reconciling = reconciling_per_queue(state)
            now_ms = state.now_ms
        depth: list[tuple[tuple[str, ...], float]] = []
        running: list[tuple[tuple[str, ...], float]] = []
        waiting: list[tuple[tuple[str, ...], float]] = []
        age: list[tuple[tuple[str, ...], float]] = []
        for queue, stat in stats.items():
            depth.append(((queue,), float(stat.depth)))
            running.append(((queue,), float(stat.running)))
            # Every queue, 0 included: an alert on it sees a queue drain.
            waiting.append(((queue,), float(reconciling.get(queue, 0))))
            oldest = stat.oldest_runnable_at_ms
            age.append(((queue,), 0.0 if oldest is None else max(0, now_ms - oldest) / 1000))
        return {
            families.QUEUE_DEPTH.name: depth,
            families.QUEUE_RUNNING.name: running,
            families.QUEUE_RECONCILING.name: waiting,
            families.QUEUE_OLDEST_AGE.name: age,
        }


def _present(value: float | None) -> Samples:
    """One unlabelled sample, or none before there is a value."""
    return [] if value is None else [((), float(value))]
