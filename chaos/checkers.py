"""The checkers: each turns the history, the sink log and the final state
into a count of anomalies with a few examples. They are pure functions of
their inputs, so tests feed them hand-made histories.

Inputs:
- `ops`: paired operations (chaos.history.operations): f in submit, read,
  claim, start, effect_get, effect, heartbeat, complete, fail, sink, reconcile,
  charge, provider_lookup, and the features' subscribe, set_tenant,
  create_schedule, submit_workflow, pause_schedule, retry_parked, and the
  payments' set_payments_queue, submit_payment; type ok/fail/info.
- `final`: {"jobs": [Job JSON] read linearizably after healing,
            "effects": {key: Effect JSON or None},
            "nodes": {node id: {"digest", "applied_index", "jobs": [Job JSON]
                                 read with consistency=stale}},
            "unreachable": [node ids that did not answer]}
  and, from the feature workload (chaos/features.py, checkers 9-12):
           "schedules": {id: {"schedule", "occurrences" (newest first)}},
           "workflows": {id: Workflow JSON}, "workflow_histories": {id: [events]},
           "outbox": {"events", "first_seq", "last_seq"},
           "subscription": Subscription JSON with its parked events,
           "subscription_start_seq": its cursor when created,
           "tenants": {name: Tenant JSON};
  sharded (docs/shards.md): "shards": S, "shard_digests": {shard: {node id:
  [applied index, digest]}}, the outbox's events carry `shard` and their
  `seq` is their shard's, its `last_seq` a cursor `v1.<seq0>.<seq1>...`.
- `sink`: the fenced sink's log (chaos.sink).
- `deliveries`: the webhook receiver's log (chaos.receiver), for checker 11.
- `provider_log`: the fake payment provider's log (chaos.provider), and
  `final["payments"]` (chaos/payments.py), for checker 15
  (chaos/payment_checkers.py).
- `final["relay"]`: the broker relay's subscription and Redis streams
  (chaos/relay.py), for checker 16 (chaos/relay_checkers.py).
- `node_log_errors`: node id -> every error-level line of its log
  (`raftsched.testing.read_log_errors`), for checker 8.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from chaos.cursors import shard0_seq
from raftsched.testing import ExpectedLogError, LogError

FINAL_STATUSES = frozenset({"succeeded", "dead_letter", "cancelled"})
EXAMPLES_MAX = 5
LEASE_OPS = ("start", "heartbeat", "complete", "effect", "reconcile")

Op = dict[str, Any]


@dataclass
class Check:
    name: str
    anomalies: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)
    # Why the checker judged nothing (its inputs could not be made in this
    # run, e.g. no redis-server for checker 16): the summary says so loudly.
    skipped: str | None = None

    def flag(self, **example: Any) -> None:
        self.anomalies += 1
        if len(self.examples) < EXAMPLES_MAX:
            self.examples.append(example)


def ms(text: str | None) -> int | None:
    if text is None:
        return None
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _ok(ops: Iterable[Op], *fs: str) -> list[Op]:
    return [op for op in ops if op["type"] == "ok" and op["f"] in fs]


def _job_of(op: Op) -> str | None:
    """The job an operation is about (from its path, or its answer)."""
    path = str(op["args"].get("path", ""))
    parts = path.split("/")
    if len(parts) >= 4 and parts[1:3] in (["v1", "jobs"], ["v1", "leases"]):
        return parts[3]
    body = op["args"].get("body") or {}
    if isinstance(body, dict) and "job_id" in body:
        return str(body["job_id"])
    if op["f"] == "submit" and op["type"] == "ok":
        return str(op["result"]["body"]["job"]["id"])
    return None


def _token_of(op: Op) -> int | None:
    body = op["args"].get("body") or op["args"]
    token = body.get("fencing_token") if isinstance(body, dict) else None
    return int(token) if token is not None else None


def _jobs_by_id(final: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {job["id"]: job for job in final.get("jobs", [])}


# -- 1 ---------------------------------------------------------------------------


def acknowledged_not_lost(ops: list[Op], final: dict[str, Any]) -> Check:
    """Every acknowledged submit exists after healing and reached a final state."""
    check = Check("1_acknowledged_not_lost")
    jobs = _jobs_by_id(final)
    for op in _ok(ops, "submit"):
        job_id = op["result"]["body"]["job"]["id"]
        job = jobs.get(job_id)
        if job is None:
            check.flag(problem="lost", job_id=job_id, op=op["id"])
        elif job["status"] not in FINAL_STATUSES:
            check.flag(problem="not final", job_id=job_id, status=job["status"])
    for job_id in final.get("unfinished_after_bound", []):
        check.flag(problem="not final within the recovery bound after healing", job_id=job_id)
    return check


# -- 2 ---------------------------------------------------------------------------


def one_job_per_key(ops: list[Op], final: dict[str, Any]) -> Check:
    check = Check("2_one_job_per_idempotency_key")
    by_key: dict[str, set[str]] = defaultdict(set)
    for job in final.get("jobs", []):
        if job.get("idempotency_key"):
            by_key[job["idempotency_key"]].add(job["id"])
    for op in _ok(ops, "submit"):
        key = op["args"]["body"]["idempotency_key"]
        by_key[key].add(op["result"]["body"]["job"]["id"])
    for key, job_ids in sorted(by_key.items()):
        if len(job_ids) > 1:
            check.flag(key=key, job_ids=sorted(job_ids))
    return check


# -- 3 ---------------------------------------------------------------------------


def fencing_tokens(ops: list[Op], final: dict[str, Any]) -> Check:
    """Tokens unique and increasing in commit order (= grant order: the token
    counter counts grants); epochs never decrease in that order; every lease a
    worker was granted is in the final state exactly as the worker saw it."""
    check = Check("3_fencing_tokens_monotonic")
    attempts = [
        (attempt, job["id"]) for job in final.get("jobs", []) for attempt in job["attempts"]
    ]
    seen: dict[int, tuple[str, int]] = {}
    for attempt, job_id in attempts:
        token = attempt["fencing_token"]
        if token in seen and seen[token] != (job_id, attempt["number"]):
            check.flag(problem="token granted twice", token=token, a=seen[token], b=job_id)
        seen[token] = (job_id, attempt["number"])
    # Each shard's group grants its own tokens (counter x S + k) and keeps
    # its own epoch and clock reading: the grant order is per shard, and a
    # token names its shard (a job a schedule of shard k fired has a `job_`
    # id, so the id does not always).
    count = int(final.get("shards", 1))
    by_shard: dict[int, list[tuple[dict[str, Any], str]]] = defaultdict(list)
    for attempt, job_id in attempts:
        by_shard[token_shard(attempt["fencing_token"], count)].append((attempt, job_id))
    for shard_attempts in by_shard.values():
        _grant_order(shard_attempts, check)
    for job in final.get("jobs", []):
        numbers = sorted(job["attempts"], key=lambda a: a["number"])
        for a, b in zip(numbers, numbers[1:], strict=False):
            if b["fencing_token"] <= a["fencing_token"]:
                check.flag(problem="token not increasing per job", job_id=job["id"])
    _cross_check_observed(ops, seen, final, check)
    return check


def token_shard(token: int, shards: int) -> int:
    """The shard that granted `token` (counter x S + k, docs/shards.md 4)."""
    return token % shards if shards > 1 else 0


def _grant_order(attempts: list[tuple[dict[str, Any], str]], check: Check) -> None:
    """One shard's attempts: epochs and grant times never go back in token order."""
    by_token = sorted(attempts, key=lambda pair: pair[0]["fencing_token"])
    for (before, job_a), (after, job_b) in zip(by_token, by_token[1:], strict=False):
        if after["epoch"] < before["epoch"]:
            check.flag(
                problem="epoch decreased in grant order",
                earlier=(job_a, before["fencing_token"], before["epoch"]),
                later=(job_b, after["fencing_token"], after["epoch"]),
            )
        before_ms, after_ms = ms(before["claimed_at"]), ms(after["claimed_at"])
        if before_ms is not None and after_ms is not None and after_ms < before_ms:
            check.flag(problem="grant time went backwards", tokens=(before["fencing_token"],))


