"""Random runs of payments against a provider that cannot deduplicate.

Workers charge a fake provider (a count per payment) while they hold the
job's current lease, and then crash at any point: before the charge, after
it and before recording it, or after recording it; leases expire; workers
fail attempts `unknown`; reconcilers answer truthfully from the provider's
books or crash themselves. With `on_unknown: reconcile` no payment is ever
charged twice and every succeeded payment was charged exactly once. The same
kind of run with the default policy finds a double charge (the negative
control), so the property is not vacuous.

The model's one assumption is the protocol's: a provider call starts only
while the caller's lease is current (a call that reaches the provider after
the job was reconciled and retried cannot be told apart by anyone).
"""

from __future__ import annotations

import pytest
from core_support import Cluster
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from raftsched.core import decode_state, encode_state, state_digest
from raftsched.core.jobs.commands import (
    CompleteJob,
    FailJob,
    ReconcileJob,
    RecordEffect,
    StartJob,
)
from raftsched.core.jobs.reconcile_report import reconciliation_report
from raftsched.core.kernel.commands import Backoff, Tick
from raftsched.core.kernel.results import Lease

PAYMENTS = 4


class Payments(RuleBasedStateMachine):
    POLICY = "reconcile"

    def __init__(self) -> None:
        super().__init__()
        self.cluster = Cluster()
        self.charges = {f"job_{n}": 0 for n in range(1, PAYMENTS + 1)}
        for _ in range(PAYMENTS):
            self.cluster.submit(
                on_unknown=self.POLICY, lease_ms=1_000, max_attempts=10, backoff=Backoff(0, 0, 0)
            )
        # The reconciliation report's log, built from here on: every step's
        # invariants compare it with a build from the jobs (reconcile_log.check).
        reconciliation_report(self.cluster.state, 168, 1000)
        # What live workers hold: job id -> its lease, and whether it started.
        self.workers: dict[str, Lease] = {}
        self.started: set[str] = set()
        self.reconcilers: dict[str, Lease] = {}

    def _current(self, job_id: str) -> bool:
        job = self.cluster.job(job_id)
        lease = self.workers.get(job_id)
        return (
            job.lease is not None
            and lease is not None
            and job.lease.fencing_token == (lease.fencing_token)
        )

    @rule(n=st.integers(1, 3))
    def claim(self, n: int) -> None:
        for lease in self.cluster.claim(worker="w", n=n):
            if lease.reconcile is not None:
                self.reconcilers[lease.job_id] = lease
            else:
                self.workers[lease.job_id] = lease
                self.started.discard(lease.job_id)

    @rule(data=st.data())
    @precondition(lambda self: self.workers)
    def start(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.workers)))
        self.cluster.run(StartJob(job_id, self.workers[job_id].fencing_token))
        self.started.add(job_id)

    @rule(data=st.data(), crash=st.sampled_from(["none", "before_record", "unknown"]))
    @precondition(lambda self: self.started)
    def charge(self, data: st.DataObject, crash: str) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.started)))
        if not self._current(job_id):
            return  # the worker learns on its next call that its lease is gone
        lease = self.workers[job_id]
        self.charges[job_id] += 1
        if crash == "before_record":  # SIGKILL between the provider and the ledger
            del self.workers[job_id]
            self.started.discard(job_id)
            return
        if crash == "unknown":  # the call timed out: the worker cannot tell
            self.cluster.run(FailJob(job_id, lease.fencing_token, "unknown", "timed out"))
            del self.workers[job_id]
            self.started.discard(job_id)
            return
        self.cluster.run(
            RecordEffect(f"charge:{job_id}", job_id, lease.fencing_token, b"\x01"),
            CompleteJob(job_id, lease.fencing_token),
        )
        del self.workers[job_id]
        self.started.discard(job_id)

    @rule(data=st.data())
    @precondition(lambda self: self.workers)
    def worker_dies_before_the_call(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.workers)))
        del self.workers[job_id]
        self.started.discard(job_id)

    @rule(step_ms=st.sampled_from([0, 400, 1_000, 1_500]))
    def time_passes(self, step_ms: int) -> None:
        self.cluster.run(Tick(seed=step_ms), at=self.cluster.now_ms + step_ms)

    @rule(data=st.data(), crash=st.booleans())
    @precondition(lambda self: self.reconcilers)
    def reconcile(self, data: st.DataObject, crash: bool) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.reconcilers)))
        ask = self.reconcilers.pop(job_id)
        if crash:
            return  # its lease expires and the question is asked again
        if self.charges[job_id] > 0:
            effects = ((f"charge:{job_id}", b"\x01"),)
            command = ReconcileJob(job_id, ask.fencing_token, "happened", b"\xc0", effects, "found")
        else:
            command = ReconcileJob(job_id, ask.fencing_token, "did_not_happen", reason="none")
        self.cluster.run(command)

    @invariant()
    def no_payment_is_charged_twice(self) -> None:
        for job_id, charges in self.charges.items():
            assert charges <= 1, (job_id, charges)
            if self.cluster.job(job_id).status == "succeeded":
                assert charges == 1, job_id

    @invariant()
    def a_snapshot_holds_the_same_state(self) -> None:
        state = self.cluster.state
        decoded = decode_state(encode_state(state))
        assert state_digest(decoded) == state_digest(state)
        # A replica that decoded it (and builds its log anew) reports alike.
        assert reconciliation_report(decoded, 24, 1000) == reconciliation_report(state, 24, 1000)


TestPayments = Payments.TestCase
TestPayments.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class RetriedPayments(Payments):
    POLICY = "retry"


def test_with_retry_the_same_runs_find_a_double_charge() -> None:
    """The negative control: the same machine with the default policy."""
    with pytest.raises(AssertionError) as found:
        run_state_machine_as_test(
            RetriedPayments,
            settings=settings(
                max_examples=300,
                stateful_step_count=40,
                deadline=None,
                database=None,
                derandomize=True,  # the same runs every time: a control must not flake
                phases=[Phase.generate],  # the first double charge will do
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    assert "2)" in str(found.value)  # (job id, 2 charges)


def test_with_retry_a_crash_after_the_charge_charges_twice() -> None:
    """The negative control: the crash after the charge, retried blindly."""
    cluster = Cluster()
    job_id = cluster.submit(lease_ms=1_000, backoff=Backoff(0, 0, 0))
    charges = 0
    for _ in range(2):
        lease = cluster.claim_one()
        cluster.run(StartJob(job_id, lease.fencing_token))
        charges += 1  # the provider charged; the worker is killed before recording
        cluster.run(Tick(), at=lease.expires_at_ms)
    assert cluster.job(job_id).status == "pending"
    assert charges == 2
