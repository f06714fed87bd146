"""The Raft adapter: the only module (with `raft_journal`) that imports pysyncobj.

It replicates opaque command bytes through pysyncobj 0.3.17 and hands each
committed entry, in log order, to a `StateMachine`. pysyncobj is small and
readable but unsafe as shipped; each guard rail below answers a fact found in
its source.

Guard rails
-----------
1. One replicated method (`_ReplicatedLog.apply_command`, taking bytes).
   pysyncobj numbers replicated methods by sorting their names, so a second
   method would renumber the first in old journals. Nothing escapes it: an
   exception raised there propagates out of `_onTick` before
   `raftLastApplied` moves, so the entry would be re-applied forever. The
   machine's exceptions and our callbacks' exceptions are caught and logged.
2. Durability. pysyncobj's journal never fsyncs and followers acknowledge
   before anything is durable. `raft_journal.DurableJournal` replaces it
   (through the `createJournal` factory), and `_SyncingTransport` syncs the
   journal before any Raft message leaves the node: a follower's entries are
   on disk before its acknowledgement, a leader's before it sends them (so
   before its own copy can count), and term and vote before a vote is asked
   for or granted. A tick callback syncs too, for a cluster of one. One
   fsync covers everything written since the last message (group commit).
   `durability="none"` keeps pysyncobj's behaviour (no fsync) to measure
   the difference. journalFile and fullDumpFile are always both set.
3. Power cuts are simulated by `RAFTSCHED_SIMULATE_POWER_CUT=1`; see
   `raft_journal`. Bad disks (docs/operations.md): a failed fsync or
   write stops the process (`raft_journal.fail_stop`); a full disk
   (`raft_journal.DiskFull`) is caught where pysyncobj would otherwise
   lose it: a leader's append fails the proposal with `disk_full` (the
   entry is not in the log) and the leader steps down if it has peers, so
   that a node with room can lead; a follower's append or an ack or vote
   that would need an unsaved term is dropped, unsent; and a node whose
   disk is full does not stand for election. Every tick it looks whether
   there is room again and then carries on, without a restart.
4. Pickle on the wire. pysyncobj unpickles every message. The cluster secret
   is required and passed as `password`: each message is an AES-256-GCM
   token (`raft_cipher.RaftCipher`, installed in place of pysyncobj's
   Fernet, which cost milliseconds per large entry), checked before
   anything is unpickled, so a stranger's bytes only close the connection.
   `accepted_secrets` are also accepted (never sent with): a secret
   rotation by rolling restart (docs/security.md).
5. Snapshots are the machine's own bytes (`StateMachine.snapshot`) behind a
   small msgpack header, through SyncObjConf's serializer/deserializer
   hooks. pysyncobj forks only for its own pickle serializer, so the adapter
   forks itself (`snapshot_in_child`, on by default): the tick thread forks
   (taking the machine's lock only if it is free: a reader can hold it for
   seconds, and waiting for it once cost an election; the child gets a new
   lock) and goes straight back to Raft; the child encodes its copy-on-write image
   of the state as of exactly the last applied entry, writing each piece
   of the encoding as it comes (the whole encoding is never in memory),
   fsyncs the file, renames it into place and exits. pysyncobj's `serializeChecker` hook
   polls the child, and the log is compacted only once the child succeeded.
   Encoding a million jobs takes seconds, far longer than an election
   timeout: done on the tick thread it would cost the leader its leadership.
   The price is memory: pages the child touches are copied (up to the size
   of the state). Without fork, or with `snapshot_in_child=False`, the
   snapshot is taken on the tick thread. A snapshot received from the leader
   is fsynced before it is acknowledged. The child runs at a lower CPU
   priority, and each replica compacts at its own log index
   (`staggered_compaction_entries`), so the replicas do not all encode at
   once on a shared machine. The child is SIGKILLed when the tick thread
   that forked it ends (`child_processes.die_with`): a node that stops or
   dies never leaves a writer behind; its journal still holds everything.
   The fork's pause and the child's copy-on-write growth are measured
   (`SnapshotStats`). Compaction is set off by entries or time (pysyncobj's
   triggers) or by journal bytes (`log_compaction_bytes`, the adapter's),
   each staggered across replicas. A snapshot load (at start, or one the
   leader sent) restarts the follower's election timeout when it ends: a
   load takes longer than the timeout at a million jobs, and pysyncobj,
   which set the deadline before the load, would otherwise stand for
   election at once and depose a healthy leader.
6. Latency: `appendEntriesUseBatch=False` sends each entry at once (about a
   millisecond per commit instead of the 0.1 s append period).
   `leaderFallbackTimeout` is a parameter and must stay below the shortest
   lease.
   Two pysyncobj habits would otherwise defeat this: a late acknowledgement
   moves the leader's nextIndex back, so followers are re-sent entries they
   hold and truncate them before re-appending (the transport keeps nextIndex
   from moving back; the journal truncates lazily and re-adopts identical
   records, so an acknowledged record never leaves the disk).
   A third: a follower raises its commit index from a snapshot chunk as
   from any AppendEntries, to min(leader's commit index, its last index),
   though a chunk checks nothing about its log; a deposed leader holding
   entries that never committed would apply them before the snapshot
   replaced them. The transport lowers a chunk's commit index to the
   follower's own (`_without_commit_claim`). And a fourth: pysyncobj
   truncates everything after `prevLogIdx` before appending, matching
   entries too, so an append that starts inside the follower's committed
   prefix (nextIndex moved back by a late reset) truncates applied entries
   and logs it at critical level. The transport starts such an append at
   the follower's commit index (`_past_committed`).
7. Stopping at an entry. A machine that cannot apply an entry at all (it
   cannot decode it: a newer release proposed it) raises `StopApplying`.
   Skipping it would diverge from the replicas that applied it, so the
   adapter stops applying for good at that entry (`halted`); see
   `RaftNode._stop_applying` for how and why.
8. pysyncobj exposes no term or index at apply time; `raftLastApplied + 1`
   inside the replicated method is the entry's index (`applying_index`).
   `status().applied_index` is the last applied index.
9. Identity. pysyncobj knows its peers by address only: a node that comes
   back at the same address with an empty data directory (its term and
   vote forgotten) or with another cluster's data is welcomed. With a
   `MessageGate` the transport puts the gate's stamp on every message it
   sends and hands the stamp of every message it receives to the gate
   before pysyncobj reads the message; a refused message is dropped, and
   nothing is sent to its sender for a while (`REFUSED_HOLD_S`), so the
   refused node takes no part: its votes, acknowledgements and candidacy
   count for nothing. A message without a stamp (a node of release 0.3.0)
   is admitted; that release ignores the stamp. See `node.identity`.
10. Large entries. pysyncobj sends an entry of 64 KiB or more in parts and
   labels the last few `finish` too early (it compares the slice position
   with the command's length, not the pickle's), so followers unpickled a
   prefix and logged `failed _onTick` with `pickle data was truncated`. The
   transport relabels the parts from the pickle's real length
   (`_TransmissionLabels`).
10. Membership changes (`change_membership`), one member at a time, through
   pysyncobj's dynamic membership: its entry goes through the same journal,
   fsynced like any other, and the configuration takes effect when the
   entry is appended (Raft's single-server change); the leader refuses a
   second one while the first is uncommitted. The configuration survives:
   pysyncobj replays its entries from the journal, and every snapshot header
   names the members (`SnapshotHeader.cluster`, read back without this node,
   which pysyncobj would otherwise count as its own peer). Three gaps are
   closed here. pysyncobj has no learners: a new member counts towards the
   majority as soon as its entry is appended, caught up or not (the node
   refuses another change until it has caught up; see node.membership).
   pysyncobj refuses to remove the leader itself, so a leader that must go
   hands leadership to its most caught-up follower (`set_retired`), which then
   removes it. pysyncobj has no pre-vote: a removed node that times out
   would ask for votes with ever higher terms and depose the leader. A
   retired node never stands for election again, and members drop vote
   requests from the addresses the node tells them were removed
   (`refuse_votes_from`); a node that pysyncobj has dropped cannot even
   connect (its transport closes connections from unknown addresses).

Threads
-------
pysyncobj runs one tick thread that does networking, disk writes, apply and
every callback. `StateMachine.apply/snapshot/restore`, proposal callbacks
and `on_leadership` all run on it, one at a time, and must return quickly;
bridge into asyncio with `loop.call_soon_threadsafe`. The tick thread stops
when the thread that created the SyncObj exits, so `start()` must run on the
main thread. `propose`, `status` and the small getters may be called from
any thread.

Proposals
---------
At most one proposal may be in flight; a second gets `busy`. Every
proposal's callback fires exactly once, on the tick thread (after `close()`,
on the caller's thread, since there is no tick thread): with the
machine's result, or with one of `ProposeError`. `leader_changed`,
`unknown_outcome` and `closed` mean the outcome is unknown: the entry may
still commit, so anything a caller retries must be idempotent. `not_leader`,
`busy` and `discarded` mean it was not and will not be committed from this
proposal. The node enforces its own deadlines on top of this.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import functools
import gc
import logging
import os
import pickle
import signal
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn, Protocol, runtime_checkable

import pysyncobj.pickle as _pysyncobj_pickle
import pysyncobj.syncobj as _pysyncobj_syncobj
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.transport import TCPTransport

from raftsched import child_processes, raft_journal
from raftsched.raft_cipher import RaftCipher, RaftSecrets
from raftsched.raft_journal import DiskFull, DurableJournal, SnapshotHeader

logger = logging.getLogger(__name__)

SECRET_CHARS_MIN: Final = 16
# How often a halted tick thread looks whether the main thread is gone.
_HALT_POLL_S: Final = 1.0
_NO_LOCK: Final = contextlib.nullcontext()
# A snapshot child still writing after this long is stuck (or the disk is):
# kill it and let pysyncobj try again later.
SNAPSHOT_CHILD_TIMEOUT_S: Final = 600.0
# The snapshot child is background work beside latency-bound threads (Raft
# ticks, HTTP). At nice 10 the kernel gives it about a tenth of a contended
# core, so it still finishes under load but no longer takes a core from the
# leader: a 30 MB snapshot on each replica at once was the cluster
# benchmark's due-to-lease tail (p99 65 ms, the slow samples all within the
# second the three children ran).
SNAPSHOT_CHILD_NICE: Final = 10
# The snapshot child's exit status when the disk had no room for it, and how
# long the next attempt waits then (pysyncobj would try again every tick).
SNAPSHOT_CHILD_NO_ROOM: Final = 28
SNAPSHOT_NO_ROOM_RETRY_S: Final = 10.0
# A full disk is logged at most this often. statvfs does not see quotas, so
# with EDQUOT the node may think there is room and find none, again and again.
DISK_FULL_LOG_EVERY_S: Final = 30.0
# Compact once the journal holds this many bytes, whatever the entry count
# (staggered like it). Entries are not all alike: a bulk submission of 1,000
# jobs is one entry of ~250 KB, so 5,000 of them are a journal of over a GB,
# which a restart reads and applies again after loading the snapshot, and
# which a lagging follower is sent entry by entry. 64 MiB keeps that replay
# to about 200,000 jobs (a few seconds of applying), inside the restart
# budget beside the snapshot itself, and the disk beyond the snapshot
# bounded. At the cluster's peak ingest (~1.4 MB of journal a second) it
# fires at most every ~45 s; a 10M snapshot costs more than that to write,
# and one at a time runs (a trigger met while the child runs waits for it).
LOG_COMPACTION_BYTES: Final = 64 * 1024 * 1024
# A follower being sent a snapshot is sent no more of it while this much is
# waiting in its connection's buffer (see _limit_snapshot_sending): 64
# chunks, ten times what loopback absorbs in a round.
SNAPSHOT_SEND_BUFFERED_MAX: Final = 4 * 1024 * 1024
# A follower receiving a snapshot tells the leader it is alive this often.
SNAPSHOT_KEEPALIVE_S: Final = 0.5
# Compaction waits while a snapshot is being sent, for at most this long
# (see RaftNode._holding_for_transfer).
COMPACTION_HOLD_MAX_S: Final = 600.0
# A fork that stopped the tick thread longer than this is logged.
FORK_PAUSE_LOG_S: Final = 0.05
# What a snapshot child reports as it exits: its Private_Dirty bytes.
_CHILD_REPORT: Final = struct.Struct("<Q")
# How often a node whose disk is full looks whether there is room again.
DISK_ROOM_CHECK_S: Final = 0.5
_NO_ROOM: Final = frozenset({errno.ENOSPC, errno.EDQUOT})
# The key of the sender's identity stamp in a Raft message (guard rail 9).
IDENTITY_KEY: Final = "raftsched_from"
# How long nothing is sent to a node whose message was refused; a message
# of it that is admitted ends the hold.
REFUSED_HOLD_S: Final = 5.0


def staggered_compaction_entries(node_id: str, node_ids: Iterable[str], entries: int) -> int:
    """This replica's log-compaction threshold: `entries`, raised by up to half
    of it by the node's place in the sorted ids. Replicas with the same
    threshold compact at the same log index, so all of them would fork and
    encode at the same moment, and a majority would be slow together. The
    same staggering applies to the byte threshold and the interval."""
    ordered = sorted(set(node_ids) | {node_id})
    position = ordered.index(node_id)
    return entries + entries * position // (2 * len(ordered))


def staggered_compaction_interval(
    node_id: str, node_ids: Iterable[str], interval_s: float
) -> float:
    """`staggered_compaction_entries` for the time trigger: replicas started
    together would otherwise all reach the interval in the same tick."""
    ordered = sorted(set(node_ids) | {node_id})
    position = ordered.index(node_id)
    return interval_s + interval_s * position / (2 * len(ordered))


@dataclass(slots=True)
class SnapshotStats:
    """What the last snapshots cost this node (written on the tick thread,
    read by /metrics; each field is replaced whole, so readers need no lock).

    `fork_pause_s` is how long the tick thread stopped to start the child:
    `os.fork()`, in which the kernel copies the page tables (it grows with
    the resident memory: 15-50 ms at 430 MB on this VM); the machine's lock
    is never waited for. `cow_bytes` is the
    child's Private_Dirty at its exit (/proc/self/smaps_rollup): the pages
    it copied from the parent's image plus its own buffers, which is the
    memory a snapshot adds to the node while it runs."""

    taken: int = 0  # snapshots written successfully
    encode_s: float | None = None  # fork (or start) to the file in place
    fork_pause_s: float | None = None
    cow_bytes: int | None = None
    size_bytes: int | None = None  # of the last file written or loaded
    loads: int = 0  # snapshots loaded (at start or received from a leader)
    load_s: float | None = None  # the last load: sync, read, check, restore
    load_restore_s: float | None = None  # of which the machine's restore


class StateMachine(Protocol):
    def apply(self, data: bytes) -> object:
        """Apply one committed command. Runs on the tick thread, in log order."""
        ...

    def snapshot(self) -> Iterable[bytes | memoryview]:
        """Encode the whole state as of the last applied entry, as pieces that
        joined in order are what `restore` reads. The adapter writes each piece
        before it asks for the next, so a piece may be a view of a buffer that
        the next one reuses. Runs in a forked
        child (or on the tick thread). A machine that other threads read must
        expose the lock they take as `lock` (a `threading.RLock`), and they
        must not change the state (only `apply` and `restore` do, on the
        tick thread). The adapter forks whether or not a reader holds it,
        and in the child replaces it with a new lock, so the child never
        waits for a thread that does not exist there."""
        ...

    def restore(self, data: bytes | memoryview) -> None:
        """Replace the whole state with a decoded snapshot."""
        ...


@runtime_checkable
class MemberRecord(Protocol):
    """A machine that keeps a replicated member directory may say whether it
    has one (guard rail 10); the adapter asks right after a snapshot load."""

    def membership_recorded(self) -> bool:
        """Whether the state records the members (False: the node's flags,
        as at the cluster's start, are the membership)."""
        ...


class MessageGate(Protocol):
    """Who this node says it is, and whom it hears (guard rail 9). Both run
    on the tick thread."""

    def stamp(self) -> object:
        """What every message this node sends carries (picklable, small)."""
        ...

    def admits(self, stamp: object) -> bool:
        """Whether a message carrying `stamp` may be handled."""
        ...


class StopApplying(Exception):
    """Raised by `StateMachine.apply` for an entry it cannot apply at all:
    the adapter applies neither it nor anything after it (`RaftNode.halted`)."""


@dataclass(frozen=True, slots=True)
class Halt:
    """Where and why this replica stopped applying."""

    index: int | None  # the entry that was not applied
    reason: str


class ProposeError(enum.StrEnum):
    NOT_LEADER = "not_leader"  # this node is not the leader; nothing was appended
    BUSY = "busy"  # another proposal is still in flight
    DISCARDED = "discarded"  # another entry took this one's place in the log
    LEADER_CHANGED = "leader_changed"  # leadership or term changed; outcome unknown
    UNKNOWN_OUTCOME = "unknown_outcome"
    QUEUE_FULL = "queue_full"
    APPLY_FAILED = "apply_failed"  # committed, but the machine raised (a bug)
    CLOSED = "closed"  # the node was closed; outcome unknown
    DISK_FULL = "disk_full"  # no room to append it to the leader's journal; not in the log
    FAILED = "failed"  # any other pysyncobj failure


_FAIL_REASON_ERRORS: Final[Mapping[int, ProposeError]] = {
    FAIL_REASON.QUEUE_FULL: ProposeError.QUEUE_FULL,
    FAIL_REASON.MISSING_LEADER: ProposeError.NOT_LEADER,
    FAIL_REASON.DISCARDED: ProposeError.DISCARDED,
    FAIL_REASON.NOT_LEADER: ProposeError.NOT_LEADER,
    FAIL_REASON.LEADER_CHANGED: ProposeError.LEADER_CHANGED,
    FAIL_REASON.REQUEST_DENIED: ProposeError.FAILED,
    FAIL_REASON.UNKNOWN_OUTCOME: ProposeError.UNKNOWN_OUTCOME,
}

_ROLES: Final = {0: "follower", 1: "candidate", 2: "leader"}
_RAFT_STATE_FOLLOWER: Final = 0

ProposeCallback = Callable[[object | None, str | None], None]


@dataclass(frozen=True, slots=True)
class PeerStatus:
    id: str
    raft_address: str
    reachable: bool
    match_index: int | None  # known on the leader only


@dataclass(frozen=True, slots=True)
class RaftStatus:
    node_id: str
    role: str  # "leader" | "follower" | "candidate"
    term: int
    leader_id: str | None
    commit_index: int
    applied_index: int
    # The other voting members of the configuration in force here.
    peers: tuple[PeerStatus, ...]
    # Whether this node is a voting member of its own configuration (False
    # once it was removed; pysyncobj never removes a node from its own).
    retired: bool = False
    # The commit index the leader of this term last told this follower (its
    # own on a leader; None before it heard one). Unlike `commit_index`, it
    # is not capped at this node's log: a follower that is being sent a
    # snapshot, or the entries after one, is behind it.
    leader_commit_index: int | None = None


MembershipCallback = Callable[[str | None], None]  # None, or a ProposeError


class _ApplyFailed:
    """Returned by the replicated method when the machine raised."""


_APPLY_FAILED: Final = _ApplyFailed()


# -- plugging our journal into pysyncobj ------------------------------------

_original_create_journal = _pysyncobj_syncobj.createJournal


class _JournalPath(str):
    """A journalFile value that carries the journal object to use."""

    journal: DurableJournal


def _create_journal(journal_file: object = None) -> object:
    # SyncObj.__init__ calls the module-level `createJournal(conf.journalFile)`
    # and offers no other hook. Our path type carries our journal; any other
    # value gets pysyncobj's own journal, so other users are unaffected.
    if isinstance(journal_file, _JournalPath):
        return journal_file.journal
    return _original_create_journal(journal_file)


_pysyncobj_syncobj.createJournal = _create_journal


# Guard rail 4: messages are AES-GCM tokens (`raft_cipher`), not Fernet ones.
# Every node of a cluster must run the same format. pysyncobj's zlib stays:
# without it, bulk submissions (1,000-job entries) went half as fast.
_pysyncobj_syncobj.getEncryptor = RaftCipher


class _SyncingTransport(TCPTransport):  # type: ignore[misc]  # pysyncobj is untyped
    """Syncs the journal before any Raft message leaves the node, except the
    leader's AppendEntries.

    A follower's ack and a vote must not leave before what they promise is on
    disk. The leader's own copy of an entry only has to be durable before the
    leader counts itself towards the entry's commit, and it counts only at
    the start of a tick, from acks received in the previous tick's poll;
    `RaftNode._on_tick` syncs after the sends and before that poll. So the
    leader's fsync runs while the entry travels to the followers instead of
    before it leaves.
    """

    def __init__(
        self,
        syncObj: Any,  # noqa: N803 - pysyncobj's names
        selfNode: Any,  # noqa: N803
        otherNodes: Any,  # noqa: N803
        *,
        journal: DurableJournal,
        gate: MessageGate | None = None,
    ) -> None:
        self._raftsched_journal = journal
        self._raftsched_parts = _TransmissionLabels(syncObj)
        self._raftsched_gate = gate
        # node -> monotonic time until which nothing is sent to it (refused).
        self._raftsched_refused: dict[Any, float] = {}
        # node -> monotonic time of the last keep-alive sent while receiving
        # a snapshot from it.
        self._raftsched_keepalive_at: dict[Any, float] = {}
        super().__init__(syncObj, selfNode, otherNodes)

    def send(self, node: Any, message: Any) -> bool:
        gate = self._raftsched_gate
        if gate is not None and isinstance(message, dict):
            if self._raftsched_refused and self._raftsched_holds(node):
                return False
            message[IDENTITY_KEY] = gate.stamp()
        if isinstance(message, dict) and message.get("type") == "append_entries":
            if "transmission" in message:
                message = self._raftsched_parts.label(node, message)
        else:
            try:
                self._raftsched_journal.sync()
            except DiskFull as full:
                # What this message promises is not on disk: it is not sent.
                self._syncObj._raftsched_adapter._on_disk_full(full)
                return False
        return bool(super().send(node, message))

    def _onNodeDisconnected(self, node: Any) -> None:  # noqa: N802 - pysyncobj's name
        # A snapshot being sent to this node lost whatever was still in the
        # connection's buffer. pysyncobj would carry on from its place in
        # the file on the next connection, and the follower would append the
        # rest to what it has: a torn file, refused by its CRC, sent again
        # and torn again for as long as the transfer outlasts a connection.
        # It starts again from the beginning instead.
        serializer = getattr(self._syncObj, "_SyncObj__serializer", None)
        if serializer is not None:
            serializer.cancelTransmisstion(node)
        super()._onNodeDisconnected(node)

    def _keep_alive_while_receiving(self, node: Any, message: dict[str, Any]) -> None:
        """A follower receiving a snapshot answers nothing until the last
        chunk, and the leader closes a connection it has read nothing from
        for connectionTimeout (3.5 s): any transfer longer than that (a
        10M-job snapshot is 1-3 GB) was cut, and started again, forever.
        A chunk is answered with pysyncobj's own "not yet" (next_node_idx,
        neither success nor reset: the leader only notes that the follower
        is alive), at most every `SNAPSHOT_KEEPALIVE_S`."""
        serialized = message.get("serialized")
        if not isinstance(serialized, tuple) or len(serialized) != 3 or serialized[2]:
            return
        now = time.monotonic()
        if now - self._raftsched_keepalive_at.get(node, 0.0) < SNAPSHOT_KEEPALIVE_S:
            return
        self._raftsched_keepalive_at[node] = now
        last_index = int(self._syncObj._SyncObj__getCurrentLogIndex())
        self.send(
            node,
            {
                "type": "next_node_idx",
                "next_node_idx": last_index + 1,
                "reset": False,
                "success": False,
            },
        )

    def _raftsched_holds(self, node: Any) -> bool:
        until = self._raftsched_refused.get(node)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._raftsched_refused[node]
        return False

    def _onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
        gate = self._raftsched_gate
        if gate is not None and isinstance(message, dict):
            stamp = message.get(IDENTITY_KEY)
            if stamp is not None:
                if not gate.admits(stamp):
                    self._raftsched_refused[node] = time.monotonic() + REFUSED_HOLD_S
                    return
                if self._raftsched_refused:
                    self._raftsched_refused.pop(node, None)
        # pysyncobj sets nextIndex from every successful ack that raises
        # matchIndex, even a late one for an entry sent before the latest:
        # nextIndex moves back and the follower is sent entries it already
        # has (and truncates and re-appends them, or after a compaction
        # gets a snapshot it does not need). A success never proves that
        # the follower lacks later entries (a failure resets nextIndex), so
        # nextIndex is kept from moving back.
        next_index = getattr(self._syncObj, "_SyncObj__raftNextIndex", None)
        before = None
        if (
            isinstance(message, dict)
            and message.get("type") == "next_node_idx"
            and message.get("success")
            and not message.get("reset")
            and isinstance(next_index, dict)
        ):
            before = next_index.get(node)
        if isinstance(message, dict) and message.get("type") == "append_entries":
            self._syncObj._raftsched_adapter._heard_commit(message)
            if "prevLogIdx" not in message:
                message = _without_commit_claim(self._syncObj, message)
            elif "transmission" not in message:
                message = _past_committed(self._syncObj, self._raftsched_journal, message)
        adapter = self._syncObj._raftsched_adapter
        if (
            isinstance(message, dict)
            and message.get("type") == "request_vote"
            and getattr(node, "address", None) in adapter._refused_voters
        ):
            # A removed node (guard rail 10): its term must not reach us.
            return
        if adapter.disk_full is not None and isinstance(message, dict) and "serialized" in message:
            # A snapshot sent by the leader (pysyncobj writes it to a file of
            # its own) cannot fit either; it is sent again later.
            return
        try:
            super()._onMessageReceived(node, message)
            if isinstance(message, dict) and "serialized" in message:
                self._keep_alive_while_receiving(node, message)
        except DiskFull as full:
            # A follower could not append an entry: the entries before it in
            # the message are in the log, this one and the rest are not, and
            # no acknowledgement is sent. The leader sends them again.
            adapter._on_disk_full(full)
            return
        except OSError as error:
            if error.errno not in _NO_ROOM:
                raise
            # pysyncobj's own write of a received snapshot found no room.
            path = self._raftsched_journal.directory / raft_journal.SNAPSHOT_NAME
            adapter._on_disk_full(DiskFull(path, error))
            return
        if before is not None and isinstance(next_index, dict):
            after = next_index.get(node)
            if after is not None and after < before:
                next_index[node] = before


def _without_commit_claim(sync_obj: Any, message: dict[str, Any]) -> dict[str, Any]:
    """A snapshot chunk, with the leader's commit index lowered to ours.

    pysyncobj raises a follower's commit index from every AppendEntries, to
    min(leader's commit index, the follower's last index). For entries that
    is right: it has just checked that the follower's log matches the
    leader's up to there. A snapshot chunk checks nothing, so a deposed
    leader that came back with entries no one else has (proposed while it
    was cut off, never committed) would commit and apply them before the
    snapshot replaced its state. Until the last chunk is loaded the commit
    index stays where it was; once it is, the snapshot's own index is
    committed, and the next AppendEntries raises the commit index again.
    """
    own = getattr(sync_obj, "_SyncObj__raftCommitIndex", None)
    claimed = message.get("commit_index")
    if isinstance(own, int) and isinstance(claimed, int) and claimed > own:
        return {**message, "commit_index": own}
    return message


def _past_committed(sync_obj: Any, log: DurableJournal, message: dict[str, Any]) -> dict[str, Any]:
    """An AppendEntries that starts inside this follower's committed prefix,
    made to start at its commit index instead.

    pysyncobj truncates everything after `prevLogIdx` before it appends, even
    entries that match, and logs "truncating already-applied log entries" at
    critical level when that reaches applied ones. A leader sends from that
    far back when its nextIndex moved back: after a failed append (a reset
    answer that arrived late, from an earlier term of the same leader, say).
    Entries up to the commit index are committed, so the leader of this
    term holds them too, identical: those in the message are dropped, and
    the check moves to the commit index, whose term this follower knows.
    The follower then truncates only what it has not committed, and never
    an applied entry. (The journal keeps identical records either way.)
    """
    commit = getattr(sync_obj, "_SyncObj__raftCommitIndex", None)
    prev = message.get("prevLogIdx")
    entries = message.get("entries")
    if not isinstance(commit, int) or not isinstance(prev, int) or prev >= commit:
        return message
    if not isinstance(entries, list) or len(log) == 0:
        return message
    first = log[0][1]
    if not first <= commit < first + len(log):
        return message
    later = [entry for entry in entries if entry[1] > commit]
    return {
        **message,
        "prevLogIdx": commit,
        "prevLogTerm": log[commit - first][2],
        "entries": later,
    }


class _TransmissionLabels:
    """Labels the parts of pysyncobj's multi-part AppendEntries correctly.

    pysyncobj sends an entry of `appendEntriesBatchSizeBytes` (64 KiB) or
    more to a follower as a transmission: it pickles the entry and sends the
    pickle in slices of that size labelled `start`, `process` ... `finish`;
    the follower concatenates them and unpickles at `finish`. pysyncobj
    0.3.17 labels a slice `finish` when `pos + batchSizeBytes >=
    len(entry[0])`: it compares with the length of the entry's command, not
    of the pickle it slices. The pickle is longer: pysyncobj pickles with
    protocol 2, which stores bytes as latin-1 text in UTF-8, so every byte of
    0x80 or more takes two (msgpack commands are full of them, and the
    command is itself such a pickle of our bytes). Each slice ending between
    the two lengths is labelled `finish` too early: the follower unpickles a
    prefix and `pickle data was truncated`, `EOFError` or
    `UnicodeDecodeError` escapes `_onTick` (pysyncobj logs `failed _onTick`,
    sleeps a tick, and the messages already read wait for the next bytes to
    arrive). Followers recovered only because a failed unpickle leaves the
    buffer in place, so the next slice, labelled `finish` again, completed it.

    The slices of one transmission are sent back to back from one loop on
    the tick thread (nothing else goes to that follower in between; a broken
    connection ends the transmission, and the next one starts with `start`).
    So `send` relabels them: at `start` it pickles the same log entry the
    same way to learn the length, then counts the bytes sent; only the slice
    that reaches the length is `finish`. The receiving side is pysyncobj's,
    unchanged.
    """

    def __init__(self, sync_obj: Any) -> None:
        self._sync_obj = sync_obj
        self._progress: dict[Any, tuple[int, int]] = {}  # node -> (pickle bytes, bytes sent)
        # (index, term) names one entry (Raft's log matching), so the
        # followers that are sent the same entry share one measurement.
        self._measured: tuple[int, int, int] | None = None  # index, term, pickle bytes

    def label(self, node: Any, message: dict[str, Any]) -> dict[str, Any]:
        data = message["data"]
        if message["transmission"] == "start":
            total_bytes = self._pickle_bytes(message["prevLogIdx"] + 1)
            if total_bytes is None:
                self._progress.pop(node, None)
                return message  # not in the log; nothing to measure
            sent_bytes = 0
        elif node in self._progress:
            total_bytes, sent_bytes = self._progress[node]
        else:
            return message  # a part of nothing we saw start; pysyncobj's own label
        first = sent_bytes == 0
        sent_bytes += len(data)
        if first:
            label = "start"
        elif sent_bytes >= total_bytes:
            label = "finish"
        else:
            label = "process"
        if label == "finish":
            self._progress.pop(node, None)
        else:
            self._progress[node] = (total_bytes, sent_bytes)
        if label == message["transmission"]:
            return message
        return {**message, "transmission": label}

    def _pickle_bytes(self, index: int) -> int | None:
        entries = self._sync_obj._SyncObj__getEntries(index, 1)
        if not entries:
            return None
        entry = entries[0]
        measured = self._measured
        if measured is not None and measured[:2] == (index, entry[2]):
            return measured[2]
        # The same object through the same pickler as pysyncobj's slicing.
        total_bytes = len(_pysyncobj_pickle.dumps(entry))
        self._measured = (index, entry[2], total_bytes)
        return total_bytes


def _limit_snapshot_sending(sync_obj: Any) -> None:
    """Send a snapshot no faster than the follower takes it.

    pysyncobj's leader sends a snapshot from its tick thread, a 64 KiB
    chunk at a time, for up to appendEntriesPeriod (0.1 s) per round, and
    each send appends to the connection's buffer in user space whatever the
    socket could not take (`writeBuffer += data`, a copy of the whole
    buffer each time). Where the follower or the network is slower than the
    leader's pickling and compressing, that buffer grows every round: a
    10M-job snapshot is 1-3 GB, all of which could end up in the leader's
    memory, copied again with every chunk. While a follower's connection
    has `SNAPSHOT_SEND_BUFFERED_MAX` bytes waiting, it is sent no chunk:
    pysyncobj's serializer answers None, which sends an empty message (a
    heartbeat) and resumes the transmission where it stopped next round.
    """
    serializer = sync_obj._SyncObj__serializer
    transport = sync_obj._SyncObj__transport
    original = serializer.getTransmissionData

    def get_transmission_data(node: Any) -> Any:
        connection = getattr(transport, "_connections", {}).get(node)
        waiting = getattr(connection, "_TcpConnection__writeBuffer", b"")
        if waiting is not None and len(waiting) >= SNAPSHOT_SEND_BUFFERED_MAX:
            return None
        return original(node)

    serializer.getTransmissionData = get_transmission_data


class _ReplicatedLog(SyncObj):  # type: ignore[misc]  # pysyncobj is untyped
    def __init__(
        self,
        adapter: RaftNode,
        self_address: str,
        partner_addresses: list[str],
        conf: Any,
        journal: DurableJournal,
        gate: MessageGate | None = None,
    ) -> None:
        # Set before SyncObj.__init__, which may start applying on its thread.
        self._raftsched_adapter = adapter
        self._raftsched_commit_announced = 0
        super().__init__(
            self_address,
            partner_addresses,
            conf=conf,
            transportClass=functools.partial(_SyncingTransport, journal=journal, gate=gate),
        )
        _limit_snapshot_sending(self)

    def _SyncObj__applyLogEntries(self) -> bool:  # noqa: N802 - pysyncobj's private name
        # pysyncobj tells the followers a new commit index only after the
        # leader has applied the entries. A follower then applies them while
        # the next entry waits for its ack, so each entry's commit waited for
        # two applies of the one before it, one after the other. Announcing
        # the commit index first lets the followers apply while the leader
        # does. (This overrides a name-mangled method: SyncObj's own calls to
        # `self.__applyLogEntries` look up this name.)
        # pysyncobj then sends the same commit index again after applying;
        # with it already announced that message is redundant (heartbeats
        # still go out on their period, new entries as they are appended).
        commit_index = int(self.raftCommitIndex)
        announced = False
        if (
            commit_index > self._raftsched_commit_announced
            and commit_index > int(self.raftLastApplied)
            and self._isLeader()
        ):
            self._raftsched_commit_announced = commit_index
            self._SyncObj__sendAppendEntries()
            announced = True
        need_send = bool(super()._SyncObj__applyLogEntries())
        return need_send and not announced

    def _checkCommandsToApply(self) -> None:  # noqa: N802 - pysyncobj's name
        # The leader appends proposals here. The journal raises DiskFull
        # before the entry is in the log; pysyncobj has already taken the
        # command off its queue, so the proposal is answered here.
        try:
            super()._checkCommandsToApply()
        except DiskFull as full:
            self._raftsched_adapter._on_disk_full(full, proposal_failed=True)

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802, N803 - pysyncobj's names
        # Any other append that found the disk full (a new leader's no-op).
        try:
            super()._onTick(timeToWait)
        except DiskFull as full:
            self._raftsched_adapter._on_disk_full(full)
            time.sleep(timeToWait)

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:  # noqa: N802, N803
        # A load (at start, or of a snapshot the leader sent) takes as long
        # as decoding the state: about a second at 1M jobs, ~10 s at 10M.
        # pysyncobj set this follower's election deadline before it (when it
        # started, or when the message with the last chunk arrived), so after
        # a load longer than the election timeout it would stand for
        # election on its next tick, with a higher term that deposes a
        # healthy leader (pysyncobj has no pre-vote). The leader has been
        # sending all along: the timeout counts from the end of the load.
        super()._SyncObj__loadDumpFile(clearJournal)
        if self._SyncObj__otherNodes:
            self._raftsched_postpone_election(self._raftsched_adapter._timing["raftMaxTimeout"])

    def _raftsched_step_down(self) -> None:
        """Become a follower, as pysyncobj does when a leader loses its majority."""
        self._SyncObj__setState(_RAFT_STATE_FOLLOWER)
        self._SyncObj__raftLeader = None

    def _raftsched_hand_over(self) -> None:
        """As leader: ask the most caught-up connected follower to stand now
        (pysyncobj's TimeoutNow); denied while none has the whole log."""
        self.transferLeadership(None, None)

    def _raftsched_postpone_election(self, seconds: float) -> None:
        deadline = float(getattr(self, "_SyncObj__raftElectionDeadline", 0.0))
        self._SyncObj__raftElectionDeadline = max(deadline, time.monotonic() + seconds)

    @replicated  # type: ignore[untyped-decorator]  # pysyncobj is untyped
    def apply_command(self, data: bytes) -> object:
        # The only replicated method. It must never raise (see module doc).
        return self._raftsched_adapter._apply_committed(data)


@dataclass(slots=True)
class _Proposal:
    callback: ProposeCallback
    term: int
    done: bool = False


class RaftNode:
    """One Raft member; see the module docstring for threads and guarantees."""

    def __init__(
        self,
        *,
        node_id: str,
        raft_address: str,
        peers: Mapping[str, str],
        data_dir: Path,
        secret: str,
        machine: StateMachine,
        accepted_secrets: Iterable[str] = (),
        bind_address: str | None = None,
        durability: str = "fsync",
        on_leadership: Callable[[bool, int], None] | None = None,
        leader_fallback_timeout_s: float = 5.0,
        election_timeout_min_s: float = 0.5,
        election_timeout_max_s: float = 1.2,
        append_entries_period_s: float = 0.1,
        connection_timeout_s: float = 3.5,
        connection_retry_s: float = 1.0,
        log_compaction_entries: int = 5000,
        log_compaction_interval_s: float = 300.0,
        log_compaction_bytes: int = LOG_COMPACTION_BYTES,
        snapshot_in_child: bool = True,
        gate: MessageGate | None = None,
        on_fork_pause: Callable[[float], None] | None = None,
    ) -> None:
        accepted = tuple(accepted_secrets)
        if any(not item or len(item) < SECRET_CHARS_MIN for item in (secret, *accepted)):
            raise ValueError(
                f"a cluster secret of at least {SECRET_CHARS_MIN} characters is required: "
                "pysyncobj speaks pickle on its Raft port"
            )
        if durability not in ("fsync", "none"):
            raise ValueError(f"durability must be 'fsync' or 'none', got {durability!r}")
        if node_id in peers:
            raise ValueError(f"peers must not include this node ({node_id})")
        addresses = [raft_address, *peers.values()]
        if len(set(addresses)) != len(addresses):
            raise ValueError(f"raft addresses must be unique, got {addresses}")
        if not leader_fallback_timeout_s > append_entries_period_s:
            raise ValueError("leader_fallback_timeout_s must exceed append_entries_period_s")
        self.node_id = node_id
        self.raft_address = raft_address
        self._peers = dict(peers)
        self._ids_by_address = {address: peer for peer, address in peers.items()}
        self._ids_by_address[raft_address] = node_id
        self._data_dir = Path(data_dir)
        self._secrets = RaftSecrets(secret, accepted)
        self._machine = machine
        self._bind_address = bind_address
        self.durability = durability
        self._on_leadership = on_leadership
        self._timing = {
            "leaderFallbackTimeout": leader_fallback_timeout_s,
            "raftMinTimeout": election_timeout_min_s,
            "raftMaxTimeout": election_timeout_max_s,
            "appendEntriesPeriod": append_entries_period_s,
            "connectionTimeout": max(connection_timeout_s, election_timeout_max_s),
            "connectionRetryTime": connection_retry_s,
            "logCompactionMinTime": staggered_compaction_interval(
                node_id, peers, log_compaction_interval_s
            ),
        }
        self._log_compaction_entries = log_compaction_entries
        self._log_compaction_bytes = int(
            staggered_compaction_entries(node_id, peers, log_compaction_bytes)
        )
        self._on_fork_pause = on_fork_pause
        self.snapshot_stats = SnapshotStats()
        self._snapshot_pipe: int | None = None  # read end: the child's report
        self._gate = gate
        self._snapshot_in_child = snapshot_in_child and hasattr(os, "fork")
        self._snapshot_child: int | None = None
        self._snapshot_started = 0.0
        self._snapshot_not_before = 0.0  # monotonic time; after a disk without room
        self._snapshot_declined = False  # one was asked for before that time
        # Since when compaction waits for a snapshot being sent to a follower.
        self._held_since: float | None = None
        self._sync_obj: _ReplicatedLog | None = None
        self._journal: DurableJournal | None = None
        self._lock = threading.Lock()
        self._in_flight: _Proposal | None = None
        self._deferred: deque[tuple[ProposeCallback, str]] = deque()
        self._tick_thread_id: int | None = None
        self._reported_leadership: tuple[bool, int] | None = None
        self._closed = False
        self._closing = threading.Event()
        self.applying_index: int | None = None
        # Set once, on the tick thread, when the machine raised StopApplying.
        self.halted: Halt | None = None
        # The file a write found full, while the disk has not got room again.
        self.disk_full: Path | None = None
        self._disk_full_logged_at = -DISK_FULL_LOG_EVERY_S
        self._disk_full_reported = False
        self._disk_room_checked_at = 0.0
        # Membership (guard rail 10), set from other threads, read on the tick thread.
        self._refused_voters: frozenset[str] = frozenset()
        self.retired = False
        self._handed_over_at = 0.0
        # (term, commit index) of the last AppendEntries heard, as the leader
        # sent it (tick thread; read by status()).
        self._leader_commit: tuple[int, int] | None = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Open the journal and start Raft. Must run on the main thread."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "RaftNode.start() must run on the main thread: pysyncobj's tick thread "
                "stops when the thread that created it exits"
            )
        if self._sync_obj is not None:
            raise RuntimeError("RaftNode already started")
        self._data_dir.mkdir(parents=True, exist_ok=True)
        disk = raft_journal.Disk.from_env(fsync=self.durability == "fsync")
        if disk.simulate_power_cut:
            logger.warning("power-cut simulation is on: a kill loses every unsynced write")
        journal = DurableJournal(self._data_dir, disk)
        journal_path = _JournalPath(str(self._data_dir / raft_journal.JOURNAL_NAME))
        journal_path.journal = journal
        conf = SyncObjConf(
            password=self._secrets,
            journalFile=journal_path,
            fullDumpFile=str(self._data_dir / raft_journal.SNAPSHOT_NAME),
            serializer=self._serialize_snapshot,
            deserializer=self._deserialize_snapshot,
            serializeChecker=self._check_snapshot if self._snapshot_in_child else None,
            bindAddress=self._bind_address,
            appendEntriesUseBatch=False,
            commandsWaitLeader=False,
            dynamicMembershipChange=True,
            logCompactionMinEntries=staggered_compaction_entries(
                self.node_id, self._peers, self._log_compaction_entries
            ),
            onStateChanged=self._on_state_changed,
            **self._timing,
        )
        self._journal = journal
        sync_obj = _ReplicatedLog(
            self, self.raft_address, list(self._peers.values()), conf, journal, self._gate
        )
        self._sync_obj = sync_obj
        sync_obj.addOnTickCallback(self._on_tick)

    def close(self) -> None:
        """Stop Raft and close the files. Call from any thread but the tick thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            proposal, self._in_flight = self._in_flight, None
        sync_obj = self._sync_obj
        if sync_obj is not None:
            if threading.get_ident() == self._tick_thread_id:
                raise RuntimeError("RaftNode.close() cannot run on the tick thread")
            self._closing.set()  # a halted tick thread wakes and ends
            sync_obj.destroy_synchronous()
            if self.halted is not None:
                # Its loop ended inside the apply, before it could do this.
                sync_obj._doDestroy()
        # A snapshot child still running dies with the tick thread
        # (child_processes.die_with); its report is not wanted.
        self._close_snapshot_pipe()
        # The tick thread is gone, so what is left is answered here.
        if proposal is not None and not proposal.done:
            proposal.done = True
            self._call_safely(proposal.callback, None, ProposeError.CLOSED)
        while self._deferred:
            callback, error = self._deferred.popleft()
            self._call_safely(callback, None, error)

    # -- proposals ---------------------------------------------------------

    def propose(self, data: bytes, callback: ProposeCallback) -> None:
        """Append one entry (leader only); `callback` fires once, on the tick thread."""
        sync_obj = self._require_started()
        with self._lock:
            if self._closed:
                closed = True
            else:
                closed = False
                if self.halted is not None:
                    closed = True  # no tick thread will deliver a callback
                elif self._in_flight is not None:
                    self._deferred.append((callback, ProposeError.BUSY))
                    return
                # Only the leader appends: pysyncobj would forward a follower's
                # command to the leader, a path whose callbacks can be lost.
                elif not sync_obj._isLeader():
                    self._deferred.append((callback, ProposeError.NOT_LEADER))
                    return
                else:
                    proposal = _Proposal(callback, term=int(sync_obj.raftCurrentTerm))
                    self._in_flight = proposal
        if closed:
            # There is no tick thread (any more, or that runs) to deliver it.
            error = ProposeError.CLOSED if self.halted is None else ProposeError.NOT_LEADER
            self._call_safely(callback, None, error)
            return
        sync_obj.apply_command(
            bytes(data), callback=functools.partial(self._on_pysyncobj_result, proposal)
        )

    def _on_pysyncobj_result(self, proposal: _Proposal, result: object, reason: int) -> None:
        if reason == FAIL_REASON.SUCCESS:
            if isinstance(result, _ApplyFailed):
                self._finish(proposal, None, ProposeError.APPLY_FAILED)
            else:
                self._finish(proposal, result, None)
        else:
            self._finish(proposal, None, _FAIL_REASON_ERRORS.get(reason, ProposeError.FAILED))

    def _finish(self, proposal: _Proposal, result: object | None, error: str | None) -> None:
        with self._lock:
            if proposal.done:
                return
            proposal.done = True
            if self._in_flight is proposal:
                self._in_flight = None
        if threading.get_ident() != self._tick_thread_id:
            # Only QUEUE_FULL is reported on the caller's thread; move it.
            self._deferred.append((proposal.callback, error or ProposeError.FAILED))
            return
        self._call_safely(proposal.callback, result, error)

    # -- membership (guard rail 10) ------------------------------------------

    def change_membership(self, action: str, address: str, callback: MembershipCallback) -> None:
        """As leader, add (`action="add"`) or remove a voting member by Raft
        address. `callback` fires once, on the tick thread, with None once the
        change is committed, or a `ProposeError`: `failed` when pysyncobj
        refused it (another change uncommitted, this term's first entry not
        yet committed, the address already in or not in the configuration,
        or this node itself)."""
        if action not in ("add", "remove"):
            raise ValueError(f"action must be 'add' or 'remove', got {action!r}")
        sync_obj = self._require_started()
        if self._closed or self.halted is not None or not sync_obj._isLeader():
            self._deferred.append((_membership_callback(callback), ProposeError.NOT_LEADER))
            return
        if address == self.raft_address:
            self._deferred.append((_membership_callback(callback), ProposeError.FAILED))
            return

        def done(result: object, reason: int) -> None:
            error = None if reason == FAIL_REASON.SUCCESS else _FAIL_REASON_ERRORS.get(reason)
            try:
                callback(None if reason == FAIL_REASON.SUCCESS else (error or ProposeError.FAILED))
            except BaseException:
                logger.exception("membership callback raised")

        if action == "add":
            sync_obj.addNodeToCluster(address, callback=done)
        else:
            sync_obj.removeNodeFromCluster(address, callback=done)

    def refuse_votes_from(self, addresses: Iterable[str]) -> None:
        """Drop vote requests from these Raft addresses (removed members)."""
        self._refused_voters = frozenset(addresses) - {self.raft_address}

    def set_peer_ids(self, ids_by_address: Mapping[str, str]) -> None:
        """The node id of each Raft address, for status (the directory changes)."""
        ids = dict(ids_by_address)
        ids[self.raft_address] = self.node_id
        self._ids_by_address = ids

    def set_retired(self, retired: bool) -> None:
        """True: this node was removed; it never stands for election again,
        and as leader it hands leadership over (pysyncobj cannot remove its
        leader), so that the next leader removes it from the configuration.
        False again only if it is added back (a replica catching up from an
        old log meets its removal before its re-addition)."""
        self.retired = retired

    def _retired_tick(self, sync_obj: _ReplicatedLog) -> None:
        sync_obj._raftsched_postpone_election(3600.0)
        if sync_obj._isLeader():
            now = time.monotonic()
            if now - self._handed_over_at >= self._timing["raftMinTimeout"]:
                self._handed_over_at = now
                sync_obj._raftsched_hand_over()

    # -- tick thread -------------------------------------------------------

    def _apply_committed(self, data: object) -> object:
        sync_obj = self._sync_obj
        index = int(sync_obj.raftLastApplied) + 1 if sync_obj is not None else None
        self.applying_index = index
        try:
            if not isinstance(data, bytes):
                raise TypeError(f"replicated command is {type(data).__name__}, not bytes")
            return self._machine.apply(data)
        except StopApplying as stop:
            self._stop_applying(index, str(stop))
        except BaseException:
            # Raising here would wedge the node: pysyncobj re-applies the
            # entry forever. A bug becomes a logged, recorded failure.
            logger.exception("state machine raised applying entry %s; entry skipped", index)
            return _APPLY_FAILED
        finally:
            self.applying_index = None

    def _stop_applying(self, index: int | None, reason: str) -> NoReturn:
        """Apply nothing more, ever: park the tick thread inside the
        replicated method until the node closes.

        pysyncobj moves `raftLastApplied` on only when the method returns, so
        returning would count the entry as applied and apply the next ones.
        Raising is worse than it looks: `_autoTickThread` logs the exception
        and calls `_onTick` again 50 ms later (`autoTickPeriod`), which re-runs
        the same entry but, before it, the election timer, and never reaches
        the network poll at its end. A node that halts while connected, hearing
        nothing, becomes a candidate and sends the others higher terms, which
        depose their leader. Measured with three nodes on loopback and a
        follower halting mid-run: raising, the others' term went from 1 to 3
        within 15 s and the halted node logged a traceback every 50 ms;
        parked, the term stayed 1, it logged one line, and its whole process
        used 0.6 s of CPU in about 25 s of life. Parked, the tick thread does
        no Raft at all: the others see a node that is down (as after SIGSTOP)
        and carry on, and this replica's state stays exactly as after the
        entry before (`status().applied_index`). The wait is on an event, so
        it costs no CPU; it also ends when the main thread is gone, as
        pysyncobj's loop would (its thread is not a daemon).

        After the park the tick thread ends inside the method, by
        `SystemExit`: pysyncobj's tick loop catches only `Exception`, and
        `threading` ends a thread on exactly `SystemExit` without a word (a
        subclass would be printed). So nothing more is applied and no
        snapshot is taken; `close()` does the clean-up the loop would have.
        Reads and HTTP keep working on the other threads; a restart meets the
        same entry again, until the node runs code that can apply it.
        """
        self.halted = Halt(index, reason)
        logger.error(
            "stopped applying at entry %s: %s; this replica stays at the entry before "
            "until it runs a release that can apply it",
            index,
            reason,
        )
        main_thread = threading.main_thread()
        while not self._closing.wait(_HALT_POLL_S) and main_thread.is_alive():
            pass
        raise SystemExit()

    def _on_tick(self) -> None:
        # Anything appended this tick and not yet sent (a cluster of one, or
        # no follower connected) becomes durable before the next tick can
        # count it towards a commit.
        self._tick_thread_id = threading.get_ident()
        if self._journal is not None:
            if self.disk_full is not None:
                self._check_disk_room(self._journal)
            try:
                self._journal.sync()
            except DiskFull as full:
                self._on_disk_full(full)
        while self._deferred:
            callback, error = self._deferred.popleft()
            self._call_safely(callback, None, error)
        if self.retired and self._sync_obj is not None:
            self._retired_tick(self._sync_obj)
        self._check_leadership()
        self._compact_by_bytes()

    def _compact_by_bytes(self) -> None:
        """Ask pysyncobj for a snapshot once the journal holds
        `log_compaction_bytes` (staggered), whatever its entry count.

        pysyncobj compacts when the log has more than logCompactionMinEntries
        entries or when logCompactionMinTime has passed since the last
        snapshot (and an entry was applied since); it knows nothing of
        bytes. Its force flag starts one on its next tick. It is set only
        while no snapshot runs: a flag left set during one would start
        another as soon as it ended, whatever the journal then held."""
        journal, sync_obj = self._journal, self._sync_obj
        if journal is None or sync_obj is None or self._snapshot_child is not None:
            return
        if journal.size_bytes < self._log_compaction_bytes:
            return
        if time.monotonic() < self._snapshot_not_before or self.halted is not None:
            return
        sync_obj.forceLogCompaction()

    def _on_disk_full(self, full: DiskFull, *, proposal_failed: bool = False) -> None:
        """A write found no room (tick thread). Nothing unwritten is acknowledged:
        the journal raised before the entry was in the log, or the message that
        needed it was not sent."""
        now = time.monotonic()
        if self.disk_full is None and now - self._disk_full_logged_at >= DISK_FULL_LOG_EVERY_S:
            self._disk_full_logged_at = now
            self._disk_full_reported = True
            logger.warning(
                "disk full: %s; this node acknowledges nothing it cannot write and "
                "carries on by itself when there is room (docs/operations.md 'Disk full')",
                full,
            )
        self.disk_full = full.path
        if proposal_failed:
            with self._lock:
                proposal = self._in_flight
            if proposal is not None:
                self._finish(proposal, None, ProposeError.DISK_FULL)
        sync_obj = self._sync_obj
        if sync_obj is None:
            return
        has_peers = bool(sync_obj.otherNodes)
        if has_peers and sync_obj._isLeader():
            # A node with room can lead; this one could not append anything.
            logger.warning("disk full on the leader: stepping down")
            sync_obj._raftsched_step_down()
        if has_peers:
            sync_obj._raftsched_postpone_election(self._timing["raftMaxTimeout"])

    def _check_disk_room(self, journal: DurableJournal) -> None:
        now = time.monotonic()
        if now - self._disk_room_checked_at < DISK_ROOM_CHECK_S:
            return
        self._disk_room_checked_at = now
        sync_obj = self._sync_obj
        if journal.has_room():
            if self._disk_full_reported:
                self._disk_full_reported = False
                logger.warning(
                    "disk full: there is room again in %s; carrying on", journal.directory
                )
            self.disk_full = None
        elif sync_obj is not None and sync_obj.otherNodes:
            # It could not save a vote; it does not ask for one either.
            sync_obj._raftsched_postpone_election(self._timing["raftMaxTimeout"])

    def _heard_commit(self, message: Mapping[str, Any]) -> None:
        term, commit = message.get("term"), message.get("commit_index")
        if isinstance(term, int) and isinstance(commit, int):
            heard = self._leader_commit
            if heard is None or (term, commit) > heard:
                self._leader_commit = (term, commit)

    def _on_state_changed(self, old_state: int, new_state: int) -> None:
        self._tick_thread_id = threading.get_ident()
        self._check_leadership()

    def _check_leadership(self) -> None:
        sync_obj = self._sync_obj
        if sync_obj is None:
            return
        current = (bool(sync_obj._isLeader()), int(sync_obj.raftCurrentTerm))
        if current == self._reported_leadership:
            return
        self._reported_leadership = current
        with self._lock:
            proposal = self._in_flight
        if proposal is not None and (not current[0] or current[1] != proposal.term):
            self._finish(proposal, None, ProposeError.LEADER_CHANGED)
        if self._on_leadership is not None:
            try:
                self._on_leadership(*current)
            except BaseException:
                logger.exception("on_leadership callback raised")

    @staticmethod
    def _call_safely(callback: ProposeCallback, result: object | None, error: str | None) -> None:
        # A callback that raised inside pysyncobj's apply loop would make it
        # apply the same entry again.
        try:
            callback(result, error)
        except BaseException:
            logger.exception("proposal callback raised")

    # -- snapshots (tick thread) ---------------------------------------------

    def _serialize_snapshot(self, file_name: str, raft_data: Any) -> None:
        # raft_data is (last applied entry, the entry before it, cluster
        # nodes): pysyncobj needs the two entries to resume the log after
        # the snapshot. The machine's state is its own encoding.
        last_entry, previous_entry, cluster = raft_data
        header = SnapshotHeader(
            last_entry=_as_entry(last_entry),
            previous_entry=_as_entry(previous_entry),
            cluster=tuple(sorted(str(getattr(node, "address", node)) for node in cluster)),
        )
        if time.monotonic() < self._snapshot_not_before:
            # The last one found no room. pysyncobj now tries to rename a
            # file that does not exist, marks its serializer failed and
            # would never call this again, unless the checker reports an
            # outcome: "serializing" until the wait is over, then "failed"
            # once, which resets it (see _check_snapshot).
            self._snapshot_declined = True
            return
        if not self._snapshot_in_child:
            started = time.monotonic()
            self._write_snapshot(Path(file_name), header)
            stats = self.snapshot_stats
            stats.encode_s = time.monotonic() - started
            stats.taken += 1
            with contextlib.suppress(OSError):
                stats.size_bytes = os.stat(file_name).st_size
            return
        if self._snapshot_child is not None:
            return  # one at a time; pysyncobj asks again later
        # The child reports what it cost through this pipe as it exits.
        report_read, report_write = os.pipe()
        # The machine's lock is taken if it is free, never waited for: a
        # reader may hold it for a second or more (a digest of a million
        # jobs), and the tick thread waiting on it stopped heartbeats long
        # enough for an election (seen at 300,000 jobs). Readers do not
        # change the state; only this thread does, by applying, so the
        # child's image is the state as of the last applied entry either
        # way. The child never uses the lock it inherits (a reader's thread
        # does not exist there to release it): it gets a new one.
        lock = getattr(self._machine, "lock", None)
        stopped = time.perf_counter()
        held = lock is not None and lock.acquire(blocking=False)
        try:
            parent_pid = os.getpid()
            pid = os.fork()
            if pid == 0:
                os.close(report_read)
                if lock is not None:
                    self._machine.lock = type(lock)()  # type: ignore[attr-defined]
                self._snapshot_child_main(Path(file_name), header, parent_pid, report_write)
        finally:
            if held and lock is not None:
                lock.release()
        resumed = time.perf_counter()
        os.close(report_write)
        self._snapshot_child = pid
        self._snapshot_pipe = report_read
        self._snapshot_started = time.monotonic()
        self._record_fork_pause(resumed - stopped, held)
        # pysyncobj now renames `file_name` into place; it does not exist (the
        # child writes elsewhere and renames its own file), so that rename
        # fails harmlessly and `_check_snapshot` reports the real outcome.

    def _record_fork_pause(self, pause_s: float, lock_held: bool) -> None:
        stats = self.snapshot_stats
        stats.fork_pause_s = pause_s
        if pause_s >= FORK_PAUSE_LOG_S:
            logger.info(
                "snapshot fork stopped the tick thread for %.0f ms (%s)",
                pause_s * 1000,
                "the state's lock was free" if lock_held else "a reader held the state's lock",
            )
        if self._on_fork_pause is not None:
            try:
                self._on_fork_pause(pause_s)
            except Exception:
                logger.exception("on_fork_pause callback raised")

    def _snapshot_child_main(
        self, tmp_path: Path, header: SnapshotHeader, parent_pid: int, report: int
    ) -> None:
        """In the forked child: write the snapshot and exit. Never returns."""
        # No collection in the child: one walks every object it tracks and
        # writes to each header, which would copy the parent's whole heap,
        # page by page. The child lives for one encoding and exits.
        gc.disable()
        status = 1
        try:
            # Killed with the tick thread that forked us: never a writer left
            # behind by a dead node (holding its ports, renaming a snapshot
            # into the data directory of the node restarted there).
            child_processes.die_with(parent_pid)
            with contextlib.suppress(OSError):
                os.nice(SNAPSHOT_CHILD_NICE)
            final = tmp_path.with_name(tmp_path.name.removesuffix(".tmp"))
            part = final.with_name(final.name + ".child")
            try:
                self._write_snapshot(part, header)
                os.replace(part, final)
            except OSError as error:
                # Abandoned, not fatal: the journal still holds every entry
                # the snapshot would cover, and pysyncobj tries again later.
                # The part file goes, or a full disk would stay full.
                with contextlib.suppress(OSError):
                    part.unlink()
                status = SNAPSHOT_CHILD_NO_ROOM if error.errno in _NO_ROOM else 1
                raise
            if self.durability == "fsync":
                # A failed directory sync is fatal (fail_stop, in this child;
                # the parent then stops too, see _check_snapshot).
                raft_journal.fsync_directory(final.parent)
            with contextlib.suppress(OSError):
                os.write(report, _CHILD_REPORT.pack(_private_dirty_bytes()))
            status = 0
        finally:
            os._exit(status)

    def _write_snapshot(self, path: Path, header: SnapshotHeader) -> None:
        raft_journal.write_snapshot_file(
            path, header, self._machine.snapshot(), durable=self.durability == "fsync"
        )

    def _check_snapshot(self) -> int:
        """pysyncobj's serializeChecker: the state of the snapshot child."""
        pid = self._snapshot_child
        if pid is None:
            if self._holding_for_transfer():
                return int(SERIALIZER_STATE.SERIALIZING)
            if not self._snapshot_declined:
                return int(SERIALIZER_STATE.NOT_SERIALIZING)
            if time.monotonic() < self._snapshot_not_before:
                return int(SERIALIZER_STATE.SERIALIZING)
            self._snapshot_declined = False
            return int(SERIALIZER_STATE.FAILED)
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            self._snapshot_child = None
            self._close_snapshot_pipe()
            return int(SERIALIZER_STATE.FAILED)
        if done == 0:
            if time.monotonic() - self._snapshot_started < SNAPSHOT_CHILD_TIMEOUT_S:
                return int(SERIALIZER_STATE.SERIALIZING)
            logger.error("snapshot child %d timed out; killing it", pid)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            self._snapshot_child = None
            self._close_snapshot_pipe()
            return int(SERIALIZER_STATE.FAILED)
        self._snapshot_child = None
        report = self._close_snapshot_pipe()
        if status != 0:
            code = os.waitstatus_to_exitcode(status)
            if code == raft_journal.EXIT_STORAGE_FAILED:
                # It synced the data directory and that failed (it logged
                # why): this process must not carry on either.
                raft_journal.fail_stop(
                    self._data_dir, "fsync (snapshot child)", OSError(errno.EIO, "see above")
                )
            if code == SNAPSHOT_CHILD_NO_ROOM:
                self._snapshot_not_before = time.monotonic() + SNAPSHOT_NO_ROOM_RETRY_S
                logger.warning(
                    "snapshot abandoned: disk full; the journal keeps every entry; "
                    "trying again in %.0f s",
                    SNAPSHOT_NO_ROOM_RETRY_S,
                )
            else:
                logger.error("snapshot child failed with exit status %d", code)
            return int(SERIALIZER_STATE.FAILED)
        stats = self.snapshot_stats
        stats.encode_s = time.monotonic() - self._snapshot_started
        stats.taken += 1
        if len(report) == _CHILD_REPORT.size:
            stats.cow_bytes = _CHILD_REPORT.unpack(report)[0]
        with contextlib.suppress(OSError):
            stats.size_bytes = (self._data_dir / raft_journal.SNAPSHOT_NAME).stat().st_size
        return int(SERIALIZER_STATE.SUCCESS)

    def _holding_for_transfer(self) -> bool:
        """Whether compaction waits because a snapshot is being sent.

        A follower sent snapshot S goes on from the entries after S, so
        they must still be in the leader's log when it has loaded S. A
        compaction during the transfer cut them, and the follower needed
        the next snapshot, which took as long again: under a steady write
        load, with a transfer longer than the time between compactions (a
        10M-job snapshot takes minutes to send), a follower could chase
        snapshots for ever (seen on three toy nodes compacting every 50
        entries). So no snapshot starts while one is being sent, for up to
        `COMPACTION_HOLD_MAX_S` (the journal grows meanwhile; the bound is
        for a transfer that keeps starting over)."""
        sync_obj = self._sync_obj
        serializer = getattr(sync_obj, "_SyncObj__serializer", None)
        transmissions = getattr(serializer, "_Serializer__transmissions", None)
        if not transmissions:
            self._held_since = None
            return False
        now = time.monotonic()
        if self._held_since is None:
            self._held_since = now
        return now - self._held_since < COMPACTION_HOLD_MAX_S

    def _close_snapshot_pipe(self) -> bytes:
        """Close the report pipe of the child that has exited; what it wrote."""
        fd, self._snapshot_pipe = self._snapshot_pipe, None
        if fd is None:
            return b""
        try:
            # The child has exited: its end is closed, so this cannot block.
            return os.read(fd, _CHILD_REPORT.size)
        except OSError:
            return b""
        finally:
            os.close(fd)

    def _deserialize_snapshot(self, file_name: str) -> tuple[Any, Any, Any]:
        # At start (the node's own snapshot) or once the last chunk of one
        # sent by the leader is in (`__loadDumpFile`), on the tick thread.
        started = time.perf_counter()
        path = Path(file_name)
        if self.durability == "fsync":
            # A snapshot received from the leader was written by pysyncobj
            # without fsync; it must be durable before it is acknowledged
            # and before the journal is cleared for it.
            with open(path, "rb") as handle:
                raft_journal.sync_fd(handle.fileno(), path)
            raft_journal.fsync_directory(path.parent)
        header, body = raft_journal.decode_snapshot(path.read_bytes())
        restore_started = time.perf_counter()
        self.applying_index = header.last_entry[1]
        try:
            self._machine.restore(body)
        finally:
            self.applying_index = None
        finished = time.perf_counter()
        stats = self.snapshot_stats
        stats.loads += 1
        stats.load_s = finished - started
        stats.load_restore_s = finished - restore_started
        stats.size_bytes = len(body)
        logger.info(
            "loaded a snapshot at index %d: %d bytes in %.2f s (restore %.2f s)",
            header.last_entry[1],
            len(body),
            stats.load_s,
            stats.load_restore_s,
            extra={"snapshot_load_s": round(stats.load_s, 3)},
        )
        # pysyncobj takes the members from here (dynamic membership) and
        # compares them with its own node, not its address: this node must
        # not be among them, or it would become its own peer.
        members = {address for address in header.cluster if address != self.raft_address}
        if isinstance(self._machine, MemberRecord) and not self._machine.membership_recorded():
            # No change ever: the flags are the membership, as they were
            # before dynamic membership. The header names the addresses of
            # its time, which a restart with new flags (new addresses) left.
            members = set(self._peers.values())
        return header.last_entry, header.previous_entry, members

    # -- status (any thread) -------------------------------------------------

    @property
    def last_snapshot_duration_s(self) -> float | None:
        """How long the last successful snapshot took to encode and write."""
        return self.snapshot_stats.encode_s

    def is_leader(self) -> bool:
        # A halted leader's pysyncobj still says so: its tick thread no longer
        # runs to notice that the others have moved on.
        return (
            self.halted is None and self._sync_obj is not None and bool(self._sync_obj._isLeader())
        )

    def term(self) -> int:
        return int(self._require_started().raftCurrentTerm)

    def leader_address(self) -> str | None:
        leader = self._require_started()._getLeader()
        return None if leader is None else str(leader.address)

    def leader_id(self) -> str | None:
        address = self.leader_address()
        return None if address is None else self._ids_by_address.get(address)

    def status(self) -> RaftStatus:
        raw = self._raw_status()
        role = _ROLES.get(int(raw["state"]), "follower")
        leader = raw.get("leader")
        leader_address = None if leader is None else str(leader.address)
        ids = self._ids_by_address
        prefix = "partner_node_status_server_"
        addresses = [key[len(prefix) :] for key in raw if key.startswith(prefix)]
        peers = tuple(
            sorted(
                (
                    PeerStatus(
                        id=ids.get(address, address),
                        raft_address=address,
                        reachable=raw.get(prefix + address) == 2,
                        match_index=(
                            raw.get(f"match_idx_server_{address}") if role == "leader" else None
                        ),
                    )
                    for address in addresses
                ),
                key=lambda peer: peer.id,
            )
        )
        term = int(raw["raft_term"])
        commit_index = int(raw["commit_idx"])
        heard = self._leader_commit
        if role == "leader":
            leader_commit: int | None = commit_index
        elif heard is not None and heard[0] == term and leader_address is not None:
            leader_commit = heard[1]
        else:
            leader_commit = None
        return RaftStatus(
            node_id=self.node_id,
            role=role,
            term=term,
            leader_id=None if leader_address is None else ids.get(leader_address),
            commit_index=commit_index,
            applied_index=int(raw["last_applied"]),
            peers=peers,
            retired=self.retired,
            leader_commit_index=leader_commit,
        )

    def _raw_status(self) -> dict[str, Any]:
        sync_obj = self._require_started()
        # getStatus() iterates dicts that the tick thread may resize (a
        # read-only node connecting); a retry is enough.
        for _ in range(5):
            try:
                return dict(sync_obj.getStatus())
            except RuntimeError:
                continue
        return dict(sync_obj.getStatus())

    def journal_fsync_count(self) -> int:
        """How many fsyncs the journal has made (for benchmarks)."""
        return 0 if self._journal is None else self._journal.fsync_count

    def _require_started(self) -> _ReplicatedLog:
        if self._sync_obj is None:
            raise RuntimeError("RaftNode.start() has not been called")
        return self._sync_obj


