"""The time wheel of packed future jobs (kernel.wheel, issue 19)."""

from __future__ import annotations

import random
import zlib

import msgpack
import pytest
from core_support import T0, Cluster
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.core import (
    State,
    apply_entry,
    check_invariants,
    decode_state,
    encode_state,
    get_job,
    list_jobs,
    new_state,
    state_digest,
)
from raftsched.core.jobs import submit
from raftsched.core.jobs.commands import (
    CancelJob,
    ConfigureWheel,
    ReplayJob,
    SetTenant,
    SubmitJobs,
)
from raftsched.core.jobs.queries import find_by_idempotency_key, job_history
from raftsched.core.kernel import wheel
from raftsched.core.kernel.codec import decode_job_rows, encode_job_row, encode_wheel_chunk
from raftsched.core.kernel.commands import (
    Barrier,
    Command,
    Entry,
    JobSpec,
    RaiseClusterVersion,
    Tick,
)
from raftsched.core.kernel.model import CANCELLED, PENDING, SCHEDULED, Job
from raftsched.core.kernel.results import (
    Ack,
    CancelAccepted,
    Rejected,
    SubmitItem,
    Submitted,
)

MIN = 60_000
HORIZON = 5 * MIN
BUCKET = MIN


def wheel_cluster() -> Cluster:
    cluster = Cluster()
    assert cluster.run(RaiseClusterVersion(7), ConfigureWheel(HORIZON, BUCKET)) == [Ack(), Ack()]
    return cluster


def far(cluster: Cluster, minutes: int = 60, **fields: object) -> JobSpec:
    return JobSpec(
        **{"queue": "q", "run_at_ms": cluster.now_ms + minutes * MIN, "payload": b"\x01", **fields}
    )  # type: ignore[arg-type]


def packed(cluster: Cluster) -> int:
    return wheel.wheel_of(cluster.state).size


def test_a_far_future_job_is_packed_and_reads_as_a_scheduled_job() -> None:
    cluster = wheel_cluster()
    job_id = cluster.submit(far(cluster, tenant="acme", idempotency_key="k1"))
    near = cluster.submit(far(cluster, 3))  # within the horizon: live
    assert job_id not in cluster.state.jobs and near in cluster.state.jobs
    assert packed(cluster) == 1
    before = cluster.digest()
    job = get_job(cluster.state, job_id)
    assert job is not None and job.status == SCHEDULED and job.tenant == "acme"
    assert job.run_at_ms == T0 + 60 * MIN and job.payload == b"\x01"
    assert find_by_idempotency_key(cluster.state, "acme", "k1") is not None
    history = job_history(cluster.state, job_id)
    assert history is not None and history[0].to_status == SCHEDULED
    assert get_job(cluster.state, "job_nope") is None
    # Reads never change the state, nor does changing what they handed out.
    (listed,) = [each for each in list_jobs(cluster.state)[0] if each.id == job_id]
    found = find_by_idempotency_key(cluster.state, "acme", "k1")
    packed_job = next(wheel.packed_jobs(cluster.state))
    for each in (job, found, packed_job, listed):
        each.status, each.payload, each.priority = CANCELLED, b"changed", 7  # type: ignore[union-attr]
    assert cluster.digest() == before
    again = get_job(cluster.state, job_id)
    assert again is not None and again.payload == b"\x01" and again.status == SCHEDULED
    assert cluster.state.status_counts[SCHEDULED] == 2
    assert cluster.state.queue_counts["q"] == [0, 0, 2]
    assert cluster.state.runnable.tenants["acme"] == [1, 0]


def test_below_version_7_nothing_is_packed() -> None:
    cluster = Cluster()
    job_id = cluster.submit(far(cluster, 600))
    assert job_id in cluster.state.jobs and packed(cluster) == 0
    cluster.run(RaiseClusterVersion(6))
    assert cluster.submit(far(cluster, 600)) in cluster.state.jobs


