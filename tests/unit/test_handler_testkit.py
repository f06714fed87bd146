"""The handler test kit (`raftsched.testing.run_handler`, `run_reconciler`):
one handler through the worker's own code on an in-process lease. Each test
names the real worker's rule it holds the kit to."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from param_ids import stable_id
from raftsched.client import InvalidRequest, LeaseLost
from raftsched.testing import (
    Seen,
    arun_handler,
    arun_reconciler,
    run_handler,
    run_reconciler,
)
from raftsched.worker import (
    CannotTell,
    Decision,
    DidNotHappen,
    Happened,
    JobCancelled,
    JobContext,
    PermanentError,
    ReconcileContext,
    TransientError,
)


class Provider:
    """Counts the calls it gets, so a test sees when `fn` really ran."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def charge(self, payment: str) -> dict[str, Any]:
        self.calls.append(payment)
        return {"charge_id": f"ch_{payment}_{len(self.calls)}"}


def charging(provider: Provider) -> Any:
    def handle(ctx: JobContext) -> dict[str, Any]:
        payment = ctx.payload["payment"]
        charge = ctx.effect(f"charge:{payment}", lambda: provider.charge(payment))
        return {"charge": charge["charge_id"], "attempt": ctx.attempt}

    return handle


# -- the ledger ------------------------------------------------------------------


def test_an_effect_is_recorded_and_the_job_succeeds() -> None:
    provider = Provider()
    outcome = run_handler(charging(provider), {"payment": "p1"})
    assert outcome.status == "succeeded"
    assert outcome.result == {"charge": "ch_p1_1", "attempt": 1}
    assert outcome.effects == {"charge:p1": {"charge_id": "ch_p1_1"}}
    assert outcome.ledger == outcome.effects and outcome.replayed == ()
    assert outcome.error is None and outcome.message is None
    assert outcome.report == {
        "op": "complete",
        "job_id": "job_test",
        "fencing_token": 1,
        "result": {"charge": "ch_p1_1", "attempt": 1},
    }
    assert provider.calls == ["p1"]


def test_a_recorded_effect_is_returned_without_calling_fn() -> None:
    provider = Provider()
    first = run_handler(charging(provider), {"payment": "p1"})
    again = run_handler(charging(provider), {"payment": "p1"}, attempt=2, effects=first.ledger)
    assert provider.calls == ["p1"]
    assert again.status == "succeeded"
    assert again.result == {"charge": "ch_p1_1", "attempt": 2}
    assert again.replayed == ("charge:p1",) and again.effects == {}
    assert again.report is not None and again.report["fencing_token"] == 2


def test_given_effects_are_what_another_attempt_recorded() -> None:
    provider = Provider()
    outcome = run_handler(
        charging(provider), {"payment": "p1"}, effects={"charge:p1": {"charge_id": "ch_earlier"}}
    )
    assert provider.calls == []
    assert outcome.result == {"charge": "ch_earlier", "attempt": 1}


def test_the_first_writer_wins_within_a_run_too() -> None:
    def handle(ctx: JobContext) -> list[Any]:
        return [ctx.effect("k", lambda: "first"), ctx.effect("k", lambda: "second")]

    outcome = run_handler(handle)
    assert outcome.result == ["first", "first"]
    assert outcome.effects == {"k": "first"} and outcome.replayed == ("k",)


def test_what_crosses_the_wire_comes_back_as_json() -> None:
    def handle(ctx: JobContext) -> Any:
        assert ctx.payload == {"pair": [1, 2]} and ctx.inputs == {"step": {"n": 1}}
        return ctx.effect("t", lambda: (3, 4))

    outcome = run_handler(handle, {"pair": (1, 2)}, inputs={"step": {"n": 1}})
    assert outcome.status == "succeeded" and outcome.result == [3, 4]


def test_a_bad_effect_key_is_the_clusters_invalid_request() -> None:
    outcome = run_handler(lambda ctx: ctx.effect("", lambda: 1))
    assert outcome.status == "failed_transient"
    assert isinstance(outcome.error, InvalidRequest)
    assert outcome.message == (
        "invalid_request: key must be a non-empty string of at most 256 chars"
    )


# -- how a run ends --------------------------------------------------------------


