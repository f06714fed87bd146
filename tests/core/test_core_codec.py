"""The codec: exact round trips, stable tags, garbage rejected, determinism."""

from __future__ import annotations

from hashlib import sha256

import msgpack
import pytest
from core_support import T0, Cluster
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.core import (
    COMMAND_TAGS,
    REGISTRY,
    CodecError,
    State,
    apply_encoded,
    apply_entry,
    check_invariants,
    decode_entry,
    decode_state,
    encode_entry,
    encode_state,
    encode_state_pieces,
    state_digest,
)
from raftsched.core.auth.commands import BootstrapAdmin, CreateToken, RevokeToken, TouchTokens
from raftsched.core.events.commands import (
    AckDelivery,
    AckParked,
    ConfigureOutbox,
    CopySubscription,
    CreateSubscription,
    DeleteSubscription,
    ParkDelivery,
    RetryParked,
)
from raftsched.core.jobs.commands import (
    CancelJob,
    ClaimJobs,
    ClaimJobsOfKinds,
    CompleteJob,
    Configure,
    ConfigureWheel,
    FailJob,
    HeartbeatJob,
    LeaseBatch,
    PauseQueue,
    PlanShardQuotas,
    ReconcileJob,
    RecordEffect,
    ReplayJob,
    ReplayReconciled,
    RequestReconcile,
    SetQueue,
    SetShardQuotas,
    SetTenant,
    SetUnknownPolicy,
    StartJob,
    SubmitJobs,
)
from raftsched.core.kernel.commands import (
    Audited,
    Backoff,
    Barrier,
    Command,
    Entry,
    ForgetIncarnation,
    JobSpec,
    RaiseClusterVersion,
    RecordIncarnation,
    SetClusterId,
    SetShard,
    TakeOver,
    Tick,
)
from raftsched.core.kernel.model import JOB_FIELDS
from raftsched.core.kernel.results import Rejected
from raftsched.core.membership.commands import AddMember, Member, RemoveMember
from raftsched.core.schedules.commands import (
    BackfillSchedule,
    CreateSchedule,
    DeleteSchedule,
    PauseSchedule,
    ResumeSchedule,
    ScheduleSpec,
    TriggerSchedule,
    UpdateSchedule,
)
from raftsched.core.workflows.commands import CancelWorkflow, StepSpec, SubmitWorkflow

