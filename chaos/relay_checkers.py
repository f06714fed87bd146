"""Checker 16: the broker relay published every event (chaos/relay.py).

Redis's stream is the ground truth of what the relay published: every entry
it kept, in the order it kept them. A pure function of the final state, like
the other checkers (chaos/checkers.py); `check_all` runs it.

Inputs (see chaos/checkers.py for the rest of `final`):
- `final["outbox"]`: every shard's outbox, read after recovery;
- `final["jobs"]`: the jobs, for each event's expected key;
- `final["relay"]`: {"subscription_id", "stream" (the template, `{shard}`
  filled per shard), "key_field", "enabled", "skipped" (why the relay did
  not run: no redis-server), "refused" (the answer that refused the
  subscription), "start_seq" (shard 0's cursor when it was created),
  "start_seqs" (each shard's last seq read just after), "parked_retried"
  ([shard, seq] of the events parked and retried once during recovery),
  "subscription" (its final view: every shard's cursor, parked events),
  "streams" {stream: [{"entry": Redis's entry id, "fields": {id, type,
  seq, tenant, key, shard, data}}] in stream order}, "read_error",
  "broker" {"restarts", "dropped_repeats_at_least"}}.

What it holds, per shard (each shard's copy publishes to its own stream):
- every entry is well formed, in its shard's stream, its id names its
  shard and seq (`evt_<seq>`, `evt<k>_<seq>`), its fields agree with its
  body (the webhook's envelope, `subscription_id` the relay's), and the
  outbox holds that event with the same type and data; its tenant is the
  event's and its key the one `key_field` names (the job's payload field,
  else its idempotency key, workflow id or id; not judged for an event
  whose job the final state no longer holds);
- after deduplication by id the stream holds every seq from its first
  entry's (or the first after the subscription's start, if lower) to the
  outbox's last, without a gap: every event after the start arrived at
  least once. One that never did is *lost* when the subscription's cursor
  for its shard passed it and it is not parked (the relay moved on without
  the broker's confirm), else *not delivered within the recovery bound*
  (behind the cursor, or parked): the run waits for the relay to drain
  as for the webhook, so both are anomalies;
- each event's first arrival is in seq order (the relay publishes in order
  on one connection and goes back to the first unconfirmed message), except
  an event parked and retried, which arrives after later ones by design;
- duplicates (entries of an id already seen) are a figure, not an anomaly:
  at least once allows them, and Redis's dedup script normally drops them.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

from chaos.checkers import Check, _last_seqs
from chaos.cursors import cursor_seqs
from raftsched.shards import event_id

RELAY_CHECK: Final = "16_relay_published"
FIELDS: Final = ("id", "type", "seq", "tenant", "key", "shard", "data")
LOST: Final = "event lost: the cursor passed it, the stream never got it"
NOT_DELIVERED: Final = "event not published within the recovery bound"
OUT_OF_ORDER: Final = "first arrival out of seq order"


@dataclass(frozen=True)
class Entry:
    entry: str  # Redis's entry id
    id: str
    type: str
    seq: int
    tenant: str
    key: str
    shard: int
    body: dict[str, Any]


def relay_published(final: dict[str, Any]) -> Check:
    return _judge(final)[0]


def relay_figures(final: dict[str, Any]) -> dict[str, Any]:
    """What the relay amounted to, for the summary."""
    return _judge(final)[1]


def _judge(final: dict[str, Any]) -> tuple[Check, dict[str, Any]]:
    check = Check(RELAY_CHECK)
    relay = final.get("relay")
    figures: dict[str, Any] = {"enabled": bool(relay and relay.get("enabled"))}
    if relay is None:
        check.skipped = figures["skipped"] = "no relay in this run"
        return check, figures
    if relay.get("skipped"):
        check.skipped = figures["skipped"] = str(relay["skipped"])
        return check, figures
    if not relay.get("enabled"):
        if relay.get("refused"):
            check.flag(problem="relay subscription refused", answer=relay["refused"])
        else:
            why = "the relay subscription was never created (cluster version below 10 to the end)"
            check.skipped = figures["skipped"] = why
        return check, figures
    if relay.get("read_error"):
        check.flag(problem="streams unreadable at the end", error=relay["read_error"])
        return check, figures
    box = final.get("outbox") or {}
    lasts = _last_seqs(box.get("last_seq", 0))
    events = {(int(e.get("shard", 0)), int(e["seq"])): e for e in box.get("events", [])}
    jobs = {job["id"]: job for job in final.get("jobs", [])}
    sub = relay.get("subscription") or {}
    cursors = cursor_seqs(sub.get("cursor_seq", 0))
    cursors += [None] * (len(lasts) - len(cursors))
    parked = {
        (int(item.get("shard", 0)), int(item["event"]["seq"])) for item in sub.get("parked", [])
    }
    retried = {(int(shard), int(seq)) for shard, seq in relay.get("parked_retried", [])}
    starts = [int(x) for x in relay.get("start_seqs") or [0]]
    starts += [0] * (len(lasts) - len(starts))
    starts[0] = int(relay.get("start_seq", starts[0]))
    streams: dict[str, list[dict[str, Any]]] = relay.get("streams") or {}
    entries_total, unique_total = 0, 0
    per_stream: dict[str, int] = {}
    counts: Counter[str] = Counter()
    for shard, last in enumerate(lasts):
        name = str(relay.get("stream", "chaos:{shard}")).replace("{shard}", str(shard))
        where = {"shard": shard} if len(lasts) > 1 else {}
        rows = streams.get(name, [])
        per_stream[name] = len(rows)
        first: dict[str, int] = {}
        highest = 0
        for row in rows:
            entry = _parse(row)
            if isinstance(entry, str):
                check.flag(problem="malformed entry", entry=row.get("entry"), why=entry, **where)
                continue
            _judge_entry(check, entry, shard, events, jobs, relay, where)
            if entry.id in first or entry.shard != shard:
                continue
            first[entry.id] = entry.seq
            if entry.seq < highest and (shard, entry.seq) not in retried:
                check.flag(problem=OUT_OF_ORDER, seq=entry.seq, after=highest, **where)
                counts[OUT_OF_ORDER] += 1
            highest = max(highest, entry.seq)
        entries_total += len(rows)
        unique_total += len(first)
        received = set(first.values())
        lowest = min([starts[shard] + 1, *received])
        cursor = cursors[shard]
        for seq in range(lowest, last + 1):
            if seq in received:
                continue
            if (shard, seq) in parked or cursor is None or seq > cursor:
                state = "parked" if (shard, seq) in parked else "behind the cursor"
                check.flag(problem=NOT_DELIVERED, seq=seq, state=state, **where)
                counts[NOT_DELIVERED] += 1
            else:
                check.flag(problem=LOST, seq=seq, cursor=cursor, **where)
                counts[LOST] += 1
    broker = relay.get("broker") or {}
    figures |= {
        "streams": per_stream,
        "entries": entries_total,
        "events_published": unique_total,
        "duplicates": entries_total - unique_total,
        "republished_and_dropped_at_least": broker.get("dropped_repeats_at_least"),
        "broker_restarts": broker.get("restarts", 0),
        # Per restart: how, how long down, the events waiting for the relay
        # just before the server came back (0: the outage did not bite).
        "broker_outages": broker.get("outages", []),
        "lost": counts[LOST],
        "not_published_within_bound": counts[NOT_DELIVERED],
        "first_arrivals_out_of_order": counts[OUT_OF_ORDER],
        "parked_at_end": len(parked),
        "parked_retried": len(retried),
    }
    return check, figures


def _parse(row: dict[str, Any]) -> Entry | str:
    """An entry, or why it is malformed."""
    fields = row.get("fields") or {}
    missing = [name for name in FIELDS if name not in fields]
    if missing:
        return f"fields missing: {missing}"
    try:
        body = json.loads(fields["data"])
        seq, shard = int(fields["seq"]), int(fields["shard"])
    except (TypeError, ValueError) as error:
        return repr(error)
    if not isinstance(body, dict):
        return "data is not a JSON object"
    return Entry(
        str(row.get("entry")),
        fields["id"],
        fields["type"],
        seq,
        fields["tenant"],
        fields["key"],
        shard,
        body,
    )


def _judge_entry(
    check: Check,
    entry: Entry,
    shard: int,
    events: dict[tuple[int, int], dict[str, Any]],
    jobs: dict[str, dict[str, Any]],
    relay: dict[str, Any],
    where: dict[str, Any],
) -> None:
    seq = entry.seq
    if entry.shard != shard:
        check.flag(
            problem="entry in another shard's stream", seq=seq, its_shard=entry.shard, **where
        )
    if entry.id != event_id(entry.shard, seq):
        check.flag(problem="entry's id is not its shard and seq", seq=seq, id=entry.id, **where)
    body = entry.body
    envelope = (body.get("id"), body.get("seq"), body.get("type"), body.get("subscription_id"))
    if envelope != (entry.id, seq, entry.type, relay.get("subscription_id")):
        check.flag(problem="entry's fields differ from its body", seq=seq, **where)
    event = events.get((entry.shard, seq))
    if event is None:
        check.flag(problem="published an event the outbox does not hold", seq=seq, **where)
        return
    if (event["type"], event.get("data")) != (entry.type, body.get("data")):
        check.flag(
            problem="published event differs from the outbox's",
            seq=seq,
            published=entry.type,
            held=event["type"],
            **where,
        )
    data = event.get("data") or {}
    if entry.tenant != str(data.get("tenant") or ""):
        check.flag(
            problem="entry's tenant is not the event's", seq=seq, tenant=entry.tenant, **where
        )
    wanted = expected_key(event, jobs, relay.get("key_field"))
    if wanted is not None and entry.key != wanted:
        check.flag(
            problem="entry's key is not the one key_field names",
            seq=seq,
            key=entry.key,
            wanted=wanted,
            **where,
        )


def expected_key(
    event: dict[str, Any], jobs: dict[str, dict[str, Any]], key_field: str | None
) -> str | None:
    """The key the relay must give `event` (docs/relays.md section 2: the
    job's payload field `key_field`, else its idempotency key, workflow id
    or id; an event about no job, its workflow or schedule id); None when
    it cannot be told (the job is gone from the final state: it may have
    been there when the event was published)."""
    data = event.get("data") or {}
    job_id = data.get("job_id")
    if isinstance(job_id, str):
        job = jobs.get(job_id)
        if job is None:
            return None
        payload = job.get("payload")
        if key_field and isinstance(payload, dict):
            found = payload.get(key_field)
            if found is not None and not isinstance(found, (dict, list)):
                return found if isinstance(found, str) else json.dumps(found)
        for candidate in (job.get("idempotency_key"), job.get("workflow_id"), job.get("id")):
            if candidate:
                return str(candidate)
    for name in ("workflow_id", "job_id", "schedule_id"):
        value = data.get(name)
        if value:
            return str(value)
    return ""
