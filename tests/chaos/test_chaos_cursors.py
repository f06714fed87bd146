"""The events cursors the harness reads: one shard's plain digits and a
sharded cluster's `v1.<seq0>.<seq1>...` (docs/shards.md), where a
subscription whose copy a shard has not made yet leaves that part empty."""

from __future__ import annotations

from chaos.cursors import cursor_seqs, shard0_seq


def test_a_one_shard_cursor_is_its_seq() -> None:
    assert cursor_seqs(17) == [17] == cursor_seqs("17")
    assert shard0_seq(17) == 17


def test_a_sharded_cursor_has_every_shards_seq() -> None:
    assert cursor_seqs("v1.5.0.12") == [5, 0, 12]
    assert shard0_seq("v1.5.0.12") == 5


def test_a_shard_without_a_copy_yet_is_none() -> None:
    assert cursor_seqs("v1.5..12") == [5, None, 12]
