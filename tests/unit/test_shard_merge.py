"""The merge of shards' pages and the cursor across them (raftsched.shard_merge).

Property tests against a simple model: each shard holds a stream (jobs by
submission seq, with a created_at that never goes back; events by seq with
their times); the model lists a shard's page exactly as the core does (newest
first below a seq cursor, or oldest first after one). Pages of random sizes
are read through the merge while new items arrive in random shards between
pages; the listing must show every item present at its start exactly once,
each shard's items in that shard's order, ordered by (created_at, shard)
across shards, and never an item twice. Events must all arrive, once each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.shard_merge import (
    DONE,
    START,
    Page,
    below_next,
    format_cursor,
    merge,
    parse_cursor,
    start,
)


@dataclass
class Shard:
    """A shard's jobs: (seq, created_at_ms), seq strictly increasing."""

    number: int
    jobs: list[tuple[int, int]] = field(default_factory=list)
    next_seq: int = 1

    def add(self, created_at_ms: int) -> tuple[int, int, int]:
        seq = self.next_seq
        self.next_seq += 1
        self.jobs.append((seq, created_at_ms))
        return (self.number, seq, created_at_ms)

    def newest_first(self, position: str | None, limit: int, match: int) -> Page:
        """As core.list_jobs: seq below the cursor, newest first, filtered
        (only seqs divisible by `match`); `more` when the page is full and
        any job, matching or not, remains below its last."""
        below = None if position is START else int(position)
        listed = [
            job
            for job in reversed(self.jobs)
            if (below is None or job[0] < below) and job[0] % match == 0
        ]
        page = listed[:limit]
        more = len(page) == limit and any(seq < page[-1][0] for seq, _ in self.jobs)
        return Page(
            items=[(self.number, seq, at) for seq, at in page],
            cursors=[str(seq) for seq, _ in page],
            keys=[at for _, at in page],
            more=more,
        )


def _read_all(
    shards: list[Shard],
    sizes: list[int],
    inserts: list[list[tuple[int, int]]],
    match: int,
) -> tuple[list[list[tuple[int, int, int]]], set[tuple[int, int, int]]]:
    """Page through every shard with the merge; between pages, add the jobs
    of `inserts` (shard, time step). Returns the pages and the jobs present
    (and matching) when the listing began."""
    clock = max((at for shard in shards for _, at in shard.jobs), default=0)
    present = {
        (shard.number, seq, at) for shard in shards for seq, at in shard.jobs if seq % match == 0
    }
    positions = start(len(shards))
    pages: list[list[tuple[int, int, int]]] = []
    for turn in range(200):
        limit = sizes[turn % len(sizes)]
        asked = {
            shard.number: shard.newest_first(positions[shard.number], limit, match)
            for shard in shards
            if positions[shard.number] != DONE
        }
        merged = merge(asked, positions, limit, newest_first=True, resume=below_next)
        pages.append([item for _, item in merged.items])
        assert all(item[0] == shard for shard, item in merged.items)
        cursor = merged.cursor()
        if cursor is None:
            return pages, present
        # The cursor is all a client keeps between pages.
        parsed = parse_cursor(cursor, len(shards))
        assert parsed is not None
        positions = parsed
        for shard_number, step in inserts[turn % len(inserts)] if inserts else []:
            clock += step
            shards[shard_number % len(shards)].add(clock)
    raise AssertionError("the listing did not end")


@settings(max_examples=300, deadline=None)
@given(
    count=st.integers(1, 5),
    initial=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3)), max_size=60),
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=6),
    inserts=st.lists(
        st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2)), max_size=6), max_size=5
    ),
    match=st.sampled_from([1, 1, 2, 3]),
)
def test_paging_lists_every_job_once_in_order_while_jobs_arrive(
    count: int,
    initial: list[tuple[int, int]],
    sizes: list[int],
    inserts: list[list[tuple[int, int]]],
    match: int,
) -> None:
    shards = [Shard(number) for number in range(count)]
    clock = 0
    for shard_number, step in initial:
        clock += step
        shards[shard_number % count].add(clock)
    pages, present = _read_all(shards, sizes, inserts, match)
    listed = [item for page in pages for item in page]
    # Never twice, never skipped; a job submitted after the first page is
    # newer than the listing's start and is not shown (as in one shard).
    assert len(listed) == len(set(listed))
    assert set(listed) == present
    # Each shard's jobs in its own order; all of them by (created_at, shard).
    for shard in range(count):
        seqs = [seq for number, seq, _ in listed if number == shard]
        assert seqs == sorted(seqs, reverse=True)
    ranks = [(at, number) for number, _, at in listed]
    assert ranks == sorted(ranks, reverse=True)
    # Every page but the last is full.
    for index, page in enumerate(pages[:-1]):
        assert len(page) == sizes[index % len(sizes)], (index, pages)