def _cross_check_observed(
    ops: list[Op], seen: dict[int, tuple[str, int]], final: dict[str, Any], check: Check
) -> None:
    jobs = _jobs_by_id(final)
    observed: dict[int, tuple[str, int]] = {}
    for op in _ok(ops, "claim"):
        for lease in op["result"]["body"].get("leases", []):
            token, where = lease["fencing_token"], (lease["job_id"], lease["attempt"])
            if observed.get(token, where) != where:
                check.flag(problem="two leases observed with one token", token=token)
            observed[token] = where
            if lease.get("reconcile") is not None:
                _reconciliation_lease(lease, seen, jobs, check)
            elif lease["job_id"] in jobs and seen.get(token) != where:
                check.flag(problem="observed lease missing from final state", lease=lease)


def _reconciliation_lease(
    lease: dict[str, Any],
    seen: dict[int, tuple[str, int]],
    jobs: dict[str, dict[str, Any]],
    check: Check,
) -> None:
    """A reconciliation lease is no attempt: its token comes from the same
    counter, so no attempt holds it; it is above the token of the attempt it
    asks about, which the final state holds under that number."""
    token, target = lease["fencing_token"], lease["reconcile"]
    if token in seen:
        check.flag(problem="reconciliation token is also an attempt's", token=token)
    if token <= target["fencing_token"]:
        check.flag(problem="reconciliation token not above its attempt's", lease=lease)
    job = jobs.get(lease["job_id"])
    asked = [a for a in (job or {}).get("attempts", []) if a["number"] == target["attempt"]]
    if job is not None and [a["fencing_token"] for a in asked] != [target["fencing_token"]]:
        check.flag(
            problem="reconciliation asks about an attempt the job does not have", lease=lease
        )


# -- 4 ---------------------------------------------------------------------------


def fenced_effects(ops: list[Op], final: dict[str, Any], sink: list[dict[str, Any]]) -> Check:
    check = Check("4_fenced_effects_once")
    highest: dict[str, int] = {}
    granted = {a["fencing_token"] for job in final.get("jobs", []) for a in job["attempts"]}
    for record in sorted(sink, key=lambda r: r["t"]):
        if not record["accepted"]:
            continue
        job_id, token = record["job_id"], record["fencing_token"]
        if token < highest.get(job_id, -1):
            check.flag(problem="sink accepted a lower token", job_id=job_id, token=token)
        if granted and token not in granted:
            check.flag(problem="sink accepted a token never granted", token=token)
        highest[job_id] = max(highest.get(job_id, -1), token)
    completions: dict[str, list[Op]] = defaultdict(list)
    for op in _ok(ops, "complete"):
        completions[str(_job_of(op))].append(op)
    for job_id, done in completions.items():
        first = [op for op in done if not op["result"]["body"].get("replayed")]
        tokens = {_token_of(op) for op in done}
        if len(first) > 1 or len(tokens) > 1:
            check.flag(problem="job completed more than once", job_id=job_id, tokens=sorted(tokens))
    _ledger(ops, final, check)
    return check


def _ledger(ops: list[Op], final: dict[str, Any], check: Check) -> None:
    recorded: dict[str, list[Op]] = defaultdict(list)
    for op in _ok(ops, "effect"):
        recorded[op["args"]["body"]["key"]].append(op)
    for key, records in recorded.items():
        first = [op for op in records if not op["result"]["body"].get("replayed")]
        answers = {
            (
                op["result"]["body"]["effect"]["job_id"],
                op["result"]["body"]["effect"]["fencing_token"],
            )
            for op in records
        }
        if len(first) > 1 or len(answers) > 1:
            check.flag(problem="effect recorded more than once", key=key, answers=sorted(answers))
    for key, effect in (final.get("effects") or {}).items():
        if effect is None:
            continue
        writer_token = (effect.get("result") or {}).get("token")
        if writer_token is not None and writer_token != effect["fencing_token"]:
            check.flag(
                problem="effect recorded under a token its writer did not hold",
                key=key,
                writer_token=writer_token,
                recorded_token=effect["fencing_token"],
            )


# -- 5 ---------------------------------------------------------------------------


