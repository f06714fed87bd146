"""The time wheel: far-future jobs kept packed instead of as a `Job` each.

Theory of operation
-------------------
Since cluster version 7 (`WHEEL_VERSION`), a submitted job that is
`scheduled` for a time beyond `now_ms + horizon_ms` is stored *packed*
(`pack`): the `Job` is appended to the *tail* of its time bucket, `bucket =
next_run_at_ms // bucket_ms`. A tail that reaches `CHUNK_JOBS` jobs is
sealed: its jobs are encoded in the snapshot's column encoding and
zlib-compressed into a chunk, and a new tail begins. A tail (at most
`CHUNK_JOBS - 1` jobs a bucket) is kept as its `Job` objects, so that
packing a job encodes nothing and sealing decodes nothing; it is encoded
only where bytes are needed (the section: each job's row in the snapshot
codec's row encoding, `codec.encode_job_row`, concatenated), and a read
hands out copies, never the stored objects. A chunk is
`(data, count, min_seq, max_seq)`; a chunk whose jobs all left is None, so
that every job keeps its location `(bucket << CHUNK_BITS) | chunk index`
(the tail's index is the number of chunks) until it leaves the wheel.

Only plain future jobs are packed: no ordering key, no deadline, no
reconcile policy, not a schedule's occurrence or a workflow's step (those go
through other paths), never a job that ran (attempts, history, effects).
Everything else stays live; so do jobs whose bucket is already within the
horizon.

Indexes without an object per job: `ids` maps the 32-bit blake2b hash of a
job id, and `keys` the hash of (tenant, idempotency key), to locations, in an
open-addressing table (256 shards by the hash's top bits, each an
`array("I")` of 32-bit hashes beside an `array("Q")` of locations; linear
probing, backward-shift deletion, duplicates allowed). A hit is confirmed by decoding the located
chunk. Python's `hash()` of a str differs per process and is never used.

Counters: a packed job is counted in `status_counts`, `queue_counts` and
the runnable index's tenant counts exactly as a live scheduled job is
(`state.count_new_job` at packing; nothing changes when it is hydrated). The
wheel keeps `counts[(queue, tenant)]` of its jobs and encodes them, so that
a decoded state adds them back (`restore_counts`) without opening a chunk.

Hydration: the Tick (`hydrate`, a step before due jobs are made runnable)
turns the earliest bucket's chunks into live jobs once `bucket * bucket_ms
<= now_ms + horizon_ms`, whole chunks within the Tick's budget. At version 7
that is as fast as Ticks go (`next_due_ms` says due while a bucket within the
horizon holds jobs, and the leader proposes Ticks back to back): a bucket of
a million jobs kept every replica's cores busy at once. From cluster version
8 (`PACED_HYDRATION_VERSION`) it is paced: a bucket is spread over the first
half of the time it has, from entering the horizon to its soft deadline
(`soft_deadline_ms`: its start minus half the horizon), a Tick taking its
share (`pace_quota`, from `Bucket.count`, derived) and `next_due_ms` asking
for a Tick every `PACE_MS` meanwhile; past the deadline a bucket goes at the
Tick's whole budget, as at version 7. The pace is a function of the entries
(the entry's time, the bucket's count), so replicas hydrate alike. A command
that names a packed job (a `job_id` or `job_ids` field, a submission's
idempotency key, the commands inside an `Audited` or a `LeaseBatch`)
hydrates it first (`hydrate_for_command`, called by `apply` before the
command's savepoint), so every handler sees a live job as before. That
hydration is part of applying the entry: a command that is then rejected
leaves its job live, identically on every replica. Reads never hydrate:
`find_packed`, `find_packed_key` and `packed_jobs` hand out transient jobs
(a chunk's decoded, a tail's copied).

Hydrated jobs join `state.jobs` after the jobs already there, so the jobs
dict is no longer strictly in submission order; listings, which are, merge
`state.order` with the hydrated `runs` (derived, sorted by seq) and the
packed jobs (`jobs.queries.list_jobs`), one newest-first stream per bucket
(`packed_newest_first`): a bucket's chunks, then its tail, hold its jobs in
seq order, and `Bucket.mins` (derived) finds the chunk a cursor falls in.

Determinism: everything above is a function of the applied entries; the
section encodes the settings, the buckets (chunks as they are, a tail as
its jobs' rows), the two tables as they are laid out and the counts, so a
replica that decoded a snapshot (a tail's rows decoded back into jobs)
holds the very bytes of one that applied the log. A table that
becomes empty is reset to capacity 0 on both. Caveat: sealed chunk bytes
come from the process's zlib; replicas must run the same zlib (a different
zlib changes digests, never decoded jobs).
"""

from __future__ import annotations

import sys
import zlib
from array import array
from bisect import bisect_left, insort
from collections.abc import Iterator
from hashlib import blake2b
from heapq import heappop, heappush
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Final, cast

from raftsched.core.kernel.cluster_version import cluster_version
from raftsched.core.kernel.codec import (
    CodecError,
    decode_job_rows,
    decode_wheel_chunk,
    encode_job_row,
    encode_wheel_chunk,
    wheel_chunk_seqs,
)
from raftsched.core.kernel.commands import Command, JobSpec
from raftsched.core.kernel.model import JOB_FIELDS, SCHEDULED, Job
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State, count_new_job, count_packed, index_job

if TYPE_CHECKING:
    from raftsched.core.kernel.feature import Registry
    from raftsched.core.kernel.savepoint import Savepoint