def test_jobs_hard_to_pack_stay_live() -> None:
    cluster = wheel_cluster()
    ids = [
        cluster.submit(far(cluster, ordering_key="o")),
        cluster.submit(far(cluster, deadline_ms=100 * MIN)),
        cluster.submit(far(cluster, on_unknown="reconcile", reconcile_queue="audit")),
    ]
    assert all(job_id in cluster.state.jobs for job_id in ids)
    assert packed(cluster) == 0


def test_idempotent_resubmit_and_conflict_of_a_packed_job() -> None:
    cluster = wheel_cluster()
    spec = far(cluster, idempotency_key="pay-1")
    job_id = cluster.submit(spec)
    assert packed(cluster) == 1
    result = cluster.one(SubmitJobs((spec,), ("job_again",)))
    assert result == Submitted((SubmitItem(job_id, created=False),))
    other = far(cluster, idempotency_key="pay-1", payload=b"\x02")
    (rejected,) = cluster.one(SubmitJobs((other,), ("job_other",))).items
    assert isinstance(rejected, Rejected) and rejected.code == "idempotency_conflict"
    assert rejected.details["job_id"] == job_id
    # The repeat made it live; it is still the one job, counted once.
    assert job_id in cluster.state.jobs and packed(cluster) == 0
    assert cluster.state.status_counts[SCHEDULED] == 1


def test_cancel_and_other_commands_on_a_packed_job() -> None:
    cluster = wheel_cluster()
    first, second = cluster.submit(far(cluster)), cluster.submit(far(cluster))
    assert packed(cluster) == 2
    assert isinstance(cluster.one(CancelJob(first, "no longer needed")), CancelAccepted)
    assert cluster.state.jobs[first].status == CANCELLED
    refused = cluster.one(ReplayJob(second, "not a dead letter"))
    assert isinstance(refused, Rejected) and refused.code == "invalid_state"
    # The refused replay still hydrated its job (before the command, on
    # every replica alike), and a missing job is still not found.
    assert second in cluster.state.jobs and packed(cluster) == 0
    missing = cluster.one(CancelJob("job_missing"))
    assert isinstance(missing, Rejected) and missing.code == "not_found"
    assert cluster.state.status_counts[SCHEDULED] == 1
    assert cluster.state.status_counts[CANCELLED] == 1


def test_max_queued_counts_packed_jobs() -> None:
    cluster = wheel_cluster()
    cluster.run(SetTenant("acme", max_queued=2))
    cluster.submit(far(cluster, tenant="acme"))
    cluster.submit(far(cluster, tenant="acme"))
    assert packed(cluster) == 2
    (item,) = cluster.one(SubmitJobs((far(cluster, tenant="acme"),), ("job_x",))).items
    assert isinstance(item, Rejected) and item.code == "queue_full"
    # After a snapshot the count is the same without opening a bucket.
    decoded = decode_state(encode_state(cluster.state))
    assert decoded.runnable.tenants["acme"] == [2, 0]


def test_the_tick_hydrates_a_bucket_on_time_and_the_job_comes_due() -> None:
    cluster = wheel_cluster()
    job_id = cluster.submit(far(cluster, 60))
    due_ms = T0 + 60 * MIN
    bucket_ms = due_ms // BUCKET * BUCKET  # when the job's bucket begins
    cluster.run(Tick(seed=1), at=bucket_ms - HORIZON - 1)
    assert packed(cluster) == 1
    assert wheel.next_due_ms(cluster.state) == bucket_ms - HORIZON
    cluster.run(Tick(seed=2), at=bucket_ms - HORIZON)
    assert packed(cluster) == 0 and cluster.state.jobs[job_id].status == SCHEDULED
    cluster.run(Tick(seed=3), at=due_ms)
    assert cluster.state.jobs[job_id].status == PENDING
    (lease,) = cluster.claim()
    assert lease.job_id == job_id