def no_overlapping_leases(ops: list[Op], final: dict[str, Any]) -> Check:
    """Consecutive attempts of a job never overlap in replicated time; and in
    real time, no operation with token t was accepted when it began after a
    grant of a higher token for the same job had been acknowledged."""
    check = Check("5_no_two_valid_leases")
    for job in final.get("jobs", []):
        attempts = sorted(job["attempts"], key=lambda a: a["number"])
        for a, b in zip(attempts, attempts[1:], strict=False):
            ended, claimed = ms(a["ended_at"]), ms(b["claimed_at"])
            if ended is None or (claimed is not None and ended > claimed):
                check.flag(
                    problem="attempts overlap",
                    job_id=job["id"],
                    same_epoch=a["epoch"] == b["epoch"],
                    attempts=(a["number"], b["number"]),
                )
    grants: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for op in _ok(ops, "claim"):
        for lease in op["result"]["body"].get("leases", []):
            grants[lease["job_id"]].append((op["complete_t"], lease["fencing_token"]))
    for op in _ok(ops, *LEASE_OPS):
        job_id, token = _job_of(op), _token_of(op)
        if job_id is None or token is None:
            continue
        for granted_t, granted_token in grants.get(job_id, []):
            if granted_token > token and granted_t < op["invoke_t"]:
                check.flag(
                    problem="stale token accepted after a newer lease was granted",
                    job_id=job_id,
                    op=op["id"],
                    f=op["f"],
                    token=token,
                    newer_token=granted_token,
                )
                break
    return check


# -- 6 ---------------------------------------------------------------------------


def linearizable_reads(ops: list[Op]) -> Check:
    """A read that began after a write finished sees it; reads never go back."""
    check = Check("6_linearizable_reads")
    submitted: dict[str, float] = {}
    for op in _ok(ops, "submit"):
        job_id = str(_job_of(op))
        submitted[job_id] = min(submitted.get(job_id, op["complete_t"]), op["complete_t"])
    completed: dict[str, float] = {}
    for op in _ok(ops, "complete"):
        job_id = str(_job_of(op))
        completed[job_id] = min(completed.get(job_id, op["complete_t"]), op["complete_t"])
    reads: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        # Only a 404 says "not there"; a read that failed otherwise (503 until
        # its budget ran out) observed nothing.
        if op["f"] == "read" and (op["type"] == "ok" or op["result"].get("status") == 404):
            reads[str(_job_of(op))].append(op)
    for job_id, job_reads in reads.items():
        for op in job_reads:
            job = op["result"]["body"].get("job") if op["type"] == "ok" else None
            if job_id in submitted and submitted[job_id] < op["invoke_t"] and job is None:
                check.flag(problem="acknowledged job not found", job_id=job_id, op=op["id"])
            seen_done = job is not None and job["status"] == "succeeded"
            if job_id in completed and completed[job_id] < op["invoke_t"] and not seen_done:
                check.flag(problem="completion not visible", job_id=job_id, op=op["id"])
        _monotonic_reads(job_id, job_reads, check)
    return check


def _monotonic_reads(job_id: str, job_reads: list[Op], check: Check) -> None:
    seen = [op for op in job_reads if op["type"] == "ok"]
    for earlier in seen:
        for later in seen:
            if earlier["complete_t"] >= later["invoke_t"]:
                continue
            a, b = earlier["result"]["body"]["job"], later["result"]["body"]["job"]
            went_back = len(b["attempts"]) < len(a["attempts"]) or (
                a["status"] in FINAL_STATUSES and b["status"] != a["status"]
            )
            if went_back:
                check.flag(
                    problem="read went back in time",
                    job_id=job_id,
                    ops=(earlier["id"], later["id"]),
                )
                return


# -- 7 ---------------------------------------------------------------------------


def replicas_converged(final: dict[str, Any]) -> Check:
    check = Check("7_replicas_converged")
    nodes = final.get("nodes", {})
    for node_id in final.get("unreachable", []):
        check.flag(problem="node did not answer", node=node_id)
    pairs = {node: (v["applied_index"], v["digest"]) for node, v in nodes.items()}
    if len(set(pairs.values())) > 1:
        check.flag(problem="replicas differ", replicas=pairs)
    _groups_converged(final, check)
    reference = {job["id"]: (job["status"], len(job["attempts"])) for job in final.get("jobs", [])}
    for node, view in nodes.items():
        mine = {job["id"]: (job["status"], len(job["attempts"])) for job in view.get("jobs", [])}
        if mine != reference:
            differing = sorted(set(mine.items()) ^ set(reference.items()))[:3]
            check.flag(
                problem="stale read differs from final state", node=node, differing=differing
            )
    return check


def _groups_converged(final: dict[str, Any], check: Check) -> None:
    """Sharded: every group's replicas (shard k's digest on every node that
    answered for group 0) hold the same (applied index, digest)."""
    if int(final.get("shards", 1)) <= 1:
        return
    answered = set(final.get("nodes", {}))
    groups: dict[str, dict[str, Any]] = final.get("shard_digests", {})
    for shard in range(int(final["shards"])):
        by_node = {node: tuple(pair) for node, pair in groups.get(str(shard), {}).items()}
        missing = sorted(answered - set(by_node))
        if missing:
            check.flag(problem="shard replica did not answer", shard=shard, nodes=missing)
        if len(set(by_node.values())) > 1:
            check.flag(problem="shard replicas differ", shard=shard, replicas=by_node)


# -- 8 ---------------------------------------------------------------------------

# Error-level node log lines that the faults cause on purpose, each with the
# reason. Any other error line, or traceback, in any node's log makes the run
# invalid: a node that logged an error did something wrong even if every
# guarantee held (pysyncobj logs its own failures and carries on).
EXPECTED_NODE_LOG_ERRORS: Final[tuple[ExpectedLogError, ...]] = ()


def node_logs_clean(
    node_log_errors: Mapping[str, list[LogError]],
    expected: Iterable[ExpectedLogError] = EXPECTED_NODE_LOG_ERRORS,
    expected_by_node: Mapping[str, Sequence[ExpectedLogError]] | None = None,
) -> Check:
    """`node_log_errors` is keyed by log: the node id, or `<id>-v<release>`
    for the log of a node while it ran the previous release;
    `expected_by_node` adds entries for one node's logs (a fault injected
    into that node)."""
    check = Check("8_no_unexpected_node_log_errors")
    for log, errors in sorted(node_log_errors.items()):
        entries = _expected_for(log, tuple(expected), expected_by_node)
        for error in errors:
            if error.expected_by(entries) is None:
                check.flag(node=log, line=error.describe())
    return check


