"""Reconciliation of unknown outcomes (issue 17): which outcomes are unknown,
the on_unknown policy and its defaults, the reconciliation lease and the
three decisions, the reconciliation budget, and the encoding behind the
cluster-version gate."""

from __future__ import annotations

import pytest
from core_support import Cluster

from raftsched.core import (
    command_version,
    decode_entry,
    decode_state,
    encode_entry,
    encode_state,
    state_digest,
)
from raftsched.core.jobs import reconcile as reconcile_module
from raftsched.core.jobs.commands import (
    CancelJob,
    ClaimJobs,
    CompleteJob,
    FailJob,
    HeartbeatJob,
    PauseQueue,
    ReconcileJob,
    RecordEffect,
    ReplayJob,
    ReplayReconciled,
    RequestReconcile,
    SetUnknownPolicy,
    StartJob,
    SubmitJobs,
)
from raftsched.core.jobs.reconcile_book import RECONCILE, RECONCILE_TRIES_MAX, book_of
from raftsched.core.kernel.codec import spec_row
from raftsched.core.kernel.commands import Audited, Backoff, Entry, JobSpec, Tick
from raftsched.core.kernel.results import Ack, Lease, Reconciled, Rejected, Replayed
from raftsched.core.schedules.commands import CreateSchedule
from raftsched.core.schedules.model import ScheduleSpec

NO_BACKOFF = Backoff(0, 0, 0)


def _running(cluster: Cluster, **fields: object) -> Lease:
    """Submit, claim and start one job of queue q."""
    job_id = cluster.submit(**fields)
    lease = cluster.claim_one()
    assert lease.job_id == job_id
    cluster.run(StartJob(job_id, lease.fencing_token))
    return lease


def _reconciling(cluster: Cluster, **fields: object) -> tuple[Lease, Lease]:
    """A job whose running attempt failed unknown, and its reconciliation lease."""
    lease = _running(cluster, on_unknown="reconcile", **fields)
    cluster.run(FailJob(lease.job_id, lease.fencing_token, "unknown", "timed out"))
    assert cluster.job(lease.job_id).status == "reconciling"
    ask = cluster.claim_one(worker="r1")
    assert ask.job_id == lease.job_id and ask.reconcile is not None
    return lease, ask


# -- which outcomes are unknown ----------------------------------------------------


def test_by_default_an_unknown_outcome_is_retried_as_before() -> None:
    cluster = Cluster()
    lease = _running(cluster, backoff=NO_BACKOFF)
    cluster.run(FailJob(lease.job_id, lease.fencing_token, "unknown"))
    assert cluster.job(lease.job_id).status == "pending"
    assert cluster.state.sections[RECONCILE].tasks == {}


def test_a_lease_expired_while_running_is_unknown() -> None:
    cluster = Cluster()
    lease = _running(cluster, on_unknown="reconcile", lease_ms=1_000)
    cluster.run(Tick(), at=lease.expires_at_ms)
    job = cluster.job(lease.job_id)
    assert job.status == "reconciling"
    assert job.attempts[-1].outcome == "lease_expired"
    assert job.attempts_made == 1
    assert job.history[-1][1:4] == ("outcome_unknown", "running", "reconciling")


def test_a_lease_expired_before_start_is_not_unknown_nothing_ran() -> None:
    cluster = Cluster()
    job_id = cluster.submit(on_unknown="reconcile", lease_ms=1_000)
    lease = cluster.claim_one()
    cluster.run(Tick(), at=lease.expires_at_ms)
    job = cluster.job(job_id)
    assert job.status == "pending"
    assert job.attempts_made == 0


def test_a_transient_or_permanent_failure_is_not_unknown() -> None:
    cluster = Cluster()
    first = _running(cluster, on_unknown="reconcile", backoff=NO_BACKOFF)
    cluster.run(FailJob(first.job_id, first.fencing_token, "transient"))
    assert cluster.job(first.job_id).status == "pending"
    cluster.run(CancelJob(first.job_id))
    second = _running(cluster, on_unknown="reconcile")
    cluster.run(FailJob(second.job_id, second.fencing_token, "permanent"))
    assert cluster.job(second.job_id).status == "dead_letter"


