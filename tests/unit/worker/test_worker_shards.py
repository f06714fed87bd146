"""A worker of a cluster of several shards (docs/shards.md, section 4): one
claim loop per shard sharing the worker's slots (`_slots`, step by step),
then the worker against an in-memory lease server of three shards."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from fakeleases import FakeLeases, run, running_worker

from raftsched.worker import JobContext
from raftsched.worker._kinds import Routes
from raftsched.worker._shards import ONE_SHARD, ShardMap, shard_map_of
from raftsched.worker._slots import CROWDED_POLL_WAIT_S, LoopState, ShardSlots

# -- who claims how many slots ------------------------------------------------


def test_four_slots_over_three_idle_shards_poll_with_two_one_and_one() -> None:
    slots = ShardSlots([0, 1, 2])
    free = 4
    for shard, wanted in ((0, 2), (1, 1), (2, 1)):
        share = slots.share(shard, free)
        assert share == wanted
        assert not slots.crowded(shard, free - share)
        slots.poll(shard, share)
        free -= share
    assert [slots.held(shard) for shard in range(3)] == [2, 1, 1]
    # No slot is left: no loop claims, whoever asks.
    slots.polled(1, 1)
    assert slots.share(1, 0) == 0


def test_the_order_loops_ask_in_does_not_change_the_split() -> None:
    slots = ShardSlots([0, 1, 2])
    assert slots.share(2, 4) == 1  # third in line
    slots.poll(2, 1)
    assert slots.share(0, 3) == 2
    slots.poll(0, 2)
    assert slots.share(1, 1) == 1


def test_one_shard_gets_every_free_slot_and_is_never_crowded() -> None:
    slots = ShardSlots([0])
    assert slots.share(0, 7) == 7
    slots.poll(0, 7)
    assert not slots.crowded(0, 0)
    slots.polled(0, 7)
    slots.started(0)
    assert slots.owed(0) == 0
    assert slots.share(0, 6) == 6


def test_fewer_slots_than_shards_poll_in_turn_and_briefly() -> None:
    slots = ShardSlots([0, 1, 2])
    assert slots.share(0, 1) == 1
    assert slots.share(1, 1) == 0 and slots.share(2, 1) == 0  # not their turn
    # Shards 1 and 2 would wait for the slot: shard 0's poll must be short.
    assert slots.crowded(0, 0)
    slots.poll(0, 1)
    assert slots.share(1, 0) == 0
    slots.polled(0, 1)  # nothing came: shard 0 goes to the back
    assert [slots.share(shard, 1) for shard in range(3)] == [0, 1, 0]
    slots.poll(1, 1)
    slots.polled(1, 1)
    assert [slots.share(shard, 1) for shard in range(3)] == [0, 0, 1]


def test_a_starved_shard_goes_before_one_that_runs_jobs() -> None:
    slots = ShardSlots([0, 1])
    slots.poll(0, 2)
    slots.polled(0, 2)
    slots.started(0)  # its claim brought one job: shard 0 holds a slot
    slots.wait(1)
    # Shard 1 waited from the start (earlier turn) and holds nothing.
    assert slots.share(0, 1) == 0
    assert slots.share(1, 1) == 1
    # Even when shard 0 waited longer: shard 1 holds nothing, it goes first.
    slots.poll(1, 1)
    slots.polled(1, 1)
    assert slots.share(0, 1) == 0 and slots.share(1, 1) == 1


def test_next_claims_leave_a_slot_to_each_starved_shard() -> None:
    slots = ShardSlots([0, 1, 2])
    for shard in (0, 1, 2):
        slots.rest(shard)
    slots.started(0)
    slots.started(0)
    slots.wait(0)
    assert slots.owed(0) == 0  # nobody else waits
    slots.wait(1)
    assert slots.owed(0) == 1
    slots.wait(2)
    assert slots.owed(0) == 2
    slots.reserve(2, 1)  # a next claim of shard 2 may bring it a job
    assert slots.owed(0) == 1
    slots.unreserve(2, 1)
    slots.rest(1)  # backing off (no leader): owed nothing
    assert slots.owed(0) == 1
    assert slots.owed(1) == 1  # shard 0 runs jobs, shard 2 waits with none


def test_a_resting_loop_takes_no_slot_and_leaves_them_to_the_others() -> None:
    slots = ShardSlots([0, 1])
    slots.rest(1)
    assert slots.state(1) is LoopState.RESTING
    assert slots.share(1, 4) == 0
    assert slots.share(0, 4) == 4
    assert not slots.crowded(0, 0)
    slots.wait(1)  # back: it waits behind shard 0
    assert slots.share(0, 4) == 2 and slots.share(1, 4) == 2


# -- the map of shards ---------------------------------------------------------


def test_the_shard_map_of_a_cluster_view() -> None:
    assert shard_map_of({"node_id": "n1"}) == ONE_SHARD
    assert shard_map_of({"shards": [{"shard": 0, "leader": None}]}) == ONE_SHARD
    view = {
        "shards": [
            {"shard": 0, "leader": {"id": "n2", "http_url": "http://127.0.0.1:8702"}},
            {"shard": 1, "leader": None, "status": "down"},
            {"shard": 2, "leader": {"id": "n1", "http_url": "http://127.0.0.1:8701"}},
            "not a shard",
        ]
    }
    assert shard_map_of(view) == ShardMap(
        3, {0: "http://127.0.0.1:8702", 2: "http://127.0.0.1:8701"}
    )


# -- a worker of three shards ----------------------------------------------------


class Peak:
    """Handler runs at once: the most seen."""

    def __init__(self, pause_s: float = 0.03) -> None:
        self.active = 0
        self.most = 0
        self._lock = threading.Lock()
        self._pause_s = pause_s

    def __call__(self, ctx: JobContext) -> dict[str, Any]:
        with self._lock:
            self.active += 1
            self.most = max(self.most, self.active)
        try:
            time.sleep(self._pause_s)
        finally:
            with self._lock:
                self.active -= 1
        return {"job": ctx.job_id}


def _sharded(fake: FakeLeases, shards: int = 3) -> None:
    fake.shard_count = shards


def _all_done(fake: FakeLeases) -> Callable[[], bool]:
    return lambda: all(job.status == "succeeded" for job in fake.jobs.values())


def test_a_worker_polls_every_shard_and_shares_its_slots() -> None:
    peak = Peak()

    async def scenario(fake: FakeLeases) -> None:
        _sharded(fake)
        async with running_worker(fake, peak, concurrency=4, poll_wait_s=1.0) as worker:
            # Idle: each shard long-polls, with 2, 1 and 1 of the 4 slots.
            await fake.wait_for(lambda: len(+fake.polling) == 3)
            assert dict(fake.polling) == {0: 2, 1: 1, 2: 1}
            assert worker.shards == [0, 1, 2]
            for n in range(45):
                fake.add(f"job{n % 3}_{n}", {"n": n}, shard=n % 3)
            await fake.wait_for(_all_done(fake), timeout_s=20)
        assert peak.most <= 4
        assert fake.polling_max <= 4
        # Every lease operation went to its job's shard, and so did each
        # batch's next claim (the fake claims from the shard a batch names).
        assert fake.misrouted == []
        assert set(fake.batch_shards) == {0, 1, 2}
        assert fake.nexts, "finished jobs' reports carried next claims"
        # Shard 0 is the worker's own client (no header), the others named.
        assert {shard: header for shard, header in
                zip(fake.claim_shards, fake.claim_headers, strict=True)} == {
            0: None, 1: "1", 2: "2"}  # fmt: skip
        assert fake.cluster_reads == 1

    run(scenario)


def test_fewer_slots_than_shards_serve_every_shard_in_turn() -> None:
    peak = Peak(pause_s=0.01)

    async def scenario(fake: FakeLeases) -> None:
        _sharded(fake)
        for shard in range(3):
            fake.add(f"job{shard}_a", shard=shard)
        async with running_worker(fake, peak, concurrency=1, poll_wait_s=2.0):
            await fake.wait_for(_all_done(fake), timeout_s=10)
            # Idle, the one slot goes round the shards in short polls.
            claims = fake.claims
            await fake.wait_for(lambda: fake.claims >= claims + 4, timeout_s=10)
        assert peak.most == 1
        assert fake.polling_max <= 1
        assert set(fake.claim_shards) == {0, 1, 2}
        assert max(fake.claim_waits) <= CROWDED_POLL_WAIT_S

    run(scenario)


def test_a_shard_without_a_leader_stops_only_its_own_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario(fake: FakeLeases) -> None:
        _sharded(fake)
        fake.down_shards = {1}
        for n in range(12):
            fake.add(f"job{n % 3}_{n}", shard=n % 3)
        with caplog.at_level(logging.INFO, logger="raftsched"):
            async with running_worker(fake, Peak(0.001), concurrency=2, poll_wait_s=0.5):
                up = [job for job in fake.jobs.values() if job.shard != 1]
                await fake.wait_for(lambda: all(j.status == "succeeded" for j in up), 10)
                assert all(j.status == "pending" for j in fake.jobs.values() if j.shard == 1)
                assert fake.claim_shards.count(1) > 1  # it keeps trying
                fake.down_shards.clear()  # elected
                await fake.wait_for(_all_done(fake), timeout_s=15)
        failed = [r for r in caplog.records if r.getMessage() == "claim failed"]
        assert failed and all(r.levelno == logging.WARNING for r in failed)
        assert {getattr(r, "shard", None) for r in failed} == {1}
        assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []

    run(scenario)


def test_a_worker_token_learns_the_shards_from_the_time_route() -> None:
    async def scenario(fake: FakeLeases) -> None:
        _sharded(fake)
        fake.cluster_forbidden = True
        fake.down_shards = {1}  # its failed claims find no leaders to learn there
        fake.add("job2_a", shard=2)
        async with running_worker(fake, Peak(0.001)):
            await fake.wait_for(_all_done(fake))
            await fake.wait_for(lambda: fake.claim_shards.count(1) > 1)
        assert fake.misrouted == []
        assert fake.cluster_reads == 1

    run(scenario)


def test_shards_unknown_at_start_are_learnt_from_a_later_claim(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("raftsched.worker._agent.REFRESH_MIN_S", 0.3)

    async def scenario(fake: FakeLeases) -> None:
        _sharded(fake)
        fake.cluster_unavailable = True
        fake.add("job_0", shard=0)
        fake.add("job2_a", shard=2)
        with caplog.at_level(logging.INFO, logger="raftsched.worker"):
            async with running_worker(fake, Peak(0.001)) as worker:
                # Meanwhile it claims from shard 0, as a worker of one shard.
                await fake.wait_for(lambda: fake.jobs["job_0"].status == "succeeded")
                assert worker.shards == [0]
                fake.cluster_unavailable = False
                await fake.wait_for(_all_done(fake))
                assert worker.shards == [0, 1, 2]
        messages = [record.getMessage() for record in caplog.records]
        assert any(m.startswith("could not read the cluster's shards") for m in messages)
        assert "claiming from every shard of the cluster" in messages

    run(scenario)


def test_a_cluster_of_one_shard_is_claimed_from_as_before() -> None:
    async def scenario(fake: FakeLeases) -> None:
        for n in range(6):
            fake.add(f"job_{n}")
        async with running_worker(fake, Peak(0.001)) as worker:
            await fake.wait_for(_all_done(fake))
            assert worker.shards == [0]
        assert fake.cluster_reads == 1  # at start, and never again
        assert set(fake.claim_headers) == {None}

    run(scenario)


def test_a_pinned_shard_is_the_only_one_claimed_from() -> None:
    async def scenario(fake: FakeLeases) -> None:
        _sharded(fake)
        fake.add("job2_a", shard=2)
        fake.add("job1_a", shard=1)
        async with running_worker(fake, Peak(0.001), shard=2) as worker:
            await fake.wait_for(lambda: fake.jobs["job2_a"].status == "succeeded")
            await asyncio.sleep(0.3)
            assert worker.shards == [2]
        assert fake.jobs["job1_a"].status == "pending"
        assert fake.cluster_reads == 0
        assert set(fake.claim_headers) == {"2"}

    run(scenario)


def test_a_kinds_limit_is_shared_by_the_shards_polls() -> None:
    routes = Routes()
    routes.add("charge", lambda ctx: None, 2)
    alone = routes.plan(4)
    assert alone is not None and alone.caps == {"charge": 2} and alone.max_jobs == 2
    first = routes.plan(4, parts=3)
    assert first is not None and first.caps == {"charge": 1} and first.max_jobs == 1
    routes.hold(first)
    second = routes.plan(4, parts=3)
    assert second is not None and second.caps == {"charge": 1}
    routes.hold(second)
    assert routes.plan(4, parts=3) is None  # the kind's room is held by the others


def test_every_shard_polls_for_a_limited_kind() -> None:
    async def scenario(fake: FakeLeases) -> None:
        _sharded(fake)
        async with running_worker(
            fake, {"charge": Peak(0.001)}, concurrency=4, kind_concurrency={"charge": 3}
        ):
            await fake.wait_for(lambda: len(+fake.polling) == 3)
            for shard in range(3):
                fake.add(f"job{shard}_c", kind="charge", shard=shard)
            await fake.wait_for(_all_done(fake))
        firsts = {}
        for shard, body in zip(fake.claim_shards, fake.claim_bodies, strict=False):
            firsts.setdefault(shard, body)
        assert {shard: body["kind_max_jobs"] for shard, body in firsts.items()} == {
            0: {"charge": 1}, 1: {"charge": 1}, 2: {"charge": 1}}  # fmt: skip

    run(scenario)


def test_loops_with_nothing_to_claim_rest_without_waking_each_other() -> None:
    """Every kind at its limit while slots are free: each loop rests until a
    job ends, rather than wake the others back and forth (a busy loop)."""
    started = threading.Event()

    def slow(ctx: JobContext) -> None:
        started.set()
        time.sleep(0.8)

    async def scenario(fake: FakeLeases) -> None:
        _sharded(fake)
        fake.add("job0_a", kind="a", shard=0)
        fake.add("job1_a", kind="a", shard=1)
        async with running_worker(
            fake, {"a": slow}, concurrency=4, kind_concurrency={"a": 1}
        ) as worker:
            await fake.wait_for(started.is_set)
            await fake.wait_for(lambda: not fake.polling.total())  # the polls came back
            claims, cpu_before = fake.claims, time.process_time()
            await asyncio.sleep(0.4)  # "a" at its limit: nothing to claim anywhere
            assert time.process_time() - cpu_before < 0.2
            assert fake.claims == claims
            assert worker.running == 1
            await fake.wait_for(_all_done(fake))

    run(scenario)
