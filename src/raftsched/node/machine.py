"""The replicated state as the Raft adapter sees it.

`apply` runs on pysyncobj's thread, in log order; HTTP handlers read the same
state from the asyncio thread. One lock keeps them from racing: apply holds
it for one entry, a read holds it while it renders its answer. After every
entry the node is told (coalesced) so that long-polls and the dispatch loop
re-check the state.

Observers of what is applied (`on_results`, `on_restored`: node.series
counts failed attempts and lease lags on every replica) run under the lock
on the Raft thread; they must be quick, and an exception in one is logged
and never reaches pysyncobj (it would wedge the replica on the entry).

An entry this code cannot decode (a newer release proposed a command it does
not know) is not applied, skipped or rejected: every replica that could
decode it has applied it, so this one stops applying at it
(`raft.StopApplying`) and says so, and the node reports itself not ready.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager

from raftsched import core
from raftsched.core.membership.members import members
from raftsched.raft import StopApplying

log = logging.getLogger("raftsched.machine")


class ReplicatedState:
    def __init__(
        self,
        on_applied: Callable[[], None],
        applying_index: Callable[[], int | None] = lambda: None,
        directory_is_ours: Callable[[core.State], bool] = lambda state: True,
        *,
        on_results: Callable[[core.State, Sequence[object]], None] | None = None,
        on_restored: Callable[[int, int], None] | None = None,
    ) -> None:
        self.state = core.new_state()
        self.lock = threading.RLock()
        self.entries_applied = 0
        # The Raft index of the last entry (or snapshot) this state holds,
        # changed under the lock together with the state: what a reader
        # holding the lock reads is exactly the state at that index.
        # `applying_index` is the adapter's (raft.RaftNode.applying_index).
        self.applied_index = 0
        self._applying_index = applying_index
        # False while a restored state still names the old cluster: its
        # member directory is the old cluster's machines (node.membership).
        self._directory_is_ours = directory_is_ours
        self._on_applied = on_applied
        self._on_results = on_results
        self._on_restored = on_restored
        self._reading = _Reading(self)

    def reading(self) -> AbstractContextManager[core.State]:
        """`with replica.reading() as state:` the state, held still."""
        return self._reading

    def apply(self, data: bytes) -> object:
        try:
            with self.lock:
                results = core.apply_encoded(self.state, data)
                self.entries_applied += 1
                self.applied_index = self._applying_index() or self.applied_index + 1
                if self._on_results is not None:
                    self._observe(results)
        except core.CodecError as error:
            raise StopApplying(f"this release cannot decode the entry ({error})") from error
        self._on_applied()
        return results

    def _observe(self, results: Sequence[object]) -> None:
        assert self._on_results is not None
        try:
            self._on_results(self.state, results)
        except Exception:  # a bug in an observer; the entry is applied all the same
            log.exception("observing an applied entry failed")

    def snapshot(self) -> Iterator[memoryview]:
        # Called in the snapshot child, whose copy of the state nothing else
        # changes, or on the tick thread, which is the only writer: either
        # way the state holds still while the pieces are written.
        with self.lock:
            yield from core.encode_state_pieces(self.state)

    def restore(self, data: bytes | memoryview) -> None:
        # A restored state is millions of long-lived objects. They are built
        # with the collector off and frozen before it is back on, so that no
        # collection walks them, neither the one that enabling it would set
        # off at once nor full collections during apply later.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            restored = core.decode_state(data)
        finally:
            gc.freeze()
            if was_enabled:
                gc.enable()
        with self.lock:
            before_ms = self.state.now_ms
            self.state = restored
            self.applied_index = self._applying_index() or 0
            if self._on_restored is not None:
                try:
                    self._on_restored(before_ms, restored.now_ms)
                except Exception:
                    log.exception("observing a restored snapshot failed")
        gc.collect()
        self._on_applied()

    def membership_recorded(self) -> bool:
        """Whether the state records this cluster's members (raft.MemberRecord)."""
        with self.lock:
            return bool(members(self.state)) and self._directory_is_ours(self.state)

    def digest(self) -> str:
        with self.lock:
            return core.state_digest(self.state)


class _Reading:
    """Holds the replica's lock for a `with` block and gives its state.

    Every request reads the state at least once, so this is a plain object
    rather than a `contextlib.contextmanager` generator (about 0.3 µs to
    enter and leave instead of 1.5). It keeps nothing per use, so one serves
    every reader, nested ones too (the lock is re-entrant)."""

    __slots__ = ("_replica",)

    def __init__(self, replica: ReplicatedState) -> None:
        self._replica = replica

    def __enter__(self) -> core.State:
        self._replica.lock.acquire()
        return self._replica.state

    def __exit__(self, *exc_info: object) -> None:
        self._replica.lock.release()