def test_a_job_cancelled_while_running_stays_cancelled() -> None:
    cluster = Cluster()
    lease = _running(cluster, on_unknown="reconcile", lease_ms=1_000)
    cluster.run(CancelJob(lease.job_id))
    cluster.run(Tick(), at=lease.expires_at_ms)
    job = cluster.job(lease.job_id)
    assert job.status == "cancelled"
    assert job.attempts[-1].outcome == "lease_expired"
    assert cluster.state.sections[RECONCILE].tasks == {}


# -- the policy and its defaults -------------------------------------------------------


def test_the_job_policy_wins_over_the_queue_and_the_tenant() -> None:
    cluster = Cluster()
    results = cluster.run(
        SetUnknownPolicy("queue", "q", "reconcile"),
        SetUnknownPolicy("tenant", "acme", "reconcile"),
        SetUnknownPolicy("queue", "other", "retry"),
    )
    assert results == [Ack()] * 3
    assert book_of(cluster.state).queues == {"q": "reconcile"}
    by_queue = _running(cluster)
    cluster.run(FailJob(by_queue.job_id, by_queue.fencing_token, "unknown"))
    assert cluster.job(by_queue.job_id).status == "reconciling"
    cluster.run(CancelJob(by_queue.job_id))
    own = _running(cluster, on_unknown="retry", backoff=NO_BACKOFF)
    cluster.run(FailJob(own.job_id, own.fencing_token, "unknown"))
    assert cluster.job(own.job_id).status == "pending"
    cluster.run(CancelJob(own.job_id))
    # The queue default cleared: the tenant's default still applies to its jobs.
    cluster.run(SetUnknownPolicy("queue", "q", "retry"))
    assert book_of(cluster.state).queues == {}
    by_tenant = _running(cluster, tenant="acme")
    cluster.run(FailJob(by_tenant.job_id, by_tenant.fencing_token, "unknown"))
    assert cluster.job(by_tenant.job_id).status == "reconciling"
    cluster.run(CancelJob(by_tenant.job_id))
    plain = _running(cluster, backoff=NO_BACKOFF)
    cluster.run(FailJob(plain.job_id, plain.fencing_token, "unknown"))
    assert cluster.job(plain.job_id).status == "pending"


@pytest.mark.parametrize(
    "command",
    [
        SetUnknownPolicy("shard", "q", "reconcile"),
        SetUnknownPolicy("queue", "", "reconcile"),
        SetUnknownPolicy("queue", "q", "sometimes"),
        SubmitJobs((JobSpec("q", on_unknown="sometimes"),), ("j1",)),
        SubmitJobs((JobSpec("q", reconcile_queue=""),), ("j1",)),
    ],
)
def test_bad_policies_are_refused_and_change_nothing(command: object) -> None:
    cluster = Cluster()
    before = cluster.digest()
    result = cluster.one(command)  # type: ignore[arg-type]
    items = getattr(result, "items", (result,))
    assert all(isinstance(item, Rejected) and item.code == "invalid_request" for item in items)
    # A rejection moves only time, exactly as an empty entry at that time does.
    assert cluster.state.sections[RECONCILE].policies == {}
    assert book_of(cluster.state).queues == {}
    assert cluster.digest() == before


def test_a_reconcile_queue_takes_the_question_elsewhere() -> None:
    cluster = Cluster()
    lease = _running(cluster, on_unknown="reconcile", reconcile_queue="audit")
    cluster.run(FailJob(lease.job_id, lease.fencing_token, "unknown"))
    assert cluster.claim(queues=("q",)) == []
    (ask,) = cluster.claim(worker="auditor", queues=("audit",))
    assert ask.reconcile is not None and ask.reconcile.queue == "audit"
    assert ask.queue == "q"


