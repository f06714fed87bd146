"""The outbox and webhook subscriptions, command by command."""

from __future__ import annotations

from dataclasses import replace

import msgpack
import pytest
from core_support import Cluster, assert_rejected_unchanged

from raftsched.core import State, check_invariants, decode_state, encode_state
from raftsched.core.events.commands import (
    AckDelivery,
    AckParked,
    ConfigureOutbox,
    CreateSubscription,
    DeleteSubscription,
    ParkDelivery,
    RetryParked,
)
from raftsched.core.events.subscriptions import PARKED_MAX, subscriptions
from raftsched.core.jobs.commands import CancelJob, CompleteJob, FailJob
from raftsched.core.kernel.commands import Tick
from raftsched.core.kernel.outbox import (
    decode_data,
    emit,
    events_after,
    first_held_seq,
    last_seq,
    outbox,
)
from raftsched.core.kernel.results import Ack, ParkedRetried, SubscriptionCreated
from raftsched.core.kernel.savepoint import Savepoint


def _types(cluster: Cluster) -> list[str]:
    return [event.type for event in events_after(cluster.state, 0, None, 1000)]


def test_job_final_transitions_emit_events_in_the_same_command() -> None:
    cluster = Cluster()
    lease = cluster.start()
    assert _types(cluster) == []
    cluster.one(CompleteJob(lease.job_id, lease.fencing_token, msgpack.packb({"ok": 1})))
    (event,) = events_after(cluster.state, 0)
    assert (event.seq, event.type, event.at_ms) == (1, "job.succeeded", cluster.now_ms)
    assert decode_data(event) == {
        "job_id": lease.job_id, "queue": "q", "tenant": "default", "attempts": 1,
    }  # fmt: skip


def test_dead_letter_and_cancel_emit() -> None:
    cluster = Cluster()
    lease = cluster.start()
    cluster.one(FailJob(lease.job_id, lease.fencing_token, "permanent", "card declined"))
    queued = cluster.submit()
    cluster.one(CancelJob(queued))
    assert _types(cluster) == ["job.dead_lettered", "job.cancelled"]
    assert decode_data(events_after(cluster.state, 0)[0])["error_kind"] == "permanent"


def test_transient_failure_emits_nothing() -> None:
    cluster = Cluster()
    lease = cluster.start()
    cluster.one(FailJob(lease.job_id, lease.fencing_token, "transient", "later"))
    assert _types(cluster) == []


def test_events_after_filters_by_seq_type_and_limit() -> None:
    cluster = Cluster()
    for kind in ("a.x", "b.y", "a.z", "b.y"):
        emit(cluster.state, kind, {}, Savepoint(cluster.state))
    assert [e.seq for e in events_after(cluster.state, 1)] == [2, 3, 4]
    assert [e.seq for e in events_after(cluster.state, 0, ["b.y"])] == [2, 4]
    assert [e.seq for e in events_after(cluster.state, 0, ["a.*"])] == [1, 3]
    assert [e.seq for e in events_after(cluster.state, 0, None, 2)] == [1, 2]
    assert last_seq(cluster.state) == 4


def test_retention_trims_and_seq_is_never_reused() -> None:
    cluster = Cluster()
    cluster.one(ConfigureOutbox(retention_ms=1_000))
    emit(cluster.state, "x", {}, Savepoint(cluster.state))
    emit(cluster.state, "x", {}, Savepoint(cluster.state))
    assert cluster.state.sections["outbox"].retention_ms == 1_000
    cluster.one(Tick(), at=cluster.now_ms + 999)
    assert len(outbox(cluster.state)) == 2
    cluster.one(Tick(), at=cluster.now_ms + 1)
    assert len(outbox(cluster.state)) == 0
    assert first_held_seq(cluster.state) == 3
    emit(cluster.state, "x", {}, Savepoint(cluster.state))
    assert [e.seq for e in events_after(cluster.state, 0)] == [3]


def test_subscription_cursor_holds_back_trimming() -> None:
    cluster = Cluster()
    cluster.one(ConfigureOutbox(retention_ms=0))
    result = cluster.one(CreateSubscription("s1", "http://127.0.0.1:9/hook", ("job.*",), "k"))
    assert result == SubscriptionCreated("s1", True, 0)
    for _ in range(3):
        emit(cluster.state, "job.succeeded", {}, Savepoint(cluster.state))
    cluster.one(Tick())
    assert len(outbox(cluster.state)) == 3
    cluster.one(AckDelivery("s1", 2))
    cluster.one(Tick())
    assert [e.seq for e in events_after(cluster.state, 0)] == [3]
    cluster.one(DeleteSubscription("s1"))
    cluster.one(Tick())
    assert len(outbox(cluster.state)) == 0


def test_full_outbox_drops_the_oldest_and_counts() -> None:
    cluster = Cluster()
    cluster.one(ConfigureOutbox(events_max=2))
    for _ in range(5):
        emit(cluster.state, "x", {}, Savepoint(cluster.state))
    box = outbox(cluster.state)
    assert [e.seq for e in events_after(cluster.state, 0)] == [4, 5]
    assert box.dropped == 3
    assert check_invariants(cluster.state) == []