WHEEL: Final = "wheel"
WHEEL_VERSION: Final = 7
"""The cluster version from which submissions are packed."""
PACED_HYDRATION_VERSION: Final = 8
"""The cluster version from which the Tick paces hydration (`hydrate`)."""
PACE_MS: Final = 100
"""Paced hydration's step: while a bucket is paced, the wheel wants a Tick
at the next multiple of this (`next_due_ms`), and each Tick takes the share
of the bucket's remaining jobs that one step of the time left holds."""
HORIZON_MS_DEFAULT: Final = 10 * 60_000
BUCKET_MS_DEFAULT: Final = 3_600_000
"""An hour: a bucket costs its own objects and an uncompressed tail of up
to 31 jobs, so wide buckets are cheaper (bench/core.py --far, 200,000 jobs
over 30 days: 571 bytes a packed job with 1-minute buckets, 242 with
15-minute ones, 195 with an hour), and an hour's jobs made live 10 minutes
before the hour cost little (10M jobs over 30 days: 14,000 an hour)."""
BUCKET_MS_MIN: Final = 1_000
BUCKET_MS_MAX: Final = 24 * 3600_000
HORIZON_MS_MAX: Final = 7 * 24 * 3600_000
CHUNK_JOBS: Final = 32
"""Rows per sealed chunk: compression gains little beyond 32 rows of
today's job shape (bench/core.py's payload with random ids and keys: 60
bytes a job at 32 rows, 57 at 64, 56 at 512), every read of a packed job
decodes one chunk, and a bucket's unsealed tail (up to 31 rows) is kept
uncompressed."""
ZLIB_LEVEL: Final = 6
CHUNK_BITS: Final = 20
_CHUNK_MASK: Final = (1 << CHUNK_BITS) - 1
BUCKET_MAX: Final = (1 << (64 - CHUNK_BITS)) - 1

Chunk = tuple[bytes, int, int, int]  # data, count, min_seq, max_seq


def id_hash(job_id: str) -> int:
    """32 bits of blake2b: the tables store them, and a hit is confirmed by
    decoding its chunk, so a rare false hit costs one decode, never a wrong
    answer (at 10M jobs about one lookup in 400)."""
    value = int.from_bytes(blake2b(job_id.encode(), digest_size=4).digest(), "little")
    return value or 1  # 0 marks an empty slot


def key_hash(tenant: str, key: str) -> int:
    name = tenant.encode()
    data = len(name).to_bytes(4, "little") + name + key.encode()
    value = int.from_bytes(blake2b(data, digest_size=4).digest(), "little")
    return value or 1


SHARDS: Final = 256
"""A table is this many shards, chosen by a hash's top 8 bits, each growing
on its own: growing reinserts one shard's entries (at 10M jobs ~26,000, tens
of milliseconds) rather than every entry in one command (seconds, on the
apply path of every replica)."""


class _Shard:
    """32-bit hashes to 64-bit values (12 bytes a slot); duplicates allowed.
    Linear probing with backward-shift deletion; grows at 4/5 full by
    reinserting in slot order, so its layout is a function of its operations.
    Every write is journalled while `journal` is set (see `HashIndex`) as
    `(shard, at, key, value)`: slot `at` held `key` and `value`; or, with
    `at` -1, the shard's arrays were `key` and `value`; -2, its size was
    `key`; -3, slot `key` was empty and the size `value` (an insert)."""

    __slots__ = ("keys", "values", "size", "journal")

    def __init__(self) -> None:
        self.keys = array("I")
        self.values = array("Q")
        self.size = 0
        self.journal: list[tuple[_Shard, int, Any, Any]] | None = None

    def find(self, hashed: int) -> list[int]:
        keys = self.keys
        if not self.size:
            return []
        mask = len(keys) - 1
        at = hashed & mask
        found: list[int] = []
        while True:
            key = keys[at]
            if key == 0:
                return found
            if key == hashed:
                found.append(self.values[at])
            at = (at + 1) & mask

    def insert(self, hashed: int, value: int) -> None:
        size = self.size
        if (size + 1) * 5 > len(self.keys) * 4:
            self._grow()
        keys = self.keys
        mask = len(keys) - 1
        at = hashed & mask
        while keys[at]:
            at = (at + 1) & mask
        journal = self.journal
        if journal is not None:
            journal.append((self, -3, at, size))  # the slot was empty
        keys[at] = hashed
        self.values[at] = value
        self.size = size + 1

    def remove(self, hashed: int, value: int) -> bool:
        keys, values = self.keys, self.values
        if not self.size:
            return False
        mask = len(keys) - 1
        at = hashed & mask
        while True:
            key = keys[at]
            if key == 0:
                return False
            if key == hashed and values[at] == value:
                break
            at = (at + 1) & mask
        journal = self.journal
        if journal is not None:
            journal.append((self, -2, self.size, 0))
        if self.size == 1:
            if journal is not None:
                journal.append((self, -1, keys, values))
            self.keys, self.values, self.size = array("I"), array("Q"), 0
            return True
        hole = at
        while True:
            at = (at + 1) & mask
            key = keys[at]
            if key == 0:
                break
            home = key & mask
            # The entry may move into the hole unless its home lies
            # cyclically in (hole, at].
            if (hole < at and (home <= hole or home > at)) or (hole > at and at < home <= hole):
                if journal is not None:
                    journal.append((self, hole, keys[hole], values[hole]))
                keys[hole], values[hole] = key, values[at]
                hole = at
        if journal is not None:
            journal.append((self, hole, keys[hole], values[hole]))
        keys[hole] = 0
        values[hole] = 0
        self.size -= 1
        return True

    def _grow(self) -> None:
        """Twice the slots, the entries reinserted in slot order (as
        `insert` would place them); the size is unchanged."""
        old_keys, old_values = self.keys, self.values
        if self.journal is not None:
            self.journal.append((self, -1, old_keys, old_values))
        capacity = max(16, 2 * len(old_keys))
        keys = array("I", bytes(4 * capacity))
        values = array("Q", bytes(8 * capacity))
        mask = capacity - 1
        for key, value in zip(old_keys, old_values, strict=True):
            if key:
                at = key & mask
                while keys[at]:
                    at = (at + 1) & mask
                keys[at] = key
                values[at] = value
        self.keys, self.values = keys, values

    def encode(self) -> list[Any]:
        return [self.size, _le_bytes(self.keys), _le_bytes(self.values)]

    @classmethod
    def decode(cls, data: object) -> _Shard:
        if type(data) is not tuple or len(data) != 3:
            raise CodecError("a wheel table shard is [size, keys, values]")
        size, keys, values = data
        if type(size) is not int or type(keys) is not bytes or type(values) is not bytes:
            raise CodecError("a wheel table shard is [size, keys, values]")
        if len(keys) * 2 != len(values) or len(keys) % 4:
            raise CodecError("a wheel table's arrays differ")
        capacity = len(keys) // 4
        if capacity & (capacity - 1) or size * 5 > capacity * 4 or (size == 0) != (capacity == 0):
            raise CodecError("a wheel table's capacity is wrong")
        shard = cls()
        shard.keys, shard.values = _from_le("I", keys), _from_le("Q", values)
        shard.size = size
        return shard