def test_a_paused_queue_grants_no_reconciliation() -> None:
    cluster = Cluster()
    lease = _running(cluster, on_unknown="reconcile")
    cluster.run(FailJob(lease.job_id, lease.fencing_token, "unknown"))
    cluster.run(PauseQueue("q", True))
    assert cluster.claim() == []
    cluster.run(PauseQueue("q", False))
    assert len(cluster.claim()) == 1


# -- the reconciliation lease and the decisions -----------------------------------------


def test_the_reconciliation_lease_names_the_unknown_attempt() -> None:
    cluster = Cluster()
    lease = _running(cluster, on_unknown="reconcile", idempotency_key="pay-1")
    cluster.run(RecordEffect("charge:pay-1", lease.job_id, lease.fencing_token, b"\x01"))
    started_at = cluster.job(lease.job_id).attempts[-1].started_at_ms
    cluster.run(FailJob(lease.job_id, lease.fencing_token, "unknown"))
    ask = cluster.claim_one(worker="r1")
    target = ask.reconcile
    assert target is not None
    assert (target.attempt, target.fencing_token, target.worker_id) == (
        1,
        lease.fencing_token,
        "w1",
    )
    assert target.started_at_ms == started_at
    assert target.effect_keys == ("charge:pay-1",)
    assert ask.idempotency_key == "pay-1"
    assert ask.fencing_token > lease.fencing_token
    assert ask.attempt == 1
    history = cluster.job(lease.job_id).history
    assert history[-1][1:7] == ("claim", "reconciling", "reconciling", "r1", 1, ask.fencing_token)
    # Nobody else gets it while it is leased.
    assert cluster.claim(worker="r2") == []


def test_happened_completes_the_job_and_records_its_effects_first_writer_wins() -> None:
    cluster = Cluster()
    lease, ask = _reconciling(cluster)
    cluster.run(RecordEffect("taken", "other", 1, b"x"))  # a rejected record: no such lease
    other = _running(cluster)
    cluster.run(RecordEffect("taken", other.job_id, other.fencing_token, b"first"))
    decision = ReconcileJob(
        lease.job_id,
        ask.fencing_token,
        "happened",
        b"\xa3ch1",
        (("charge:1", b"\x01"), ("taken", b"second"), ("charge:1", b"\x02")),
        "provider lists ch1",
    )
    result = cluster.one(decision)
    assert result == Reconciled(lease.job_id, "happened", "succeeded", None)
    job = cluster.job(lease.job_id)
    assert job.result == b"\xa3ch1"
    assert [(e.key, e.result, e.fencing_token) for e in job.effects] == [
        ("charge:1", b"\x01", ask.fencing_token)
    ]
    assert cluster.state.effects["taken"][1].result == b"first"
    at, event, from_status, to_status, actor, _, token, detail = job.history[-1]
    assert (event, from_status, to_status, actor, token) == (
        "complete", "reconciling", "succeeded", "r1", ask.fencing_token,
    )  # fmt: skip
    assert detail == "reconciled happened: provider lists ch1"
    assert cluster.state.sections[RECONCILE].tasks == {}
    # Delivered twice (the answer was lost): the same answer, nothing changed.
    before = cluster.digest()
    again = cluster.one(decision)
    assert again == Reconciled(lease.job_id, "happened", "succeeded", None, replayed=True)
    assert cluster.digest() == before


def test_the_unknown_attempts_late_complete_after_happened_is_lease_lost() -> None:
    """The worker whose lease expired while running comes back with its
    complete after the reconciler decided `happened` (found by the chaos
    campaign, docs/chaos.md): its token lost the lease, so 409 lease_lost,
    not a `replayed` success with the reconciler's result; nothing changes."""
    cluster = Cluster()
    lease = _running(cluster, on_unknown="reconcile", lease_ms=1_000)
    cluster.run(Tick(), at=lease.expires_at_ms)
    ask = cluster.claim_one(worker="r1")
    assert ask.reconcile is not None
    cluster.run(ReconcileJob(lease.job_id, ask.fencing_token, "happened", b"\xa1r"))
    assert cluster.job(lease.job_id).status == "succeeded"
    before = cluster.digest()
    late = cluster.one(CompleteJob(lease.job_id, lease.fencing_token, b"\xa1w"))
    assert isinstance(late, Rejected) and late.code == "lease_lost", late
    assert cluster.digest() == before
    assert cluster.job(lease.job_id).result == b"\xa1r"