def expected_log_errors_seen(
    node_log_errors: Mapping[str, list[LogError]],
    expected: Iterable[ExpectedLogError] = EXPECTED_NODE_LOG_ERRORS,
    expected_by_node: Mapping[str, Sequence[ExpectedLogError]] | None = None,
) -> dict[str, int]:
    """How many error lines each expected entry's reason accounts for."""
    counts: dict[str, int] = {}
    for log, errors in node_log_errors.items():
        entries = _expected_for(log, tuple(expected), expected_by_node)
        for error in errors:
            entry = error.expected_by(entries)
            if entry is not None:
                counts[entry.reason] = counts.get(entry.reason, 0) + 1
    return counts


def _expected_for(
    log: str,
    expected: tuple[ExpectedLogError, ...],
    expected_by_node: Mapping[str, Sequence[ExpectedLogError]] | None,
) -> tuple[ExpectedLogError, ...]:
    node_id, _, release = log.partition("-v")
    entries = expected + tuple((expected_by_node or {}).get(node_id, ()))
    return entries + (EXPECTED_PREVIOUS_RELEASE_LOG_ERRORS if release else ())


# The critical line of the fail-stop that an injected fsync fault causes
# (docs/operations.md "Failed fsync"): expected in the logs of the nodes the
# nemesis armed, and only there.
FSYNC_FAULT_LOG_ERROR: Final = ExpectedLogError(
    r"storage failure: f(data)?sync of .*raft\.journal failed: EIO",
    reason="the nemesis made this node's journal fsync fail with EIO (fsync_fail)",
)

# Error lines of the previous release (in a node's log while it ran it, the
# mixed-version phase) that are known and fixed since, each with its fix.
# None for 0.5.0 (nor 0.4.0): the one 0.3.0 had (a leadership loss while acknowledging a
# webhook batch, logged at error level) is a warning since 0.4.0
# (tests/unit/test_webhook_leadership_loss.py).
EXPECTED_PREVIOUS_RELEASE_LOG_ERRORS: Final[tuple[ExpectedLogError, ...]] = ()


def shard_exit_log_error(shard: int, pid: int) -> ExpectedLogError:
    """The line a node logs when the shard process the nemesis SIGKILLed
    (kill_shard_leader) exits, before it starts it again: expected for that
    node, shard and pid only."""
    return ExpectedLogError(
        rf"shard process {shard} \(pid {pid}\) exited with status -9 \(SIGKILL\)",
        reason="the nemesis SIGKILLed this shard process (kill_shard_leader)",
    )


def expected_log_errors_by_node(
    notes: Iterable[dict[str, Any]],
) -> dict[str, list[ExpectedLogError]]:
    """Node id -> the entries its injected faults make expected: the
    fail-stop line of every node an fsync fault was injected into, and the
    exit line of every shard process the nemesis killed alone."""
    found: dict[str, list[ExpectedLogError]] = defaultdict(list)
    for note in notes:
        value = note.get("value") or {}
        if note.get("f") != "fault_end":
            continue
        target = value.get("target")
        if not target:
            continue
        if value.get("kind") == "fsync_fail" and FSYNC_FAULT_LOG_ERROR not in found[str(target)]:
            found[str(target)].append(FSYNC_FAULT_LOG_ERROR)
        if value.get("kind") == "kill_shard_leader" and value.get("pid") is not None:
            found[str(target)].append(shard_exit_log_error(value["shard"], value["pid"]))
    return dict(found)


# -- 9 ---------------------------------------------------------------------------

# Decisions that create the occurrence's job.
JOB_DECISIONS = frozenset({"fired", "triggered", "backfilled"})
SCHEDULE_KEY_PREFIX = "schedule:"
RECORDS_KEPT = 1000  # core/schedules: the newest records per schedule


def schedule_occurrences(final: dict[str, Any]) -> Check:
    """Exactly one job per schedule occurrence: no two jobs share a (schedule,
    nominal time); each occurrence is decided once (a buffered one once more,
    when released or skipped), a firing names the one job the final state
    holds for it, every job of a schedule is in its records, and the
    recorded nominal times have no gap (no occurrence silently dropped)."""
    check = Check("9_one_job_per_schedule_occurrence")
    jobs_at: dict[tuple[str, int], set[str]] = defaultdict(set)
    for job in final.get("jobs", []):
        schedule_id = job.get("schedule_id")
        if schedule_id is None:
            continue
        nominal = _nominal_of(job)
        if nominal is None:
            check.flag(problem="schedule job without an occurrence key", job_id=job["id"])
            continue
        jobs_at[(schedule_id, nominal)].add(job["id"])
    for (schedule_id, nominal), job_ids in sorted(jobs_at.items()):
        if len(job_ids) > 1:
            check.flag(
                problem="two jobs for one occurrence",
                schedule=schedule_id,
                nominal_ms=nominal,
                job_ids=sorted(job_ids),
            )
    for schedule_id, view in sorted((final.get("schedules") or {}).items()):
        _occurrence_records(check, schedule_id, view, jobs_at)
    return check


def _nominal_of(job: dict[str, Any]) -> int | None:
    """`schedule:<id>:<nominal ms>` -> nominal ms (None for a manual trigger)."""
    key = str(job.get("idempotency_key") or "")
    head, _, tail = key.rpartition(":")
    if not key.startswith(SCHEDULE_KEY_PREFIX) or not tail.isdigit() or head.endswith(":trigger"):
        return None
    return int(tail)