class HashIndex:
    """32-bit hashes to 64-bit locations in `SHARDS` shards (`_Shard`).

    While a command that may be rolled back changes it (`record`), every
    write of every shard is journalled, and `rewind` puts back the very
    layout: re-inserting what was removed would lay colliding entries out
    differently, and the tables are encoded."""

    __slots__ = ("shards", "size", "journal")

    def __init__(self) -> None:
        self.shards = [_Shard() for _ in range(SHARDS)]
        self.size = 0
        self.journal: list[tuple[_Shard, int, Any, Any]] | None = None

    def find(self, hashed: int) -> list[int]:
        if not self.size:
            return []
        return self.shards[hashed >> 24].find(hashed)

    def insert(self, hashed: int, value: int) -> None:
        self.shards[hashed >> 24].insert(hashed, value)
        self.size += 1

    def remove(self, hashed: int, value: int) -> bool:
        removed = self.shards[hashed >> 24].remove(hashed, value)
        if removed:
            self.size -= 1
        return removed

    def record(self) -> None:
        """Journal every change from here on (a new command's first change)."""
        journal: list[tuple[_Shard, int, Any, Any]] = []
        self.journal = journal
        for shard in self.shards:
            shard.journal = journal

    def stop(self) -> None:
        """Journal nothing (changes outside a savepoint)."""
        if self.journal is not None:
            self.journal = None
            for shard in self.shards:
                shard.journal = None

    def rewind(self, size: int) -> None:
        """Undo every change journalled since `record`; `size` as it was then."""
        journal = self.journal
        assert journal is not None
        while journal:
            shard, at, key, value = journal.pop()
            if at == -3:  # an insert into the empty slot `key`
                shard.keys[key] = 0
                shard.values[key] = 0
                shard.size = value
            elif at == -2:
                shard.size = key
            elif at == -1:
                shard.keys, shard.values = key, value
            else:
                shard.keys[at], shard.values[at] = key, value
        self.size = size

    def encode(self) -> list[Any]:
        return [self.size, [shard.encode() for shard in self.shards]]

    @classmethod
    def decode(cls, data: object) -> HashIndex:
        if type(data) is not tuple or len(data) != 2 or type(data[1]) is not tuple:
            raise CodecError("a wheel table is [size, shards]")
        size, shards = data
        if len(shards) != SHARDS:
            raise CodecError(f"a wheel table has {SHARDS} shards")
        index = cls()
        index.shards = [_Shard.decode(shard) for shard in shards]
        index.size = sum(shard.size for shard in index.shards)
        if index.size != size:
            raise CodecError("a wheel table's size disagrees with its shards")
        return index


def _le_bytes(values: array[int]) -> bytes:
    if sys.byteorder == "little":
        return values.tobytes()
    swapped = array(values.typecode, values)  # pragma: no cover - big-endian hosts
    swapped.byteswap()
    return swapped.tobytes()


def _from_le(typecode: str, data: bytes) -> array[int]:
    values = array(typecode)
    values.frombytes(data)
    if sys.byteorder != "little":  # pragma: no cover
        values.byteswap()
    return values


class Bucket:
    __slots__ = ("chunks", "tail", "first", "mins", "count")

    def __init__(self) -> None:
        self.chunks: list[Chunk | None] = []
        # The unsealed jobs, in seq order: the stored objects, never handed
        # to a reader (`_transient`). Only appended to in place; every other
        # change puts a new list here, so a rollback that kept the list and
        # its length restores it (`pack`, `_take`).
        self.tail: list[Job] = []
        # Derived, not encoded: every chunk before it is None. Hydration
        # takes chunks in order, so a bucket of a million jobs is not
        # scanned from its start for every chunk.
        self.first = 0
        # Derived, not encoded: per chunk, a lower bound of its jobs' seqs
        # (its first seq when sealed; a chunk that emptied keeps the one
        # before it after a decode), non-decreasing because a bucket's jobs
        # are appended in seq order. A listing from a cursor bisects it to
        # find the one chunk of the bucket that holds seqs on both sides.
        self.mins = array("Q")
        # Derived, not encoded: the jobs the bucket holds (its chunks' and
        # tail's), so that paced hydration knows what is left in O(1).
        self.count = 0

    def first_chunk(self) -> int:
        """The index of the first chunk still holding jobs (the number of
        chunks when none does: the tail's index)."""
        chunks = self.chunks
        at = min(self.first, len(chunks))
        while at < len(chunks) and chunks[at] is None:
            at += 1
        self.first = at
        return at

    def empty(self) -> bool:
        return not self.tail and self.first_chunk() == len(self.chunks)

    @property
    def tail_count(self) -> int:
        return len(self.tail)

    @property
    def tail_min_seq(self) -> int:
        return self.tail[0].seq if self.tail else 0

    @property
    def tail_max_seq(self) -> int:
        return self.tail[-1].seq if self.tail else 0

    def tail_bytes(self) -> bytes:
        """The tail as the section encodes it: its jobs' rows, concatenated."""
        return b"".join(map(encode_job_row, self.tail))


