"""SubmitJobs: create jobs, or return the original for an idempotent repeat."""

from __future__ import annotations

from dataclasses import replace
from hashlib import blake2b

import msgpack

from raftsched.core.jobs import flow, trace_book
from raftsched.core.jobs.commands import SubmitJobs
from raftsched.core.jobs.reconcile_book import remember_policy
from raftsched.core.kernel import wheel
from raftsched.core.kernel.cluster_version import cluster_version
from raftsched.core.kernel.codec import spec_row
from raftsched.core.kernel.commands import Backoff, JobSpec
from raftsched.core.kernel.feature import Context
from raftsched.core.kernel.model import DEFAULT_BACKOFF_MS, PENDING, SCHEDULED, BackoffMs, Job
from raftsched.core.kernel.results import (
    IDEMPOTENCY_CONFLICT,
    Rejected,
    SubmitItem,
    Submitted,
)
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.state import NO_KEYS, State, count_new_job, index_job, intern
from raftsched.core.kernel.validate import BATCH_MAX, check_name, check_spec, invalid


def apply_submit(state: State, command: SubmitJobs, context: Context) -> Submitted | Rejected:
    return submit_jobs(state, command, context.savepoint, pack=True)


def submit_jobs(
    state: State, command: SubmitJobs, savepoint: Savepoint, *, pack: bool = False
) -> Submitted | Rejected:
    """SubmitJobs, also for schedules firing an occurrence. With `pack`
    (a client's submission, not a schedule's occurrence, which its schedule
    reads back at once) far-future jobs go into the time wheel."""
    specs, job_ids = command.specs, command.job_ids
    if type(specs) is not tuple or not 1 <= len(specs) <= BATCH_MAX:
        return invalid("specs", f"a submission carries 1 to {BATCH_MAX} specs")
    if type(job_ids) is not tuple or len(job_ids) != len(specs):
        return invalid("job_ids", "one job id per spec")
    version = cluster_version(state) if pack else 0
    items = [
        _submit_one(state, spec, job_id, savepoint, version)
        for spec, job_id in zip(specs, job_ids, strict=True)
    ]
    return Submitted(tuple(items))


def spec_fingerprint(spec: JobSpec) -> bytes:
    """16 bytes that are equal exactly when two specs encode equally, but
    for their trace context: a repeat of a request is the same request from
    whichever span it is sent (a client's retry, a redelivered message)."""
    if spec.traceparent is not None or spec.tracestate is not None:
        spec = replace(spec, traceparent=None, tracestate=None)
    return blake2b(msgpack.packb(spec_row(spec)), digest_size=16).digest()


def _canonical(spec: JobSpec) -> JobSpec:
    """Labels sorted by key, so that equal requests fingerprint equally."""
    labels = spec.labels
    if len(labels) > 1 and any(labels[i][0] > labels[i + 1][0] for i in range(len(labels) - 1)):
        return replace(spec, labels=tuple(sorted(labels)))
    return spec


def _submit_one(
    state: State, spec: JobSpec, job_id: str, savepoint: Savepoint, version: int = 0
) -> SubmitItem | Rejected:
    rejected = check_spec(spec) or check_name(job_id, "job_ids")
    if rejected is not None:
        return rejected
    spec = _canonical(spec)
    fingerprint = None
    if spec.idempotency_key is not None:
        fingerprint = spec_fingerprint(spec)
        keys = state.idempotency.by_tenant.get(spec.tenant, NO_KEYS)
        original = keys.get(spec.idempotency_key)
        if original is not None:
            if original.fingerprint == fingerprint:
                return SubmitItem(original.id, created=False)
            return Rejected(
                IDEMPOTENCY_CONFLICT,
                "this idempotency key was used with a different request",
                {"field": "idempotency_key", "job_id": original.id},
            )
    existing = state.jobs.get(job_id)
    if existing is not None:
        # The proposer draws ids at random, so a known id is this very command
        # applied again (a retried proposal); anything else is a proposer bug.
        if (existing.queue, existing.tenant, existing.payload) == (
            spec.queue,
            spec.tenant,
            spec.payload,
        ):
            return SubmitItem(job_id, created=False)
        return invalid("job_ids", f"job id {job_id} is already in use")
    rejected = flow.admit(state, spec)  # backpressure: the tenant's max_queued
    if rejected is not None:
        return rejected
    _create(state, spec, job_id, fingerprint, savepoint, version)
    savepoint.created.append(job_id)
    return SubmitItem(job_id, created=True)


def _backoff(state: State, backoff: Backoff) -> BackoffMs | None:
    stored = (backoff.initial_ms, backoff.max_ms, backoff.jitter_ms)
    return None if stored == DEFAULT_BACKOFF_MS else intern(state, stored)


def create_job(state: State, spec: JobSpec, job_id: str, savepoint: Savepoint | None) -> Job:
    """Create one job from a spec that `check_spec` accepted, without the
    idempotency map: workflow steps (whose workflow holds the key) use this."""
    job = _create(state, _canonical(replace(spec, idempotency_key=None)), job_id, None, savepoint)
    if savepoint is not None:
        savepoint.created.append(job_id)
    return job


def _create(
    state: State,
    spec: JobSpec,
    job_id: str,
    fingerprint: bytes | None,
    savepoint: Savepoint | None,
    version: int = 0,
) -> Job:
    """Create a job; from cluster `version` 7 on (0: never) a plain
    far-future one is packed into the time wheel instead (`kernel.wheel`).
    Its trace context, if any, is kept beside it either way (`trace_book`)."""
    now_ms = state.now_ms
    if spec.run_at_ms is not None:
        run_at_ms = spec.run_at_ms
    elif spec.delay_ms is not None:
        run_at_ms = now_ms + spec.delay_ms
    else:
        run_at_ms = now_ms
    waiting = run_at_ms > now_ms
    seq = state.next_seq
    state.next_seq = seq + 1
    job = Job(
        job_id,
        intern(state, spec.queue),
        intern(state, spec.tenant),
        SCHEDULED if waiting else PENDING,
        spec.priority,
        spec.payload,
        spec.idempotency_key,
        spec.ordering_key,
        spec.correlation_id,
        spec.labels,
        now_ms,
        now_ms,
        run_at_ms,
        run_at_ms if waiting else now_ms,
        spec.max_attempts,
        0,
        False,
        None,
        None,
        None,
        None,
        None,
        None,
        (),
        None if spec.deadline_ms is None else now_ms + spec.deadline_ms,
        _backoff(state, spec.backoff),
        spec.lease_ms,
        seq,
        state.epoch,
        fingerprint,
        None,
        None,
        None if spec.kind is None else intern(state, spec.kind),
    )
    trace_book.remember(state, job_id, spec, savepoint)
    if (
        version
        and spec.on_unknown is None
        and spec.reconcile_queue is None
        and wheel.packable(state, job, version)
    ):
        wheel.pack(state, job, savepoint)
        return job
    state.jobs[job_id] = job
    state.order.append(job)
    count_new_job(state, job)
    index_job(state, job)
    remember_policy(state, job_id, spec.on_unknown, spec.reconcile_queue, savepoint)
    return job