def test_the_tick_hydrates_whole_chunks_within_its_budget() -> None:
    cluster = wheel_cluster()
    count = wheel.CHUNK_JOBS * 3 + 5
    specs = tuple(far(cluster, 60, payload=bytes([i % 7])) for i in range(count))
    ids = tuple(f"job_{i:04d}" for i in range(count))
    cluster.run(SubmitJobs(specs, ids))
    bucket = wheel.wheel_of(cluster.state).buckets[(T0 + 60 * MIN) // BUCKET]
    assert len(bucket.chunks) == 3 and bucket.tail_count == 5
    # A job in a sealed chunk is found, cancelled, and its chunk re-encoded.
    assert get_job(cluster.state, "job_0070") is not None
    cluster.run(CancelJob("job_0070"))
    assert packed(cluster) == count - 1
    cluster.run(Tick(seed=1, max_items=10), at=T0 + 55 * MIN)
    assert packed(cluster) == count - 1 - wheel.CHUNK_JOBS  # one whole chunk, at least
    cluster.run(Tick(seed=2, max_items=1_000))
    assert packed(cluster) == 0 and len(cluster.state.jobs) == count
    assert wheel.wheel_of(cluster.state).buckets == {}


def test_listing_merges_live_hydrated_and_packed_jobs_with_stable_paging() -> None:
    cluster = wheel_cluster()
    ids = []
    for i in range(30):
        minutes = [2, 60, 120][i % 3]  # live, packed, packed
        ids.append(cluster.submit(far(cluster, minutes)))
    cluster.run(CancelJob(ids[4]))  # a packed one made live by a command
    cluster.run(Tick(seed=1), at=T0 + 57 * MIN)  # the 60-minute bucket is hydrated
    assert 0 < packed(cluster) < 20
    newest_first = list(reversed(ids))
    jobs, cursor = list_jobs(cluster.state, limit=7)
    seen = [job.id for job in jobs]
    while cursor is not None:
        jobs, cursor = list_jobs(cluster.state, limit=7, cursor=cursor)
        seen += [job.id for job in jobs]
    assert seen == newest_first
    scheduled, _ = list_jobs(cluster.state, status=SCHEDULED, limit=1_000)
    assert len(scheduled) == cluster.state.status_counts[SCHEDULED]
    assert [job.id for job in list_jobs(cluster.state, status=CANCELLED)[0]] == [ids[4]]


def test_a_snapshot_mid_wheel_decodes_to_the_same_bytes_and_goes_on_alike() -> None:
    cluster = wheel_cluster()
    specs = tuple(
        far(cluster, 10 + i % 50, tenant=f"t{i % 3}", idempotency_key=f"k{i}") for i in range(300)
    )
    cluster.run(SubmitJobs(specs, tuple(f"job_{i:04d}" for i in range(300))))
    cluster.run(CancelJob("job_0007"), Tick(seed=1), at=T0 + 20 * MIN)
    data = encode_state(cluster.state)
    decoded = decode_state(data)
    assert encode_state(decoded) == data
    assert check_invariants(decoded) == []
    assert decoded.status_counts == cluster.state.status_counts
    assert decoded.queue_counts == cluster.state.queue_counts
    later = (
        [CancelJob("job_0100"), SubmitJobs((specs[200],), ("job_z",))],
        [Tick(seed=2, max_items=50)],
        [Tick(seed=3, max_items=5_000)],
    )
    steps = [(T0 + (40 + 20 * step) * MIN, commands) for step, commands in enumerate(later)]
    goes_on_alike(cluster, decoded, steps)
    assert packed(cluster) == 0


def goes_on_alike(cluster: Cluster, decoded: State, steps: list[tuple[int, list[Command]]]) -> None:
    """Apply each step (its time, its commands) to the cluster's state and to
    one decoded from its snapshot: the same bytes after every step."""
    for at, commands in steps:
        cluster.run(*commands, at=at)
        apply_entry(decoded, Entry(cluster.epoch, at, tuple(commands)))
        assert check_invariants(decoded) == []
        assert state_digest(decoded) == state_digest(cluster.state)
        assert wheel_section(decoded) == wheel_section(cluster.state)


def wheel_section(state: State) -> bytes:
    return msgpack.packb(wheel.SECTION.encode(state))


def test_packing_sealing_and_rollbacks_give_the_bytes_a_replay_from_the_snapshot_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tail is kept as its jobs: sealing them gives the chunk that sealing
    their rows (encoded, decoded) gave; the section encodes them as their
    rows; a rolled-back seal, hydration of a tail or submission leaves the
    very bytes; and a state decoded from a snapshot goes on alike."""
    real_seal = wheel._seal

    def seal_as_rows_would(bucket: wheel.Bucket) -> None:
        rows = b"".join(map(encode_job_row, bucket.tail))
        jobs = decode_job_rows(new_state(), rows, len(bucket.tail))
        from_rows = zlib.compress(encode_wheel_chunk(jobs), wheel.ZLIB_LEVEL)
        real_seal(bucket)
        assert bucket.chunks[-1] is not None and bucket.chunks[-1][0] == from_rows
        sealed.append(bucket)

    sealed: list[wheel.Bucket] = []
    monkeypatch.setattr(wheel, "_seal", seal_as_rows_would)
    real_admit = submit.flow.admit

    def admit_unless_boom(state: State, spec: JobSpec) -> Rejected | None:
        if spec.payload == b"boom":
            raise RuntimeError("a bug")
        return real_admit(state, spec)

    monkeypatch.setattr(submit.flow, "admit", admit_unless_boom)
    cluster = wheel_cluster()
    number = (T0 + 60 * MIN) // BUCKET

    def spec(i: int, minutes: int = 60, payload: bytes = b"\x01") -> JobSpec:
        return far(
            cluster,
            minutes,
            tenant=f"t{i % 3}",
            idempotency_key=f"k{i}" if i % 2 else None,
            labels=(("team", f"l{i % 4}"),) if i % 5 == 0 else (),
            priority=i % 3,
            payload=payload,
        )

    def submission(first: int, count: int, minutes: int = 60, boom: bool = False) -> SubmitJobs:
        specs = [spec(i, minutes) for i in range(first, first + count)]
        if boom:
            specs.append(spec(first + count, minutes, payload=b"boom"))
        ids = tuple(f"job_{i:04d}" for i in range(first, first + len(specs)))
        return SubmitJobs(tuple(specs), ids)

    cluster.run(submission(0, wheel.CHUNK_JOBS - 1))
    bucket = wheel.wheel_of(cluster.state).buckets[number]
    assert bucket.tail_count == wheel.CHUNK_JOBS - 1 and not bucket.chunks
    # The next job seals the tail, one more starts the next, another opens a
    # new bucket; then the submission fails: all of it is rolled back.
    before, section = cluster.digest(), wheel_section(cluster.state)
    (failed,) = cluster.run(
        SubmitJobs(
            (spec(100), spec(101), spec(102, 120), spec(103, payload=b"boom")),
            ("job_0100", "job_0101", "job_0102", "job_0103"),
        )
    )
    assert isinstance(failed, Rejected) and failed.code == "internal_error"
    assert len(sealed) == 1 and not bucket.chunks and bucket.tail_count == wheel.CHUNK_JOBS - 1
    assert cluster.digest() == before and wheel_section(cluster.state) == section
    # For real: two chunks and a tail here, a tail in a later bucket; a
    # command hydrates a job from a tail and one from a chunk.
    cluster.run(submission(200, 41), submission(300, 5, 120))
    assert len(bucket.chunks) == 2 and bucket.tail_count == 8
    cluster.run(CancelJob("job_0240"), CancelJob("job_0003"))
    assert len(sealed) == 3 and bucket.tail_count == 7
    # The section holds each tail as its jobs' rows, as a read gives them.
    (encoded,) = (row for row in wheel.SECTION.encode(cluster.state)[3] if row[0] == number)
    tail = [get_job(cluster.state, f"job_{i:04d}") for i in range(233, 240)]
    assert encoded[2:] == [
        b"".join(encode_job_row(job) for job in tail),  # type: ignore[arg-type]
        7,
        tail[0].seq,  # type: ignore[union-attr]
        tail[-1].seq,  # type: ignore[union-attr]
    ]
    # A Tick that hydrates the chunks and the tail fails on the tail's last
    # job: the tail comes back as it was.
    real_index = wheel.index_job

    def index_unless_last(state: State, job: Job) -> None:
        if job.id == "job_0239":
            raise RuntimeError("a bug")
        real_index(state, job)

    monkeypatch.setattr(wheel, "index_job", index_unless_last)
    cluster.run(Barrier(), at=T0 + 56 * MIN)  # time moves on; the Tick comes next
    before, section = cluster.digest(), wheel_section(cluster.state)
    (failed,) = cluster.run(Tick(seed=1))
    assert isinstance(failed, Rejected) and failed.code == "internal_error"
    assert cluster.digest() == before and wheel_section(cluster.state) == section
    monkeypatch.setattr(wheel, "index_job", real_index)
    # A snapshot, and a replica that decoded it goes on as this one does:
    # more seals, a failing one, hydration of whole tails and of one job.
    data = encode_state(cluster.state)
    decoded = decode_state(data)
    assert encode_state(decoded) == data and check_invariants(decoded) == []
    goes_on_alike(
        cluster,
        decoded,
        [  # the specs' times are from now, T0 + 56 minutes
            (T0 + 57 * MIN, [submission(400, 30, 70), submission(500, 30, 70, boom=True)]),
            (T0 + 58 * MIN, [submission(600, 30, 70), CancelJob("job_0620")]),
            (T0 + 59 * MIN, [submission(700, 3), CancelJob("job_0238"), CancelJob("job_0302")]),
            (T0 + 60 * MIN, [Tick(seed=2)]),  # the 60-minute bucket: chunks and tail
            (T0 + 121 * MIN, [Tick(seed=3, max_items=40)]),  # whole tails, one chunk
            (T0 + 122 * MIN, [Tick(seed=4)]),
        ],
    )
    # Each of the two states sealed twice more, one seal rolled back.
    assert packed(cluster) == 0 and len(sealed) == 3 + 2 * 2


def test_configure_wheel_checks_its_settings() -> None:
    cluster = wheel_cluster()
    bad = cluster.one(ConfigureWheel(HORIZON, 10))
    assert isinstance(bad, Rejected) and bad.code == "invalid_request"
    cluster.submit(far(cluster))
    busy = cluster.one(ConfigureWheel(HORIZON, 2 * BUCKET))
    assert isinstance(busy, Rejected) and busy.code == "invalid_state"
    assert cluster.one(ConfigureWheel(2 * HORIZON, BUCKET)) == Ack()


def test_the_default_wheel_is_not_encoded() -> None:
    """A state that never used the wheel keeps the bytes earlier releases gave it."""
    cluster = Cluster()
    cluster.run(RaiseClusterVersion(7))
    cluster.submit()
    assert b"wheel" not in encode_state(cluster.state)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 40)), max_size=300))
def test_the_hash_index_agrees_with_a_dict(operations: list[tuple[bool, int]]) -> None:
    index = wheel.HashIndex()
    model: dict[tuple[int, int], int] = {}
    for insert, n in operations:
        hashed, value = (n % 9) * 16 + 1, n  # few distinct hashes: collisions
        if insert:
            index.insert(hashed, value)
            model[hashed, value] = model.get((hashed, value), 0) + 1
        else:
            removed = index.remove(hashed, value)
            assert removed == (model.get((hashed, value), 0) > 0)
            if removed:
                model[hashed, value] -= 1
        assert index.size == sum(model.values())
    for n in range(9):
        hashed = n * 16 + 1
        expected = sorted(v for (h, v), c in model.items() if h == hashed for _ in range(c))
        assert sorted(index.find(hashed)) == expected


def test_hashes_are_stable_across_processes() -> None:
    assert wheel.id_hash("job_1") == wheel.id_hash("job_1") != wheel.id_hash("job_2")
    # Fixed values: never Python's per-process hash().
    assert wheel.id_hash("job_1") == int.from_bytes(
        __import__("hashlib").blake2b(b"job_1", digest_size=4).digest(), "little"
    )
    rng = random.Random(1)
    keys = {wheel.key_hash(f"t{rng.randrange(5)}", f"k{i}") for i in range(1000)}
    assert len(keys) == 1000


def test_a_failing_submission_rolls_its_packed_jobs_back(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = wheel_cluster()
    cluster.submit(far(cluster))  # the bucket exists already
    before = cluster.digest()
    calls = []

    def admit_then_fail(state: object, spec: JobSpec) -> None:
        calls.append(spec)
        if len(calls) == 3:
            raise RuntimeError("a bug")

    monkeypatch.setattr(submit.flow, "admit", admit_then_fail)
    specs = (far(cluster), far(cluster, 600), far(cluster))  # one in a new bucket
    (result,) = cluster.run(SubmitJobs(specs, ("job_a", "job_b", "job_c")))
    assert isinstance(result, Rejected) and result.code == "internal_error"
    assert cluster.digest() == before
    assert packed(cluster) == 1


def test_a_failing_tick_rolls_its_hydration_back(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = wheel_cluster()
    count = wheel.CHUNK_JOBS * 2 + 3
    specs = tuple(far(cluster, 60) for _ in range(count))
    cluster.run(SubmitJobs(specs, tuple(f"job_{i:04d}" for i in range(count))))
    cluster.run(Barrier(), at=T0 + 58 * MIN)  # time moves on; the Tick comes next
    before = cluster.digest()
    calls = []
    real = wheel.index_job

    def index_then_fail(state: object, job: object) -> None:
        calls.append(job)
        if len(calls) == wheel.CHUNK_JOBS + 5:
            raise RuntimeError("a bug")
        real(state, job)  # type: ignore[arg-type]

    monkeypatch.setattr(wheel, "index_job", index_then_fail)
    (result,) = cluster.run(Tick(seed=1))
    assert isinstance(result, Rejected) and result.code == "internal_error"
    # The tables' layout too: their changes were journalled and rewound.
    assert packed(cluster) == count and cluster.digest() == before


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["near", "far", "farther", "cancel", "tick"]), st.integers(0, 99)
        ),
        min_size=1,
        max_size=60,
    ),
    st.integers(1, 9),
)
def test_paging_through_any_mix_lists_every_job_once_newest_first(
    steps: list[tuple[str, int]], limit: int
) -> None:
    cluster = wheel_cluster()
    ids: list[str] = []
    for kind, n in steps:
        if kind in ("near", "far", "farther"):
            minutes = {"near": 2, "far": 60 + n % 7, "farther": 180 + n}[kind]
            specs = tuple(far(cluster, minutes, tenant=f"t{n % 2}") for _ in range(1 + n % 40))
            new = tuple(f"job_{len(ids) + i:05d}" for i in range(len(specs)))
            cluster.run(SubmitJobs(specs, new))
            ids += new
        elif kind == "cancel" and ids:
            cluster.run(CancelJob(ids[n % len(ids)]))
        elif kind == "tick":
            cluster.run(Tick(seed=n), at=cluster.now_ms + n * MIN)
    for tenant in (None, "t1"):
        expected = [
            job_id
            for job_id in reversed(ids)
            if tenant is None or get_job(cluster.state, job_id).tenant == tenant  # type: ignore[union-attr]
        ]
        seen: list[str] = []
        jobs, cursor = list_jobs(cluster.state, tenant=tenant, limit=limit)
        seen += [job.id for job in jobs]
        for _ in range(len(ids) + 2):
            if cursor is None:
                break
            jobs, cursor = list_jobs(cluster.state, tenant=tenant, limit=limit, cursor=cursor)
            seen += [job.id for job in jobs]
        assert seen == expected


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 60)), max_size=150),
    st.lists(st.tuples(st.booleans(), st.integers(0, 60)), max_size=150),
)
def test_a_journalled_table_rewinds_to_its_very_layout(
    before: list[tuple[bool, int]], during: list[tuple[bool, int]]
) -> None:
    """Shards by the top bits, collisions in the low ones; whatever a command
    did (grows and empties included), `rewind` gives back the same bytes."""
    index = wheel.HashIndex()

    def hashed(n: int) -> int:
        return ((n % 3) << 24) | ((n % 5) * 16 + 1)

    def apply(operations: list[tuple[bool, int]]) -> None:
        for insert, n in operations:
            if insert:
                index.insert(hashed(n), n)
            else:
                index.remove(hashed(n), n)

    apply(before)
    encoded, size = index.encode(), index.size
    index.record()
    apply(during)
    index.rewind(size)
    assert index.encode() == encoded
    index.stop()
    decoded = wheel.HashIndex.decode(msgpack.unpackb(msgpack.packb(encoded), use_list=False))
    assert decoded.encode() == encoded


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["near", "far", "farther", "cancel", "tick"]), st.integers(0, 99)
        ),
        min_size=1,
        max_size=40,
    ),
    st.lists(st.integers(0, 1_500), max_size=6),
    st.integers(1, 40),
    st.booleans(),
)
def test_a_page_from_any_cursor_holds_the_newest_jobs_below_it(
    steps: list[tuple[str, int]], cursors: list[int], limit: int, decoded: bool
) -> None:
    """The listing's merge of buckets (a bisect of each bucket's seq bounds,
    the straddling chunk's seq column) against every job sorted by seq,
    from cursors inside chunks, with chunks emptied or re-encoded by
    commands and hydration, and after a snapshot (the bounds rebuilt)."""
    cluster = wheel_cluster()
    ids: list[str] = []
    for kind, n in steps:
        if kind in ("near", "far", "farther"):
            minutes = {"near": 2, "far": 60 + n % 5, "farther": 180 + n % 3}[kind]
            specs = tuple(far(cluster, minutes, tenant=f"t{n % 3}") for _ in range(1 + n % 70))
            new = tuple(f"job_{len(ids) + i:05d}" for i in range(len(specs)))
            cluster.run(SubmitJobs(specs, new))
            ids += new
        elif kind == "cancel" and ids:
            for at in range(0, len(ids), 1 + n):
                cluster.run(CancelJob(ids[(at + n) % len(ids)]))
        elif kind == "tick":
            cluster.run(Tick(seed=n), at=cluster.now_ms + n * MIN)
    state = decode_state(encode_state(cluster.state)) if decoded else cluster.state
    assert check_invariants(state) == []
    every = [get_job(state, job_id) for job_id in ids]
    assert all(job is not None for job in every)
    by_seq = sorted(every, key=lambda job: -job.seq)  # type: ignore[union-attr]
    for cursor in [None, *cursors]:
        for status in (None, SCHEDULED, CANCELLED):
            for tenant in (None, "t1"):
                expected = [
                    job.id  # type: ignore[union-attr]
                    for job in by_seq
                    if (cursor is None or job.seq < cursor)  # type: ignore[union-attr]
                    and (status is None or job.status == status)  # type: ignore[union-attr]
                    and (tenant is None or job.tenant == tenant)  # type: ignore[union-attr]
                ][:limit]
                jobs, _ = list_jobs(
                    state,
                    status=status,
                    tenant=tenant,
                    limit=limit,
                    cursor=None if cursor is None else str(cursor),
                )
                assert [job.id for job in jobs] == expected
    assert encode_state(state) == encode_state(cluster.state)  # reads changed nothing