class Wheel:
    """The `wheel` section."""

    __slots__ = (
        "horizon_ms",
        "bucket_ms",
        "buckets",
        "order",
        "ids",
        "keys",
        "counts",
        "size",
        "runs",
        "hashes",
    )

    def __init__(
        self, horizon_ms: int = HORIZON_MS_DEFAULT, bucket_ms: int = BUCKET_MS_DEFAULT
    ) -> None:
        self.horizon_ms = horizon_ms
        self.bucket_ms = bucket_ms
        self.buckets: dict[int, Bucket] = {}
        self.order: list[int] = []  # bucket numbers, ascending
        self.ids = HashIndex()
        self.keys = HashIndex()
        self.counts: dict[tuple[str, str], int] = {}
        self.size = 0
        # Derived: hydrated jobs as runs sorted by seq, for listings.
        self.runs: list[list[Job]] = []
        # Not state: the hashes of the job ids (`id_hash`) and (tenant, key)
        # pairs (`key_hash`) that `hydrate_for_command` looked up for the
        # command being applied, so that packing its new jobs does not hash
        # them again. Pure values, emptied before every command.
        self.hashes: dict[object, int] = {}


def wheel_of(state: State) -> Wheel:
    wheel: Wheel = state.sections[WHEEL]
    return wheel


class _Names:
    """Interning for transient jobs a read decodes: the state's own map is
    never touched by a read."""

    __slots__ = ("interned",)

    def __init__(self) -> None:
        self.interned: dict[object, object] = {}


def _chunk_jobs(names: object, bucket: Bucket, index: int) -> list[Job]:
    """The jobs at one location: a sealed chunk's decoded, or the tail's
    stored objects themselves (a new list). Only for the wheel's own use;
    a read hands out `_read_jobs`."""
    if index < len(bucket.chunks):
        chunk = bucket.chunks[index]
        if chunk is None:
            return []
        return decode_wheel_chunk(cast(State, names), zlib.decompress(chunk[0]))
    if index == len(bucket.chunks):
        return list(bucket.tail)
    return []


def _read_jobs(names: object, bucket: Bucket, index: int) -> list[Job]:
    """The jobs at one location as a read may hand them out: transient."""
    if index == len(bucket.chunks):
        return list(map(_transient, bucket.tail))
    return _chunk_jobs(names, bucket, index)


_row_fields: Final = attrgetter(*JOB_FIELDS)


def _transient(job: Job) -> Job:
    """A copy of a tail's job that shares nothing a caller could change. A
    packed job never ran (`check` verifies it): it holds no lease, attempts,
    history or effects, only immutable values, so a shallow copy is one;
    anything else is copied through its row."""
    if job.lease is None and not job.attempts and job.history is None and job.effects is None:
        return Job(*_row_fields(job))
    (copy,) = decode_job_rows(cast(State, _Names()), encode_job_row(job), 1)
    return copy


# Packing (SubmitJobs).


def packable(state: State, job: Job, version: int) -> bool:
    """Whether a new job goes into the wheel (see the module docstring)."""
    if version < WHEEL_VERSION or job.status != SCHEDULED or job.ordering_key is not None:
        return False
    if job.deadline_at_ms is not None or job.next_run_at_ms is None:
        return False
    wheel = wheel_of(state)
    number = job.next_run_at_ms // wheel.bucket_ms
    if number > BUCKET_MAX or number * wheel.bucket_ms <= state.now_ms + wheel.horizon_ms:
        return False
    bucket = wheel.buckets.get(number)
    # A location has CHUNK_BITS for the chunk: a bucket of 33M jobs is full.
    return bucket is None or len(bucket.chunks) < _CHUNK_MASK


def pack(state: State, job: Job, savepoint: Savepoint | None) -> None:
    """Store a new job (counted here, never put in `state.jobs`). The wheel
    keeps `job` itself: the caller hands it over and must not change it."""
    wheel = wheel_of(state)
    _journal(wheel, savepoint)
    assert job.next_run_at_ms is not None
    number = job.next_run_at_ms // wheel.bucket_ms
    bucket = wheel.buckets.get(number)
    created = bucket is None
    if bucket is None:
        bucket = wheel.buckets[number] = Bucket()
        insort(wheel.order, number)
    tail = bucket.tail
    before = len(tail)
    location = (number << CHUNK_BITS) | len(bucket.chunks)
    tail.append(job)
    bucket.count += 1
    sealed = before + 1 >= CHUNK_JOBS
    if sealed:
        _seal(bucket)
    hashes = wheel.hashes
    hashed = hashes.pop(job.id, None)
    wheel.ids.insert(id_hash(job.id) if hashed is None else hashed, location)
    key = job.idempotency_key
    if key is not None:
        hashed = hashes.pop((job.tenant, key), None)
        wheel.keys.insert(key_hash(job.tenant, key) if hashed is None else hashed, location)
    pair = (job.queue, job.tenant)
    wheel.counts[pair] = wheel.counts.get(pair, 0) + 1
    wheel.size += 1
    count_new_job(state, job)
    if savepoint is None:
        return

    def undo() -> None:  # the tables are rewound by `_journal`'s action
        _uncount(wheel, pair, 1)
        wheel.size -= 1
        assert bucket is not None
        bucket.count -= 1
        if sealed:
            bucket.chunks.pop()
            bucket.mins.pop()
        del tail[before:]  # the tail as it was (later changes are undone already)
        bucket.tail = tail
        if created:
            del wheel.buckets[number]
            wheel.order.remove(number)

    savepoint.on_rollback(undo)


def _journal(wheel: Wheel, savepoint: Savepoint | None) -> None:
    """Before a command's first change to the tables: journal them so that a
    rollback restores their exact layout (re-inserting what was removed
    would lay colliding entries out differently, and the tables are
    encoded). Changes made outside a savepoint are not journalled."""
    if savepoint is None:
        wheel.ids.stop()
        wheel.keys.stop()
        return
    if savepoint.memo.get(WHEEL) is wheel:
        return
    savepoint.memo[WHEEL] = wheel
    ids, keys = wheel.ids, wheel.keys
    sizes = (ids.size, keys.size)
    ids.record()
    keys.record()

    def rewind() -> None:
        ids.rewind(sizes[0])
        keys.rewind(sizes[1])

    savepoint.on_rollback(rewind)