def test_a_permanent_error_dead_letters() -> None:
    def handle(ctx: JobContext) -> None:
        raise PermanentError("card declined")

    outcome = run_handler(handle)
    assert outcome.status == "failed_permanent"
    assert isinstance(outcome.error, PermanentError)
    assert outcome.message == "PermanentError: card declined"
    assert outcome.report is not None and outcome.report["error"]["kind"] == "permanent"


@pytest.mark.parametrize(
    ("raised", "retry_after_s"),
    [(TransientError("busy", retry_after_s=7.5), 7.5), (ConnectionError("reset"), None)],
)
def test_other_errors_are_transient(raised: Exception, retry_after_s: float | None) -> None:
    def handle(ctx: JobContext) -> None:
        raise raised

    outcome = run_handler(handle)
    assert outcome.status == "failed_transient"
    assert outcome.error is raised and outcome.retry_after_s == retry_after_s


@pytest.mark.parametrize("result", [{"when": object()}, {"ratio": float("nan")}], ids=stable_id)
def test_a_result_that_is_not_json_fails_permanently(result: Any) -> None:
    """NaN too: sent, the node would refuse the whole lease batch carrying it."""
    outcome = run_handler(lambda ctx: result)
    assert outcome.status == "failed_permanent" and outcome.error is None
    assert outcome.message is not None
    assert outcome.message.startswith("result must be JSON the API takes: ")


def test_an_async_handler_awaits_its_effects() -> None:
    async def handle(ctx: JobContext) -> dict[str, Any]:
        async def charge() -> str:
            await asyncio.sleep(0)
            return "ch_1"

        ctx.progress({"step": "charging"})
        charge_id = await ctx.aeffect("charge:p1", charge)
        ctx.progress({"step": "done"})
        return {"charge": charge_id}

    outcome = run_handler(handle)
    assert outcome.status == "succeeded" and outcome.result == {"charge": "ch_1"}
    assert outcome.progress == ({"step": "charging"}, {"step": "done"})


def test_the_blocking_effect_is_refused_in_an_async_handler() -> None:
    async def handle(ctx: JobContext) -> Any:
        return ctx.effect("k", lambda: 1)

    outcome = run_handler(handle)
    assert outcome.status == "failed_transient" and isinstance(outcome.error, RuntimeError)
    assert "aeffect" in str(outcome.error) and outcome.ledger == {}


@pytest.mark.parametrize(
    "details", [{"at": object()}, {"ratio": float("nan")}, "\ud800", 2**64], ids=stable_id
)
def test_progress_must_be_json_the_api_takes(details: Any) -> None:
    """As a worker's `ctx.progress` refuses it: the same check, the same error."""
    outcome = run_handler(lambda ctx: ctx.progress(details))
    assert outcome.status == "failed_transient" and isinstance(outcome.error, TypeError)
    assert str(outcome.error).startswith("progress must be JSON the API takes: ")
    assert outcome.progress == ()


def test_heartbeats_keep_a_short_lease_past_its_length() -> None:
    def handle(ctx: JobContext) -> str:
        for step in range(8):
            ctx.progress({"step": step})
            time.sleep(0.1)
        return "done"

    outcome = run_handler(handle, lease_s=0.5)
    assert outcome.status == "succeeded" and outcome.result == "done"
    assert [p["step"] for p in outcome.progress] == list(range(8))


def test_a_run_whose_heartbeats_never_pause_still_ends() -> None:
    """With a 0.2 s lease the worker renews without pause, each answer in the
    same loop turn: Python 3.11's wait_for then swallowed the keeper's cancel,
    and the run never reported (it raised TimeoutError here)."""

    def handle(ctx: JobContext) -> str:
        time.sleep(0.3)
        return "done"

    outcome = run_handler(handle, lease_s=0.2, timeout_s=10)
    assert outcome.error is None  # the handler returned, and its return was handled
    # On a loaded machine a renewal can come too late: then the complete is refused.
    assert (outcome.status, outcome.result) in {("succeeded", "done"), ("lease_lost", None)}


# -- cancellation ----------------------------------------------------------------


def cooperative(ctx: JobContext) -> str:
    for _ in range(200):
        ctx.check_cancelled()
        time.sleep(0.01)
    return "not cancelled"


def test_a_cancel_request_stops_a_cooperative_sync_handler() -> None:
    outcome = run_handler(cooperative, cancel_after=0.05)
    assert outcome.status == "cancelled" and outcome.cancel_reason == "cancel_requested"
    assert isinstance(outcome.error, JobCancelled)
    assert outcome.message == "handler stopped: cancel_requested"