EVERY_COMMAND: tuple[Command, ...] = (
    SubmitJobs(
        (
            JobSpec("q"),
            JobSpec(
                "payments", "acme", b"\x01", -3, 5, None, 7, Backoff(1, 2, 3), 1_000, 9,
                "k", "o", "corr", (("a", "1"), ("b", "2")),
            ),
        ),
        ("j1", "j2"),
    ),
    ClaimJobs("w", ("q", "r"), 10, 5_000),
    ClaimJobs("w", ("q",), 1),
    StartJob("j1", 1),
    HeartbeatJob("j1", 1, 500, b"\x90"),
    HeartbeatJob("j1", 1),
    CompleteJob("j1", 1, b"\xa2ok"),
    FailJob("j1", 1, "transient", "boom", 100, 2**32 - 1),
    CancelJob("j1", "why", "bob"),
    ReplayJob("j1", "fixed", "alice"),
    RecordEffect("key", "j1", 1, b"\x01"),
    Tick(2**64 - 1, 5),
    TakeOver(),
    Barrier(),
    Configure(60_000),
    Configure(),
    ConfigureWheel(120_000, 10_000),
    RaiseClusterVersion(2),
    # Recurring schedules (issue 5).
    CreateSchedule(
        ScheduleSpec("s", JobSpec("q"), cron="0 2 * * *", timezone="Europe/London")
    ),
    UpdateSchedule(
        ScheduleSpec(
            "s", JobSpec("q", priority=2), None, 5_000, "UTC", 1, 2, 3, "buffer_all", "all",
            4, 5, 6, True,
        )
    ),
    DeleteSchedule("s"),
    PauseSchedule("s"),
    ResumeSchedule("s"),
    TriggerSchedule("s"),
    BackfillSchedule("s", 1, 2, "allow_all"),
    BackfillSchedule("s", 1, 2),
    # Workflows, the outbox and subscriptions (issue 6).
    ConfigureOutbox(1_000, 50),
    ConfigureOutbox(),
    CreateSubscription("s1", "http://h/", ("job.*",), "secret"),
    CopySubscription("s1", "http://h/", ("job.*",), "secret", 1_800_000_000_000),
    DeleteSubscription("s1"),
    AckDelivery("s1", 7),
    ParkDelivery("s1", 7, 3, "HTTP 500"),
    RetryParked("s1"),
    AckParked("s1", 7),
    SubmitWorkflow(
        "wf_1",
        (
            StepSpec("a", JobSpec("q")),
            StepSpec("b", JobSpec("r", priority=3), ("a",), JobSpec("undo")),
        ),
        "acme", "key", 60_000, "continue", False,
    ),
    CancelWorkflow("wf_1", "why", "bob"),
    # Flow control (issue 7).
    SetQueue("q", True, 2_500, 10, 4, 20, 1_000),
    SetQueue("q"),
    PauseQueue("q", False),
    SetTenant("acme", 3, 10, 1_000),
    SetTenant("acme"),
    # The audit trail (issue 15).
    Audited("alice (tok_1)", CancelJob("job_1", "why", "alice (tok_1)")),
    Audited("bob", SetQueue("q", True, 2_500, 10, 4, 20, 1_000)),
    # API tokens (issue 15).
    CreateToken("tok_1", "api", "submitter", ("acme",), ("*",), b"h" * 32, 5_000),
    CreateToken("tok_2", "ops", "operator", ("*",), ("*",), b"i" * 32),
    RevokeToken("tok_1"),
    BootstrapAdmin("tok_0", "admin", b"a" * 32),
    TouchTokens(("tok_0", "tok_2"), 60_000),
    # Membership (issue 16).
    AddMember("n4", "10.0.0.4:7000", "http://10.0.0.4:8080"),
    AddMember("n4", "10.0.0.4:7000", "https://n4", (Member("n1", "10.0.0.1:7000", "https://n1"),)),
    RemoveMember("n2"),
    RemoveMember("n2", (Member("n2", "h:1", "http://h"), Member("n3", "h:2", "http://i"))),
    SetClusterId("clu_a"), SetClusterId("clu_b", "clu_a"), RecordIncarnation("n1", "inc_1"),
    ForgetIncarnation("n1"),
    # Reconciliation of unknown outcomes (issue 17).
    SubmitJobs((JobSpec("q", on_unknown="reconcile", reconcile_queue="rq"),), ("j3",)),
    SubmitJobs((JobSpec("q", reconcile_queue="rq"),), ("j4",)),
    SetUnknownPolicy("queue", "payments", "reconcile"),
    ReconcileJob("j1", 9, "happened", b"\xa2ok", (("charge:1", b"\x01"),), "provider says paid", 3),
    ReconcileJob("j1", 9, "cannot_tell"),
    ReplayReconciled("j1", "refunded by hand", "alice"),
    RequestReconcile("j1", "the provider is back", "alice"),
    # Lease batches (issue 18).
    LeaseBatch(
        (
            StartJob("j1", 1), HeartbeatJob("j1", 1, 500, b"\x90"), CompleteJob("j1", 1, b"\xa2ok"),
            FailJob("j2", 2, "unknown", "lost", None, 7), ReconcileJob("j3", 3, "cannot_tell"),
        ),
        ClaimJobs("w", ("q", "r"), 5, 1_000),
    ),
    LeaseBatch((CompleteJob("j1", 1),)),
    LeaseBatch((), ClaimJobs("w", ("q",), 1)),
    # Job kinds (issue 20).
    SubmitJobs(
        (JobSpec("q", kind="charge"), JobSpec("q", on_unknown="retry", kind="a.b:c-1")),
        ("j5", "j6"),
    ),
    ClaimJobsOfKinds("w", ("q",), 5, None, (("charge", 2), (None, 5))),
    LeaseBatch((CompleteJob("j1", 1),), ClaimJobsOfKinds("w", ("q",), 1, 1_000, (("c", 1),))),
    # Shards (issue 21).
    SetShard(2, 3),
    SetShardQuotas(1_800_000_000_000, (("q", 2, None, None), ("r", None, 500, 1)), (("a", 3, 9),)),
    SetShardQuotas(2),
    PlanShardQuotas(1, 1_800_000_000_000, (("q", 2, 500, 1),), (("a", None, 9),)),
    PlanShardQuotas(0, 2),
)  # fmt: skip