def _seal(bucket: Bucket) -> None:
    """The tail's jobs become a chunk in the snapshot's column encoding
    behind their seqs (`encode_wheel_chunk`: a listing decompresses only
    the seqs), compressed (columns compress better than rows: ~60 bytes a
    job). The tail's list is left as it was (a rollback puts it back) and a
    new one begins."""
    jobs = bucket.tail
    chunk = (
        zlib.compress(encode_wheel_chunk(jobs), ZLIB_LEVEL),
        len(jobs),
        jobs[0].seq,
        jobs[-1].seq,
    )
    bucket.chunks.append(chunk)
    bucket.mins.append(jobs[0].seq)
    bucket.tail = []


def _uncount(wheel: Wheel, pair: tuple[str, str], count: int) -> None:
    left = wheel.counts[pair] - count
    if left:
        wheel.counts[pair] = left
    else:
        del wheel.counts[pair]


# Reads: transient jobs, the state untouched.


def find_packed(state: State, job_id: str) -> Job | None:
    wheel = wheel_of(state)
    if not wheel.size:
        return None
    names = _Names()
    for location in wheel.ids.find(id_hash(job_id)):
        for job in _located(wheel, names, location):
            if job.id == job_id:
                return _own(wheel, location, job)
    return None


def find_packed_key(state: State, tenant: str, key: str) -> Job | None:
    wheel = wheel_of(state)
    if not wheel.keys.size:
        return None
    names = _Names()
    for location in wheel.keys.find(key_hash(tenant, key)):
        for job in _located(wheel, names, location):
            if job.tenant == tenant and job.idempotency_key == key:
                return _own(wheel, location, job)
    return None


def _located(wheel: Wheel, names: object, location: int) -> list[Job]:
    """The jobs at `location` as `_chunk_jobs` has them (a tail's stored)."""
    bucket = wheel.buckets.get(location >> CHUNK_BITS)
    if bucket is None:
        return []
    return _chunk_jobs(names, bucket, location & _CHUNK_MASK)


def _own(wheel: Wheel, location: int, job: Job) -> Job:
    """`job`, found at `location`, as a read hands it out: a tail's copied."""
    bucket = wheel.buckets[location >> CHUNK_BITS]
    return _transient(job) if location & _CHUNK_MASK == len(bucket.chunks) else job


def packed_jobs(state: State) -> Iterator[Job]:
    """Every packed job (transient), bucket by bucket: for checks and tests."""
    wheel = wheel_of(state)
    names = _Names()
    for number in wheel.order:
        bucket = wheel.buckets[number]
        for index in range(len(bucket.chunks) + 1):
            yield from _read_jobs(names, bucket, index)


_by_seq: Final = attrgetter("seq")


def packed_newest_first(state: State, below_seq: int | None) -> Iterator[Job]:
    """Packed jobs with seq below `below_seq` (all when None), newest first,
    as transient jobs.

    A bucket's chunks and tail hold its jobs in seq order, so each bucket is
    a stream, newest first, and the buckets are merged: a heap holds one
    location per bucket, keyed by the newest seq below the cursor it can
    hold. A location is decoded only once no other could hold a newer job,
    and then the bucket's next older location takes its place. Where the
    cursor falls inside a location (found by bisecting the bucket's `mins`),
    its key is read from the chunk's seq column (decompressed, no job
    built) when it reaches the top. So a call costs the buckets (a bisect
    each), at most one such peek per bucket, and the locations that hold the
    jobs it yields, never every chunk: O(buckets + page), not O(jobs)."""
    wheel = wheel_of(state)
    if not wheel.size:
        return
    limit = below_seq if below_seq is not None else 1 << 62
    names = _Names()
    buckets = wheel.buckets
    # (-key, exact, bucket number, location index): `exact` is False while
    # the key is only `limit - 1`, a bound.
    places: list[tuple[int, bool, int, int]] = []
    for number in wheel.order:
        bucket = buckets[number]
        if bucket.tail_count and bucket.tail_min_seq < limit:
            _push_place(places, bucket, number, len(bucket.chunks), limit)
        else:
            _push_place(places, bucket, number, bisect_left(bucket.mins, limit) - 1, limit)
    ready: list[tuple[int, Job]] = []
    while places or ready:
        while places and (not ready or -places[0][0] > -ready[0][0]):
            _, exact, number, index = heappop(places)
            bucket = buckets[number]
            if not exact:
                below = [seq for seq in _location_seqs(bucket, index) if seq < limit]
                if below:
                    heappush(places, (-below[-1], True, number, index))
                    continue
            else:
                for job in _read_jobs(names, bucket, index):
                    if job.seq < limit:
                        heappush(ready, (-job.seq, job))
            _push_place(places, bucket, number, index - 1, limit)
        if ready:
            yield heappop(ready)[1]


def _push_place(
    places: list[tuple[int, bool, int, int]],
    bucket: Bucket,
    number: int,
    index: int,
    limit: int,
) -> None:
    """Add the bucket's newest location at or before `index` that may hold
    a job below `limit` (nothing when none does). Reads only."""
    chunks = bucket.chunks
    if index == len(chunks):
        top = bucket.tail_max_seq
    else:
        first = bucket.first  # every chunk before it is None
        while index >= first:
            chunk = chunks[index]
            if chunk is not None and chunk[2] < limit:
                break
            index -= 1
        else:
            return
        top = chunks[index][3]  # type: ignore[index]
    if top < limit:
        heappush(places, (-top, True, number, index))
    else:
        heappush(places, (1 - limit, False, number, index))


def _location_seqs(bucket: Bucket, index: int) -> tuple[int, ...]:
    """The seqs at one location, ascending, without building its jobs."""
    if index == len(bucket.chunks):
        return tuple(job.seq for job in bucket.tail)
    chunk = bucket.chunks[index]
    assert chunk is not None
    # The seqs come first in a chunk (`encode_wheel_chunk`): only their
    # bytes are decompressed.
    head = zlib.decompressobj().decompress(chunk[0], 3 + 9 * chunk[1])
    return wheel_chunk_seqs(head)


# Hydration.


