"""Checker 16 (the broker relay published every event) on hand-made final
states: a clean run passes; a lost event, an event not published within the
recovery bound, an out-of-order first arrival and entries that differ from
the outbox are flagged; a duplicate is a figure, not an anomaly; a run
without redis-server is skipped loudly. Then the broker's own pieces: its
fault schedule is a function of the seed that leaves the nodes' schedule
alone, and a real redis-server keeps every entry across a kill and a stop."""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import threading
from pathlib import Path
from typing import Any

import chaos_support as s
import pytest
from chaos.broker import (
    BROKER_DOWN_S,
    BROKER_FAULT,
    BROKER_WINDOW,
    RedisBroker,
    broker_schedule,
    redis_server_binary,
)
from chaos.checkers import check_all
from chaos.relay import RELAY_KEY_FIELD, RELAY_STREAM, RELAY_SUBSCRIPTION_ID, skipped_state
from chaos.relay_checkers import (
    LOST,
    NOT_DELIVERED,
    OUT_OF_ORDER,
    RELAY_CHECK,
    expected_key,
    relay_figures,
    relay_published,
)
from chaos.summary import render_text, summarize

from chaos import nemesis

# -- builders ----------------------------------------------------------------------


def event(seq: int, job_id: str, shard: int = 0, kind: str = "job.succeeded") -> dict[str, Any]:
    data = {"job_id": job_id, "queue": "chaos", "tenant": "default", "attempts": 1}
    found = {"seq": seq, "type": kind, "at": s.iso(seq * 1000), "data": data}
    if shard:
        found["shard"] = shard
    return found


def client_job(job_id: str, n: int) -> dict[str, Any]:
    found = s.job(job_id, key=f"c0-{n}")
    found["payload"] = {"n": n}
    return found


def entry(found: dict[str, Any], key: str, shard: int = 0, **change: Any) -> dict[str, Any]:
    """The stream entry the relay writes for outbox event `found`."""
    seq = int(found["seq"])
    event_id = f"evt_{seq}" if shard == 0 else f"evt{shard}_{seq}"
    body = {
        "id": event_id,
        "seq": seq,
        "type": found["type"],
        "at": found["at"],
        "subscription_id": RELAY_SUBSCRIPTION_ID,
        "data": found["data"],
    }
    fields = {
        "id": event_id,
        "type": found["type"],
        "seq": str(seq),
        "tenant": found["data"]["tenant"],
        "key": key,
        "shard": str(shard),
        "data": json.dumps(body),
    }
    fields |= {name: str(value) for name, value in change.items()}
    return {"entry": f"{1000 + seq}-0", "fields": fields}


def relay_state(
    streams: dict[str, list[Any]],
    cursor: str | int,
    start_seq: int = 0,
    start_seqs: list[int] | None = None,
    parked: list[Any] | None = None,
    parked_retried: list[Any] | None = None,
) -> dict[str, Any]:
    return {
        "subscription_id": RELAY_SUBSCRIPTION_ID,
        "stream": RELAY_STREAM,
        "key_field": RELAY_KEY_FIELD,
        "enabled": True,
        "refused": None,
        "start_seq": start_seq,
        "start_seqs": start_seqs or [start_seq],
        "parked_retried": parked_retried or [],
        "subscription": {
            "id": RELAY_SUBSCRIPTION_ID,
            "cursor_seq": cursor,
            "parked_count": len(parked or []),
            "parked": parked or [],
        },
        "streams": streams,
        "broker": {
            "restarts": 1,
            "dropped_repeats_at_least": 2,
            "outages": [{"how": "kill", "down_s": 3.1, "events_waiting": 4}],
        },
    }


def clean(count: int = 5) -> dict[str, Any]:
    """`count` events of client jobs j1..jN, each published once, in order."""
    jobs = [client_job(f"j{n}", n) for n in range(1, count + 1)]
    events = [event(n, f"j{n}") for n in range(1, count + 1)]
    final = s.final(*jobs)
    final["outbox"] = {"events": events, "first_seq": 1, "last_seq": count}
    rows = [entry(e, key=str(n)) for n, e in enumerate(events, 1)]
    final["relay"] = relay_state({"chaos:0": rows}, cursor=count)
    return final