def test_every_command_type_has_a_stable_tag() -> None:
    assert {
        SubmitJobs: 1, ClaimJobs: 2, StartJob: 3, HeartbeatJob: 4, CompleteJob: 5,
        FailJob: 6, CancelJob: 7, ReplayJob: 8, RecordEffect: 9, Tick: 10,
        TakeOver: 11, Barrier: 12, Configure: 13, RaiseClusterVersion: 14,
        CreateSchedule: 20, UpdateSchedule: 21, DeleteSchedule: 22, PauseSchedule: 23,
        ResumeSchedule: 24, TriggerSchedule: 25, BackfillSchedule: 26,
        ConfigureOutbox: 40, CreateSubscription: 41, DeleteSubscription: 42,
        AckDelivery: 43, ParkDelivery: 44, RetryParked: 45, AckParked: 46,
        CopySubscription: 47,
        SubmitWorkflow: 50, CancelWorkflow: 51,
        SetQueue: 60, PauseQueue: 61, SetTenant: 62,
        Audited: 80,
        CreateToken: 70, RevokeToken: 71, BootstrapAdmin: 72, TouchTokens: 73,
        SetClusterId: 90, RecordIncarnation: 91, ForgetIncarnation: 92,
        AddMember: 93, RemoveMember: 94,
        SetUnknownPolicy: 100, ReconcileJob: 101, ReplayReconciled: 102,
        RequestReconcile: 103,
        LeaseBatch: 110,
        ConfigureWheel: 120,
        ClaimJobsOfKinds: 130,
        SetShard: 140, SetShardQuotas: 141, PlanShardQuotas: 142,
    } == COMMAND_TAGS  # fmt: skip
    assert {type(command) for command in EVERY_COMMAND} == set(COMMAND_TAGS)


def test_entries_round_trip_exactly() -> None:
    entry = Entry(7, T0, EVERY_COMMAND)
    data = encode_entry(entry)
    assert decode_entry(data) == entry
    assert encode_entry(decode_entry(data)) == data


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"garbage",
        msgpack.packb([1, 2, 3]),
        msgpack.packb([1, 1, 1, [[99]]]),
        msgpack.packb([1, 1, 1, [[3, "j", "not an int"]]]),
        msgpack.packb([1, 1, 1, [[3, "j", True]]]),
        msgpack.packb([1, 1, 1, [[3, "j"]]]),
        msgpack.packb([2, 1, 1, []]),
        msgpack.packb({"a": 1}),
        msgpack.packb([1, 1, 1, [[1, [["q"]], ["j"]]]]),
    ],
)
def test_garbage_entries_raise_codec_error_and_apply_leaves_the_state_alone(data: bytes) -> None:
    """An entry this code cannot decode is not rejected: a replica that
    could decode it applied it, so the caller must stop (node.machine)."""
    with pytest.raises(CodecError):
        decode_entry(data)
    cluster = Cluster()
    before = cluster.digest()
    with pytest.raises(CodecError):
        apply_encoded(cluster.state, data)
    assert cluster.digest() == before


def test_apply_encoded_applies_a_valid_entry() -> None:
    cluster = Cluster()
    entry = Entry(1, T0, (SubmitJobs((JobSpec("q"),), ("j",)),))
    (result,) = apply_encoded(cluster.state, encode_entry(entry))
    assert not isinstance(result, Rejected)
    assert "j" in cluster.state.jobs


