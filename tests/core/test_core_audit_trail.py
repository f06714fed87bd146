"""The replicated audit trail: `Audited(actor, command)` applies an operator
command and records who asked, in the same command (kernel.audit)."""

from __future__ import annotations

from collections import deque

import msgpack
import pytest
from core_support import T0, Cluster, assert_rejected_unchanged

from raftsched.core import (
    REGISTRY,
    CodecError,
    command_version,
    decode_entry,
    decode_state,
    encode_entry,
    encode_state,
    job_history,
    state_digest,
)
from raftsched.core.jobs.commands import (
    CancelJob,
    ClaimJobs,
    FailJob,
    PauseQueue,
    ReplayJob,
    SetTenant,
    SubmitJobs,
)
from raftsched.core.kernel import audit
from raftsched.core.kernel.audit import AUDIT, AuditEntry, audit_entries, trail
from raftsched.core.kernel.commands import Audited, Entry, JobSpec, Tick
from raftsched.core.kernel.feature import Audit, AuditSubject
from raftsched.core.kernel.results import CancelAccepted, Claimed, Rejected, Replayed
from raftsched.core.schedules.commands import CreateSchedule, DeleteSchedule, ScheduleSpec
from raftsched.core.workflows.commands import CancelWorkflow, StepSpec, SubmitWorkflow


def entries(cluster: Cluster) -> list[AuditEntry]:
    return list(trail(cluster.state).entries)


def dead_letter(cluster: Cluster, tenant: str = "acme", key: str = "charge:1") -> str:
    job_id = cluster.submit(tenant=tenant, idempotency_key=key, max_attempts=1)
    result = cluster.one(ClaimJobs("w1", ("q",), 1))
    assert isinstance(result, Claimed)
    (lease,) = result.leases
    cluster.one(FailJob(job_id, lease.fencing_token, "permanent", "bad"))
    assert cluster.job(job_id).status == "dead_letter"
    return job_id


def test_the_inner_command_is_applied_and_recorded_with_its_actor() -> None:
    cluster = Cluster()
    job_id = cluster.submit(tenant="acme")
    result = cluster.one(Audited("alice (tok_1)", CancelJob(job_id, "wrong", "alice (tok_1)")))
    assert isinstance(result, CancelAccepted) and result.status == "cancelled"
    assert entries(cluster) == [
        AuditEntry(1, T0, "alice (tok_1)", "job.cancel", job_id, "acme", "wrong")
    ]
    history = job_history(cluster.state, job_id)
    assert history is not None and history[-1].actor == "alice (tok_1)"


def test_a_replay_keeps_the_idempotency_key_and_records_the_reason() -> None:
    cluster = Cluster()
    job_id = dead_letter(cluster)
    result = cluster.one(Audited("ops", ReplayJob(job_id, "fixed the bug", "ops")), at=T0 + 5)
    assert result == Replayed(job_id)
    job = cluster.job(job_id)
    assert (job.status, job.idempotency_key) == ("pending", "charge:1")
    assert cluster.state.idempotency.get("acme", "charge:1") is job
    assert entries(cluster)[-1] == AuditEntry(
        1, T0 + 5, "ops", "job.replay", job_id, "acme", "fixed the bug"
    )


def test_a_rejected_inner_command_leaves_no_entry_and_no_change() -> None:
    cluster = Cluster()
    job_id = cluster.submit()
    cluster.one(CancelJob(job_id))
    # Cancelling a cancelled job is not allowed; nothing is recorded.
    assert_rejected_unchanged(cluster, Audited("alice", CancelJob(job_id)), "invalid_state")
    assert_rejected_unchanged(cluster, Audited("alice", CancelJob("job_nope")), "not_found")
    assert entries(cluster) == []
    assert AUDIT not in [name for name, _ in msgpack.unpackb(encode_state(cluster.state))[7]]


@pytest.mark.parametrize(
    "inner",
    [
        SubmitJobs((JobSpec("q"),), ("job_x",)),
        ClaimJobs("w1", ("q",), 1),
        Tick(),
        Audited("bob", PauseQueue("q", True)),
    ],
)
def test_only_operator_commands_can_be_audited(inner: object) -> None:
    cluster = Cluster()
    rejected = assert_rejected_unchanged(cluster, Audited("alice", inner), "invalid_request")  # type: ignore[arg-type]
    assert rejected.details == {"field": "command"}


@pytest.mark.parametrize("actor", ["", "x" * 201, None])
def test_the_actor_must_be_a_name(actor: object) -> None:
    cluster = Cluster()
    command = Audited(actor, PauseQueue("q", True))  # type: ignore[arg-type]
    assert_rejected_unchanged(cluster, command, "invalid_request")


def test_each_kind_names_its_target_and_tenant() -> None:
    cluster = Cluster()
    spec = ScheduleSpec("nightly", JobSpec("q", tenant="globex"), cron="0 2 * * *")
    cluster.one(Audited("a", CreateSchedule(spec)))
    cluster.one(Audited("a", DeleteSchedule("nightly")))  # the tenant is read before
    cluster.one(Audited("a", SetTenant("acme", 2, None, 10)))
    cluster.one(Audited("a", PauseQueue("q", True)))
    steps = (StepSpec("a", JobSpec("q")),)
    cluster.one(SubmitWorkflow("wf_1", steps, "initech"))
    cluster.one(Audited("a", CancelWorkflow("wf_1", "stop", "a")))
    assert [(e.kind, e.target, e.tenant, e.detail) for e in entries(cluster)] == [
        ("schedule.create", "nightly", "globex", "0 2 * * * queue=q"),
        ("schedule.delete", "nightly", "globex", None),
        ("tenant.set", "acme", "acme", "weight=2 max_queued=10"),
        ("queue.pause", "q", None, "paused"),
        ("workflow.cancel", "wf_1", "initech", "stop"),
    ]


