"""Reads across shards (docs/shards.md, section 3): the cursors and merges.

A node of several shards answers a list (jobs, workflows, schedules) or the
event stream by asking every shard for a page of its own and merging them.
This module is that merge and the cursor that carries each shard's own
cursor from one page to the next; it does no I/O, so it is tested alone
(tests/unit/test_shard_merge.py) against a simple model.

Theory of operation
-------------------
Each shard lists in an order of its own (jobs and workflows newest first by
their submission sequence, schedules by id, events oldest first by seq) and
continues after a cursor of its own. The node asks every shard that is not
exhausted for up to `limit` items after that shard's position, then takes
items one at a time from the head of whichever shard's page comes first by
a merge key (for jobs `(created_at, shard)`, newest first), until it has
`limit`. It never takes an item of a shard before that shard's earlier ones,
so the merged stream restricted to one shard is that shard's own order,
whatever the keys; when each shard's keys are monotonic in its order (a
group's replicated time never goes back, so `created_at` is) the merged
stream is ordered by the key too.

After the page, each shard's position is:

- the cursor after its last item taken, if any was taken;
- `DONE` if every item it had was taken and it said it has no more: items
  that reach it later are newer than the listing's start (a new job's seq
  is above every cursor), as a one-shard listing would not show them either;
- else its position before the page; from the start (`START`), a list that
  can name it (`Kind.resume`) pins the shard at its first item, so that a
  job submitted to it between pages is never shown below older ones.

So a page is the merge of pages each shard alone would have given, no item
is taken twice (a shard continues after what was taken) and none is skipped
(a shard's page starts right after what was taken, and an untaken item stays
at or after its shard's position). Event streams never end (`endless`): a
shard whose outbox is empty now stays where it is.

The cursor is `v1.<p0>.<p1>...`, one part per shard in shard order: the
shard's own cursor if it is decimal digits, `-` for DONE, empty for START,
else `~` and the cursor in unpadded base64url (a schedule id may hold any
character). Clients treat it as opaque.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

CURSOR_PREFIX: Final = "v1"
DONE: Final = "-"
START: Final = None
# A position: START (None), DONE, or a shard's own cursor.
Position = str | None
# A cursor's length is bounded by the shards (at most 64) and each part.
CURSOR_PART_CHARS_MAX: Final = 400


@dataclass(frozen=True, slots=True)
class Page:
    """One shard's answer: its items in its own order, the cursor after each
    (`cursors[i]` continues after `items[i]`), the merge key of each, and
    whether it has more after the last item."""

    items: Sequence[Any]
    cursors: Sequence[str]
    keys: Sequence[Any]
    more: bool

    def __post_init__(self) -> None:
        assert len(self.items) == len(self.cursors) == len(self.keys), "a page's lists differ"


@dataclass(frozen=True, slots=True)
class Merged:
    """A merged page: (shard, item) in merge order, and each shard's position
    after it."""

    items: list[tuple[int, Any]]
    positions: list[Position]

    def cursor(self) -> str | None:
        """The cursor of the next page; None once every shard is exhausted."""
        if all(position == DONE for position in self.positions):
            return None
        return format_cursor(self.positions)


def merge(
    pages: Mapping[int, Page],
    positions: Sequence[Position],
    limit: int,
    *,
    newest_first: bool,
    resume: Callable[[str], Position] | None = None,
    endless: bool = False,
) -> Merged:
    """Merge `pages` (one per shard that was asked: every shard whose
    position is not DONE) into at most `limit` items; see the module's
    theory. `resume(cursor_after_first_item)` pins a shard at its first item
    when none of it was taken from START (None: it stays at START)."""
    assert limit >= 1
    heads = {shard: 0 for shard, page in pages.items() if page.items}
    taken: list[tuple[int, Any]] = []
    while heads and len(taken) < limit:
        best = None
        for shard, index in heads.items():
            rank = (pages[shard].keys[index], shard)
            if best is None or (rank > best[0] if newest_first else rank < best[0]):
                best = (rank, shard)
        assert best is not None
        shard = best[1]
        index = heads[shard]
        taken.append((shard, pages[shard].items[index]))
        if index + 1 == len(pages[shard].items):
            del heads[shard]
        else:
            heads[shard] = index + 1
    counts = dict.fromkeys(pages, 0)
    for shard, _ in taken:
        counts[shard] += 1
    after = list(positions)
    for shard, page in pages.items():
        count = counts[shard]
        if count == len(page.items) and not page.more and not endless:
            after[shard] = DONE
        elif count > 0:
            after[shard] = page.cursors[count - 1]
        elif after[shard] is START and page.items and resume is not None:
            after[shard] = resume(page.cursors[0])
    return Merged(taken, after)


def start(shards: int) -> list[Position]:
    return [START] * shards


def format_cursor(positions: Sequence[Position]) -> str:
    return ".".join([CURSOR_PREFIX, *(_part(position) for position in positions)])


def _part(position: Position) -> str:
    if position is START:
        return ""
    if position == DONE or (position.isascii() and position.isdigit()):
        return position
    return "~" + base64.urlsafe_b64encode(position.encode()).decode().rstrip("=")


def parse_cursor(text: str, shards: int) -> list[Position] | None:
    """The positions a cursor of this module holds, one per shard; None for
    text that is not such a cursor for `shards` shards."""
    parts = text.split(".")
    if len(parts) != shards + 1 or parts[0] != CURSOR_PREFIX:
        return None
    positions: list[Position] = []
    for part in parts[1:]:
        if len(part) > CURSOR_PART_CHARS_MAX:
            return None
        if part == "":
            positions.append(START)
        elif part == DONE or (part.isascii() and part.isdigit()):
            positions.append(part)
        elif part.startswith("~") and len(part) > 1:
            encoded = part[1:] + "=" * (-len(part[1:]) % 4)
            try:
                decoded = base64.b64decode(encoded, altchars=b"-_", validate=True).decode()
            except (binascii.Error, UnicodeDecodeError, ValueError):
                return None
            if _part(decoded) != part:  # one spelling per position
                return None
            positions.append(decoded)
        else:
            return None
    return positions


def below_next(cursor: str) -> Position:
    """`resume` for a list whose cursor is the seq of the last item and that
    continues below it (jobs, workflows): the position that lists the item
    at `cursor` and everything older."""
    return str(int(cursor) + 1)
