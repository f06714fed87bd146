"""What a node reads of a shard and proposes there to bring it in line with
group 0 (node.shard_view, node.shard_settings; docs/shards.md section 4),
and the event ids and envelopes of a shard's webhooks."""

from __future__ import annotations

import json

import pytest

from raftsched.core import apply_entry, check_invariants, new_state
from raftsched.core.events.commands import (
    CopySubscription,
    CreateSubscription,
    DeleteSubscription,
)
from raftsched.core.jobs.commands import (
    PlanShardQuotas,
    SetQueue,
    SetShardQuotas,
    SetTenant,
    SetUnknownPolicy,
    SubmitJobs,
)
from raftsched.core.kernel.commands import Command, Entry, JobSpec, SetShard, TakeOver
from raftsched.core.kernel.outbox import OutboxEvent
from raftsched.core.kernel.state import State
from raftsched.node.quota_split import ShardQuotas
from raftsched.node.shard_view import (
    aligning_commands,
    command_from_json,
    command_json,
    read_view,
    secrets_of,
    settings_digest,
    settings_of,
    view,
)
from raftsched.node.webhooks import describe, event_id

T = 1_800_000_000_000


class Cluster:
    """One group's state, commands applied in entries of a leader's."""

    def __init__(self) -> None:
        self.state: State = new_state()
        self.run(TakeOver())

    def run(self, *commands: Command) -> None:
        apply_entry(self.state, Entry(1, T, tuple(commands)))
        assert check_invariants(self.state) == []


def group(*commands: Command) -> Cluster:
    cluster = Cluster()
    cluster.run(*commands)
    return cluster


def align(zero: Cluster, shard: Cluster, most: int = 100) -> list[Command]:
    return list(
        aligning_commands(
            settings_of(zero.state), settings_of(shard.state), secrets_of(zero.state), most
        )
    )


def test_a_shard_is_brought_in_line_and_reset() -> None:
    zero = group(
        SetQueue("q", True, 2_500, 7, 4, 8, 1_000),
        SetTenant("acme", 3, 10, 100),
        SetUnknownPolicy("queue", "pay", "reconcile"),
        CreateSubscription("sub_1", "https://example.com/h", ("job.succeeded",), "s3cret"),
    )
    shard = group(
        SetTenant("gone", 2),
        CreateSubscription("sub_2", "https://example.com/old", (), "old"),
        SetUnknownPolicy("tenant", "t", "reconcile"),
    )
    commands = align(zero, shard)
    assert commands == [
        SetQueue("q", True, 2_500, 7, 4, 8, 1_000),
        SetTenant("acme", 3, 10, 100),
        SetTenant("gone"),  # group 0 has none: back to the defaults
        SetUnknownPolicy("queue", "pay", "reconcile"),
        SetUnknownPolicy("tenant", "t", "retry"),
        CopySubscription("sub_1", "https://example.com/h", ("job.succeeded",), "s3cret", T),
        DeleteSubscription("sub_2"),
    ]
    shard.run(*commands)
    assert align(zero, shard) == []
    assert settings_digest(settings_of(zero.state)) == settings_digest(settings_of(shard.state))
    # A subscription whose secret changed is deleted and created again.
    zero.run(DeleteSubscription("sub_1"))
    zero.run(CreateSubscription("sub_1", "https://example.com/h", ("job.succeeded",), "new"))
    assert align(zero, shard) == [
        DeleteSubscription("sub_1"),
        CopySubscription("sub_1", "https://example.com/h", ("job.succeeded",), "new", T),
    ]
    # A queue back to the defaults in group 0 is reset in the shard.
    zero.run(SetQueue("q"))
    assert align(zero, shard)[0] == SetQueue("q")


def test_a_pass_is_bounded() -> None:
    zero = group(*(SetTenant(f"t{n:03d}", 2) for n in range(50)))
    commands = align(zero, Cluster(), most=20)
    assert commands == [SetTenant(f"t{n:03d}", 2) for n in range(20)]


