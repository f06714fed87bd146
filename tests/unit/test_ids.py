"""Identifiers: Crockford base32 of 50 bits of milliseconds and 80 random bits."""

from __future__ import annotations

import random

from raftsched.node.draws import Draws, IdSource, _base32_id

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def reference(now_ms: int, random_bits: int) -> str:
    """The definition, one 5-bit group at a time, most significant first."""
    value = ((now_ms % 2**50) << 80) | (random_bits % 2**80)
    return "".join(CROCKFORD[(value >> (5 * i)) & 31] for i in reversed(range(26)))


def test_encoding_matches_the_definition() -> None:
    draw = random.Random(7)
    cases = [(0, 0), (2**50 - 1, 2**80 - 1), (1_764_547_200_000, 1), (2**50, 2**80 + 5)]
    cases += [(draw.getrandbits(50), draw.getrandbits(80)) for _ in range(2_000)]
    for now_ms, random_bits in cases:
        assert _base32_id(now_ms, random_bits) == reference(now_ms, random_bits)


def test_ids_sort_by_creation_and_are_unique_within_a_millisecond() -> None:
    ids = IdSource()
    made = [ids.new("job", 1_764_547_200_000 + i // 50) for i in range(500)]
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    assert all(len(i) == len("job_") + 26 for i in made)
    # The clock stepping back does not make an id sort before an earlier one.
    assert ids.new("job", 1_764_547_100_000) > made[-1]


def test_draws_stamp_ids_with_the_clock_and_a_batch_reads_it_once() -> None:
    readings = iter([1_764_547_200_000, 1_764_547_200_009])
    draws = Draws(lambda: next(readings))
    batch = draws.new_ids("job", 3)
    assert list(batch) == sorted(batch) and len(set(batch)) == 3
    assert {made[4:14] for made in batch} == {_base32_id(1_764_547_200_000, 0)[:10]}
    assert draws.new_id("wf")[3:13] == _base32_id(1_764_547_200_009, 0)[:10]
    assert 0 <= draws.u32() < 2**32 and 0 <= draws.u64() < 2**64