def _occurrence_records(
    check: Check, schedule_id: str, view: dict[str, Any], jobs_at: dict[tuple[str, int], set[str]]
) -> None:
    records = list(reversed(view.get("occurrences", [])))  # the API lists newest first
    schedule = view.get("schedule") or {}
    still_buffered = {ms(text) for text in schedule.get("buffered", [])}
    decided: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        nominal = ms(record["nominal_time"])
        assert nominal is not None
        decided[nominal].append(record)
    for nominal, rows in sorted(decided.items()):
        decisions = [row["decision"] for row in rows]
        if not _decided_once(decisions, nominal in still_buffered):
            check.flag(
                problem="occurrence decided more than once",
                schedule=schedule_id,
                nominal_ms=nominal,
                decisions=decisions,
            )
        named = {row["job_id"] for row in rows if row["decision"] in JOB_DECISIONS}
        held = jobs_at.get((schedule_id, nominal), set())
        if named != held:
            check.flag(
                problem="occurrence's recorded job differs from the final state's",
                schedule=schedule_id,
                nominal_ms=nominal,
                recorded=sorted(map(str, named)),
                jobs=sorted(held),
            )
    if len(records) < RECORDS_KEPT:
        for (owner, nominal), job_ids in sorted(jobs_at.items()):
            if owner == schedule_id and nominal not in decided:
                check.flag(
                    problem="job for an occurrence that was never recorded",
                    schedule=schedule_id,
                    nominal_ms=nominal,
                    job_ids=sorted(job_ids),
                )
    period = _period_ms(schedule)
    nominals = sorted(decided)
    for before, after in zip(nominals, nominals[1:], strict=False):
        if period is not None and after - before != period:
            check.flag(
                problem="occurrences missing between two decided ones",
                schedule=schedule_id,
                after_ms=before,
                next_ms=after,
                period_ms=period,
            )


def _decided_once(decisions: list[str], still_buffered: bool) -> bool:
    """One decision; or `buffered` then one more (released or skipped), or
    `buffered` alone while the final state still holds it in the buffer."""
    if decisions and decisions[0] == "buffered":
        rest = decisions[1:]
        return (not rest and still_buffered) or (len(rest) == 1 and rest[0] != "buffered")
    return len(decisions) == 1


def _period_ms(schedule: dict[str, Any]) -> int | None:
    """The fixed distance between occurrences, where the calendar has one:
    an interval, or a seconds-cron `*/N * * * * *` with N dividing 60."""
    if schedule.get("interval_s"):
        return int(float(schedule["interval_s"]) * 1000)
    fields = str(schedule.get("cron") or "").split()
    if len(fields) == 6 and fields[0].startswith("*/") and fields[1:] == ["*"] * 5:
        step = fields[0][2:]
        if step.isdigit() and 60 % int(step) == 0:
            return int(step) * 1000
    return None


# -- 10 --------------------------------------------------------------------------

STEP_JOB_STATUS = {"succeeded": "succeeded", "failed": "dead_letter", "cancelled": "cancelled"}
WORKFLOW_FINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out"})
STEP_TERMINAL_EVENTS = ("step_succeeded", "step_failed", "step_cancelled", "step_skipped")


def workflow_steps(ops: list[Op], final: dict[str, Any]) -> Check:
    """Each workflow step created once and advanced once: one workflow per
    idempotency key, acknowledged ones present and finished; each step has at
    most one job (and one compensation job), whose status matches the step's;
    a step's job was created in the very command that recorded the success
    of its last dependency (same replicated time); each step started and
    ended once in the workflow's history; only steps meant to fail failed;
    compensations ran one at a time, in reverse order of completion; and
    every lease of a step carried its dependencies' results as inputs."""
    check = Check("10_workflow_steps_once")
    workflows: dict[str, dict[str, Any]] = final.get("workflows") or {}
    jobs = _jobs_by_id(final)
    by_key: dict[str, set[str]] = defaultdict(set)
    for workflow in workflows.values():
        if workflow.get("idempotency_key"):
            by_key[workflow["idempotency_key"]].add(workflow["id"])
    for op in _ok(ops, "submit_workflow"):
        answered = op["result"]["body"]["workflow"]
        by_key[op["args"]["body"]["idempotency_key"]].add(answered["id"])
        if answered["id"] not in workflows:
            check.flag(problem="acknowledged workflow lost", workflow_id=answered["id"])
    for key, ids in sorted(by_key.items()):
        if len(ids) > 1:
            check.flag(problem="two workflows for one idempotency key", key=key, ids=sorted(ids))
    jobs_of: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for job in final.get("jobs", []):
        if job.get("workflow_id"):
            jobs_of[job["workflow_id"]].append(job)
    histories = final.get("workflow_histories") or {}
    for workflow_id, workflow in sorted(workflows.items()):
        _one_workflow(check, workflow, jobs_of.pop(workflow_id, []), jobs)
        _workflow_history(check, workflow, histories.get(workflow_id))
    for workflow_id, orphans in sorted(jobs_of.items()):
        check.flag(
            problem="step jobs of an unknown workflow",
            workflow_id=workflow_id,
            job_ids=sorted(job["id"] for job in orphans),
        )
    _step_inputs(check, ops, workflows, jobs)
    return check


def _succeeded_at(job: dict[str, Any] | None) -> int | None:
    """When the job's succeeding attempt ended (replicated time)."""
    for attempt in (job or {}).get("attempts", []):
        if attempt.get("outcome") == "succeeded":
            return ms(attempt["ended_at"])
    return None


def _one_workflow(
    check: Check,
    workflow: dict[str, Any],
    own_jobs: list[dict[str, Any]],
    jobs: dict[str, dict[str, Any]],
) -> None:
    workflow_id = workflow["id"]
    steps: dict[str, dict[str, Any]] = workflow.get("steps") or {}
    if workflow["status"] not in WORKFLOW_FINAL:
        check.flag(
            problem="workflow not finished", workflow_id=workflow_id, status=workflow["status"]
        )
    expected: dict[str, tuple[str, str]] = {}  # job id -> (step, "step" | "compensation")
    for name, step in steps.items():
        if step.get("job_id"):
            expected[step["job_id"]] = (name, "step")
        compensation = step.get("compensation") or {}
        if compensation.get("job_id"):
            expected[compensation["job_id"]] = (name, "compensation")
    for job in own_jobs:
        where = expected.get(job["id"])
        if where is None or job.get("step") != where[0]:
            check.flag(
                problem="job of a workflow that no step names",
                workflow_id=workflow_id,
                job_id=job["id"],
                step=job.get("step"),
            )
    for name, step in steps.items():
        _one_step(check, workflow, name, step, steps, jobs)
    _compensations(check, workflow, steps, jobs)