def rows(final: dict[str, Any], shard: int = 0) -> list[Any]:
    result: list[Any] = final["relay"]["streams"][f"chaos:{shard}"]
    return result


def problems(final: dict[str, Any]) -> list[str]:
    return [example["problem"] for example in relay_published(final).examples]


# -- checker 16 --------------------------------------------------------------------


def test_a_clean_run_passes_with_its_figures() -> None:
    final = clean()
    check = relay_published(final)
    assert (check.name, check.anomalies, check.skipped) == (RELAY_CHECK, 0, None)
    figures = relay_figures(final)
    assert figures["entries"] == figures["events_published"] == 5
    assert figures["streams"] == {"chaos:0": 5}
    assert figures["duplicates"] == figures["lost"] == 0
    assert figures["not_published_within_bound"] == figures["first_arrivals_out_of_order"] == 0
    assert figures["broker_restarts"] == 1
    assert figures["republished_and_dropped_at_least"] == 2
    assert figures["broker_outages"] == [{"how": "kill", "down_s": 3.1, "events_waiting": 4}]


def test_every_checker_sees_the_clean_relay_and_16_is_last() -> None:
    checks = check_all([], clean(), [], [], [], [])
    assert checks[-1].name == RELAY_CHECK
    assert [c.anomalies for c in checks] == [0] * len(checks)


def test_a_duplicate_is_a_figure_not_an_anomaly() -> None:
    final = clean()
    # The relay published evt_3 again after a leader change, and the dedup
    # window did not drop it: it arrives again after later events.
    rows(final).append(copy.deepcopy(rows(final)[2]))
    assert relay_published(final).anomalies == 0
    figures = relay_figures(final)
    assert (figures["entries"], figures["events_published"], figures["duplicates"]) == (6, 5, 1)


def test_an_event_the_cursor_passed_that_never_arrived_is_lost() -> None:
    final = clean()
    del rows(final)[2]  # evt_3; the cursor is at 5, nothing parked
    check = relay_published(final)
    assert check.anomalies == 1
    assert check.examples[0] == {"problem": LOST, "seq": 3, "cursor": 5}
    assert relay_figures(final)["lost"] == 1


def test_the_first_event_missing_is_lost_too() -> None:
    """Gapless from the subscription's start, not from the first entry."""
    final = clean()
    del rows(final)[0]
    assert problems(final) == [LOST]


def test_events_behind_the_cursor_or_parked_were_not_published_within_the_bound() -> None:
    final = clean()
    del rows(final)[3:]  # evt_4 and evt_5
    parked = [{"shard": 0, "event": event(4, "j4"), "attempts": 8}]
    final["relay"]["subscription"] |= {"cursor_seq": 4, "parked": parked, "parked_count": 1}
    check = relay_published(final)
    assert [(e["problem"], e["seq"], e["state"]) for e in check.examples] == [
        (NOT_DELIVERED, 4, "parked"),
        (NOT_DELIVERED, 5, "behind the cursor"),
    ]
    figures = relay_figures(final)
    assert (figures["lost"], figures["not_published_within_bound"]) == (0, 2)
    assert figures["parked_at_end"] == 1


def test_a_first_arrival_out_of_seq_order_is_flagged() -> None:
    final = clean()
    stream = rows(final)
    stream[1], stream[2] = stream[2], stream[1]  # evt_3 first stored before evt_2
    check = relay_published(final)
    assert [(e["problem"], e["seq"], e["after"]) for e in check.examples] == [(OUT_OF_ORDER, 2, 3)]
    assert relay_figures(final)["first_arrivals_out_of_order"] == 1


def test_a_repeat_after_later_events_keeps_the_first_arrivals_in_order() -> None:
    """Go-back-N: evt_2..3 stored, the confirm lost, evt_2..5 published again."""
    final = clean()
    stream = rows(final)
    stream[3:3] = copy.deepcopy(stream[1:3])
    assert relay_published(final).anomalies == 0
    assert relay_figures(final)["duplicates"] == 2


