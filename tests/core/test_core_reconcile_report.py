"""The reconciliation report (issue 17, item 6) and the derived log it reads.

Each test builds a state, makes unknown outcomes and decisions happen, and
reads the exact report. `Cluster.run` checks the invariants after every
step, which include `reconcile_log.check`: once built, the log holds exactly
what a build from the jobs finds, so the hooks and the build never disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from core_support import T0, Cluster

from raftsched.core import (
    apply_encoded,
    check_invariants,
    decode_state,
    encode_state,
    new_state,
    state_digest,
)
from raftsched.core.jobs.commands import (
    CancelJob,
    Configure,
    FailJob,
    ReconcileJob,
    RequestReconcile,
    StartJob,
)
from raftsched.core.jobs.reconcile_book import RECONCILE_TRIES_MAX, book_of
from raftsched.core.jobs.reconcile_log import HOUR_MS, WINDOW_MS_MAX
from raftsched.core.jobs.reconcile_report import (
    CompletedJob,
    ReconcilingJob,
    reconciliation_report,
    window_start_ms,
)
from raftsched.core.kernel.commands import Backoff, Tick
from raftsched.core.kernel.results import Lease

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import golden  # noqa: E402  (tests/fixtures is not a package)

NO_BACKOFF = Backoff(0, 0, 0)
# A round hour, so that the tests can say which hour a record falls in.
HOUR_0 = 500 * HOUR_MS


def _running(cluster: Cluster, **fields: object) -> Lease:
    job_id = cluster.submit(**fields)
    lease = cluster.claim_one(queues=(str(fields.get("queue", "q")),))
    assert lease.job_id == job_id
    cluster.run(StartJob(job_id, lease.fencing_token))
    return lease


def _unknown(cluster: Cluster, **fields: object) -> Lease:
    """A job whose running attempt failed `unknown`; a `reconcile` one is
    reconciled from queue rq, so that the next job of q is claimed as work."""
    if fields.get("on_unknown") == "reconcile":
        fields.setdefault("reconcile_queue", "rq")
    lease = _running(cluster, **fields)
    cluster.run(FailJob(lease.job_id, lease.fencing_token, "unknown", "timed out"))
    return lease


def _ask(cluster: Cluster, queue: str = "rq", worker: str = "r1") -> Lease:
    ask = cluster.claim_one(worker=worker, queues=(queue,))
    assert ask.reconcile is not None
    return ask


def test_a_report_of_a_quiet_state_is_empty_and_builds_the_log_once() -> None:
    cluster = Cluster(now_ms=HOUR_0 + 1234)
    assert book_of(cluster.state).log is None  # nothing built until asked
    report = reconciliation_report(cluster.state, 24, 100)
    assert report.now_ms == HOUR_0 + 1234
    assert report.since_ms == HOUR_0 - 23 * HOUR_MS
    assert window_start_ms(HOUR_0 + 1234, 1) == HOUR_0
    assert (report.reconciling, report.reconciling_total) == ((), 0)
    assert report.unknown_outcomes == {} and report.endings == {}
    assert (report.completed, report.completed_total) == ((), 0)
    assert book_of(cluster.state).log is not None


def test_unknown_outcomes_are_counted_per_queue_and_hour_whatever_the_policy() -> None:
    cluster = Cluster(now_ms=HOUR_0)
    reconciliation_report(cluster.state, 24, 100)  # built now: the hooks feed it from here
    # Retried blindly (the default policy): still an unknown outcome.
    _unknown(cluster, queue="mail", backoff=NO_BACKOFF)
    # A lease that expired while running, an hour later.
    expired = _running(
        cluster, queue="pay", lease_ms=1_000, on_unknown="reconcile", reconcile_queue="rq"
    )
    cluster.run(Tick(), at=HOUR_0 + HOUR_MS + 5)
    assert cluster.job(expired.job_id).status == "reconciling"
    # Not unknown: a lease that expired before start, a transient failure.
    cluster.submit(queue="pay", lease_ms=1_000)
    claimed = cluster.claim_one(queues=("pay",))
    cluster.run(Tick(), at=claimed.expires_at_ms)
    transient = _running(cluster, queue="sms", backoff=NO_BACKOFF)
    cluster.run(FailJob(transient.job_id, transient.fencing_token, "transient"))
    report = reconciliation_report(cluster.state, 3, 100)
    assert report.since_ms == HOUR_0 - HOUR_MS
    assert report.unknown_outcomes == {"mail": (0, 1, 0), "pay": (0, 0, 1)}
    assert report.reconciling == (
        ReconcilingJob(
            expired.job_id, "pay", "default", 1, HOUR_0 + HOUR_MS + 5, 0, "rq",
            HOUR_0 + HOUR_MS + 5, None,
        ),
    )  # fmt: skip
    # A one-hour window sees only the current hour.
    assert reconciliation_report(cluster.state, 1, 100).unknown_outcomes == {"pay": (1,)}


def test_decisions_and_completed_jobs_name_the_worker_token_and_evidence() -> None:
    cluster = Cluster(now_ms=HOUR_0)
    reconciliation_report(cluster.state, 24, 100)
    happened = _unknown(cluster, on_unknown="reconcile")
    spared = _unknown(cluster, on_unknown="reconcile", backoff=NO_BACKOFF)
    unsure = _unknown(cluster, on_unknown="reconcile", tenant="acme")
    asks = {ask.job_id: ask for ask in cluster.claim(worker="r1", queues=("rq",), n=3)}
    assert set(asks) == {happened.job_id, spared.job_id, unsure.job_id}
    token = asks[happened.job_id].fencing_token
    cluster.run(
        ReconcileJob(happened.job_id, token, "happened", reason="provider lists ch_1"),
        ReconcileJob(spared.job_id, asks[spared.job_id].fencing_token, "did_not_happen"),
        ReconcileJob(unsure.job_id, asks[unsure.job_id].fencing_token, "cannot_tell", reason="?"),
        at=HOUR_0 + 10,
    )
    report = reconciliation_report(cluster.state, 24, 100)
    assert report.endings == {
        "q": {"happened": 1, "did_not_happen": 1, "cannot_tell": 1, "unanswered": 0}
    }
    assert report.completed == (
        CompletedJob(happened.job_id, "q", "default", HOUR_0 + 10, "r1", token,
                     "provider lists ch_1"),
    )  # fmt: skip
    assert report.completed_total == 1 and report.reconciling == ()
    assert report.unknown_outcomes == {"q": (0,) * 23 + (3,)}
    # A caller who sees only tenant acme sees only its job.
    scoped = reconciliation_report(cluster.state, 24, 100, lambda job: job.tenant == "acme")
    assert scoped.unknown_outcomes == {"q": (0,) * 23 + (1,)}
    assert scoped.endings == {
        "q": {"happened": 0, "did_not_happen": 0, "cannot_tell": 1, "unanswered": 0}
    }
    assert scoped.completed == ()


def test_reconciliations_nobody_answers_end_unanswered() -> None:
    cluster = Cluster(now_ms=HOUR_0)
    reconciliation_report(cluster.state, 24, 100)
    lease = _unknown(cluster, on_unknown="reconcile", backoff=Backoff(1_000, 1_000, 0))
    for _ in range(RECONCILE_TRIES_MAX):
        ask = _ask(cluster)
        cluster.run(Tick(), at=ask.expires_at_ms)
        if cluster.job(lease.job_id).status == "reconciling":
            cluster.run(Tick(), at=cluster.now_ms + 1_000)
    assert cluster.job(lease.job_id).status == "dead_letter"
    report = reconciliation_report(cluster.state, 24, 100)
    assert report.endings == {
        "q": {"happened": 0, "did_not_happen": 0, "cannot_tell": 0, "unanswered": 1}
    }
    # Sent back to its reconcilers by an operator: reconciling since then.
    back_ms = cluster.now_ms + 60_000
    cluster.run(RequestReconcile(lease.job_id, "provider is back", "ops"), at=back_ms)
    (item,) = reconciliation_report(cluster.state, 24, 100).reconciling
    assert (item.job_id, item.since_ms, item.tries) == (lease.job_id, back_ms, 0)


def test_lists_are_capped_oldest_reconciling_and_newest_completed_first() -> None:
    cluster = Cluster(now_ms=HOUR_0)
    reconciliation_report(cluster.state, 24, 100)
    leases = []
    for _ in range(4):
        leases.append(_unknown(cluster, on_unknown="reconcile"))
        cluster.run(Tick(), at=cluster.now_ms + 1_000)
    report = reconciliation_report(cluster.state, 24, 2)
    assert [item.job_id for item in report.reconciling] == [lease.job_id for lease in leases[:2]]
    assert report.reconciling_total == 4
    for _ in leases:
        ask = _ask(cluster)
        cluster.run(ReconcileJob(ask.job_id, ask.fencing_token, "happened"))
        cluster.run(Tick(), at=cluster.now_ms + 1_000)
    report = reconciliation_report(cluster.state, 24, 3)
    assert report.completed_total == 4
    assert [item.job_id for item in report.completed] == [
        lease.job_id for lease in reversed(leases[1:])
    ]
    assert all(item.evidence is None for item in report.completed)  # no reason given


def test_a_snapshot_answers_the_same_report_and_old_records_leave_the_window() -> None:
    cluster = Cluster(now_ms=HOUR_0)
    reconciliation_report(cluster.state, 24, 100)
    old = _unknown(cluster, on_unknown="reconcile", tenant="acme")
    ask = _ask(cluster)
    cluster.run(ReconcileJob(old.job_id, ask.fencing_token, "happened", reason="seen"))
    cluster.run(Tick(), at=HOUR_0 + WINDOW_MS_MAX - HOUR_MS)
    _unknown(cluster, queue="late", backoff=NO_BACKOFF)
    decoded = decode_state(encode_state(cluster.state))
    assert state_digest(decoded) == state_digest(cluster.state)  # the log is not encoded
    assert book_of(decoded).log is None
    for hours in (1, 24, 168):
        assert reconciliation_report(decoded, hours, 100) == reconciliation_report(
            cluster.state, hours, 100
        )
    week = reconciliation_report(cluster.state, 168, 100)
    assert week.completed_total == 1 and sum(week.unknown_outcomes["q"]) == 1
    # A week and an hour later the first records are out of every window,
    # and the log drops them as new ones arrive.
    cluster.run(Tick(), at=HOUR_0 + WINDOW_MS_MAX + HOUR_MS)
    _unknown(cluster, queue="later", backoff=NO_BACKOFF)
    week = reconciliation_report(cluster.state, 168, 100)
    assert week.completed == () and "q" not in week.unknown_outcomes
    assert set(week.unknown_outcomes) == {"late", "later"}
    log = book_of(cluster.state).log
    assert log is not None and all(record[2].queue != "q" for record in log.since(0))


def test_a_purged_job_leaves_the_report() -> None:
    cluster = Cluster(now_ms=HOUR_0)
    reconciliation_report(cluster.state, 24, 100)
    cluster.run(Configure(retention_ms=60_000))
    lease = _unknown(cluster, on_unknown="reconcile")
    ask = _ask(cluster)
    cluster.run(ReconcileJob(lease.job_id, ask.fencing_token, "happened"))
    assert reconciliation_report(cluster.state, 24, 100).completed_total == 1
    cluster.run(Tick(), at=cluster.now_ms + 120_000)
    assert lease.job_id not in cluster.state.jobs
    report = reconciliation_report(cluster.state, 24, 100)
    assert report.completed == () and report.unknown_outcomes == {} and report.endings == {}


def test_a_cancelled_reconciliation_is_no_decision() -> None:
    cluster = Cluster(now_ms=T0)
    reconciliation_report(cluster.state, 24, 100)
    lease = _unknown(cluster, on_unknown="reconcile")
    cluster.run(CancelJob(lease.job_id))
    report = reconciliation_report(cluster.state, 24, 100)
    assert report.endings == {} and report.reconciling == ()
    assert report.unknown_outcomes == {"q": (0,) * 23 + (1,)}


@pytest.mark.parametrize("release", golden.release_dirs(), ids=lambda path: path.name)
def test_every_release_log_keeps_the_log_and_a_snapshot_in_step(release: Path) -> None:
    """Each release's golden entry log, applied with the log built from the
    start: after every entry it equals a build from the jobs (the
    invariants), and a snapshot of the end answers the same report."""
    expected = golden.read_expected(release)["entries"]
    state = new_state()
    reconciliation_report(state, 168, 1000)
    for number, data in enumerate(golden.read_entries(release / expected["file"]), start=1):
        apply_encoded(state, data)
        assert check_invariants(state) == [], f"after entry {number} of {release.name}"
    live = reconciliation_report(state, 168, 1000)
    assert reconciliation_report(decode_state(encode_state(state)), 168, 1000) == live
    if "ReconcileJob" in expected["command_kinds"]:
        # Not vacuous: decisions are in the report (the scenario's short
        # retention has purged some of its jobs, the happened one too).
        assert any(n for counts in live.endings.values() for n in counts.values())