def test_a_cancel_request_stops_an_async_handler_at_its_next_await() -> None:
    async def handle(ctx: JobContext) -> str:
        await asyncio.sleep(5)
        return "not cancelled"

    outcome = run_handler(handle, cancel_after=0.05)
    assert outcome.status == "cancelled"
    assert isinstance(outcome.error, asyncio.CancelledError)


@pytest.mark.parametrize("reason", ["shutdown", "deadline"])
def test_a_stopped_worker_reports_an_unknown_outcome(reason: Any) -> None:
    outcome = run_handler(cooperative, cancel_after=0.05, cancel_reason=reason)
    assert outcome.status == "failed_unknown" and outcome.cancel_reason == reason


def test_cancel_when_stops_the_run_right_after_an_effect() -> None:
    provider = Provider()

    def handle(ctx: JobContext) -> None:
        ctx.effect("charge:p1", lambda: provider.charge("p1"))
        ctx.check_cancelled()
        ctx.effect("email:p1", lambda: provider.charge("email"))

    outcome = run_handler(handle, cancel_when=lambda seen: "charge:p1" in seen.effects)
    assert outcome.status == "cancelled"
    assert list(outcome.effects) == ["charge:p1"] and provider.calls == ["p1"]


def test_cancel_when_sees_progress() -> None:
    def handle(ctx: JobContext) -> None:
        for step in range(10):
            ctx.progress(step)
            ctx.check_cancelled()

    seen_at_cancel: list[Seen] = []

    def third_step(seen: Seen) -> bool:
        if len(seen.progress) == 3:
            seen_at_cancel.append(seen)
            return True
        return False

    outcome = run_handler(handle, cancel_when=third_step)
    assert outcome.status == "cancelled" and outcome.progress == (0, 1, 2)
    assert len(seen_at_cancel) == 1


def test_a_lost_lease_fences_off_the_effects_and_the_report() -> None:
    provider = Provider()

    def slow_charge() -> dict[str, Any]:
        time.sleep(0.2)  # the lease is lost meanwhile
        return provider.charge("p1")

    def handle(ctx: JobContext) -> None:
        ctx.effect("charge:p1", slow_charge)

    outcome = run_handler(handle, cancel_after=0.05, cancel_reason="lease_lost")
    assert outcome.status == "lease_lost" and outcome.report is None
    assert isinstance(outcome.error, LeaseLost)
    assert outcome.ledger == {} and provider.calls == ["p1"]


def test_a_handler_that_knows_it_lost_the_lease_does_not_call_fn() -> None:
    provider = Provider()

    def handle(ctx: JobContext) -> None:
        time.sleep(0.2)  # the lease is lost meanwhile; the handler does not look
        ctx.effect("charge:p1", lambda: provider.charge("p1"))

    outcome = run_handler(handle, cancel_after=0.05, cancel_reason="lease_lost")
    assert outcome.status == "lease_lost" and isinstance(outcome.error, JobCancelled)
    assert provider.calls == []


def test_a_handler_that_ignores_a_cancel_loses_its_lease() -> None:
    def handle(ctx: JobContext) -> str:
        time.sleep(1.0)
        return "finished anyway"

    outcome = run_handler(handle, lease_s=0.3, cancel_after=0.05)
    # The worker stopped renewing one lease after the cancel; the cluster
    # ends the job cancelled, and the late complete is refused.
    assert outcome.status == "lease_lost" and outcome.cancel_reason == "cancel_requested"


def test_a_handler_past_the_timeout_is_abandoned() -> None:
    release = threading.Event()

    def handle(ctx: JobContext) -> None:
        release.wait(10)

    try:
        with pytest.raises(TimeoutError, match="still running after 0.2 s"):
            run_handler(handle, timeout_s=0.2)
    finally:
        release.set()


def test_arun_handler_runs_on_the_tests_own_loop() -> None:
    async def scenario() -> None:
        outcome = await arun_handler(lambda ctx: ctx.job_id, job_id="job_42")
        assert outcome.result == "job_42"

    asyncio.run(scenario())


