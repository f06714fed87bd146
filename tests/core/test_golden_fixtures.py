"""Every release's golden fixtures still load, byte for byte, on today's code.

`tests/fixtures/<release>/` holds an entry log and a snapshot written by that
release (see docs/fixtures.md). Replaying the log into an empty state and
decoding the snapshot must give exactly the recorded digests: a replica of
today's code and one of that release, applying the same entries, must hold
the same state, and a snapshot on disk must keep loading after an upgrade.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import golden  # noqa: E402  (tests/fixtures is not a package)

from raftsched.core import (
    COMMAND_TAGS,
    COMMAND_VERSIONS,
    apply_encoded,
    check_invariants,
    decode_entry,
    decode_state,
    encode_entry,
    encode_state,
    new_state,
    state_digest,
)
from raftsched.core.kernel import codec
from raftsched.raft_journal import decode_snapshot, encode_snapshot  # noqa: E402

RELEASES = golden.release_dirs()


def release_ids(paths: list[Path]) -> list[str]:
    return [path.name for path in paths]


def test_there_are_fixtures_for_at_least_the_first_release() -> None:
    assert "v0.1.0" in release_ids(RELEASES), golden.FIXTURES_DIR


def current_digests(part: dict[str, object], release: Path) -> dict[str, str]:
    """The part's digests for today's state format, or a failure that says why."""
    by_format = part["state_digests"]
    assert isinstance(by_format, dict)
    digests = by_format.get(str(codec.STATE_FORMAT))
    if digests is None:
        pytest.fail(
            f"{release.name} records no digest for state format {codec.STATE_FORMAT} "
            f"(only {sorted(by_format)}).\n{golden.RULE}",
            pytrace=False,
        )
    return digests if isinstance(digests, dict) else {"state": digests}


@pytest.mark.parametrize("release", RELEASES, ids=release_ids(RELEASES))
def test_the_entry_log_replays_to_the_recorded_digests_and_results(release: Path) -> None:
    expected = golden.read_expected(release)["entries"]
    path = release / expected["file"]
    assert golden.file_sha256(path) == expected["sha256"], (
        f"{path} is not the file {release.name} wrote.\n{golden.RULE}"
    )
    entries = golden.read_entries(path)
    assert len(entries) == expected["count"]
    digests = current_digests(expected, release)
    assert str(len(entries)) in digests  # the final state is always recorded
    state = new_state()
    results = []
    for number, data in enumerate(entries, start=1):
        results.append(apply_encoded(state, data))
        assert check_invariants(state) == [], f"after entry {number} of {release.name}"
        if str(number) in digests:
            assert state_digest(state) == digests[str(number)], (
                f"the state after entry {number} of {release.name}/{expected['file']} "
                f"has another digest.\n{golden.RULE}"
            )
    summaries = [[golden.result_summary(result) for result in entry] for entry in results]
    assert summaries == expected["results"], (
        f"today's code answers {release.name}'s commands differently: replicas of the two "
        f"versions would disagree during a rolling upgrade.\n{golden.RULE}"
    )
    assert golden.results_digest(results) in expected["results_digests"], (
        f"a result of {release.name}'s commands changed in its fields. If a result type "
        "changed on purpose (a new field), append the new digest to results_digests in "
        f"{release.name}/expected.json; if not, today's code answers old commands "
        f"differently.\n{golden.RULE}"
    )


@pytest.mark.parametrize("release", RELEASES, ids=release_ids(RELEASES))
def test_each_entry_decodes_and_encodes_back_to_the_same_bytes(release: Path) -> None:
    expected = golden.read_expected(release)["entries"]
    entries = golden.read_entries(release / expected["file"])
    kinds = Counter(
        type(command).__name__ for data in entries for command in decode_entry(data).commands
    )
    assert dict(kinds) == expected["command_kinds"]
    if expected["entry_format"] != codec.ENTRY_FORMAT:
        pytest.skip(
            f"{release.name} wrote entry format {expected['entry_format']}; today's is "
            f"{codec.ENTRY_FORMAT}, so only decoding is checked"
        )
    for number, data in enumerate(entries, start=1):
        assert encode_entry(decode_entry(data)) == data, (
            f"entry {number} of {release.name} encodes to other bytes under the same "
            f"ENTRY_FORMAT {codec.ENTRY_FORMAT}.\n{golden.RULE}"
        )


def fixture_version(release: Path) -> int:
    """The cluster version a release's fixtures were written at (what its
    data directories' cluster raised to; release 0.1.0 had none: 1)."""
    version = golden.read_expected(release).get("datadir", {}).get("cluster_version")
    return version if type(version) is int else 1