def _one_step(
    check: Check,
    workflow: dict[str, Any],
    name: str,
    step: dict[str, Any],
    steps: dict[str, dict[str, Any]],
    jobs: dict[str, dict[str, Any]],
) -> None:
    workflow_id = workflow["id"]
    job = jobs.get(step.get("job_id") or "")
    status = step["status"]
    where = {"workflow_id": workflow_id, "step": name}
    if status in ("waiting", "skipped"):
        if step.get("job_id"):
            check.flag(problem="a step that never started has a job", **where)
        return
    if job is None:
        check.flag(problem="step job missing", job_id=step.get("job_id"), **where)
        return
    if STEP_JOB_STATUS.get(status) != job["status"]:
        check.flag(
            problem="step status disagrees with its job", status=status, job=job["status"], **where
        )
    wins = sum(1 for a in job.get("attempts", []) if a.get("outcome") == "succeeded")
    if wins > 1 or (job["status"] == "succeeded" and wins != 1):
        check.flag(problem="step job succeeded more than once", succeeded_attempts=wins, **where)
    if job["status"] == "dead_letter" and not (job.get("payload") or {}).get("fail"):
        check.flag(problem="a step failed that was not meant to", **where)
    deps = step.get("depends_on") or []
    if deps:
        released = [_succeeded_at(jobs.get(steps[dep].get("job_id") or "")) for dep in deps]
        due = None if None in released else max(t for t in released if t is not None)
    else:
        due = ms(workflow.get("created_at"))
    if due is None or ms(job.get("created_at")) != due:
        check.flag(
            problem="step job not created in the command that released it",
            created_ms=ms(job.get("created_at")),
            released_ms=due,
            **where,
        )


def _compensations(
    check: Check,
    workflow: dict[str, Any],
    steps: dict[str, dict[str, Any]],
    jobs: dict[str, dict[str, Any]],
) -> None:
    workflow_id = workflow["id"]
    order: list[str] = workflow.get("compensation_order") or []
    compensated = {
        name for name, step in steps.items() if (step.get("compensation") or {}).get("status")
    }
    failed_on_purpose = any(
        (jobs.get(step.get("job_id") or "", {}).get("payload") or {}).get("fail")
        for step in steps.values()
    )
    if workflow["status"] == "succeeded" and failed_on_purpose:
        check.flag(
            problem="workflow succeeded although a step had to fail", workflow_id=workflow_id
        )
    if workflow["status"] == "succeeded" and (order or compensated):
        check.flag(problem="a succeeded workflow ran compensations", workflow_id=workflow_id)
    if workflow["status"] != "failed":
        return
    succeeded = {
        name
        for name, step in steps.items()
        if step["status"] == "succeeded" and step.get("compensation") is not None
    }
    if set(order) != succeeded or compensated != succeeded or len(order) != len(set(order)):
        check.flag(
            problem="compensated steps are not the steps that succeeded",
            workflow_id=workflow_id,
            order=order,
            succeeded=sorted(succeeded),
        )
        return
    done_at = [_succeeded_at(jobs.get(steps[name].get("job_id") or "")) for name in order]
    if any(a is None or b is None or a < b for a, b in zip(done_at, done_at[1:], strict=False)):
        check.flag(
            problem="compensations not in reverse order of completion",
            workflow_id=workflow_id,
            order=order,
            completed_ms=done_at,
        )
    ended = [ms(a["ended_at"]) for s in steps.values() for a in _attempts_of(jobs, s.get("job_id"))]
    previous_end = max((t for t in ended if t is not None), default=None)
    for name in order:
        compensation = steps[name]["compensation"]
        job = jobs.get(compensation.get("job_id") or "")
        if compensation["status"] != "succeeded" or job is None or job["status"] != "succeeded":
            check.flag(problem="compensation did not succeed", workflow_id=workflow_id, step=name)
            return
        created = ms(job.get("created_at"))
        if previous_end is not None and created is not None and created < previous_end:
            check.flag(
                problem="compensation started before the previous one ended",
                workflow_id=workflow_id,
                step=name,
            )
        previous_end = _succeeded_at(job)


def _attempts_of(jobs: dict[str, dict[str, Any]], job_id: str | None) -> list[dict[str, Any]]:
    job = jobs.get(job_id or "")
    return list(job.get("attempts", [])) if job else []


def _workflow_history(
    check: Check, workflow: dict[str, Any], events: list[dict[str, Any]] | None
) -> None:
    if events is None:
        return
    counts: dict[tuple[str, str | None], int] = defaultdict(int)
    for event in events:
        name = event["event"]
        if name in STEP_TERMINAL_EVENTS:
            name = "step_ended"
        elif name.startswith("compensation_") and name != "compensation_started":
            name = "compensation_ended"
        counts[(name, event.get("detail") if name != "finished" else None)] += 1
    for (name, step), count in sorted(counts.items(), key=str):
        if count > 1 and name != "stopping":
            check.flag(
                problem="workflow history repeats a transition",
                workflow_id=workflow["id"],
                event=name,
                step=step,
                count=count,
            )


def _step_inputs(
    check: Check,
    ops: list[Op],
    workflows: dict[str, dict[str, Any]],
    jobs: dict[str, dict[str, Any]],
) -> None:
    """A step's lease carries its dependencies' results; a compensation's,
    the result of the step it undoes."""
    for op in _ok(ops, "claim"):
        for lease in op["result"]["body"].get("leases", []):
            workflow = workflows.get(lease.get("workflow_id") or "")
            if workflow is None:
                continue
            steps = workflow.get("steps") or {}
            step = steps.get(lease.get("step") or "")
            if step is None:
                continue
            if lease["job_id"] == (step.get("compensation") or {}).get("job_id"):
                wanted = {lease["step"]: step.get("result")}
            else:
                wanted = {dep: steps[dep].get("result") for dep in step.get("depends_on") or []}
            if (lease.get("inputs") or {}) != wanted:
                check.flag(
                    problem="lease inputs differ from the dependencies' results",
                    job_id=lease["job_id"],
                    inputs=lease.get("inputs"),
                    wanted=wanted,
                )


# -- 11 --------------------------------------------------------------------------

JOB_FINAL_EVENT = {
    "succeeded": "job.succeeded",
    "dead_letter": "job.dead_lettered",
    "cancelled": "job.cancelled",
}