def test_create_subscription_is_idempotent_and_validated() -> None:
    cluster = Cluster()
    emit(cluster.state, "x", {}, Savepoint(cluster.state))
    command = CreateSubscription("s1", "https://example.test/h", ("job.succeeded",), "secret")
    assert cluster.one(command) == SubscriptionCreated("s1", True, 1)
    assert cluster.one(command) == SubscriptionCreated("s1", False, 1)
    assert_rejected_unchanged(
        cluster, CreateSubscription("s1", "https://other.test/", (), "secret"),
        "idempotency_conflict",
    )  # fmt: skip
    bad = assert_rejected_unchanged(
        cluster, CreateSubscription("s2", "ftp://x", (), "secret"), "invalid_request"
    )
    assert bad.details == {"field": "url"}
    bad = assert_rejected_unchanged(
        cluster, CreateSubscription("s2", "http://x", (), ""), "invalid_request"
    )
    assert bad.details == {"field": "secret"}
    assert_rejected_unchanged(cluster, DeleteSubscription("nope"), "not_found")


def test_ack_only_moves_forward_and_not_beyond_the_outbox() -> None:
    cluster = Cluster()
    cluster.one(CreateSubscription("s1", "http://h/", (), "k"))
    emit(cluster.state, "x", {}, Savepoint(cluster.state))
    emit(cluster.state, "x", {}, Savepoint(cluster.state))
    assert cluster.one(AckDelivery("s1", 2)) == Ack()
    cluster.one(AckDelivery("s1", 1))
    assert subscriptions(cluster.state)["s1"].cursor == 2
    assert_rejected_unchanged(cluster, AckDelivery("s1", 3), "invalid_request")


def test_park_retry_and_ack_parked() -> None:
    cluster = Cluster()
    cluster.one(CreateSubscription("s1", "http://h/", (), "k"))
    emit(cluster.state, "x", {"n": 1}, Savepoint(cluster.state))
    assert cluster.one(ParkDelivery("s1", 1, 8, "HTTP 500")) == Ack()
    cluster.one(AckDelivery("s1", 1))
    cluster.one(ConfigureOutbox(retention_ms=0))
    cluster.one(Tick())
    assert len(outbox(cluster.state)) == 0  # the parked copy lives on
    sub = subscriptions(cluster.state)["s1"]
    assert sub.parked[1].attempts == 8 and sub.parked[1].error == "HTTP 500"
    assert decode_data(sub.parked[1].event) == {"n": 1}
    assert cluster.one(RetryParked("s1")) == ParkedRetried("s1", 1)
    assert sub.parked[1].retry is True
    # A retried delivery that fails again is parked again with the new error.
    cluster.one(ParkDelivery("s1", 1, 3, "timeout"))
    assert sub.parked[1].retry is False and sub.parked[1].error == "timeout"
    cluster.one(AckParked("s1", 1))
    assert sub.parked == {}
    # A park of an event already past the cursor and not parked is a repeat.
    before = cluster.digest()
    assert cluster.one(ParkDelivery("s1", 1, 3, "x")) == Ack()
    assert cluster.digest() == before


def test_parked_events_are_bounded() -> None:
    cluster = Cluster()
    cluster.one(CreateSubscription("s1", "http://h/", (), "k"))
    for _ in range(PARKED_MAX + 2):
        emit(cluster.state, "x", {}, Savepoint(cluster.state))
    cluster.run(*(ParkDelivery("s1", seq, 1, "e") for seq in range(1, PARKED_MAX + 3)))
    sub = subscriptions(cluster.state)["s1"]
    assert len(sub.parked) == PARKED_MAX and sub.parked_dropped == 2
    assert min(sub.parked) == 3


def test_sections_survive_a_snapshot_byte_for_byte() -> None:
    cluster = Cluster()
    cluster.one(CreateSubscription("s1", "http://h/", ("job.*",), "k"))
    lease = cluster.start()
    cluster.one(CompleteJob(lease.job_id, lease.fencing_token))
    emit(cluster.state, "x", {}, Savepoint(cluster.state))
    cluster.one(ParkDelivery("s1", 2, 1, "e"))
    data = encode_state(cluster.state)
    copy = decode_state(data)
    assert encode_state(copy) == data
    assert check_invariants(copy) == []
    assert [e.type for e in events_after(copy, 0)] == ["job.succeeded", "x"]


def test_a_rolled_back_command_takes_its_events_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster()
    emit(cluster.state, "before", {}, Savepoint(cluster.state))
    lease = cluster.start()
    before = cluster.digest()

    def emit_then_raise(state: State, job: object, savepoint: Savepoint) -> None:
        emit(state, "job.succeeded", {}, savepoint)
        raise RuntimeError("boom")

    hooks = cluster.state.hooks
    monkeypatch.setattr(cluster.state, "hooks", replace(hooks, on_job_finished=(emit_then_raise,)))
    result = cluster.one(CompleteJob(lease.job_id, lease.fencing_token))
    assert result.code == "internal_error"
    assert cluster.digest() == before
    assert last_seq(cluster.state) == 1