def _membership_callback(callback: MembershipCallback) -> ProposeCallback:
    """A membership callback as `_deferred` calls proposal callbacks."""

    def call(result: object | None, error: str | None) -> None:
        callback(error)

    return call


def _as_entry(value: Any) -> raft_journal.Entry:
    command, index, term = value
    data = command if isinstance(command, bytes) else str(command).encode("utf-8")
    return (bytes(data), int(index), int(term))


def decode_command(command: bytes) -> bytes | None:
    """The proposal bytes inside a journal entry, or None for pysyncobj's own entries.

    For tests and offline tools that read a node's journal: pysyncobj stores
    a type byte and a pickle of (method id, args). Only use on trusted files.
    """
    if not command or command[0] != 0:
        return None
    call = pickle.loads(command[1:])
    if isinstance(call, tuple) and len(call) >= 2 and isinstance(call[1], tuple) and call[1]:
        data = call[1][0]
        return data if isinstance(data, bytes) else None
    return None


def _private_dirty_bytes() -> int:
    """This process's Private_Dirty memory (Linux; 0 elsewhere). In a forked
    child that is what it copied of its parent's pages plus what it allocated
    itself: what the child adds to the machine's memory."""
    try:
        with open("/proc/self/smaps_rollup", "rb") as handle:
            for line in handle:
                if line.startswith(b"Private_Dirty:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
