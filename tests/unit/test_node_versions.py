"""The node's part of rolling upgrades: peers' versions, the raise, the gate,
and the replica that stops at an entry it cannot decode."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import msgpack
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from raftsched import core
from raftsched.api.app import _answer
from raftsched.core import COMMAND_VERSION_MAX, COMMAND_VERSIONS
from raftsched.core.jobs.commands import (
    ClaimJobs,
    CompleteJob,
    Configure,
    ConfigureWheel,
    LeaseBatch,
    SetQueue,
    StartJob,
    SubmitJobs,
)
from raftsched.core.kernel.cluster_version import CLUSTER_VERSION_DEFAULT
from raftsched.core.kernel.codec import ENTRY_FORMAT
from raftsched.core.kernel.commands import Audited, Entry, JobSpec, RaiseClusterVersion, TakeOver
from raftsched.node.machine import ReplicatedState
from raftsched.node.versions import (
    THIS_NODE,
    UPGRADE_FIRST,
    NodeVersion,
    PeerVersions,
    UpgradeRequired,
    check_allowed,
    from_answer,
    gated,
    plain,
)
from raftsched.raft import StopApplying


def test_a_node_of_release_0_1_0_answers_without_a_version_and_understands_1() -> None:
    assert from_answer({"node_id": "n2", "wall_ms": 1.0}) == NodeVersion(None, 1)


def test_a_node_of_today_says_what_it_understands() -> None:
    answer = {"node_id": "n2", "wall_ms": 1.0, "version": THIS_NODE.as_json()}
    assert from_answer(answer) == THIS_NODE
    assert THIS_NODE.command_version_max == COMMAND_VERSION_MAX


@pytest.mark.parametrize(
    "body",
    [None, [], {}, {"wall_ms": 1, "version": 2}, {"wall_ms": 1, "version": {"release": "x"}}],
)
def test_other_answers_are_no_answer(body: Any) -> None:
    with pytest.raises(ValueError):
        from_answer(body)


def poll(answers: dict[str, Any]) -> PeerVersions:
    """PeerVersions after one poll in which each peer's URL answered as given
    (an exception: it did not answer)."""
    versions = PeerVersions({node_id: node_id for node_id in answers})

    async def fetch(url: str) -> object:
        answer = answers[url]
        if isinstance(answer, Exception):
            raise answer
        return answer

    asyncio.run(versions.poll(fetch))
    return versions


NEW = {"wall_ms": 1, "version": {"release": "0.2.0", "command_version_max": 2}}
OLD = {"wall_ms": 1}


def test_the_version_is_raised_when_every_member_understands_it() -> None:
    assert poll({"n2": NEW, "n3": NEW}).version_to_raise(1) == 2


def test_one_old_member_holds_the_version() -> None:
    versions = poll({"n2": NEW, "n3": OLD})
    assert versions.heard == {"n2": NodeVersion("0.2.0", 2), "n3": NodeVersion(None, 1)}
    assert versions.version_to_raise(1) is None


def test_a_member_that_does_not_answer_holds_the_version() -> None:
    versions = poll({"n2": NEW, "n3": ConnectionRefusedError()})
    assert versions.heard["n3"] is None
    assert versions.version_to_raise(1) is None


def test_nothing_to_raise_at_the_version_in_force() -> None:
    assert poll({"n2": NEW, "n3": NEW}).version_to_raise(2) is None


def test_a_member_that_understands_less_than_this_node_sets_the_version() -> None:
    partial = {"wall_ms": 1, "version": {"release": "x", "command_version_max": 1}}
    assert poll({"n2": partial, "n3": NEW}).version_to_raise(1) is None


def test_the_gate_refuses_a_command_newer_than_the_cluster_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = core.new_state()
    check_allowed(state, [Configure(), RaiseClusterVersion(2)])
    monkeypatch.setitem(COMMAND_VERSIONS, SetQueue, 2)  # as if it were new
    with pytest.raises(UpgradeRequired) as refused:
        check_allowed(state, [Configure(), SetQueue("q")])
    assert (refused.value.command_kind, refused.value.needed, refused.value.in_force) == (
        "SetQueue",
        2,
        1,
    )


def test_the_api_answers_409_invalid_state_upgrade_every_node_first() -> None:
    async def handler(request: web.Request) -> web.Response:
        raise UpgradeRequired(SetQueue("q"), 2, 1)

    async def answer() -> web.StreamResponse:
        return await _answer(make_mocked_request("PUT", "/v1/queues/q"), handler)

    response = asyncio.run(answer())
    assert isinstance(response, web.Response) and response.status == 409
    assert response.text is not None
    body = json.loads(response.text)
    assert body["error"]["code"] == "invalid_state"
    assert body["error"]["message"] == UPGRADE_FIRST == "upgrade every node first"
    assert body["error"]["details"] == {
        "reason": "cluster_version",
        "command": "SetQueue",
        "command_version": 2,
        "cluster_version": 1,
    }


def test_the_replica_stops_at_an_entry_it_cannot_decode_and_changes_nothing() -> None:
    applied: list[None] = []
    replica = ReplicatedState(lambda: applied.append(None))
    replica.apply(core.encode_entry(Entry(1, 5, (TakeOver(),))))
    before = replica.digest()
    future = msgpack.packb([ENTRY_FORMAT, 1, 6, [[99]]])
    with pytest.raises(StopApplying, match="unknown command tag 99"):
        replica.apply(future)
    assert replica.digest() == before
    assert replica.entries_applied == 1 and len(applied) == 1


def test_only_commands_newer_than_every_cluster_version_are_gated() -> None:
    everyday = [Configure(None), TakeOver(), SetQueue("q", False, None, None, None, None, 0)]
    assert gated(everyday) == []
    raise_version = RaiseClusterVersion(2)
    assert gated([*everyday, raise_version]) == [raise_version]


def test_a_lease_batch_is_gated_until_the_cluster_is_at_6_and_answered_409() -> None:
    """Release 0.5.0 cannot decode a lease batch (tag 110): while the
    cluster version is 5 the node refuses to propose one, whatever it holds,
    and the API answers 409 invalid_state "upgrade every node first"."""
    batch = LeaseBatch((CompleteJob("j", 1),), ClaimJobs("w", ("q",), 1))
    assert gated([CompleteJob("j", 1), ClaimJobs("w", ("q",), 1), batch]) == [batch]
    state = core.new_state()
    core.apply_entry(state, Entry(1, 5, (TakeOver(), RaiseClusterVersion(5))))
    with pytest.raises(UpgradeRequired) as refused:
        check_allowed(state, [batch])
    assert (refused.value.command_kind, refused.value.needed, refused.value.in_force) == (
        "LeaseBatch",
        6,
        5,
    )

    async def handler(request: web.Request) -> web.Response:
        raise refused.value

    async def answer() -> web.StreamResponse:
        return await _answer(make_mocked_request("POST", "/v1/leases/batch"), handler)

    response = asyncio.run(answer())
    assert isinstance(response, web.Response) and response.status == 409
    assert response.text is not None
    body = json.loads(response.text)["error"]
    assert (body["code"], body["message"]) == ("invalid_state", UPGRADE_FIRST)
    assert body["details"]["command"] == "LeaseBatch"
    core.apply_entry(state, Entry(1, 6, (RaiseClusterVersion(6),)))
    check_allowed(state, [batch])


def test_an_audited_configure_wheel_is_refused_at_6_naming_configure_wheel() -> None:
    """`PUT /v1/wheel` proposes `Audited(ConfigureWheel)`: while the cluster
    version is 6 (a member still on 0.6.0) it is refused, and the answer
    names the kind that needs version 7, not the audit wrapper."""
    command = Audited("admin", ConfigureWheel(900_000, 3_600_000))
    state = core.new_state()
    core.apply_entry(state, Entry(1, 5, (TakeOver(), RaiseClusterVersion(6))))
    with pytest.raises(UpgradeRequired) as refused:
        check_allowed(state, [command])
    assert (refused.value.command_kind, refused.value.needed, refused.value.in_force) == (
        "ConfigureWheel",
        7,
        6,
    )
    assert core.newest_kind(Audited("admin", SetQueue("q"))) == "Audited"
    assert core.newest_kind(LeaseBatch((CompleteJob("j", 1),), None)) == "LeaseBatch"
    core.apply_entry(state, Entry(1, 6, (RaiseClusterVersion(7),)))
    check_allowed(state, [command])


def test_the_gate_skips_the_walk_only_for_kinds_that_cannot_hold_a_job_spec() -> None:
    # The worker protocol's kinds are plain: their commands pass unwalked.
    assert all(plain(kind) for kind in (ClaimJobs, StartJob, CompleteJob, SetQueue, TakeOver))
    # A kind that holds job specs, or another command, or is newer, is walked.
    assert not any(plain(kind) for kind in (SubmitJobs, Audited, RaiseClusterVersion))
    reconciling = SubmitJobs((JobSpec("q", on_unknown="reconcile"),), ("job_1",))
    audited = Audited("ops", SetQueue("q", False, None, None, None, None, 0))
    commands = [
        StartJob("job_1", 3),
        CompleteJob("job_1", 3),
        ClaimJobs("w", ("q",), 1),
        SubmitJobs((JobSpec("q"),), ("job_2",)),
        reconciling,
        audited,
    ]
    assert gated(commands) == [reconciling, audited]
    # Cross-checked against the annotations as written: no plain kind names
    # a job spec, a command or anything else that could hold one.
    for kind in COMMAND_VERSIONS:
        if plain(kind):
            assert COMMAND_VERSIONS[kind] == CLUSTER_VERSION_DEFAULT, kind
            for field in dataclasses.fields(kind):
                written = str(field.type)
                assert not any(word in written for word in ("Spec", "Command", "Any")), field
