"""The campaign summary: counts for the human, and one JSON object."""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from typing import Any

from chaos import wheel
from chaos.checkers import Check, token_shard
from chaos.features import LIMITED_TENANT
from chaos.history import Event
from chaos.payment_checkers import (
    UNRECONCILED,
    acknowledged_payments,
    charges_by_payment,
    reconcile_decisions,
)
from chaos.payments import PAYMENTS_QUEUE
from chaos.relay_checkers import relay_figures
from raftsched.shards import shard_of_id

HISTORY_GLOB = "history-*.jsonl"


def summarize(
    args: argparse.Namespace,
    ops: list[dict[str, Any]],
    events: list[Event],
    final: dict[str, Any],
    checks: list[Check],
    faults: list[dict[str, Any]],
    fault_errors: list[str],
    recover_s: float | None,
    unfinished: list[str],
    fault_phase_s: float,
    expected_log_errors: dict[str, int] | None = None,
    deliveries: list[dict[str, Any]] | None = None,
    provider_log: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    by_f: dict[str, Counter[str]] = defaultdict(Counter)
    for op in ops:
        by_f[op["f"]][op["type"]] += 1
    fault_kinds = Counter(f["kind"] for f in faults)
    attempts = [a for job in final.get("jobs", []) for a in job["attempts"]]
    lease_lost = sum(1 for op in ops if op["type"] == "fail" and _code(op) == "lease_lost")
    sink_rejected = sum(1 for op in ops if op["f"] == "sink" and op["type"] == "fail")
    leaders = [e["value"] for e in events if e["f"] == "leader" and e["type"] == "note"]
    stalls = sum(1 for e in events if e["f"] == "stall")
    anomalies = {check.name: check.anomalies for check in checks}
    return {
        "seed": args.seed,
        "duration_s": round(fault_phase_s, 1),
        "nodes": args.nodes,
        "workers": args.workers,
        "clients": args.clients,
        "unsafe_ignore_fencing": bool(args.unsafe_ignore_fencing),
        "ops": {f: dict(counts) for f, counts in sorted(by_f.items())},
        "faults": {
            "total": len(faults),
            "by_kind": dict(sorted(fault_kinds.items())),
            "fault_seconds": round(sum(f["held_s"] for f in faults), 1),
            "errors": fault_errors,
        },
        # Distinct terms in which the monitor saw a leader, minus the first.
        "leader_changes": max(0, len({leader["term"] for leader in leaders}) - 1),
        "jobs": len(final.get("jobs", [])),
        "leases_granted": len(attempts),
        "leases_expired": sum(1 for a in attempts if a["outcome"] == "lease_expired"),
        "worker_stalls": stalls,
        "stale_token_rejections": lease_lost + sink_rejected,
        "stale_token_rejections_by_source": {
            "cluster_lease_lost": lease_lost,
            "sink": sink_rejected,
        },
        "recovery_bound_s": args.recovery_bound_s,
        "time_to_recover_s": None if recover_s is None else round(recover_s, 1),
        "unfinished_after_bound": unfinished[:20],
        "features": features(final, deliveries or []),
        "payments": payments(ops, events, final, provider_log or []),
        "wheel": wheel.summary(ops, events),
        # The broker relay (chaos/relay.py, checker 16): entries, events
        # published, duplicates, broker restarts, lost; or why it was skipped.
        "relay": relay_figures(final),
        "operations": operations_summary(faults, events, final),
        **({"shards": shards_summary(faults, events, final)} if final.get("shards", 1) > 1 else {}),
        "anomalies": anomalies,
        # Checkers that judged nothing, and why (a missing broker): loud, not invalid.
        "skipped_checks": {check.name: check.skipped for check in checks if check.skipped},
        # Error-level node log lines the faults explain (reason -> count);
        # any other one is an anomaly of checker 8.
        "expected_log_errors": dict(sorted((expected_log_errors or {}).items())),
        "examples": {check.name: check.examples for check in checks if check.anomalies},
        "history": str(args.out),
        "valid": all(count == 0 for count in anomalies.values()),
    }


def features(final: dict[str, Any], deliveries: list[dict[str, Any]]) -> dict[str, Any]:
    """What the schedules, workflows, webhooks and flow limits amounted to."""
    schedules = {
        schedule_id: dict(Counter(r["decision"] for r in view.get("occurrences", [])))
        for schedule_id, view in sorted((final.get("schedules") or {}).items())
    }
    workflows = Counter(w["status"] for w in (final.get("workflows") or {}).values())
    answered = Counter(d.get("answered") for d in deliveries)
    received = Counter(
        (d.get("shard") or 0, d.get("seq")) for d in deliveries if d.get("answered") == 200
    )
    jobs = final.get("jobs", [])
    return {
        "schedule_occurrences": schedules,
        "schedule_jobs": sum(1 for job in jobs if job.get("schedule_id")),
        "workflows": dict(sorted(workflows.items())),
        "workflow_jobs": sum(1 for job in jobs if job.get("workflow_id")),
        "outbox_events": (final.get("outbox") or {}).get("last_seq", 0),
        "webhook_deliveries": sum(answered.values()),
        "webhook_refused_on_purpose": answered.get(503, 0),
        "webhook_events_received": len(received),
        "webhook_redelivered": sum(count - 1 for count in received.values()),
        "limited_tenant_jobs": sum(1 for job in jobs if job.get("tenant") == LIMITED_TENANT),
        "ordering_key_jobs": sum(1 for job in jobs if job.get("ordering_key")),
    }


def payments(
    ops: list[dict[str, Any]],
    events: list[Event],
    final: dict[str, Any],
    provider_log: list[dict[str, Any]],
) -> dict[str, Any]:
    """What the payments scenario amounted to (chaos/payments.py): the
    policy, when it was enabled, the payments and how they ended, the crash
    windows the workers went through, reconciliations by decision, and the
    charges the provider made."""
    state = final.get("payments") or {}
    notes = [e for e in events if e["type"] == "note"]
    enabled = [e for e in notes if e["f"] == "payments_enabled"]
    crash_windows = Counter(e["value"]["how"] for e in notes if e["f"] == "crash_window")
    exits = [e["value"] for e in notes if e["f"] == "worker_exit"]
    jobs = [job for job in final.get("jobs", []) if job.get("queue") == PAYMENTS_QUEUE]
    unreconciled = sum(
        1
        for job in jobs
        if job["status"] == "dead_letter"
        and (job.get("last_error") or {}).get("kind") == UNRECONCILED
    )
    charges = [len(made) for made in charges_by_payment(provider_log).values()]
    queue = state.get("queue") or {}
    return {
        "policy": state.get("policy"),
        "queue_on_unknown": queue.get("on_unknown"),
        "enabled": bool(enabled),
        "enabled_at_cluster_version": enabled[0]["value"]["cluster_version"] if enabled else None,
        "submitted": len(
            {op["args"]["body"]["idempotency_key"] for op in ops if op["f"] == "submit_payment"}
        ),
        "acknowledged": len(acknowledged_payments(ops)),
        "jobs_by_status": dict(sorted(Counter(job["status"] for job in jobs).items())),
        "unreconciled_dead_letters": unreconciled,
        "crash_window": {
            "kill": crash_windows.get("kill", 0),
            "stall": crash_windows.get("stall", 0),
        },
        # Calls a worker did not start: its heartbeat came back too late.
        "charges_not_started_late_lease": sum(1 for e in notes if e["f"] == "charge_not_started"),
        "worker_restarts": len(exits),
        "worker_exits_unexpected": sum(1 for x in exits if not x.get("expected")),
        "reconciliations": reconcile_decisions(final),
        "charges": sum(charges),
        "payments_charged": len(charges),
        "max_charges_per_payment": max(charges, default=0),
        "payments_charged_more_than_once": sum(1 for n in charges if n > 1),
    }


def operations_summary(
    faults: list[dict[str, Any]], events: list[Event], final: dict[str, Any]
) -> dict[str, Any]:
    """What the operations faults amounted to: each membership change,
    upgrade and disk fault with its outcome, the node exits by status, and
    the members at the end."""
    kinds = ("add_node", "remove_node", "replace_node", "upgrade", "fsync_fail", "disk_full")
    outcomes: dict[str, Counter[str]] = defaultdict(Counter)
    for fault in faults:
        if fault["kind"] in kinds:
            kind = fault.get("adapted", fault["kind"])
            outcomes[kind][str(fault.get("outcome") or fault.get("skipped") or "held")] += 1
    exits = [e["value"] for e in events if e["f"] == "node_exit" and e["type"] == "note"]
    membership = final.get("membership") or {}
    # Membership changes not done (sharded: in every group) within the
    # nemesis's bounded wait before the next fault.
    unsettled = [
        {"kind": f["kind"], "target": f.get("target"), **(f.get("unsettled") or {})}
        for f in faults
        if f["kind"] in ("add_node", "remove_node", "replace_node") and f.get("settled") is False
    ]
    return {
        "outcomes": {kind: dict(counts) for kind, counts in sorted(outcomes.items())},
        "membership_not_settled": unsettled,
        "node_exits": dict(
            Counter(f"{x['code']} ({'expected' if x['expected'] else 'UNEXPECTED'})" for x in exits)
        ),
        "members_at_end": membership.get("members", []),
    }


def shards_summary(
    faults: list[dict[str, Any]], events: list[Event], final: dict[str, Any]
) -> dict[str, Any]:
    """Per shard (docs/shards.md): jobs and leases, leader changes (group 0:
    distinct terms with a leader; shard k: changes of its leader as the
    monitor saw them), events in its outbox, the faults aimed at it, and
    the shard events the subscription does not deliver (not built yet)."""
    count = int(final.get("shards", 1))
    jobs: Counter[int] = Counter()
    leases: Counter[int] = Counter()
    for job in final.get("jobs", []):
        # Its tokens name its shard; a job never leased, its id (a job a
        # schedule of shard k fired has a `job_` id: counted in shard 0).
        tokens = [a["fencing_token"] for a in job["attempts"]]
        shard = token_shard(tokens[0], count) if tokens else shard_of_id(job["id"])
        jobs[shard] += 1
        leases[shard] += len(job["attempts"])
    notes = [e for e in events if e["type"] == "note"]
    terms = {e["value"]["term"] for e in notes if e["f"] == "leader"}
    changes = Counter(e["value"]["shard"] for e in notes if e["f"] == "shard_leader")
    outbox = final.get("outbox") or {}
    events_by_shard = Counter(int(e.get("shard", 0)) for e in outbox.get("events", []))
    aimed: dict[int, Counter[str]] = defaultdict(Counter)
    for fault in faults:
        if "shard" in fault:
            aimed[int(fault["shard"])][fault["kind"]] += 1
    digests = final.get("shard_digests") or {}
    views = (final.get("membership") or {}).get("shard_views") or {}
    return {
        str(shard): {
            "members_at_end": _shard_members(views, shard),
            "jobs": jobs[shard],
            "leases_granted": leases[shard],
            "leader_changes": max(0, (len(terms) if shard == 0 else changes[shard]) - 1),
            "outbox_events": events_by_shard[shard],
            "faults": dict(aimed[shard]),
            "digests_equal": len({tuple(p) for p in digests.get(str(shard), {}).values()}) == 1,
        }
        for shard in range(count)
    }


def _shard_members(views: dict[str, dict[str, Any]], shard: int) -> list[str] | None:
    """Shard k's members as the first node whose replica of it answered
    lists them (shard 0: None, group 0's are `members_at_end`)."""
    for by_shard in views.values():
        view = by_shard.get(str(shard))
        if view is not None:
            return sorted(n["id"] for n in view.get("nodes", []) if n.get("status") != "removed")
    return None


def _code(op: dict[str, Any]) -> str | None:
    error = (op.get("result") or {}).get("body", {}).get("error")
    return error.get("code") if isinstance(error, dict) else None


def render_text(summary: dict[str, Any]) -> str:
    lines = [
        "",
        "=== chaos summary ===",
        f"seed {summary['seed']}  duration {summary['duration_s']} s  nodes {summary['nodes']}"
        f"  workers {summary['workers']}  clients {summary['clients']}"
        + (
            "  UNSAFE_IGNORE_FENCING (negative control)" if summary["unsafe_ignore_fencing"] else ""
        ),
        "operations (ok/fail/info):",
    ]
    for f, counts in summary["ops"].items():
        lines.append(
            f"  {f:<15} {counts.get('ok', 0):>6} / {counts.get('fail', 0):>5}"
            f" / {counts.get('info', 0):>5}"
        )
    faults = summary["faults"]
    lines.append(f"faults: {faults['total']} ({faults['fault_seconds']} fault-seconds)")
    for kind, count in faults["by_kind"].items():
        lines.append(f"  {kind:<15} {count}")
    for error in faults["errors"]:
        lines.append(f"  fault error: {error}")
    lines += [
        f"leader changes: {summary['leader_changes']}",
        f"jobs: {summary['jobs']}  leases granted: {summary['leases_granted']}"
        f"  expired: {summary['leases_expired']}  worker stalls: {summary['worker_stalls']}",
        f"stale-token rejections: {summary['stale_token_rejections']}"
        f" {summary['stale_token_rejections_by_source']}",
        f"features: {summary.get('features', {})}",
        f"payments: {summary.get('payments', {})}",
        f"time wheel: {summary.get('wheel', {})}",
        f"relay: {summary.get('relay', {})}",
        f"operations: {summary.get('operations', {})}",
        *([f"shards: {summary['shards']}"] if "shards" in summary else []),
        f"time to recover after healing: {summary['time_to_recover_s']} s"
        f" (bound {summary['recovery_bound_s']} s)",
        "anomalies per checker:",
    ]
    skipped = summary.get("skipped_checks") or {}
    for name, count in summary["anomalies"].items():
        lines.append(
            f"  {name:<38} {count}" + (f"  SKIPPED: {skipped[name]}" if name in skipped else "")
        )
        for example in summary["examples"].get(name, [])[:3]:
            lines.append(f"      e.g. {example}")
    for reason, count in summary.get("expected_log_errors", {}).items():
        lines.append(f"expected node log errors: {count} ({reason})")
    for name, why in skipped.items():
        lines.append(f"!!! CHECKER {name} SKIPPED: {why}")
    lines.append(f"valid: {summary['valid']}")
    return "\n".join(lines)
