"""The cluster version: RaiseClusterVersion, its optional section, the gate."""

from __future__ import annotations

import msgpack
import pytest
from core_support import Cluster

from raftsched.core import (
    COMMAND_TAGS,
    COMMAND_VERSION_MAX,
    COMMAND_VERSIONS,
    REGISTRY,
    CodecError,
    command_version,
    decode_state,
    encode_state,
    needs_upgrade,
)
from raftsched.core.auth.commands import BootstrapAdmin, CreateToken, RevokeToken, TouchTokens
from raftsched.core.events.commands import CopySubscription
from raftsched.core.jobs.commands import (
    ClaimJobs,
    ClaimJobsOfKinds,
    CompleteJob,
    Configure,
    ConfigureWheel,
    LeaseBatch,
    PlanShardQuotas,
    ReconcileJob,
    ReplayReconciled,
    RequestReconcile,
    SetShardQuotas,
    SetUnknownPolicy,
)
from raftsched.core.kernel.cluster_version import CLUSTER_VERSION, cluster_version
from raftsched.core.kernel.commands import (
    Audited,
    Barrier,
    ForgetIncarnation,
    RaiseClusterVersion,
    RecordIncarnation,
    SetClusterId,
    SetShard,
)
from raftsched.core.kernel.results import Ack, Rejected
from raftsched.core.membership.commands import AddMember, RemoveMember


def test_a_new_state_is_at_version_1() -> None:
    assert cluster_version(Cluster().state) == 1


def test_every_command_kind_has_a_version_and_only_the_known_ones_are_new() -> None:
    assert COMMAND_VERSIONS.keys() == COMMAND_TAGS.keys()
    assert {cls: version for cls, version in COMMAND_VERSIONS.items() if version > 1} == {
        RaiseClusterVersion: 2,
        Audited: 3,
        BootstrapAdmin: 3,
        CreateToken: 3,
        RevokeToken: 3,
        TouchTokens: 3,
        AddMember: 4,
        RemoveMember: 4,
        SetClusterId: 4,
        RecordIncarnation: 4,
        ForgetIncarnation: 4,
        SetUnknownPolicy: 5,
        ReconcileJob: 5,
        ReplayReconciled: 5,
        RequestReconcile: 5,
        LeaseBatch: 6,
        ConfigureWheel: 7,
        ClaimJobsOfKinds: 8,
        SetShard: 9,
        SetShardQuotas: 9,
        PlanShardQuotas: 9,
        CopySubscription: 9,
    }
    # Version 10 adds no kind: a subscription's sink, tenants and key field
    # (docs/relays.md) are later fields of two kinds of before.
    assert COMMAND_VERSION_MAX == 10


def test_raise_moves_the_version_up_and_never_down() -> None:
    cluster = Cluster()
    assert cluster.one(RaiseClusterVersion(2)) == Ack()
    assert cluster_version(cluster.state) == 2
    before = cluster.digest()
    assert cluster.one(RaiseClusterVersion(1)) == Ack()  # a late proposal
    assert cluster.one(RaiseClusterVersion(2)) == Ack()  # a retried one
    assert cluster_version(cluster.state) == 2
    assert cluster.digest() == before


@pytest.mark.parametrize("version", [0, -1, COMMAND_VERSION_MAX + 1, 2**40])
def test_a_version_this_code_does_not_know_is_refused(version: int) -> None:
    cluster = Cluster()
    before = cluster.digest()
    result = cluster.one(RaiseClusterVersion(version))
    assert isinstance(result, Rejected) and result.code == "invalid_request"
    assert result.details == {"field": "version"}
    assert cluster.digest() == before


def test_at_its_default_the_section_is_not_encoded_at_all() -> None:
    """So every state that never raised the version has release 0.1.0's bytes."""
    cluster = Cluster()
    cluster.submit()
    doc = msgpack.unpackb(encode_state(cluster.state))
    names = [name for name, _ in doc[7]]
    assert CLUSTER_VERSION not in names
    assert names == [s.name for s in REGISTRY.sections if not s.optional]


def test_a_raised_version_is_encoded_in_section_order_and_round_trips() -> None:
    cluster = Cluster()
    cluster.submit()
    cluster.one(RaiseClusterVersion(2))
    data = encode_state(cluster.state)
    names = [name for name, _ in msgpack.unpackb(data)[7]]
    assert names == sorted(names) and names[0] == CLUSTER_VERSION
    assert msgpack.unpackb(data)[7][0] == [CLUSTER_VERSION, 2]
    decoded = decode_state(data)
    assert cluster_version(decoded) == 2
    assert encode_state(decoded) == data


def test_an_absent_section_decodes_to_version_1() -> None:
    cluster = Cluster()
    decoded = decode_state(encode_state(cluster.state))
    assert cluster_version(decoded) == 1


def _with_sections(data: bytes, change: object) -> bytes:
    doc = msgpack.unpackb(data)
    doc[7] = change(doc[7])  # type: ignore[operator]
    packed: bytes = msgpack.packb(doc)
    return packed


@pytest.mark.parametrize(
    "change",
    [
        lambda rows: [[CLUSTER_VERSION, 1], *rows],  # the default must be left out
        lambda rows: [[CLUSTER_VERSION, "2"], *rows],
        lambda rows: [*rows, [CLUSTER_VERSION, 2]],  # out of order
        lambda rows: rows[1:],  # a section that is not optional is missing
        lambda rows: [*rows, ["unknown", []]],
        lambda rows: [["aaa", 1], *rows],
    ],
)
def test_sections_other_than_the_encoders_are_refused(change: object) -> None:
    cluster = Cluster()
    cluster.submit()
    with pytest.raises(CodecError):
        decode_state(_with_sections(encode_state(cluster.state), change))


def test_the_gate_holds_every_version_2_command_until_the_cluster_is_at_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No user command is version 2 yet; pretend Configure were."""
    cluster = Cluster()
    assert not needs_upgrade(cluster.state, Configure())
    monkeypatch.setitem(COMMAND_VERSIONS, Configure, 2)
    assert command_version(Configure()) == 2
    assert needs_upgrade(cluster.state, Configure())
    # RaiseClusterVersion is what opens the gate, so it never waits.
    assert not needs_upgrade(cluster.state, RaiseClusterVersion(2))
    cluster.one(RaiseClusterVersion(2))
    assert not needs_upgrade(cluster.state, Configure())


def test_a_lease_batch_waits_for_version_6_whatever_it_carries() -> None:
    """Its ops and claim are version 1 (or 5): the batch itself is the new
    kind, which a replica of release 0.5.0 cannot decode."""
    batch = LeaseBatch((CompleteJob("j", 1),), ClaimJobs("w", ("q",), 1))
    assert command_version(batch) == 6
    assert command_version(LeaseBatch((ReconcileJob("j", 1, "happened"),))) == 6
    cluster = Cluster()
    for version in (5, 6):
        assert needs_upgrade(cluster.state, batch)
        cluster.one(RaiseClusterVersion(version))
    assert not needs_upgrade(cluster.state, batch)


def test_a_nested_command_raises_its_holders_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should a later lease operation be newer than the batch, the batch
    waits for it too, as `Audited` waits for its inner command."""
    monkeypatch.setitem(COMMAND_VERSIONS, CompleteJob, 7)
    assert command_version(LeaseBatch((CompleteJob("j", 1),))) == 7
    assert command_version(LeaseBatch((), ClaimJobs("w", ("q",), 1))) == 6
    monkeypatch.setitem(COMMAND_VERSIONS, Barrier, 9)
    assert command_version(Audited("ops", Barrier())) == 9