def test_state_round_trips_with_every_kind_of_job() -> None:
    cluster = Cluster()
    cluster.submit(labels=(("x", "y"),), idempotency_key="k", deadline_ms=99_999, tenant="t")
    cluster.submit(delay_ms=5_000)
    lease = cluster.start(lease_ms=1_000, backoff=Backoff(7, 70, 7))
    cluster.run(RecordEffect("e", lease.job_id, lease.fencing_token, b"\x01"))
    cluster.run(CancelJob(lease.job_id))
    done = cluster.start()
    cluster.run(CompleteJob(done.job_id, done.fencing_token, b"\x02"))
    failing = cluster.start(max_attempts=1)
    cluster.run(FailJob(failing.job_id, failing.fencing_token, "transient", "x"))
    cluster.run(Tick(), at=T0 + 2_000)
    data = encode_state(cluster.state)
    decoded = decode_state(data)
    assert check_invariants(decoded) == []
    assert encode_state(decoded) == data
    assert state_digest(decoded) == cluster.digest()
    for name in ("status_counts", "queue_counts"):
        assert getattr(decoded, name) == getattr(cluster.state, name)
    assert _keyed(decoded) == _keyed(cluster.state)
    assert decoded.effects.keys() == cluster.state.effects.keys()


def test_garbage_states_raise_codec_error() -> None:
    for data in (b"", b"\x00", msgpack.packb([1, 2]), msgpack.packb([1] * 9)):
        with pytest.raises(CodecError):
            decode_state(data)


def _keyed(state: State) -> dict[tuple[str, str], str]:
    """The idempotency index as (tenant, key) -> job id."""
    return {pair: job.id for pair, job in state.idempotency.items()}


def _mixed_state(jobs: int) -> Cluster:
    """Jobs over several chunks: queues, tenants, priorities, ordering keys,
    idempotency keys and deadlines, in every status."""
    cluster = Cluster()
    specs, ids = [], []
    for i in range(jobs):
        specs.append(
            JobSpec(
                f"q{i % 3}",
                tenant=f"t{i % 5}",
                priority=(i % 4) - 1,
                ordering_key=f"k{i % 7}" if i % 11 == 0 else None,
                idempotency_key=f"i{i}" if i % 13 == 0 else None,
                deadline_ms=60_000 if i % 17 == 0 else None,
                delay_ms=5_000 if i % 19 == 0 else None,
            )
        )
        ids.append(f"job_{i:06d}")
    for start in range(0, jobs, 1_000):
        cluster.run(
            SubmitJobs(tuple(specs[start : start + 1_000]), tuple(ids[start : start + 1_000]))
        )
    claimed = cluster.one(ClaimJobs("w1", ("q0", "q1"), 300))
    leases = claimed.leases
    cluster.run(*(StartJob(lease.job_id, lease.fencing_token) for lease in leases[:200]))
    cluster.run(
        *(CompleteJob(lease.job_id, lease.fencing_token, b"ok") for lease in leases[:100]),
        *(
            FailJob(lease.job_id, lease.fencing_token, "transient", "x", None, 1)
            for lease in leases[100:150]
        ),
    )
    return cluster


def test_a_state_of_many_chunks_decodes_to_one_that_chooses_the_same() -> None:
    cluster = _mixed_state(10_000)
    data = encode_state(cluster.state)
    decoded = decode_state(data)
    assert check_invariants(decoded) == []
    assert encode_state(decoded) == data
    original = cluster.state
    for name in ("status_counts", "queue_counts"):
        assert getattr(decoded, name) == getattr(original, name)
    assert _keyed(decoded) == _keyed(original)
    assert decoded.runnable.tenants == original.runnable.tenants
    # Both replicas grant the same jobs in the same order from here on.
    later = Entry(1, cluster.now_ms + 10_000, (Tick(), ClaimJobs("w2", ("q0", "q1", "q2"), 500)))
    assert apply_entry(decoded, later) == apply_entry(original, later)
    assert encode_state(decoded) == encode_state(original)