def _make_live(state: State, jobs: list[Job]) -> None:
    wheel = wheel_of(state)
    for job in jobs:
        state.jobs[job.id] = job
        index_job(state, job)
    if not jobs:
        return
    runs = wheel.runs
    runs.append(sorted(jobs, key=_by_seq))
    # Runs merge as a binary counter does (a run merges into the one before
    # while that one is not more than twice as long), so there are
    # O(log jobs) of them and each job is merged O(log jobs) times; jobs
    # purged since drop out.
    live = state.jobs
    while len(runs) > 1 and len(runs[-2]) <= 2 * len(runs[-1]):
        newer = runs.pop()
        merged = sorted(runs.pop() + newer, key=_by_seq)  # two sorted runs: linear
        runs.append([job for job in merged if live.get(job.id) is job])


def _forget(wheel: Wheel, jobs: list[Job], location: int) -> None:
    for job in jobs:
        wheel.ids.remove(id_hash(job.id), location)
        if job.idempotency_key is not None:
            wheel.keys.remove(key_hash(job.tenant, job.idempotency_key), location)
        _uncount(wheel, (job.queue, job.tenant), 1)
    wheel.size -= len(jobs)


def _drop_if_empty(wheel: Wheel, number: int) -> bool:
    bucket = wheel.buckets[number]
    if not bucket.empty():
        return False
    del wheel.buckets[number]
    wheel.order.remove(number)
    return True


def hydrate(state: State, budget: int, savepoint: Savepoint | None) -> int:
    """Tick: make the chunks of buckets within the horizon live, earliest
    bucket first, whole chunks, within `budget` jobs (at least one chunk);
    paced from cluster version 8 (`_hydrate_paced`)."""
    wheel = wheel_of(state)
    if not wheel.size:
        return 0
    if cluster_version(state) >= PACED_HYDRATION_VERSION:
        return _hydrate_paced(state, wheel, budget, savepoint)
    limit_ms = state.now_ms + wheel.horizon_ms
    done = 0
    while wheel.order and done < budget:
        number = wheel.order[0]
        if number * wheel.bucket_ms > limit_ms:
            break
        bucket = wheel.buckets[number]
        index, count = _first_location(bucket)
        if done and done + count > budget:
            break
        jobs = _chunk_jobs(state, bucket, index)
        _take(state, wheel, number, index, jobs, savepoint)
        done += len(jobs)
    return done


def _first_location(bucket: Bucket) -> tuple[int, int]:
    """The bucket's first location still holding jobs (a chunk's index, or
    the number of chunks for the tail) and how many jobs it holds."""
    index = bucket.first_chunk()
    if index == len(bucket.chunks):
        return index, bucket.tail_count
    chunk = bucket.chunks[index]
    assert chunk is not None
    return index, chunk[1]


def soft_deadline_ms(wheel: Wheel, number: int) -> int:
    """When bucket `number` should be live, at version 8: half the horizon
    before it begins. It enters the horizon a whole horizon before."""
    return number * wheel.bucket_ms - wheel.horizon_ms // 2