def test_a_repeated_complete_of_the_attempt_that_succeeded_is_still_replayed() -> None:
    cluster = Cluster()
    lease = _running(cluster, on_unknown="reconcile")
    first = cluster.one(CompleteJob(lease.job_id, lease.fencing_token, b"\xa1w"))
    again = cluster.one(CompleteJob(lease.job_id, lease.fencing_token, b"\xa1x"))
    assert not first.replayed and again.replayed and again.result == b"\xa1w"


def test_did_not_happen_retries_as_the_next_attempt_with_a_higher_token() -> None:
    cluster = Cluster()
    lease, ask = _reconciling(cluster, backoff=NO_BACKOFF)
    result = cluster.one(ReconcileJob(lease.job_id, ask.fencing_token, "did_not_happen"))
    assert isinstance(result, Reconciled) and result.status == "pending"
    retry = cluster.claim_one()
    assert retry.job_id == lease.job_id and retry.reconcile is None
    assert retry.attempt == 2
    assert retry.fencing_token > ask.fencing_token > lease.fencing_token
    cluster.run(StartJob(retry.job_id, retry.fencing_token))
    cluster.run(CompleteJob(retry.job_id, retry.fencing_token))
    assert cluster.job(lease.job_id).status == "succeeded"


def test_did_not_happen_with_the_attempts_spent_dead_letters() -> None:
    cluster = Cluster()
    lease, ask = _reconciling(cluster, max_attempts=1)
    cluster.run(ReconcileJob(lease.job_id, ask.fencing_token, "did_not_happen", reason="none"))
    assert cluster.job(lease.job_id).status == "dead_letter"


def test_cannot_tell_dead_letters_as_unreconciled() -> None:
    cluster = Cluster()
    lease, ask = _reconciling(cluster)
    result = cluster.one(
        ReconcileJob(lease.job_id, ask.fencing_token, "cannot_tell", reason="provider down")
    )
    assert isinstance(result, Reconciled) and result.status == "dead_letter"
    job = cluster.job(lease.job_id)
    assert job.last_error == ("unreconciled", "provider down")
    assert job.history[-1][4] == "r1"


def test_stale_and_bad_decisions_are_refused_and_change_nothing() -> None:
    cluster = Cluster()
    lease, ask = _reconciling(cluster)
    before = cluster.digest()
    token = ask.fencing_token
    too_many = (("k", b""),) * 101
    for command, code in [
        (ReconcileJob(lease.job_id, lease.fencing_token, "happened"), "lease_lost"),
        (ReconcileJob(lease.job_id, ask.fencing_token + 1, "happened"), "lease_lost"),
        (ReconcileJob("nope", ask.fencing_token, "happened"), "not_found"),
        (ReconcileJob(lease.job_id, ask.fencing_token, "maybe"), "invalid_request"),
        (ReconcileJob(lease.job_id, token, "happened", effects=(("", b""),)), "invalid_request"),
        (ReconcileJob(lease.job_id, token, "happened", effects=too_many), "invalid_request"),
        # The reconciliation's token is not a job lease: it cannot complete or fail.
        (CompleteJob(lease.job_id, ask.fencing_token), "lease_lost"),
        (FailJob(lease.job_id, ask.fencing_token, "transient"), "lease_lost"),
        (StartJob(lease.job_id, ask.fencing_token), "lease_lost"),
    ]:  # fmt: skip
        result = cluster.one(command, at=cluster.now_ms)
        assert isinstance(result, Rejected) and result.code == code, command
    assert cluster.digest() == before