def test_the_lease_carries_what_was_given() -> None:
    def handle(ctx: JobContext) -> dict[str, Any]:
        return {
            "job_id": ctx.job_id,
            "queue": ctx.queue,
            "key": ctx.idempotency_key,
            "attempt": ctx.attempt,
            "token": ctx.fencing_token,
            "worker": ctx.worker_id,
        }

    outcome = run_handler(
        handle, job_id="job_7", queue="payments", idempotency_key="pay_7", attempt=3
    )
    assert outcome.result == {
        "job_id": "job_7",
        "queue": "payments",
        "key": "pay_7",
        "attempt": 3,
        "token": 3,
        "worker": "testkit",
    }


# -- reconcile handlers ----------------------------------------------------------


def test_happened_records_its_effects_first_writer_wins() -> None:
    def was_charged(ctx: ReconcileContext) -> Decision:
        assert ctx.effect_keys == ("fee:p1",) and ctx.attempt.number == 2
        return Happened(
            {"charge": "ch_1"},
            effects={"charge:p1": "ch_1", "fee:p1": "late"},
            reason="the provider lists ch_1",
        )

    outcome = run_reconciler(
        was_charged, {"payment": "p1"}, effects={"fee:p1": "early"}, unknown_attempt=2
    )
    assert outcome.decision == "happened" and outcome.result == {"charge": "ch_1"}
    assert outcome.reason == "the provider lists ch_1"
    assert outcome.effects == {"charge:p1": "ch_1"}
    assert outcome.ledger == {"fee:p1": "early", "charge:p1": "ch_1"}
    assert outcome.answer is not None and outcome.answer["fencing_token"] == 3


@pytest.mark.parametrize(
    ("decision", "name"),
    [(DidNotHappen("no charge"), "did_not_happen"), (CannotTell("provider down"), "cannot_tell")],
)
def test_the_other_decisions(decision: Decision, name: str) -> None:
    outcome = run_reconciler(lambda ctx: decision)
    assert outcome.decision == name and outcome.reason == decision.reason
    assert outcome.effects == {} and outcome.error is None


def test_a_reconciler_that_raises_gives_no_answer() -> None:
    def broken(ctx: ReconcileContext) -> Decision:
        raise ConnectionError("provider unreachable")

    outcome = run_reconciler(broken)
    assert outcome.decision is None and outcome.answer is None
    assert isinstance(outcome.error, ConnectionError)


@pytest.mark.parametrize(
    "decision",
    [Happened(result={"ratio": float("nan")}), Happened(effects={"charge:1": {1, 2}})],
    ids=repr,
)
def test_a_happened_the_api_would_refuse_is_no_answer(decision: Decision) -> None:
    """Refused before the batch that would carry it (and others' ops) is sent."""
    outcome = run_reconciler(lambda ctx: decision)
    assert outcome.decision is None and outcome.answer is None
    assert isinstance(outcome.error, TypeError)
    assert str(outcome.error).startswith("Happened.")


def test_a_reconciler_must_return_a_decision() -> None:
    outcome = run_reconciler(lambda ctx: {"happened": True})  # type: ignore[arg-type,return-value]
    assert outcome.decision is None and isinstance(outcome.error, TypeError)


def test_an_async_reconciler_and_its_cancellation() -> None:
    async def lookup(ctx: ReconcileContext) -> Decision:
        await asyncio.sleep(0)
        return DidNotHappen(f"nothing for {ctx.payload['payment']}")

    async def slow(ctx: ReconcileContext) -> Decision:
        await asyncio.sleep(5)
        return DidNotHappen()

    async def scenario() -> None:
        answered = await arun_reconciler(lookup, {"payment": "p1"})
        assert answered.decision == "did_not_happen" and answered.reason == "nothing for p1"
        cancelled = await arun_reconciler(slow, cancel_after=0.05)
        assert cancelled.decision is None
        assert isinstance(cancelled.error, asyncio.CancelledError)

    asyncio.run(scenario())


def test_a_sync_reconciler_that_answers_after_losing_its_lease_is_not_heard() -> None:
    def slow(ctx: ReconcileContext) -> Decision:
        time.sleep(0.2)
        return DidNotHappen()

    outcome = run_reconciler(slow, cancel_after=0.05)
    assert outcome.decision is None and outcome.answer is None


def test_a_handler_sees_the_kind_it_is_run_for() -> None:
    outcome = run_handler(lambda ctx: ctx.kind, kind="charge")
    assert outcome.result == "charge"
    assert run_handler(lambda ctx: ctx.kind).result is None
