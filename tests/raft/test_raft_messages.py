"""What the Raft adapter's transport changes in pysyncobj's AppendEntries
before pysyncobj handles it (raft.py, guard rail 6), on a real journal."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from raftsched import raft
from raftsched.raft_journal import Disk, DurableJournal


def follower(tmp_path: Path, *, terms: list[int], commit: int) -> tuple[Any, DurableJournal]:
    """A follower's journal with entries 1.. in the given terms, and the
    attribute pysyncobj keeps its commit index in."""
    journal = DurableJournal(tmp_path, Disk(fsync=False, simulate_power_cut=False, writeback_s=30))
    for index, term in enumerate(terms, start=1):
        journal.add(b"e%d" % index, index, term)
    return SimpleNamespace(_SyncObj__raftCommitIndex=commit), journal


def append(prev: int, prev_term: int, first: int, terms: list[int]) -> dict[str, Any]:
    entries = [(b"e%d" % index, index, term) for index, term in enumerate(terms, start=first)]
    return {
        "type": "append_entries",
        "term": 3,
        "commit_index": 9,
        "prevLogIdx": prev,
        "prevLogTerm": prev_term,
        "entries": entries,
    }


def test_an_append_from_inside_the_committed_prefix_starts_at_the_commit_index(
    tmp_path: Path,
) -> None:
    sync_obj, journal = follower(tmp_path, terms=[1, 1, 1, 2, 2, 2, 2], commit=5)
    message = append(prev=2, prev_term=1, first=3, terms=[1, 2, 2, 2, 2, 3])
    moved = raft._past_committed(sync_obj, journal, message)
    assert (moved["prevLogIdx"], moved["prevLogTerm"]) == (5, 2)
    assert [entry[1:] for entry in moved["entries"]] == [(6, 2), (7, 2), (8, 3)]
    assert {key: moved[key] for key in ("type", "term", "commit_index")} == {
        "type": "append_entries",
        "term": 3,
        "commit_index": 9,
    }


def test_an_append_of_committed_entries_only_becomes_a_heartbeat_at_the_commit_index(
    tmp_path: Path,
) -> None:
    sync_obj, journal = follower(tmp_path, terms=[1, 1, 1, 2, 2], commit=5)
    moved = raft._past_committed(sync_obj, journal, append(prev=1, prev_term=1, first=2, terms=[1]))
    assert (moved["prevLogIdx"], moved["prevLogTerm"], moved["entries"]) == (5, 2, [])


def test_an_append_at_or_after_the_commit_index_is_left_alone(tmp_path: Path) -> None:
    sync_obj, journal = follower(tmp_path, terms=[1, 1, 1, 2, 2], commit=3)
    for prev in (3, 4, 5, 9):
        message = append(prev=prev, prev_term=2, first=prev + 1, terms=[3])
        assert raft._past_committed(sync_obj, journal, message) is message


def test_a_compacted_log_is_read_from_its_first_entry(tmp_path: Path) -> None:
    sync_obj, journal = follower(tmp_path, terms=[1, 1, 1, 2, 2, 2, 3], commit=6)
    journal.deleteEntriesTo(3)  # entries 4.. remain, as after a snapshot at 3
    moved = raft._past_committed(sync_obj, journal, append(prev=4, prev_term=2, first=5, terms=[2]))
    assert (moved["prevLogIdx"], moved["prevLogTerm"], moved["entries"]) == (6, 2, [])
    # A commit index outside the log (a snapshot ahead of it): left alone.
    sync_obj._SyncObj__raftCommitIndex = 2
    message = append(prev=1, prev_term=1, first=2, terms=[1])
    assert raft._past_committed(sync_obj, journal, message) is message