def test_a_view_reads_back_and_carries_no_secret() -> None:
    cluster = group(
        SetShard(1, 3),
        SetQueue("q", concurrency_limit=5),
        SetTenant("acme", 2, None, 9),
        SetShardQuotas(7, (("q", 2, None, None),), (("acme", None, 3),)),
        CreateSubscription("sub_1", "https://example.com/h", (), "s3cret"),
        SubmitJobs(
            (JobSpec("q", tenant="acme"), JobSpec("q", tenant="acme"), JobSpec("r")),
            ("job1_a", "job1_b", "job1_c"),
        ),
    )
    raw = view(cluster.state, leader=True, queues=["q", "r", "none"], tenants=["acme"])
    text = json.dumps(raw)
    assert "s3cret" not in text
    seen = read_view(json.loads(text))
    assert seen.leader and seen.identity == (1, 3) and seen.round == 7
    # Settings whose digest the asker knows are left out.
    digest = settings_digest(settings_of(cluster.state))
    assert read_view(view(cluster.state, leader=False, known_digest=digest)).settings is None
    assert seen.quotas == ShardQuotas({"q": (2, None, None)}, {"acme": (None, 3)})
    assert seen.settings == settings_of(cluster.state)
    assert seen.queue_demand["q"].runnable == 2 and "none" not in seen.queue_demand
    assert seen.tenant_demand["acme"].queued == 2


@pytest.mark.parametrize(
    "command",
    [
        SetQueue("q", True, 2_500, 7, 4, 8, 1_000),
        SetTenant("acme"),
        SetUnknownPolicy("queue", "q", "reconcile"),
        SetShardQuotas(9, (("q", 1, 500, 1),), (("t", None, 2),)),
        CopySubscription("sub_1", "https://x.example/h", ("a", "b"), "s", 5),
        DeleteSubscription("sub_1"),
    ],
)
def test_commands_go_to_a_shard_process_as_json_and_back(command: Command) -> None:
    assert command_from_json(json.loads(json.dumps(command_json(command)))) == command


@pytest.mark.parametrize(
    "raw",
    [
        {"kind": "PlanShardQuotas", "fields": [0, 1, [], []]},  # group 0's, never a shard's
        {"kind": "SetShard", "fields": [1, 3]},
        {"kind": "SetQueue", "fields": ["q"]},
        {"kind": "SetQueue"},
        {"kind": "CreateSubscription", "fields": ["sub_1", "https://x.example/h", [], "s"]},
        ["SetQueue"],
    ],
)
def test_a_shard_process_takes_only_the_aligning_commands(raw: object) -> None:
    with pytest.raises(ValueError):
        command_from_json(raw)
    with pytest.raises(ValueError):
        command_json(PlanShardQuotas(0, 1))


def test_event_ids_and_envelopes_name_their_shard() -> None:
    event = OutboxEvent(17, "job.succeeded", 1_000, b"\x80")
    assert event_id(event) == "evt_17"
    assert event_id(event, 0) == "evt_17"
    assert event_id(event, 2) == "evt2_17"
    assert "shard" not in describe(event)  # one shard: the envelope as before
    assert describe(event, 0)["shard"] == 0
    envelope = describe(event, 2)
    assert envelope["id"] == "evt2_17" and envelope["shard"] == 2 and envelope["seq"] == 17


def test_a_broker_subscription_is_copied_with_its_sink_which_no_view_shows() -> None:
    from raftsched.core.events.sinks import make_sink

    sink = make_sink("redis", {"url": "redis://:pw-123@r:6379/0", "stream": "s:{shard}"})
    zero = group(CreateSubscription("sub_r", "", ("job.*",), "", sink, ("acme",), "payment_id"))
    shard = Cluster()
    commands = align(zero, shard)
    copy = CopySubscription("sub_r", "", ("job.*",), "", T, sink, ("acme",), "payment_id")
    assert commands == [copy]
    assert command_from_json(json.loads(json.dumps(command_json(copy)))) == copy
    # The view carries a hash of the sink, never its URL; an equal copy is in line.
    seen = json.dumps(view(zero.state, leader=True))
    assert "pw-123" not in seen and "redis://" not in seen
    assert read_view(json.loads(seen)).settings == settings_of(zero.state)
    shard.run(*commands)
    assert align(zero, shard) == []
    assert settings_digest(settings_of(zero.state)) == settings_digest(settings_of(shard.state))
    # Another stream: deleted and copied again.
    other = make_sink("redis", {"url": "redis://:pw-123@r:6379/0", "stream": "t"})
    zero.run(DeleteSubscription("sub_r"))
    zero.run(CreateSubscription("sub_r", "", ("job.*",), "", other, ("acme",), "payment_id"))
    assert align(zero, shard) == [
        DeleteSubscription("sub_r"),
        CopySubscription("sub_r", "", ("job.*",), "", T, other, ("acme",), "payment_id"),
    ]
    # A webhook's view and digest are those of before version 10.
    hook = group(CreateSubscription("sub_1", "https://example.com/h", (), "k"))
    assert settings_of(hook.state).subscriptions["sub_1"][4] == ""