def test_the_trail_keeps_the_newest_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit, "AUDIT_ENTRIES_MAX", 3)
    cluster = Cluster()
    for number in range(5):
        cluster.one(Audited(f"op{number}", PauseQueue("q", number % 2 == 0)))
    assert [(e.seq, e.actor) for e in entries(cluster)] == [(3, "op2"), (4, "op3"), (5, "op4")]
    assert trail(cluster.state).next_seq == 6


def test_a_full_trail_is_restored_when_the_command_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug after the inner command applied: the savepoint takes back the
    action, the entry and the entry the bound pushed out."""
    monkeypatch.setattr(audit, "AUDIT_ENTRIES_MAX", 2)
    cluster = Cluster()
    cluster.one(Audited("op1", PauseQueue("q", True)))
    cluster.one(Audited("op2", PauseQueue("q", False)))
    job_id = cluster.submit()
    before, kept = cluster.digest(), entries(cluster)

    class BrokenDeque(deque[AuditEntry]):
        def append(self, entry: AuditEntry) -> None:
            raise RuntimeError("boom")  # after the oldest entry left

    record = trail(cluster.state)
    record.entries = BrokenDeque(record.entries)
    result = cluster.one(Audited("op3", CancelJob(job_id, "", "op3")))
    assert isinstance(result, Rejected) and result.code == "internal_error"
    assert cluster.job(job_id).status == "pending"
    assert entries(cluster) == kept and cluster.digest() == before


def test_an_error_before_the_inner_command_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster()
    job_id = cluster.submit()
    before = cluster.digest()

    def broken_describe(state: object, command: object) -> AuditSubject:
        raise RuntimeError("describe failed")

    kind = REGISTRY.audits[CancelJob]
    monkeypatch.setitem(REGISTRY.audits, CancelJob, Audit(kind.kind, broken_describe))
    result = cluster.one(Audited("op", CancelJob(job_id)))
    assert isinstance(result, Rejected) and result.code == "internal_error"
    assert cluster.digest() == before and entries(cluster) == []


def test_the_version_of_an_audited_command_is_3() -> None:
    assert command_version(Audited("a", PauseQueue("q", True))) == 3


def test_an_entry_with_an_audited_command_round_trips() -> None:
    entry = Entry(3, T0, (Audited("alice (tok_1)", CancelJob("job_1", "why", "alice (tok_1)")),))
    data = encode_entry(entry)
    assert decode_entry(data) == entry
    # The inner command is nested as its own row: [80, actor, [7, fields...]].
    assert msgpack.unpackb(data)[3] == [[80, "alice (tok_1)", [7, "job_1", "why", "alice (tok_1)"]]]


@pytest.mark.parametrize(
    "row",
    [
        [80, "a", [80, "b", [61, "q", True]]],  # nested twice
        [80, "a", [999, "q"]],  # unknown inner tag
        [80, "a", "not a row"],
        [80, "a"],
    ],
)
def test_malformed_audited_rows_do_not_decode(row: list[object]) -> None:
    with pytest.raises(CodecError):
        decode_entry(msgpack.packb([1, 1, T0, [row]]))


def test_encoding_a_doubly_nested_command_is_refused() -> None:
    entry = Entry(1, T0, (Audited("a", Audited("b", PauseQueue("q", True))),))  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        encode_entry(entry)


def test_the_trail_survives_a_snapshot_with_the_same_digest() -> None:
    cluster = Cluster()
    job_id = cluster.submit(tenant="acme")
    cluster.one(Audited("alice", CancelJob(job_id, "why", "alice")))
    cluster.one(Audited("bob", SetTenant("acme", 3)))
    decoded = decode_state(encode_state(cluster.state))
    assert list(trail(decoded).entries) == entries(cluster)
    assert trail(decoded).next_seq == 3
    assert state_digest(decoded) == cluster.digest()


def test_the_same_log_gives_the_same_trail_on_every_replica() -> None:
    def replay() -> Cluster:
        cluster = Cluster()
        for number in range(20):
            job_id = cluster.submit(tenant=f"t{number % 3}")
            command = CancelJob(job_id, f"r{number}", f"op{number % 4}")
            cluster.one(Audited(f"op{number % 4}", command), at=T0 + number)
        return cluster

    first, second = replay(), replay()
    assert first.digest() == second.digest()
    assert entries(first) == entries(second)


def test_queries_filter_by_actor_kind_and_tenants_newest_first_in_pages() -> None:
    cluster = Cluster()
    for number in range(6):
        job_id = cluster.submit(tenant="acme" if number % 2 else "globex")
        cluster.one(Audited("alice" if number < 3 else "bob", CancelJob(job_id)))
    cluster.one(Audited("alice", PauseQueue("q", True)))
    state = cluster.state
    page, cursor = audit_entries(state, limit=3)
    assert [e.seq for e in page] == [7, 6, 5] and cursor == 5
    page, cursor = audit_entries(state, limit=3, before_seq=cursor)
    assert [e.seq for e in page] == [4, 3, 2] and cursor == 2
    page, cursor = audit_entries(state, limit=3, before_seq=cursor)
    assert [e.seq for e in page] == [1] and cursor is None
    alice, _ = audit_entries(state, actor="alice", kind="job.cancel")
    assert [e.seq for e in alice] == [3, 2, 1]
    # A scoped reader sees its tenants' entries and none without a tenant.
    acme, _ = audit_entries(state, tenants=frozenset({"acme"}))
    assert [(e.seq, e.tenant) for e in acme] == [(6, "acme"), (4, "acme"), (2, "acme")]
    assert audit_entries(state, tenants=frozenset()) == ([], None)