def pace_quota(wheel: Wheel, number: int, now_ms: int) -> int | None:
    """The jobs of bucket `number` a Tick at `now_ms` makes live: the share
    of its remaining jobs that one `PACE_MS` holds of the time left until
    its soft deadline (all of them in the last step); None past the
    deadline (no pacing: as many as the Tick's budget allows)."""
    left_ms = soft_deadline_ms(wheel, number) - now_ms
    if left_ms <= 0:
        return None
    remaining = wheel.buckets[number].count
    return -(-remaining * PACE_MS // max(PACE_MS, left_ms))


def _hydrate_paced(state: State, wheel: Wheel, budget: int, savepoint: Savepoint | None) -> int:
    """`hydrate` from cluster version 8. A bucket that came within the
    horizon (at its start minus the horizon) is spread over the first half
    of the time it has: a Tick takes `pace_quota` of its jobs, whole chunks
    and at least one, and `next_due_ms` asks for a Tick every `PACE_MS`,
    so that a bucket of a million jobs is not hydrated at full speed on
    every replica at once. Past its soft deadline a bucket goes at the
    Tick's whole budget, as at version 7. Each bucket within the horizon,
    earliest first, is paced by its own deadline; the Tick's budget bounds
    them all (only the Tick's first chunk may exceed it, as at version 7)."""
    now_ms = state.now_ms
    limit_ms = now_ms + wheel.horizon_ms
    done = 0
    at = 0  # the place in `wheel.order` of the bucket at hand
    while at < len(wheel.order) and done < budget:
        number = wheel.order[at]
        if number * wheel.bucket_ms > limit_ms:
            break
        bucket = wheel.buckets[number]
        quota = pace_quota(wheel, number, now_ms)
        taken = 0
        while True:
            index, count = _first_location(bucket)
            if done and done + count > budget:
                return done
            if quota is not None and taken and taken + count > quota:
                break  # paced: this bucket has had its share
            jobs = _chunk_jobs(state, bucket, index)
            _take(state, wheel, number, index, jobs, savepoint)
            done += len(jobs)
            taken += len(jobs)
            if number not in wheel.buckets:
                break  # emptied and dropped: the next bucket is at `at` now
        if number in wheel.buckets:
            at += 1
    return done


def _take(
    state: State,
    wheel: Wheel,
    number: int,
    index: int,
    jobs: list[Job],
    savepoint: Savepoint | None,
) -> None:
    """Move the jobs of one whole location out of the wheel and make them live."""
    _journal(wheel, savepoint)
    bucket = wheel.buckets[number]
    location = (number << CHUNK_BITS) | index
    if index < len(bucket.chunks):
        before_chunk = bucket.chunks[index]
        bucket.chunks[index] = None
    else:
        before_tail = bucket.tail  # not changed below: the jobs are handed on
        bucket.tail = []
    bucket.count -= len(jobs)
    _forget(wheel, jobs, location)
    dropped = _drop_if_empty(wheel, number)

    def undo() -> None:
        for job in jobs:
            state.jobs.pop(job.id, None)
        bucket.count += len(jobs)
        if dropped:
            wheel.buckets[number] = bucket
            insort(wheel.order, number)
        if index < len(bucket.chunks):
            bucket.chunks[index] = before_chunk
            bucket.first = min(bucket.first, index)
        else:
            bucket.tail = before_tail
        for job in jobs:  # the tables are rewound by `_journal`'s action
            pair = (job.queue, job.tenant)
            wheel.counts[pair] = wheel.counts.get(pair, 0) + 1
        wheel.size += len(jobs)

    # Registered before the jobs go live, which is what could fail; the
    # derived indexes are rebuilt by the rollback anyway.
    if savepoint is not None:
        savepoint.on_rollback(undo)
    _make_live(state, jobs)


def hydrate_one(state: State, location: int, match: Job) -> None:
    """Make one packed job live (a command names it); the rest of its chunk
    stays packed, re-encoded without it (a tail keeps the others' objects)."""
    wheel = wheel_of(state)
    _journal(wheel, None)
    number, index = location >> CHUNK_BITS, location & _CHUNK_MASK
    bucket = wheel.buckets[number]
    jobs = _chunk_jobs(state, bucket, index)
    job = next(each for each in jobs if each.id == match.id)
    rest = [each for each in jobs if each is not job]
    if index < len(bucket.chunks):
        bucket.chunks[index] = (
            (
                zlib.compress(encode_wheel_chunk(rest), ZLIB_LEVEL),
                len(rest),
                rest[0].seq,
                rest[-1].seq,
            )
            if rest
            else None
        )
    else:
        bucket.tail = rest
    bucket.count -= 1
    _forget(wheel, [job], location)
    _drop_if_empty(wheel, number)
    _make_live(state, [job])


def hydrate_id(state: State, job_id: str) -> None:
    wheel = wheel_of(state)
    if not wheel.size or job_id in state.jobs:
        return
    hashed = wheel.hashes[job_id] = id_hash(job_id)
    names = _Names()
    for location in wheel.ids.find(hashed):
        for job in _located(wheel, names, location):
            if job.id == job_id:
                hydrate_one(state, location, job)
                return


def hydrate_key(state: State, tenant: str, key: str) -> None:
    wheel = wheel_of(state)
    if not wheel.keys.size or state.idempotency.get(tenant, key) is not None:
        return
    hashed = wheel.hashes[tenant, key] = key_hash(tenant, key)
    names = _Names()
    for location in wheel.keys.find(hashed):
        for job in _located(wheel, names, location):
            if job.tenant == tenant and job.idempotency_key == key:
                hydrate_one(state, location, job)
                return


def hydrate_for_command(state: State, command: Command, registry: Registry) -> None:
    """Make live every packed job `command` names, before it is applied:
    a `job_id` or `job_ids` field, an idempotency key of a spec in `specs`,
    and the same in the commands it holds (`Audited`, `LeaseBatch`)."""
    wheel: Wheel | None = state.sections.get(WHEEL)
    if wheel is None:
        return
    if wheel.hashes:
        wheel.hashes = {}
    if not wheel.size:
        return
    _hydrate_named(state, command)
    for inner in registry.inner_commands(command):
        _hydrate_named(state, inner)


def _hydrate_named(state: State, command: object) -> None:
    job_id = getattr(command, "job_id", None)
    if type(job_id) is str:
        hydrate_id(state, job_id)
    job_ids = getattr(command, "job_ids", None)
    if type(job_ids) is tuple:
        for each in job_ids:
            if type(each) is str:
                hydrate_id(state, each)
    specs = getattr(command, "specs", None)
    if type(specs) is tuple:
        for spec in specs:
            if (
                isinstance(spec, JobSpec)
                and type(spec.tenant) is str
                and type(spec.idempotency_key) is str
            ):
                hydrate_key(state, spec.tenant, spec.idempotency_key)


def next_due_ms(state: State) -> int | None:
    """When the earliest bucket enters the horizon. From cluster version 8,
    while it is paced (within the horizon, before its soft deadline), the
    next multiple of `PACE_MS` after now instead: one paced Tick a step, not
    Ticks back to back. A step of the grid, not now plus a step: every entry
    moves now on, and under steady traffic now plus a step would recede until
    the deadline. Past the deadline it is due (as at version 7)."""
    wheel = wheel_of(state)
    if not wheel.order:
        return None
    number = wheel.order[0]
    enters_ms = max(0, number * wheel.bucket_ms - wheel.horizon_ms)
    now_ms = state.now_ms
    if (
        now_ms < enters_ms
        or now_ms >= soft_deadline_ms(wheel, number)
        or cluster_version(state) < PACED_HYDRATION_VERSION
    ):
        return enters_ms
    return (now_ms // PACE_MS + 1) * PACE_MS


# Counters and derived data after a rebuild or a decode.


def restore_counts(state: State) -> None:
    """Add the packed jobs to the counters rebuilt from the live jobs, and
    start the hydrated runs afresh (`state.order` holds every live job in
    seq order again)."""
    wheel = wheel_of(state)
    wheel.runs = []
    for (queue, tenant), count in wheel.counts.items():
        count_packed(state, queue, tenant, count)


# The section.


def _at_default(state: State) -> bool:
    wheel = wheel_of(state)
    return (
        not wheel.buckets
        and wheel.horizon_ms == HORIZON_MS_DEFAULT
        and wheel.bucket_ms == BUCKET_MS_DEFAULT
    )


def _encode(state: State) -> Any:
    wheel = wheel_of(state)
    buckets = []
    for number in wheel.order:
        bucket = wheel.buckets[number]
        buckets.append(
            [
                number,
                [None if chunk is None else list(chunk) for chunk in bucket.chunks],
                bucket.tail_bytes(),
                bucket.tail_count,
                bucket.tail_min_seq,
                bucket.tail_max_seq,
            ]
        )
    counts = [[queue, tenant, count] for (queue, tenant), count in sorted(wheel.counts.items())]
    return [
        wheel.horizon_ms,
        wheel.bucket_ms,
        wheel.size,
        buckets,
        wheel.ids.encode(),
        wheel.keys.encode(),
        counts,
    ]


def _int(value: object) -> int:
    if type(value) is not int or value < 0:
        raise CodecError("the wheel holds non-negative integers")
    return value


def _decode(state: State, data: Any) -> None:
    if type(data) is not tuple or len(data) != 7:
        raise CodecError("the wheel is [horizon, bucket, size, buckets, ids, keys, counts]")
    horizon_ms, bucket_ms, size, buckets, ids, keys, counts = data
    wheel = Wheel(_int(horizon_ms), _int(bucket_ms))
    wheel.size = _int(size)
    if type(buckets) is not tuple or type(counts) is not tuple:
        raise CodecError("the wheel's buckets and counts are arrays")
    for row in buckets:
        if type(row) is not tuple or len(row) != 6 or type(row[1]) is not tuple:
            raise CodecError("a wheel bucket is [number, chunks, tail, count, min, max]")
        bucket = Bucket()
        low = 0
        for chunk in row[1]:
            if chunk is None:
                bucket.chunks.append(None)
                bucket.mins.append(low)
                continue
            if type(chunk) is not tuple or len(chunk) != 4 or type(chunk[0]) is not bytes:
                raise CodecError("a wheel chunk is [data, count, min_seq, max_seq]")
            bucket.chunks.append((chunk[0], _int(chunk[1]), _int(chunk[2]), _int(chunk[3])))
            if chunk[2] < low:
                raise CodecError("a wheel bucket's chunks are out of seq order")
            low = chunk[2]
            bucket.mins.append(low)
        if type(row[2]) is not bytes:
            raise CodecError("a wheel tail is bytes")
        count, min_seq, max_seq = map(_int, row[3:])
        bucket.tail = decode_job_rows(state, row[2], count)
        bucket.count = count + sum(chunk[1] for chunk in bucket.chunks if chunk is not None)
        if (bucket.tail_min_seq, bucket.tail_max_seq) != (min_seq, max_seq):
            raise CodecError("a wheel tail's seq range is wrong")
        number = _int(row[0])
        if wheel.order and number <= wheel.order[-1]:
            raise CodecError("wheel buckets out of order")
        wheel.buckets[number] = bucket
        wheel.order.append(number)
    wheel.ids, wheel.keys = HashIndex.decode(ids), HashIndex.decode(keys)
    for row in counts:
        if type(row) is not tuple or len(row) != 3:
            raise CodecError("a wheel count is [queue, tenant, count]")
        queue, tenant, count = row
        if type(queue) is not str or type(tenant) is not str or _int(count) == 0:
            raise CodecError("a wheel count is [queue, tenant, count]")
        wheel.counts[queue, tenant] = count
    if sum(wheel.counts.values()) != wheel.size or wheel.ids.size != wheel.size:
        raise CodecError("the wheel's counts disagree with its size")
    state.sections[WHEEL] = wheel
    restore_counts(state)


SECTION: Final = Section(WHEEL, Wheel, _encode, _decode, at_default=_at_default)


def check(state: State) -> list[str]:
    """Every packed job is located by its hashes and counted; for tests."""
    wheel = wheel_of(state)
    problems: list[str] = []
    counts: dict[tuple[str, str], int] = {}
    total = 0
    for number in wheel.order:
        bucket = wheel.buckets[number]
        if bucket.empty():
            problems.append(f"wheel: bucket {number} is empty")
        held = bucket.tail_count + sum(chunk[1] for chunk in bucket.chunks if chunk is not None)
        if bucket.count != held:
            problems.append(f"wheel: bucket {number} counts {bucket.count} jobs, holds {held}")
        mins = bucket.mins
        if len(mins) != len(bucket.chunks) or any(
            a > b for a, b in zip(mins, mins[1:], strict=False)
        ):
            problems.append(f"wheel: bucket {number}'s seq bounds are wrong")
        for low, chunk in zip(mins, bucket.chunks, strict=False):
            if chunk is not None and chunk[2] < low:
                problems.append(f"wheel: bucket {number}'s chunk below its seq bound")
        newest = -1
        for chunk in bucket.chunks:
            if chunk is not None:
                if chunk[2] <= newest or chunk[3] < chunk[2]:
                    problems.append(f"wheel: bucket {number}'s chunks out of seq order")
                newest = chunk[3]
        if bucket.tail_count and bucket.tail_min_seq <= newest:
            problems.append(f"wheel: bucket {number}'s tail out of seq order")
        for index in range(len(bucket.chunks) + 1):
            location = (number << CHUNK_BITS) | index
            located = _chunk_jobs(_Names(), bucket, index)
            seqs = [job.seq for job in located]
            if seqs != sorted(seqs):
                problems.append(f"wheel: location {location} out of seq order")
            if located:
                header = (
                    (bucket.tail_min_seq, bucket.tail_max_seq)
                    if index == len(bucket.chunks)
                    else cast(Chunk, bucket.chunks[index])[2:]
                )
                if header != (seqs[0], seqs[-1]):
                    problems.append(f"wheel: location {location}'s seq range is wrong")
                if seqs != list(_location_seqs(bucket, index)):
                    problems.append(f"wheel: location {location}'s seq column is wrong")
            for job in located:
                if job.schedule_id is not None or job.workflow_id is not None:
                    problems.append(f"wheel: {job.id} is a schedule's or a workflow's")
                total += 1
                pair = (job.queue, job.tenant)
                counts[pair] = counts.get(pair, 0) + 1
                if job.id in state.jobs:
                    problems.append(f"wheel: {job.id} is both packed and live")
                if location not in wheel.ids.find(id_hash(job.id)):
                    problems.append(f"wheel: {job.id} missing from the id table")
                key = job.idempotency_key
                if key is not None and location not in wheel.keys.find(key_hash(job.tenant, key)):
                    problems.append(f"wheel: {job.id} missing from the key table")
                if job.lease or job.attempts or job.history is not None or job.effects is not None:
                    problems.append(f"wheel: {job.id} ran")
                if job.status != SCHEDULED or job.next_run_at_ms is None:
                    problems.append(f"wheel: {job.id} is not a scheduled job")
                elif job.next_run_at_ms // wheel.bucket_ms != number:
                    problems.append(f"wheel: {job.id} in the wrong bucket")
    if counts != wheel.counts or total != wheel.size or wheel.ids.size != total:
        problems.append(f"wheel: counts {wheel.counts} (size {wheel.size}) != {counts}")
    return problems