def test_a_page_merges_the_shards_newest_first_and_pins_an_untouched_shard() -> None:
    pages = {
        0: Page(["a3", "a2"], ["30", "20"], ["t3", "t2"], more=True),
        1: Page(["b9"], ["90"], ["t1"], more=False),
        2: Page([], [], [], more=False),
    }
    merged = merge(pages, start(3), 2, newest_first=True, resume=below_next)
    assert merged.items == [(0, "a3"), (0, "a2")]
    # Shard 0 continues below its last; shard 1 is pinned at its first job;
    # shard 2 had nothing and is done.
    assert merged.positions == ["20", "91", DONE]
    assert merged.cursor() == "v1.20.91.-"
    merged = merge(pages, start(3), 5, newest_first=True, resume=below_next)
    assert merged.items == [(0, "a3"), (0, "a2"), (1, "b9")]
    assert merged.positions == ["20", DONE, DONE]


def test_equal_times_order_by_shard_then_each_shard_s_own_order() -> None:
    pages = {
        0: Page(["a2", "a1"], ["2", "1"], ["t", "t"], more=False),
        1: Page(["b2", "b1"], ["2", "1"], ["t", "t"], more=False),
    }
    merged = merge(pages, start(2), 10, newest_first=True)
    assert [item for _, item in merged.items] == ["b2", "b1", "a2", "a1"]
    assert merged.cursor() is None
    merged = merge(pages, start(2), 10, newest_first=False)
    assert [item for _, item in merged.items] == ["a2", "a1", "b2", "b1"]


@dataclass
class Outbox:
    number: int
    events: list[tuple[int, int]] = field(default_factory=list)  # (seq, at_ms)

    def after(self, position: str, limit: int) -> Page:
        found = [event for event in self.events if event[0] > int(position)][:limit]
        return Page(
            items=[(self.number, seq, at) for seq, at in found],
            cursors=[str(seq) for seq, _ in found],
            keys=[at for _, at in found],
            more=False,
        )


@settings(max_examples=300, deadline=None)
@given(
    count=st.integers(1, 5),
    emitted=st.lists(
        st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3)), max_size=8),
        min_size=1,
        max_size=8,
    ),
    sizes=st.lists(st.integers(1, 10), min_size=1, max_size=4),
)
def test_events_merge_by_time_and_every_event_arrives_once(
    count: int, emitted: list[list[tuple[int, int]]], sizes: list[int]
) -> None:
    outboxes = [Outbox(number) for number in range(count)]
    clocks = [0] * count
    positions: list[str | None] = ["0"] * count
    seen: list[tuple[int, int, int]] = []
    batches = iter(emitted)
    for turn in range(400):
        for shard_number, step in next(batches, []):
            box = outboxes[shard_number % count]
            clocks[box.number] += step
            box.events.append((len(box.events) + 1, clocks[box.number]))
        limit = sizes[turn % len(sizes)]
        asked = {box.number: box.after(str(positions[box.number]), limit) for box in outboxes}
        merged = merge(asked, positions, limit, newest_first=False, endless=True)
        page = [item for _, item in merged.items]
        ranks = [(at, number) for number, _, at in page]
        assert ranks == sorted(ranks)
        seen += page
        cursor = merged.cursor()
        assert cursor is not None
        parsed = parse_cursor(cursor, count)
        assert parsed is not None and DONE not in parsed
        positions = parsed
        if not page and next(batches, None) is None:
            break
    everything = [(box.number, seq, at) for box in outboxes for seq, at in box.events]
    assert sorted(seen) == sorted(everything)
    for shard in range(count):
        seqs = [seq for number, seq, _ in seen if number == shard]
        assert seqs == list(range(1, len(seqs) + 1))


@given(
    st.lists(
        st.one_of(st.none(), st.just(DONE), st.from_regex(r"[0-9]{1,12}", fullmatch=True),
                  st.text(min_size=1, max_size=40)),
        min_size=1,
        max_size=8,
    )
)  # fmt: skip
def test_a_cursor_holds_each_shard_s_position(positions: list[str | None]) -> None:
    text = format_cursor(positions)
    assert text.isascii() and " " not in text
    assert parse_cursor(text, len(positions)) == positions


@pytest.mark.parametrize(
    "text",
    ["", "12", "v1", "v1.1", "v1.1.2.3", "v2.1.2", "v1.x.2", "v1.~.2", "v1.~!!.2", "v1.1.-2",
     "v1.1.٣", "v1.1." + "9" * 401],
)  # fmt: skip
def test_what_is_not_a_cursor_for_two_shards(text: str) -> None:
    assert parse_cursor(text, 2) is None


def test_one_shard_s_digits_are_its_own_cursor() -> None:
    assert parse_cursor("v1.12", 1) == ["12"]
    assert parse_cursor("v1.-.", 2) == [DONE, START]