def outbox_and_webhooks(final: dict[str, Any], deliveries: list[dict[str, Any]]) -> Check:
    """The outbox sequence is gapless from 1; every final job has exactly one
    event of its outcome and every finished workflow one of its status; every
    delivery was signed and matches the event the outbox holds under its seq;
    and every event after the subscription's start reached the receiver at
    least once. An event it never got is *lost* if the final subscription
    moved past it without parking it, else *not delivered within the recovery
    bound* (the run waits for the subscription to drain before it reads the
    final state, so both are anomalies)."""
    check = Check("11_outbox_gapless_webhooks_delivered")
    box = final.get("outbox")
    if box is None:
        return check
    all_events: list[dict[str, Any]] = box.get("events", [])
    lasts = _last_seqs(box.get("last_seq", 0))
    for shard, last in enumerate(lasts):
        # Each shard's outbox is gapless in its own seq.
        seqs = sorted(e["seq"] for e in all_events if int(e.get("shard", 0)) == shard)
        if seqs != list(range(1, last + 1)):
            holes = sorted(set(range(1, last + 1)) - set(seqs))
            flagged = {"missing": holes[:10], "count": len(seqs)}
            check.flag(
                problem="outbox sequence has gaps or repeats",
                **({"shard": shard} if len(lasts) > 1 else {}),
                **flagged,
            )
    strays = [e.get("id") for e in all_events if int(e.get("shard", 0)) >= len(lasts)]
    if strays:
        check.flag(problem="event of a shard the cluster lacks", ids=strays[:10])
    _events_match_transitions(check, final, all_events)
    by_key = {(int(e.get("shard", 0)), e["seq"]): e for e in all_events}
    received: set[tuple[int, int]] = set()
    for delivery in deliveries:
        seq = delivery.get("seq")
        shard = int(delivery.get("shard") or 0)
        where = {"shard": shard} if len(lasts) > 1 else {}
        wanted_id = f"evt_{seq}" if shard == 0 else f"evt{shard}_{seq}"
        if not delivery.get("signature_ok"):
            check.flag(problem="delivery with a bad signature", seq=seq, **where)
        if delivery.get("event_id") != wanted_id or delivery.get("body_id") != wanted_id:
            check.flag(problem="delivery's event id is not its shard and seq", seq=seq, **where)
        event = by_key.get((shard, seq)) if isinstance(seq, int) else None
        if event is None:
            check.flag(problem="delivered an event the outbox does not hold", seq=seq, **where)
        elif (event["type"], event.get("data")) != (delivery.get("type"), delivery.get("data")):
            check.flag(
                problem="delivered event differs from the outbox's",
                seq=seq,
                delivered=delivery.get("type"),
                held=event["type"],
                **where,
            )
        elif delivery.get("answered") == 200:
            received.add((shard, int(event["seq"])))
    subscription = final.get("subscription")
    if subscription is None:
        return check
    # Shard 0: the subscription's view (group 0's copy) tells a lost event
    # from one still parked or ahead of the cursor.
    # Sharded, the view merges every shard's copy: its parked items name
    # their shard and its cursor is a cursor of every shard's seq.
    parked = {
        item["event"]["seq"] for item in subscription.get("parked", []) if item.get("shard", 0) == 0
    }
    cursor = shard0_seq(subscription.get("cursor_seq", 0))
    for seq in range(int(final.get("subscription_start_seq", 0)) + 1, lasts[0] + 1):
        if (0, seq) in received:
            continue
        if seq in parked or seq > cursor:
            check.flag(problem="event not delivered within the recovery bound", seq=seq)
        else:
            check.flag(
                problem="event lost: the cursor passed it, the receiver never got it", seq=seq
            )
    # Shards 1..S-1 deliver through their own copies of the subscription,
    # whose cursors and parked events the API does not show: every event
    # after the shard's seq read just after the subscription was made must
    # have reached the receiver.
    starts = list(final.get("subscription_start_seqs") or [0])
    for shard in range(1, len(lasts)):
        start = starts[shard] if shard < len(starts) else 0
        for seq in range(start + 1, lasts[shard] + 1):
            if (shard, seq) not in received:
                check.flag(
                    problem="event not delivered within the recovery bound",
                    shard=shard,
                    seq=seq,
                )
    return check


def _last_seqs(last_seq: Any) -> list[int]:
    """Every shard's last seq from the outbox's `last_seq`: a plain seq (one
    shard) or the cursor `v1.<seq0>.<seq1>...` (one per shard)."""
    text = str(last_seq)
    if text.startswith("v1."):
        return [int(part) for part in text.split(".")[1:]]
    return [int(text or 0)]


def _events_match_transitions(
    check: Check, final: dict[str, Any], events: list[dict[str, Any]]
) -> None:
    """An event exists exactly when its transition committed."""
    about_jobs: dict[str, list[str]] = defaultdict(list)
    about_workflows: dict[str, list[str]] = defaultdict(list)
    for event in events:
        data = event.get("data") or {}
        if event["type"] in JOB_FINAL_EVENT.values():
            about_jobs[str(data.get("job_id"))].append(event["type"])
        elif event["type"] in {f"workflow.{status}" for status in WORKFLOW_FINAL}:
            about_workflows[str(data.get("workflow_id"))].append(event["type"])
    for job in final.get("jobs", []):
        wanted = JOB_FINAL_EVENT.get(job["status"])
        got = about_jobs.pop(job["id"], [])
        if got != ([wanted] if wanted else []):
            check.flag(
                problem="job's events disagree with its status", job_id=job["id"], events=got
            )
    for job_id, got in sorted(about_jobs.items()):
        check.flag(problem="event about a job the final state lacks", job_id=job_id, events=got)
    for workflow_id, workflow in (final.get("workflows") or {}).items():
        wanted = f"workflow.{workflow['status']}" if workflow["status"] in WORKFLOW_FINAL else None
        got = about_workflows.pop(workflow_id, [])
        if got != ([wanted] if wanted else []):
            check.flag(
                problem="workflow's events disagree with its status",
                workflow_id=workflow_id,
                events=got,
            )


# -- 12 --------------------------------------------------------------------------


