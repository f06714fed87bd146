"""The checkers: each turns the history, the sink log and the final state
into a count of anomalies with a few examples. They are pure functions of
their inputs, so tests feed them hand-made histories.

Inputs:
- `ops`: paired operations (chaos.history.operations): f in submit, read,
  claim, start, effect_get, effect, heartbeat, complete, sink; type ok/fail/info.
- `final`: {"jobs": [Job JSON] read linearizably after healing,
            "effects": {key: Effect JSON or None},
            "nodes": {node id: {"digest", "applied_index", "jobs": [Job JSON]
                                 read with consistency=stale}},
            "unreachable": [node ids that did not answer]}
- `sink`: the fenced sink's log (chaos.sink).
- `node_log_errors`: node id -> every error-level line of its log
  (`raftsched.testing.read_log_errors`), for checker 8.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from raftsched.testing import ExpectedLogError, LogError

FINAL_STATUSES = frozenset({"succeeded", "dead_letter", "cancelled"})
EXAMPLES_MAX = 5
LEASE_OPS = ("start", "heartbeat", "complete", "effect")

Op = dict[str, Any]


@dataclass
class Check:
    name: str
    anomalies: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)

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
    for job in final.get("jobs", []):
        numbers = sorted(job["attempts"], key=lambda a: a["number"])
        for a, b in zip(numbers, numbers[1:], strict=False):
            if b["fencing_token"] <= a["fencing_token"]:
                check.flag(problem="token not increasing per job", job_id=job["id"])
    _cross_check_observed(ops, seen, final, check)
    return check


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
            if lease["job_id"] in jobs and seen.get(token) != where:
                check.flag(problem="observed lease missing from final state", lease=lease)


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
    reference = {job["id"]: (job["status"], len(job["attempts"])) for job in final.get("jobs", [])}
    for node, view in nodes.items():
        mine = {job["id"]: (job["status"], len(job["attempts"])) for job in view.get("jobs", [])}
        if mine != reference:
            differing = sorted(set(mine.items()) ^ set(reference.items()))[:3]
            check.flag(
                problem="stale read differs from final state", node=node, differing=differing
            )
    return check


def check_all(ops: list[Op], final: dict[str, Any], sink: list[dict[str, Any]]) -> list[Check]:
    return [
        acknowledged_not_lost(ops, final),
        one_job_per_key(ops, final),
        fencing_tokens(ops, final),
        fenced_effects(ops, final, sink),
        no_overlapping_leases(ops, final),
        linearizable_reads(ops),
        replicas_converged(final),
    ]


# -- 8 ---------------------------------------------------------------------------

# Error-level node log lines that the faults cause on purpose, each with the
# reason. Any other error line, or traceback, in any node's log makes the run
# invalid: a node that logged an error did something wrong even if every
# guarantee held (pysyncobj logs its own failures and carries on).
EXPECTED_NODE_LOG_ERRORS: Final[tuple[ExpectedLogError, ...]] = ()


def node_logs_clean(
    node_log_errors: Mapping[str, list[LogError]],
    expected: Iterable[ExpectedLogError] = EXPECTED_NODE_LOG_ERRORS,
) -> Check:
    check = Check("8_no_unexpected_node_log_errors")
    expected = tuple(expected)
    for node_id, errors in sorted(node_log_errors.items()):
        for error in errors:
            if error.expected_by(expected) is None:
                check.flag(node=node_id, line=error.describe())
    return check


def expected_log_errors_seen(
    node_log_errors: Mapping[str, list[LogError]],
    expected: Iterable[ExpectedLogError] = EXPECTED_NODE_LOG_ERRORS,
) -> dict[str, int]:
    """How many error lines each expected entry's reason accounts for."""
    counts: dict[str, int] = {}
    expected = tuple(expected)
    for errors in node_log_errors.values():
        for error in errors:
            entry = error.expected_by(expected)
            if entry is not None:
                counts[entry.reason] = counts.get(entry.reason, 0) + 1
    return counts