def test_decoded_jobs_share_names_statuses_and_instants() -> None:
    cluster = _mixed_state(5_000)
    decoded = decode_state(encode_state(cluster.state))
    jobs = [job for job in decoded.jobs.values() if job.status == "pending"]
    assert len({id(job.queue) for job in jobs}) == 3
    assert len({id(job.status) for job in jobs}) == 1
    assert all(job.updated_at_ms is job.created_at_ms for job in jobs[:100])


def test_a_snapshot_in_the_row_format_still_decodes() -> None:
    """Snapshots written before the column format (STATE_FORMAT 2): one row
    per job, each the job's slots in JOB_FIELDS order."""
    cluster = _mixed_state(3_000)
    state = cluster.state

    def records(value: object) -> object:
        return tuple(getattr(value, name) for name in type(value).__slots__)

    rows = [[getattr(job, name) for name in JOB_FIELDS] for job in state.jobs.values()]
    sections = [
        [section.name, section.encode(state)]
        for section in REGISTRY.sections
        if not section.omitted(state)
    ]
    header = [2, state.now_ms, state.epoch, state.last_fencing_token, state.retention_ms]
    data = msgpack.packb([*header, state.next_seq, rows, sections], default=records)
    decoded = decode_state(data)
    assert check_invariants(decoded) == []
    assert encode_state(decoded) == encode_state(state)


def test_damaged_job_chunks_raise_codec_error() -> None:
    cluster = _mixed_state(100)
    good = msgpack.unpackb(encode_state(cluster.state), use_list=True)
    chunk = good[6][0]
    damaged = []
    for change in ("short column", "negative index", "not arrays", "too few arrays"):
        bad = [list(column) if isinstance(column, list) else column for column in chunk]
        if change == "short column":
            bad[1] = bad[1][:-1]
        elif change == "negative index":
            bad[1 + JOB_FIELDS.index("queue")][0] = -1
        elif change == "not arrays":
            bad[5] = 7
        else:
            bad = bad[:-1]
        damaged.append(msgpack.packb([*good[:6], [bad], good[7]]))
    for data in damaged:
        with pytest.raises(CodecError):
            decode_state(data)


def test_the_pieces_of_a_state_are_its_encoding_and_each_is_lent_not_given() -> None:
    """A snapshot is written piece by piece (`encode_state_pieces`), the
    digest hashed the same way: joined, the pieces are exactly
    `encode_state`, and each is a view of the encoder's buffer that is
    released once the next piece is asked for."""
    cluster = _mixed_state(10_000)
    data = encode_state(cluster.state)
    pieces = encode_state_pieces(cluster.state)
    first = next(pieces)
    kept = [bytes(first)]
    assert len(first) < len(data) // 2
    kept += (bytes(piece) for piece in pieces)
    assert len(kept) > 2
    assert b"".join(kept) == data
    with pytest.raises(ValueError, match="released"):
        bytes(first)
    assert state_digest(cluster.state) == sha256(data).hexdigest()
    # A view (of a snapshot file read whole) decodes like bytes.
    assert encode_state(decode_state(memoryview(b"..." + data)[3:])) == data


# -- commands inside commands (Audited, LeaseBatch) ---------------------------------

COMPLETE_ROW = [5, "j", 1, b"\xc0"]
CLAIM_ROW = [2, "w", ["q"], 1, None]
CANCEL_ROW = [7, "j", "", "api"]


def _entry_of(*rows: object) -> bytes:
    packed: bytes = msgpack.packb([1, 1, T0, list(rows)])
    return packed


def test_a_lease_batch_holds_its_commands_rows_as_an_entry_does() -> None:
    with_claim = LeaseBatch((CompleteJob("j", 1),), ClaimJobs("w", ("q",), 1))
    without = LeaseBatch((CompleteJob("j", 1), CompleteJob("j", 1)))
    data = encode_entry(Entry(1, T0, (with_claim, without)))
    assert data == _entry_of(
        [110, [COMPLETE_ROW], CLAIM_ROW], [110, [COMPLETE_ROW, COMPLETE_ROW], None]
    )
    assert decode_entry(data).commands == (with_claim, without)