def test_a_heartbeat_extends_the_reconciliation_lease() -> None:
    cluster = Cluster()
    lease, ask = _reconciling(cluster)
    result = cluster.one(HeartbeatJob(lease.job_id, ask.fencing_token, 90_000))
    assert result.expires_at_ms == cluster.now_ms + 90_000
    task = book_of(cluster.state).tasks[lease.job_id]
    assert task.lease is not None and task.lease[3] == cluster.now_ms + 90_000
    stale = cluster.one(HeartbeatJob(lease.job_id, lease.fencing_token))
    assert isinstance(stale, Rejected) and stale.code == "lease_lost"


# -- the reconciliation budget --------------------------------------------------------------


def test_expired_reconciliations_are_offered_again_until_the_budget_is_spent() -> None:
    cluster = Cluster()
    lease, ask = _reconciling(cluster, backoff=Backoff(1_000, 1_000, 0))
    for tries in range(1, RECONCILE_TRIES_MAX + 1):
        cluster.run(Tick(), at=ask.expires_at_ms)
        job = cluster.job(lease.job_id)
        if tries == RECONCILE_TRIES_MAX:
            break
        assert job.status == "reconciling"
        assert job.history[-1][1] == "reconcile_expired"
        assert cluster.claim() == []  # it waits out the backoff
        cluster.run(Tick(), at=cluster.now_ms + 1_000)
        ask = cluster.claim_one(worker=f"r{tries + 1}")
        assert ask.reconcile is not None
    assert job.status == "dead_letter"
    assert job.last_error == (
        "unreconciled",
        f"{RECONCILE_TRIES_MAX} reconciliation leases expired unanswered",
    )
    assert book_of(cluster.state).tasks == {}


def test_a_deadline_ends_a_reconciliation() -> None:
    cluster = Cluster()
    lease, _ = _reconciling(cluster, deadline_ms=60_000)
    cluster.run(Tick(), at=cluster.now_ms + 60_000)
    assert cluster.job(lease.job_id).status == "dead_letter"
    assert book_of(cluster.state).tasks == {}


def test_an_operator_may_cancel_a_reconciling_job() -> None:
    cluster = Cluster()
    lease, ask = _reconciling(cluster)
    cluster.run(CancelJob(lease.job_id, "refunded by hand"))
    assert cluster.job(lease.job_id).status == "cancelled"
    late = cluster.one(ReconcileJob(lease.job_id, ask.fencing_token, "happened"))
    assert isinstance(late, Rejected) and late.code == "lease_lost"


def test_a_new_leader_gives_reconciliation_leases_their_full_duration() -> None:
    cluster = Cluster()
    lease, ask = _reconciling(cluster)
    cluster.run(Tick(), at=ask.expires_at_ms - 1, epoch=2)
    task = book_of(cluster.state).tasks[lease.job_id]
    assert task.lease is not None and task.lease[3] == cluster.now_ms + ask.lease_ms


# -- encoding and the version gate ----------------------------------------------------------


def test_a_state_that_never_reconciles_encodes_as_before() -> None:
    cluster = Cluster()
    _running(cluster)
    assert b"reconcile" not in encode_state(cluster.state)


def test_a_reconciling_state_survives_a_snapshot_and_goes_on_identically() -> None:
    cluster = Cluster()
    cluster.run(SetUnknownPolicy("tenant", "acme", "reconcile"))
    lease, ask = _reconciling(cluster, reconcile_queue="q")
    _running(cluster, tenant="acme")
    copy = Cluster()
    copy.state = decode_state(encode_state(cluster.state))
    copy.now_ms = cluster.now_ms
    assert state_digest(copy.state) == cluster.digest()
    for each in (cluster, copy):
        each.run(HeartbeatJob(lease.job_id, ask.fencing_token, 5_000), at=each.now_ms + 1)
        each.run(Tick(seed=3), at=ask.expires_at_ms + 10_000)
        each.run(ClaimJobs("r2", ("q",), 5))
    assert state_digest(copy.state) == cluster.digest()