def test_every_command_kind_of_the_codec_appears_in_some_fixture() -> None:
    """A new command kind needs a fixture: add it to core_scenario.py and write
    the next release's fixtures (docs/fixtures.md).

    A kind newer than the newest fixtures (`since` above the cluster version
    they were written at) cannot be in them yet: the release that brings it
    writes them on its release commit. Until then it must be in today's
    story (`test_todays_story_uses_every_command_kind`), so that the next
    fixtures have it."""
    covered: set[str] = set()
    for release in RELEASES:
        covered |= set(golden.read_expected(release)["entries"]["command_kinds"])
    newest = max(fixture_version(release) for release in RELEASES)
    table = {cls.__name__ for cls in COMMAND_TAGS if COMMAND_VERSIONS[cls] <= newest}
    missing = sorted(table - covered)
    assert not missing, (
        f"command kinds in COMMAND_TAGS that no golden entry log uses: {missing}. "
        "Add them to tests/fixtures/core_scenario.py and write the next release's fixtures "
        "(python tests/fixtures/make_fixtures.py --out tests/fixtures/vX.Y.Z)."
    )


def test_todays_story_uses_every_command_kind(tmp_path: Path) -> None:
    """What the next release's fixtures will hold: the generator's core part
    runs on today's code (each step checks its outcomes; the snapshot has
    every job status and section) and uses every command kind."""
    import make_fixtures

    written = make_fixtures.core_fixtures(tmp_path)
    kinds = set(written["entries"]["command_kinds"])
    assert kinds == {cls.__name__ for cls in COMMAND_TAGS}
    assert golden.read_entries(tmp_path / golden.ENTRIES_NAME)


@pytest.mark.parametrize("release", RELEASES, ids=release_ids(RELEASES))
def test_the_snapshot_loads_to_its_digest_and_encodes_to_the_same_bytes(release: Path) -> None:
    expected = golden.read_expected(release)["snapshot"]
    path = release / expected["file"]
    data = path.read_bytes()
    assert golden.file_sha256(path) == expected["sha256"], (
        f"{path} is not the file {release.name} wrote.\n{golden.RULE}"
    )
    header, body = decode_snapshot(data)
    assert encode_snapshot(header, bytes(body)) == data, (
        f"the snapshot file format (raft_journal) changed.\n{golden.RULE}"
    )
    state = decode_state(body)
    assert check_invariants(state) == []
    assert len(state.jobs) == expected["jobs"]
    statuses = Counter(job.status for job in state.jobs.values())
    assert dict(sorted(statuses.items())) == expected["job_statuses"]
    assert state_digest(state) == current_digests(expected, release)["state"], (
        f"{release.name}/{expected['file']} decodes to another state.\n{golden.RULE}"
    )
    if expected["state_format"] != codec.STATE_FORMAT:
        pytest.skip(
            f"{release.name} wrote state format {expected['state_format']}; today's is "
            f"{codec.STATE_FORMAT}, so its bytes are not expected back"
        )
    assert encode_state(state) == bytes(body), (
        f"{release.name}'s snapshot encodes to other bytes under the same STATE_FORMAT "
        f"{codec.STATE_FORMAT}.\n{golden.RULE}"
    )


@pytest.mark.parametrize("release", RELEASES, ids=release_ids(RELEASES))
def test_the_snapshot_is_the_logs_state_and_the_log_continues_from_it(release: Path) -> None:
    """What a restarted node does: load the snapshot, apply the entries after it."""
    expected = golden.read_expected(release)
    entries = golden.read_entries(release / expected["entries"]["file"])
    _, body = decode_snapshot((release / expected["snapshot"]["file"]).read_bytes())
    state = decode_state(body)
    after = expected["snapshot"]["after_entry"]
    for data in entries[after:]:
        apply_encoded(state, data)
    final = current_digests(expected["entries"], release)[str(len(entries))]
    assert state_digest(state) == final, (
        f"{release.name}: the snapshot plus the entries after it reach another state than "
        f"the whole log.\n{golden.RULE}"
    )
