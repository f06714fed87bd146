"""The member directory (core.membership): build a state, apply, assert exactly."""

from __future__ import annotations

from core_support import Cluster

from raftsched.core import check_invariants, decode_state, encode_state, state_digest
from raftsched.core.kernel.commands import RecordIncarnation, SetClusterId
from raftsched.core.kernel.identity import incarnations
from raftsched.core.kernel.results import Ack, Rejected
from raftsched.core.membership.commands import AddMember, Member, RemoveMember
from raftsched.core.membership.members import (
    MEMBERS_MAX,
    changes_applied,
    is_removed,
    members,
    removed_addresses,
)

N1 = Member("n1", "10.0.0.1:7000", "http://10.0.0.1:8080")
N2 = Member("n2", "10.0.0.2:7000", "http://10.0.0.2:8080")
N3 = Member("n3", "10.0.0.3:7000", "http://10.0.0.3:8080")
KNOWN = (N1, N2, N3)


def add(member: Member, known: tuple[Member, ...] = ()) -> AddMember:
    return AddMember(member.node_id, member.raft_address, member.http_url, known)


def test_a_state_without_changes_encodes_as_before() -> None:
    cluster = Cluster()
    before = encode_state(cluster.state)
    assert members(cluster.state) == () and changes_applied(cluster.state) == 0
    assert b"members" not in before


def test_the_first_change_records_the_known_members_too() -> None:
    cluster = Cluster()
    n4 = Member("n4", "10.0.0.4:7000", "http://10.0.0.4:8080")
    assert cluster.one(add(n4, KNOWN)) == Ack()
    assert members(cluster.state) == (N1, N2, N3, n4)
    # Later changes ignore `known`: the directory is the truth now.
    n5 = Member("n5", "10.0.0.5:7000", "http://10.0.0.5:8080")
    assert cluster.one(add(n5, (N1,))) == Ack()
    assert members(cluster.state) == (N1, N2, N3, n4, n5)
    assert check_invariants(cluster.state) == []


def test_duplicates_are_refused_and_change_nothing() -> None:
    cluster = Cluster()
    cluster.one(RemoveMember("n3", KNOWN))
    digest = state_digest(cluster.state)
    for command, reason in [
        (add(N1), "duplicate_id"),
        (AddMember("n9", N2.raft_address, "http://n9"), "duplicate_address"),
        (AddMember("n9", "10.0.0.9:1", N2.http_url), "duplicate_http_url"),
    ]:
        result = cluster.one(command)
        assert isinstance(result, Rejected) and result.code == "invalid_state"
        assert result.details["reason"] == reason
    for command, field in [
        (AddMember("n9", "no-port", "http://n9"), "raft_address"),
        (AddMember("n9", "h:99999", "http://n9"), "raft_address"),
        (AddMember("n9", "h:1", "ftp://n9"), "http_url"),
        (AddMember("", "h:1", "http://n9"), "id"),
    ]:
        result = cluster.one(command)
        assert isinstance(result, Rejected) and result.code == "invalid_request"
        assert result.details["field"] == field
    assert state_digest(cluster.state) == digest


def test_remove_remembers_the_address_and_an_add_forgets_it() -> None:
    cluster = Cluster()
    assert cluster.one(RemoveMember("n3", KNOWN)) == Ack()
    assert is_removed(cluster.state, "n3")
    assert removed_addresses(cluster.state) == {N3.raft_address}
    assert cluster.one(RemoveMember("n3")) == Rejected(
        "not_found", "node n3 is not a member", {"id": "n3"}
    )
    # A new node at the old address: its votes are not refused.
    assert cluster.one(AddMember("n4", N3.raft_address, "http://n4")) == Ack()
    assert removed_addresses(cluster.state) == set()
    # The same id again (a node that lost its data rejoins): not removed any more.
    assert cluster.one(AddMember("n3", "10.0.0.33:7000", "http://n3b")) == Ack()
    assert not is_removed(cluster.state, "n3")
    assert check_invariants(cluster.state) == []


def test_a_removed_member_loses_its_incarnation_and_is_recorded_afresh() -> None:
    cluster = Cluster()
    assert cluster.one(SetClusterId("clu_1")) == Ack()
    assert cluster.one(RecordIncarnation("n3", "inc_old")) == Ack()
    assert cluster.one(RemoveMember("n3", KNOWN)) == Ack()
    assert "n3" not in incarnations(cluster.state)
    # Back under the same id on a new data directory: a new incarnation.
    assert cluster.one(AddMember("n3", N3.raft_address, N3.http_url)) == Ack()
    assert cluster.one(RecordIncarnation("n3", "inc_new")) == Ack()
    assert incarnations(cluster.state)["n3"] == "inc_new"
    assert check_invariants(cluster.state) == []


def test_a_restored_state_renamed_to_its_new_cluster_drops_the_old_directory() -> None:
    cluster = Cluster()
    assert cluster.one(SetClusterId("clu_old")) == Ack()
    assert cluster.one(RemoveMember("n3", KNOWN)) == Ack()
    assert members(cluster.state) == (N1, N2) and is_removed(cluster.state, "n3")
    # The first leader of the restored cluster renames it: the directory
    # named the old cluster's machines; the new one starts from its flags.
    assert cluster.one(SetClusterId("clu_new", "clu_old")) == Ack()
    assert members(cluster.state) == () and changes_applied(cluster.state) == 0
    assert not is_removed(cluster.state, "n3") and removed_addresses(cluster.state) == set()
    assert b"members" not in encode_state(cluster.state)
    assert check_invariants(cluster.state) == []


def test_the_last_member_stays_and_the_directory_is_bounded() -> None:
    cluster = Cluster()
    assert cluster.one(RemoveMember("n1", (N1, N2))) == Ack()
    result = cluster.one(RemoveMember("n2"))
    assert isinstance(result, Rejected) and result.details["reason"] == "last_member"
    for index in range(2, MEMBERS_MAX + 1):
        cluster.one(AddMember(f"m{index}", f"10.1.0.{index}:7000", f"http://m{index}"))
    assert len(members(cluster.state)) == MEMBERS_MAX
    result = cluster.one(AddMember("one-more", "10.2.0.1:7000", "http://one-more"))
    assert isinstance(result, Rejected) and result.details == {"members_max": MEMBERS_MAX}


def test_the_directory_survives_a_snapshot() -> None:
    cluster = Cluster()
    cluster.one(RemoveMember("n2", KNOWN))
    cluster.one(AddMember("n4", "10.0.0.4:7000", "http://n4"))
    restored = decode_state(encode_state(cluster.state))
    assert members(restored) == members(cluster.state)
    assert removed_addresses(restored) == {N2.raft_address}
    assert changes_applied(restored) == 2
    assert state_digest(restored) == state_digest(cluster.state)