def test_job_specs_without_the_new_fields_encode_exactly_as_before() -> None:
    assert len(spec_row(JobSpec("q"))) == 14
    assert len(spec_row(JobSpec("q", on_unknown="reconcile"))) == 16
    entry = Entry(1, 5, (SubmitJobs((JobSpec("q", reconcile_queue="rq"),), ("j1",)),))
    assert decode_entry(encode_entry(entry)) == entry


def test_the_new_commands_and_fields_wait_for_cluster_version_5() -> None:
    plain = JobSpec("q")
    reconciled = JobSpec("q", on_unknown="reconcile")
    assert command_version(SubmitJobs((plain,), ("j1",))) == 1
    assert command_version(SubmitJobs((plain, reconciled), ("j1", "j2"))) == 5
    assert command_version(SetUnknownPolicy("queue", "q", "reconcile")) == 5
    assert command_version(Audited("ops", SetUnknownPolicy("queue", "q", "reconcile"))) == 5
    assert command_version(ReconcileJob("j1", 1, "happened")) == 5
    schedule = ScheduleSpec("s", reconciled, cron="0 2 * * *")
    assert command_version(CreateSchedule(schedule)) == 5
    assert command_version(CreateSchedule(ScheduleSpec("s", plain, cron="0 2 * * *"))) == 1