@pytest.mark.parametrize(
    "command",
    [
        LeaseBatch((LeaseBatch((CompleteJob("j", 1),)),)),
        LeaseBatch((), LeaseBatch((CompleteJob("j", 1),))),  # type: ignore[arg-type]
        LeaseBatch((Audited("ops", CancelJob("j")),)),
        LeaseBatch((), Audited("ops", CancelJob("j"))),  # type: ignore[arg-type]
        Audited("ops", LeaseBatch((CompleteJob("j", 1),))),
        LeaseBatch([CompleteJob("j", 1)]),  # type: ignore[arg-type]
        LeaseBatch((object(),)),  # type: ignore[arg-type]
        LeaseBatch((), "claim"),  # type: ignore[arg-type]
    ],
    ids=[
        "batch in batch", "batch as claim", "audited in batch", "audited as claim",
        "batch in audited", "ops a list", "not a command", "claim a string",
    ],
)  # fmt: skip
def test_encoding_a_nested_holder_or_a_non_command_is_refused(command: Command) -> None:
    with pytest.raises(CodecError):
        encode_entry(Entry(1, T0, (command,)))


@pytest.mark.parametrize(
    "row",
    [
        [110, [[110, [COMPLETE_ROW], None]], None],  # a batch in a batch
        [110, [], [110, [COMPLETE_ROW], None]],
        [110, [[80, "a", CANCEL_ROW]], None],  # an Audited in a batch
        [110, [COMPLETE_ROW], [80, "a", CANCEL_ROW]],
        [80, "a", [110, [COMPLETE_ROW], None]],  # a batch in an Audited
        [110, [COMPLETE_ROW]],  # a field short
        [110, [COMPLETE_ROW], None, None],  # a field too many
        [110, "ops", None],
        [110, None, None],
        [110, {"a": 1}, None],
        [110, [5], None],
        [110, [[]], None],
        [110, [[5, "j"]], None],
        [110, [[999]], None],
        [110, [[True, "j", 1, b""]], None],
        [110, [["5", "j", 1, b""]], None],
        [110, [[5, "j", "1", b""]], None],
        [110, [COMPLETE_ROW], "claim"],
        [110, [COMPLETE_ROW], []],
        [110, [COMPLETE_ROW], [2, "w", "q", 1, None]],
    ],
)
def test_malformed_lease_batch_rows_do_not_decode(row: list[object]) -> None:
    with pytest.raises(CodecError):
        decode_entry(_entry_of(row))


def test_a_deep_nest_is_refused_at_its_second_level() -> None:
    """A nest as deep as msgpack reads is refused by its second tag, before
    anything below is decoded (no recursion through it)."""
    for depth in (2, 50, 400):
        row: list[object] = COMPLETE_ROW
        for _ in range(depth):
            row = [110, [row], None]
        with pytest.raises(CodecError):
            decode_entry(_entry_of(row))


_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([2, 5, 80, 110, 999, 0, -1]),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.sampled_from([COMPLETE_ROW, CLAIM_ROW, CANCEL_ROW, [110, [COMPLETE_ROW], None]]),
)
_VALUES = st.recursive(_LEAVES, lambda inner: st.lists(inner, max_size=5), max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(value=_VALUES, other=_VALUES)
def test_anything_in_a_batch_row_decodes_exactly_or_is_a_codec_error(
    value: object, other: object
) -> None:
    """Fuzzing the nested fields: garbage is a `CodecError`, never another
    exception, and whatever decodes encodes back to the same bytes."""
    rows = (
        [110, value, other],
        [110, [value], None],
        [110, [COMPLETE_ROW, value], other],
        [110, [], value],
        [110, [[5, value, 1, b""]], [2, "w", [other], 1, None]],
        [80, "a", value],
        value,
    )
    for row in rows:
        data = _entry_of(row)
        try:
            entry = decode_entry(data)
        except CodecError:
            continue
        assert encode_entry(entry) == data