def test_a_parked_event_retried_may_arrive_after_later_ones() -> None:
    final = clean()
    stream = rows(final)
    stream.append(stream.pop(1))  # evt_2 parked, retried once during recovery
    assert problems(final) == [OUT_OF_ORDER]
    final["relay"]["parked_retried"] = [[0, 2]]
    assert relay_published(final).anomalies == 0


@pytest.mark.parametrize(
    ("index", "change", "wanted"),
    [
        (0, {"type": "job.dead_lettered"}, {"published event differs from the outbox's",
                                             "entry's fields differ from its body"}),
        (1, {"key": "c0-2"}, {"entry's key is not the one key_field names"}),
        (1, {"tenant": "acme"}, {"entry's tenant is not the event's"}),
        (2, {"id": "evt_99"}, {"entry's id is not its shard and seq",
                               "entry's fields differ from its body"}),
    ],
)  # fmt: skip
def test_entries_that_differ_from_the_outbox_are_flagged(
    index: int, change: dict[str, str], wanted: set[str]
) -> None:
    final = clean()
    stream = rows(final)
    stream[index]["fields"] |= change
    assert set(problems(final)) == wanted


def test_an_entry_whose_body_differs_from_the_outbox_is_flagged() -> None:
    final = clean()
    fields = rows(final)[0]["fields"]
    body = json.loads(fields["data"])
    body["data"]["attempts"] = 2
    fields["data"] = json.dumps(body)
    assert problems(final) == ["published event differs from the outbox's"]


def test_an_event_no_outbox_holds_is_flagged() -> None:
    final = clean()
    rows(final).append(entry(event(6, "j6"), key="6"))
    assert problems(final) == ["published an event the outbox does not hold"]


def test_a_malformed_entry_is_flagged() -> None:
    final = clean()
    del rows(final)[0]["fields"]["key"]
    assert problems(final) == ["malformed entry", LOST]


def test_the_key_falls_back_as_the_relay_does() -> None:
    jobs = {"j1": client_job("j1", 7), "j2": s.job("j2", key="pay-1")}
    assert expected_key(event(1, "j1"), jobs, "n") == "7"
    assert expected_key(event(2, "j2"), jobs, "n") == "pay-1"  # no `n`: idempotency key
    assert expected_key(event(3, "gone"), jobs, "n") is None  # job removed: not judged
    workflow = {"seq": 4, "type": "workflow.failed", "data": {"workflow_id": "wf_1"}}
    assert expected_key(workflow, jobs, "n") == "wf_1"


def test_per_shard_streams_cursors_and_starts() -> None:
    """Sharded: each shard's stream holds its own events from its start on,
    with ids naming the shard; a hole is judged against that shard's cursor."""
    jobs = [client_job(f"j{n}", n) for n in range(1, 7)]
    shard0 = [event(1, "j1"), event(2, "j2")]
    shard1 = [event(n, f"j{n + 2}", shard=1) for n in range(1, 5)]
    final = s.final(*jobs)
    final["shards"] = 2
    final["outbox"] = {"events": shard0 + shard1, "last_seq": "v1.2.4"}
    streams = {
        "chaos:0": [entry(e, key=str(n)) for n, e in enumerate(shard0, 1)],
        # Shard 1's events 1 and 2 came before the subscription's start
        # (its seq 1 read just after): 2 was published anyway, 1 was not.
        "chaos:1": [entry(e, key=str(n + 3), shard=1) for n, e in enumerate(shard1[1:], 1)],
    }
    final["relay"] = relay_state(streams, cursor="v1.2.4", start_seqs=[0, 1])
    check = relay_published(final)
    assert check.anomalies == 0, check.examples
    assert relay_figures(final)["streams"] == {"chaos:0": 2, "chaos:1": 3}
    del streams["chaos:1"][1]  # evt1_3: shard 1's cursor (4) passed it
    assert relay_published(final).examples == [{"problem": LOST, "seq": 3, "cursor": 4, "shard": 1}]
    streams["chaos:0"].append(entry(shard1[3], key="6", shard=1))  # in shard 0's stream
    assert "entry in another shard's stream" in problems(final)