def test_a_bug_inside_a_decision_is_rolled_back_with_the_section(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster()
    lease, ask = _reconciling(cluster)
    before = cluster.digest()

    def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(reconcile_module, "transition", broken)
    decision = ReconcileJob(lease.job_id, ask.fencing_token, "happened", effects=(("k", b"1"),))
    result = cluster.one(decision, at=cluster.now_ms)
    assert isinstance(result, Rejected) and result.code == "internal_error"
    assert cluster.digest() == before
    assert lease.job_id in book_of(cluster.state).tasks
    assert "k" not in cluster.state.effects


# -- replaying what was never reconciled ---------------------------------------------------


def test_an_unreconciled_dead_letter_is_replayed_only_with_the_operators_word() -> None:
    cluster = Cluster()
    lease, ask = _reconciling(cluster)
    cluster.run(ReconcileJob(lease.job_id, ask.fencing_token, "cannot_tell", reason="no record"))
    refused = cluster.one(ReplayJob(lease.job_id, "try again"), at=cluster.now_ms)
    assert isinstance(refused, Rejected) and refused.code == "invalid_state"
    assert refused.details["reason"] == "unreconciled"
    blank = cluster.one(ReplayReconciled(lease.job_id, " "), at=cluster.now_ms)
    assert isinstance(blank, Rejected) and blank.code == "invalid_request"
    audited = Audited("ops (tok_1)", ReplayReconciled(lease.job_id, "refunded by hand", "ops"))
    assert cluster.one(audited) == Replayed(lease.job_id)
    job = cluster.job(lease.job_id)
    assert job.status == "pending"
    assert job.history[-1][1] == "replay" and job.history[-1][4] == "ops"
    assert job.history[-1][7] == "reconciled by operator: refunded by hand"
    assert cluster.state.sections["audit"].entries[-1].kind == "job.replay_reconciled"


def test_a_deadline_during_reconciliation_leaves_it_unreconciled() -> None:
    cluster = Cluster()
    lease, _ = _reconciling(cluster, deadline_ms=60_000)
    cluster.run(Tick(), at=cluster.now_ms + 60_000)
    refused = cluster.one(ReplayJob(lease.job_id, "again"), at=cluster.now_ms)
    assert isinstance(refused, Rejected) and refused.code == "invalid_state"


def test_a_decided_or_ordinary_dead_letter_replays_as_before() -> None:
    cluster = Cluster()
    lease, ask = _reconciling(cluster, max_attempts=1)
    cluster.run(ReconcileJob(lease.job_id, ask.fencing_token, "did_not_happen"))
    assert cluster.job(lease.job_id).status == "dead_letter"
    assert cluster.one(ReplayJob(lease.job_id, "more attempts")) == Replayed(lease.job_id)
    cluster.run(CancelJob(lease.job_id))
    retried = _running(cluster, max_attempts=1, lease_ms=1_000)  # the default policy
    cluster.run(Tick(), at=retried.expires_at_ms)
    assert cluster.job(retried.job_id).status == "dead_letter"
    assert cluster.one(ReplayJob(retried.job_id, "again")) == Replayed(retried.job_id)


@pytest.mark.parametrize("decision", ["happened", "did_not_happen", "cannot_tell", "cancel"])
def test_a_reconciling_job_keeps_its_ordering_key_until_decided(decision: str) -> None:
    cluster = Cluster()
    first = cluster.submit(on_unknown="reconcile", ordering_key="k", backoff=NO_BACKOFF)
    second = cluster.submit(ordering_key="k")
    lease = cluster.claim_one()
    assert lease.job_id == first
    cluster.run(StartJob(first, lease.fencing_token))
    cluster.run(FailJob(first, lease.fencing_token, "unknown"))
    (ask,) = cluster.claim(n=3)  # the reconciliation only: the key is held
    assert ask.job_id == first and ask.reconcile is not None
    if decision == "cancel":
        cluster.run(CancelJob(first))
    else:
        cluster.run(ReconcileJob(first, ask.fencing_token, decision))
    copy = decode_state(encode_state(cluster.state))
    assert state_digest(copy) == cluster.digest()
    expected = {
        "happened": [second],
        "did_not_happen": [first],
        "cannot_tell": [],
        "cancel": [second],
    }
    assert [granted.job_id for granted in cluster.claim(n=3)] == expected[decision]


def test_an_operator_sends_an_unreconciled_dead_letter_back_to_reconciliation() -> None:
    cluster = Cluster()
    lease, ask = _reconciling(cluster, deadline_ms=60_000, ordering_key="k", backoff=NO_BACKOFF)
    queued = cluster.submit(ordering_key="k")
    cluster.run(Tick(), at=cluster.now_ms + 60_000)  # the deadline ends the reconciliation
    assert cluster.job(lease.job_id).status == "dead_letter"
    audited = Audited("ops (tok_1)", RequestReconcile(lease.job_id, "provider back", "ops"))
    assert cluster.one(audited) == Ack()
    job = cluster.job(lease.job_id)
    assert job.status == "reconciling" and job.deadline_at_ms is None
    assert job.history[-1][1:5] == ("reconcile", "dead_letter", "reconciling", "ops")
    assert cluster.state.sections["audit"].entries[-1].kind == "job.reconcile"
    (again,) = cluster.claim(n=3)  # a fresh reconciliation; the key is still held
    assert again.reconcile is not None and again.reconcile.fencing_token == lease.fencing_token
    assert again.fencing_token > ask.fencing_token
    cluster.run(ReconcileJob(lease.job_id, again.fencing_token, "did_not_happen"))
    assert [granted.job_id for granted in cluster.claim(n=3)] == [lease.job_id]
    assert cluster.job(queued).status == "pending"
    copy = decode_state(encode_state(cluster.state))
    assert state_digest(copy) == cluster.digest()


def test_only_an_unreconciled_dead_letter_goes_back_to_reconciliation() -> None:
    cluster = Cluster()
    plain = _running(cluster)
    cluster.run(FailJob(plain.job_id, plain.fencing_token, "permanent"))
    before = cluster.digest()
    refused = cluster.one(RequestReconcile(plain.job_id, "why not"), at=cluster.now_ms)
    assert isinstance(refused, Rejected) and refused.code == "invalid_state"
    missing = cluster.one(RequestReconcile("nope"), at=cluster.now_ms)
    assert isinstance(missing, Rejected) and missing.code == "not_found"
    assert cluster.digest() == before