def flow_limits(ops: list[Op], final: dict[str, Any]) -> Check:
    """Tenant concurrency limits and ordering keys never violated.

    Replicated time: a tenant's attempts (claimed_at to ended_at, both
    stamped by the command) never number more than its limit at once; the
    jobs of one (tenant, ordering key) hold the key one at a time, from
    their first claim to their last attempt's end; and a job whose submit
    began after another's was acknowledged never ran before that one ended.
    Real time, from the history: a lease whose completion was accepted was
    held at least from the claim's answer to the completion's request, so
    more such windows of one tenant at once than its limit, or two of one
    key, are anomalies too."""
    check = Check("12_tenant_limits_and_ordering_keys")
    jobs = final.get("jobs", [])
    limits = {
        name: tenant.get("concurrency_limit")
        for name, tenant in (final.get("tenants") or {}).items()
        if tenant.get("concurrency_limit")
    }
    for tenant, limit in sorted(limits.items()):
        windows = [
            (ms(a["claimed_at"]) or 0, ms(a["ended_at"]) if a["ended_at"] else None)
            for job in jobs
            if job.get("tenant") == tenant
            for a in job["attempts"]
        ]
        _at_most(check, windows, limit, problem="tenant over its concurrency limit", tenant=tenant)
    keyed: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for job in jobs:
        if job.get("ordering_key") and job["attempts"]:
            keyed[(job.get("tenant") or "default", job["ordering_key"])].append(job)
    for (_, key), members in sorted(keyed.items()):
        spans = [_span(job) for job in members]
        _at_most(check, spans, 1, problem="two jobs of one ordering key at once", key=key)
    _submission_order(check, ops, keyed)
    _real_time_windows(check, ops, final, limits)
    return check


def _span(job: dict[str, Any]) -> tuple[int, int | None]:
    attempts = job["attempts"]
    first = ms(attempts[0]["claimed_at"]) or 0
    return first, ms(attempts[-1]["ended_at"]) if job["status"] in FINAL_STATUSES else None


def _at_most(
    check: Check, windows: Sequence[tuple[float, float | None]], limit: int, **what: Any
) -> None:
    """Half-open windows [start, end); an end at the same instant as a start
    frees its slot first. None: still open at the end."""
    points = sorted(
        [(start, 1) for start, _ in windows] + [(end, -1) for _, end in windows if end is not None]
    )
    held = 0
    for at, delta in points:
        held += delta
        if held > limit:
            check.flag(at=at, held=held, limit=limit, **what)
            return


def _submission_order(
    check: Check, ops: list[Op], keyed: dict[tuple[str, str], list[dict[str, Any]]]
) -> None:
    acked: dict[str, float] = {}
    began: dict[str, float] = {}
    job_of_key: dict[str, str] = {
        job["idempotency_key"]: job["id"]
        for members in keyed.values()
        for job in members
        if job.get("idempotency_key")
    }
    for op in ops:
        if op["f"] != "submit":
            continue
        job_id = job_of_key.get((op["args"].get("body") or {}).get("idempotency_key", ""))
        if job_id is None:
            continue
        began[job_id] = min(began.get(job_id, op["invoke_t"]), op["invoke_t"])
        if op["type"] == "ok":
            acked[job_id] = min(acked.get(job_id, op["complete_t"]), op["complete_t"])
    for (_, key), members in sorted(keyed.items()):
        for first in members:
            for then in members:
                if first is then or first["id"] not in acked or then["id"] not in began:
                    continue
                if acked[first["id"]] >= began[then["id"]]:
                    continue
                first_end = _span(first)[1]
                then_start = _span(then)[0]
                if first_end is None or then_start < first_end:
                    check.flag(
                        problem="ordering key ran a later job before an earlier one ended",
                        key=key,
                        earlier=first["id"],
                        later=then["id"],
                    )


def _real_time_windows(
    check: Check, ops: list[Op], final: dict[str, Any], limits: dict[str, int]
) -> None:
    jobs = _jobs_by_id(final)
    granted: dict[int, float] = {}
    for op in _ok(ops, "claim"):
        for lease in op["result"]["body"].get("leases", []):
            granted[lease["fencing_token"]] = op["complete_t"]
    by_tenant: dict[str, list[tuple[float, float | None]]] = defaultdict(list)
    by_key: dict[tuple[str, str], list[tuple[float, float | None]]] = defaultdict(list)
    for op in _ok(ops, "complete"):
        job = jobs.get(str(_job_of(op)))
        token = _token_of(op)
        if job is None or token not in granted or op["result"]["body"].get("replayed"):
            continue
        window = (granted[token], op["invoke_t"])
        if window[0] >= window[1]:
            continue
        tenant = job.get("tenant") or "default"
        by_tenant[tenant].append(window)
        if job.get("ordering_key"):
            by_key[(tenant, job["ordering_key"])].append(window)
    for tenant, windows in sorted(by_tenant.items()):
        if tenant in limits:
            _at_most(check, windows, limits[tenant], problem="tenant over its limit (real time)")
    for (_, key), windows in sorted(by_key.items()):
        _at_most(
            check, windows, 1, problem="two jobs of one ordering key at once (real time)", key=key
        )


def check_all(
    ops: list[Op],
    final: dict[str, Any],
    sink: list[dict[str, Any]],
    deliveries: list[dict[str, Any]] | None = None,
    notes: list[dict[str, Any]] | None = None,
    provider_log: list[dict[str, Any]] | None = None,
) -> list[Check]:
    """Every checker but the eighth, which reads the node logs once the nodes
    have stopped (the campaign puts it in its place). `notes`: the history's
    notes, for checkers 13 and 14 (chaos/ops_checkers.py); `provider_log`:
    the payment provider's log, for checker 15 (chaos/payment_checkers.py);
    checker 16 reads `final["relay"]` (chaos/relay_checkers.py)."""
    # Imported here: they build on this module's Check.
    from chaos.ops_checkers import ops_checks
    from chaos.payment_checkers import charges_per_payment_at_most_one
    from chaos.relay_checkers import relay_published

    return [
        acknowledged_not_lost(ops, final),
        one_job_per_key(ops, final),
        fencing_tokens(ops, final),
        fenced_effects(ops, final, sink),
        no_overlapping_leases(ops, final),
        linearizable_reads(ops),
        replicas_converged(final),
        schedule_occurrences(final),
        workflow_steps(ops, final),
        outbox_and_webhooks(final, deliveries or []),
        flow_limits(ops, final),
        *ops_checks(ops, final, notes),
        charges_per_payment_at_most_one(ops, final, provider_log or []),
        relay_published(final),
    ]