def test_a_run_without_redis_server_skips_the_checker_loudly(tmp_path: Path) -> None:
    final = s.final()
    final["relay"] = skipped_state("redis-server is not installed")
    check = relay_published(final)
    assert (check.anomalies, check.skipped) == (0, "redis-server is not installed")
    args = argparse.Namespace(
        seed=3, nodes=3, workers=2, clients=2, unsafe_ignore_fencing=False,
        recovery_bound_s=60.0, out=tmp_path,
    )  # fmt: skip
    summary = summarize(args, [], [], final, [check], [], [], 1.0, [], 10.0)
    assert summary["valid"] is True
    assert summary["skipped_checks"] == {RELAY_CHECK: "redis-server is not installed"}
    assert summary["relay"]["skipped"] == "redis-server is not installed"
    assert f"CHECKER {RELAY_CHECK} SKIPPED: redis-server is not installed" in render_text(summary)


def test_a_refused_subscription_is_an_anomaly() -> None:
    final = clean()
    final["relay"] = {**final["relay"], "enabled": False, "refused": {"status": 422}}
    assert problems(final) == ["relay subscription refused"]


def test_a_mixed_version_run_that_never_opened_version_10_is_skipped() -> None:
    final = clean()
    final["relay"] = {**final["relay"], "enabled": False}
    check = relay_published(final)
    assert check.anomalies == 0 and check.skipped is not None


# -- the broker's faults and the real server ------------------------------------------


def test_broker_schedule_is_seeded_and_leaves_the_nodes_schedule_alone() -> None:
    faults = broker_schedule(20251129, 150)
    assert faults == broker_schedule(20251129, 150)
    assert faults != broker_schedule(20251130, 150)
    assert len(faults) == 2 and len(broker_schedule(7, 720)) == 8
    assert broker_schedule(1, 10) == []
    for fault in faults:
        assert fault.kind == BROKER_FAULT and fault.params["how"] in ("stop", "kill")
        assert BROKER_DOWN_S[0] <= fault.hold_s <= BROKER_DOWN_S[1]
        assert BROKER_WINDOW[0] * 150 <= fault.at_s
        assert fault.at_s + fault.hold_s <= BROKER_WINDOW[1] * 150 + 0.1
    assert faults[0].at_s + faults[0].hold_s <= faults[1].at_s
    assert BROKER_FAULT not in nemesis.KINDS  # a schedule of its own


@pytest.mark.skipif(redis_server_binary() is None, reason="redis-server is not installed")
def test_the_broker_keeps_every_entry_across_a_kill_and_a_stop(tmp_path: Path) -> None:
    binary = redis_server_binary()
    assert binary is not None and shutil.which(binary)
    broker = RedisBroker(tmp_path / "redis", "127.0.0.1", "pw-test", binary)
    broker.start()
    try:
        client = broker.client()
        for n in range(1, 1501):  # more than a page
            client.xadd("chaos:0", {"id": f"evt_{n}", "seq": n})
            client.get(f"chaos:0:dedup:evt_{n}")
        client.get("chaos:0:dedup:evt_1")  # a repeat the window dropped
        down = threading.Event()
        outage = broker.restart_after("kill", 0.2, down, waiting=lambda: 3)
        assert outage["how"] == "kill" and outage["events_waiting"] == 3
        assert outage["down_s"] >= 0.2 and broker.running
        broker.stop("stop")
        assert not broker.running
        broker.start()
        assert (broker.restarts, broker.outages) == (1, [outage])
        found = broker.entries("chaos:0")
        assert [int(row["fields"]["seq"]) for row in found] == list(range(1, 1501))
        assert found[0]["fields"]["id"] == "evt_1" and found[0]["entry"]
        assert broker.dropped_repeats() == 1
        assert "***" not in broker.url and "pw-test" in broker.url
    finally:
        broker.close()
    assert not broker.running
