"""Everything that must hold between commands. Tests run it after every step.

`check_invariants` returns a list of violations (empty when the state is
sound): the kernel's own (`check_kernel`, jobs and indexes) and each
feature's. It is O(jobs); the node may run it after decoding a snapshot.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from raftsched.core.kernel import cluster_version, outbox, shard, wheel
from raftsched.core.kernel.model import (
    FINAL_STATUSES,
    JOB_STATUSES,
    LEASED_STATUSES,
    PENDING,
    WAITING_STATUSES,
    Job,
)
from raftsched.core.kernel.state import State

if TYPE_CHECKING:
    from raftsched.core.kernel.feature import Registry


def check_invariants(state: State, registry: Registry) -> list[str]:
    """Every feature's invariants, the kernel's first (`Feature.check`)."""
    problems: list[str] = []
    for check in registry.checks:
        problems.extend(check(state))
    return problems


def check_kernel(state: State) -> list[str]:
    """The jobs, their indexes, the outbox and the cluster version."""
    problems: list[str] = []
    _check_scalars(state, problems)
    tokens: set[int] = set()
    last_token = shard.last_fencing_token(state)
    # Jobs are stored in submission order, except those hydrated from the
    # time wheel (kernel.wheel), which join after the jobs already live.
    seqs: set[int] = set()
    for job_id, job in state.jobs.items():
        if job.id != job_id:
            problems.append(f"job stored under {job_id} has id {job.id}")
        if job.seq in seqs:
            problems.append(f"{job_id}: seq {job.seq} used twice")
        seqs.add(job.seq)
        _check_job(state, job, tokens, last_token, problems)
    if max(seqs, default=0) >= state.next_seq:
        problems.append("next_seq is not above every job's seq")
    _check_counters(state, problems)
    _check_maps(state, problems)
    _check_heaps(state, problems)
    problems.extend(outbox.check(state))
    problems.extend(cluster_version.check(state))
    return problems


def _check_scalars(state: State, problems: list[str]) -> None:
    for name in ("now_ms", "epoch", "last_fencing_token", "retention_ms"):
        value = getattr(state, name)
        if type(value) is not int or value < 0:
            problems.append(f"state.{name} is {value!r}")


def _check_job(
    state: State, job: Job, tokens: set[int], last_token: int, problems: list[str]
) -> None:
    where = f"job {job.id}"
    if job.status not in JOB_STATUSES:
        problems.append(f"{where}: unknown status {job.status}")
    leased = job.status in LEASED_STATUSES
    if leased != (job.lease is not None):
        problems.append(f"{where}: status {job.status} with lease {job.lease is not None}")
    if job.status in WAITING_STATUSES and job.next_run_at_ms is None:
        problems.append(f"{where}: waiting without next_run_at_ms")
    if job.attempts_made > job.max_attempts:
        problems.append(f"{where}: {job.attempts_made} attempts made of {job.max_attempts}")
    for number, attempt in enumerate(job.attempts, start=1):
        if attempt.number != number:
            problems.append(f"{where}: attempt {attempt.number} at position {number}")
        if attempt.fencing_token in tokens:
            problems.append(f"{where}: fencing token {attempt.fencing_token} granted twice")
        tokens.add(attempt.fencing_token)
        if attempt.fencing_token > last_token:
            problems.append(f"{where}: token above the last one handed out")
        if number > 1 and attempt.fencing_token <= job.attempts[number - 2].fencing_token:
            problems.append(f"{where}: attempt {number}'s token is not above the one before")
        if attempt.epoch > state.epoch:
            problems.append(f"{where}: attempt epoch above state epoch")
        is_open = attempt.ended_at_ms is None
        if is_open != (leased and number == len(job.attempts)):
            problems.append(f"{where}: attempt {number} open={is_open} while {job.status}")
    if job.lease is not None:
        if not job.attempts or job.attempts[-1].fencing_token != job.lease.fencing_token:
            problems.append(f"{where}: lease token is not the last attempt's")
        if job.lease.epoch > state.epoch:
            problems.append(f"{where}: lease epoch above state epoch")
    if job.updated_at_ms < job.created_at_ms or job.updated_at_ms > state.now_ms:
        problems.append(f"{where}: updated_at_ms out of range")
    if job.history:
        status = job.history[-1][3]
        if status != job.status:
            problems.append(f"{where}: history ends in {status}, job is {job.status}")


def _check_counters(state: State, problems: list[str]) -> None:
    packed = list(wheel.packed_jobs(state)) if wheel.WHEEL in state.sections else []
    everyone = [*state.jobs.values(), *packed]
    by_status = Counter(job.status for job in everyone)
    for status in JOB_STATUSES:
        if state.status_counts.get(status, 0) != by_status.get(status, 0):
            problems.append(f"status count for {status} is {state.status_counts.get(status)}")
    expected: dict[str, list[int]] = {}
    for job in everyone:
        counts = expected.setdefault(job.queue, [0, 0, 0])
        counts[0] += job.status == PENDING
        counts[1] += job.status in LEASED_STATUSES
        counts[2] += 1
    if expected != state.queue_counts:
        problems.append(f"queue counts {state.queue_counts} != {expected}")


def _check_maps(state: State, problems: list[str]) -> None:
    keyed = {
        (job.tenant, job.idempotency_key): job
        for job in state.jobs.values()
        if job.idempotency_key is not None
    }
    indexed = dict(state.idempotency.items())
    if indexed.keys() != keyed.keys() or any(indexed[key] is not job for key, job in keyed.items()):
        problems.append("idempotency map disagrees with the jobs")
    if not all(state.idempotency.by_tenant.values()):
        problems.append("idempotency map keeps a tenant without keys")
    for job in keyed.values():
        if job.fingerprint is None:
            problems.append(f"job {job.id}: idempotency key without fingerprint")
    owned = {
        effect.key: (job, effect) for job in state.jobs.values() for effect in job.effects or ()
    }
    if owned.keys() != state.effects.keys() or any(
        state.effects[key][1] is not effect for key, (_, effect) in owned.items()
    ):
        problems.append("effects map disagrees with the jobs")


def _check_heaps(state: State, problems: list[str]) -> None:
    """Every job that needs an index entry has one that is valid for it."""
    due = {(id(job), key) for key, _, job in state.due}
    leases = {(id(job), token): key for key, token, job in state.leases}
    deadlines = {(id(job), key) for key, _, job in state.deadlines}
    retention = {(id(job), key) for key, _, job in state.retention}
    for job in state.jobs.values():
        where = f"job {job.id}"
        if job.status in WAITING_STATUSES and (id(job), job.next_run_at_ms) not in due:
            problems.append(f"{where}: waiting but not in the due heap")
        if job.lease is not None:
            key = leases.get((id(job), job.lease.fencing_token))
            if key is None or key > job.lease.expires_at_ms:
                problems.append(f"{where}: lease missing from the lease heap")
        final = job.status in FINAL_STATUSES
        deadline_ms = job.deadline_at_ms
        if deadline_ms is not None and not final and (id(job), deadline_ms) not in deadlines:
            problems.append(f"{where}: deadline missing from the deadline heap")
        if final and (id(job), job.updated_at_ms) not in retention:
            problems.append(f"{where}: finished but not in the retention heap")
