"""The registry: one record per feature, and every table derived from them."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any

import pytest

import raftsched.core  # noqa: F401  (imports every feature's commands)
from raftsched.core import COMMAND_TAGS, REGISTRY
from raftsched.core.jobs import feature as jobs
from raftsched.core.jobs.commands import CancelJob, SubmitJobs
from raftsched.core.kernel import apply, cluster_version, codec, invariants, tick
from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.commands import Command, Entry, JobSpec, Tick
from raftsched.core.kernel.feature import (
    CommandKind,
    Context,
    Feature,
    FieldKind,
    JobFinishedHook,
    Registry,
    TickWork,
)
from raftsched.core.kernel.results import Ack, Rejected, Ticked
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State, new_state
from raftsched.core.registry import FEATURES


def _all_command_types() -> set[type[Any]]:
    found: set[type[Any]] = set()
    pending = [Command]
    while pending:
        for subclass in pending.pop().__subclasses__():
            # Not tests' own; and not the class a slotted dataclass replaced.
            module = sys.modules[subclass.__module__]
            if module.__name__.startswith("raftsched.") and (
                getattr(module, subclass.__name__, None) is subclass
            ):
                found.add(subclass)
            pending.append(subclass)
    return found


def test_every_command_type_has_exactly_one_kind() -> None:
    kinds = [kind.type for feature in FEATURES for kind in feature.commands]
    assert len(kinds) == len(set(kinds))
    assert set(kinds) == _all_command_types()


def test_the_public_tables_are_the_registrys() -> None:
    assert COMMAND_TAGS is REGISTRY.command_tags
    assert set(REGISTRY.handlers) == set(COMMAND_TAGS) == set(REGISTRY.codec.by_type)
    assert {tag for tag, _ in REGISTRY.codec.by_tag.items()} == set(COMMAND_TAGS.values())
    assert set(REGISTRY.command_versions.values()) == {1, 2, 3, 4, 5, 6, 7, 8, 9}
    assert REGISTRY.command_version_max == 10  # a later field (sinks.SINK_VERSION)


def test_tick_work_and_job_finished_hooks_keep_their_order() -> None:
    """Tick order and finish() order decide the replicated bytes."""
    assert [(work.rank, work.run.__name__) for work in REGISTRY.tick_work] == [
        (10, "expire_leases"),
        (15, "expire_reconciliations"),
        (20, "enforce_deadlines"),
        (25, "hydrate_wheel"),
        (30, "make_due_runnable"),
        (40, "fire_due"),
        (50, "purge_finished"),
        (60, "tick"),
        (70, "trim"),
    ]
    assert [hook.__name__ for hook in REGISTRY.hooks.on_job_finished] == [
        "emit_job_event",
        "record_step_outcome",
        "release_ordering_key",
        "mark_buffer_releasable",
        "close_finished",
    ]
    assert [section.name for section in REGISTRY.sections] == sorted(
        section.name for section in REGISTRY.sections
    )


def _handler(state: State, command: Any, context: Context) -> Ack:
    return Ack()


def _ticker(state: State, budget: int, command: Tick, context: Context) -> int:
    return 0


@dataclass(frozen=True, slots=True)
class Other(Command):
    name: str


def _feature(name: str, **fields: Any) -> Feature:
    return Feature(name=name, **fields)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (_feature("jobs"), "feature 'jobs'"),
        (_feature("x", commands=(CommandKind(Other, 1, ("str",), _handler),)), "command tag 1"),
        (
            _feature("x", commands=(CommandKind(Tick, 99, ("int", "int"), _handler),)),
            "command type 'Tick'",
        ),
        (_feature("x", sections=(Section("flow", dict, dict, _handler),)), "state section 'flow'"),
        (_feature("x", tick=(TickWork(40, _ticker),)), "tick rank 40"),
        (_feature("x", tick=(TickWork(45, _ticker, reports="purged"),)), "Ticked count"),
        (_feature("x", field_kinds=(FieldKind("specs", list, list),)), "field kind 'specs'"),
        (
            _feature("x", on_job_finished=(JobFinishedHook(10, _handler),)),  # type: ignore[arg-type]
            "job-finished rank 10",
        ),
    ],
)
def test_the_registry_refuses_anything_declared_twice(extra: Feature, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Registry((*FEATURES, extra))


def test_the_registry_refuses_a_schema_that_does_not_fit_the_command() -> None:
    with pytest.raises(ValueError, match="one field kind per dataclass field"):
        Registry((*FEATURES, _feature("x", commands=(CommandKind(Other, 900, (), _handler),))))
    with pytest.raises(ValueError, match="unknown field kind"):
        Registry((*FEATURES, _feature("x", commands=(CommandKind(Other, 900, ("?",), _handler),))))


def test_a_features_own_versions_count_in_the_highest_understood() -> None:
    """A version that changes what existing commands do (paced hydration, 8)
    is understood, and reported, like one that brings a command kind."""
    plain = Registry(tuple(replace(f, versions=()) for f in FEATURES))
    # Its kinds' versions, and the versions of their later fields (a
    # subscription's sink: 10).
    tails = [version for _, version in plain.command_tails.values()]
    assert plain.command_version_max == max(*plain.command_versions.values(), *tails)
    assert Registry((*FEATURES, _feature("x", versions=(99,)))).command_version_max == 99
    with pytest.raises(ValueError, match="feature versions"):
        Registry((*FEATURES, _feature("x", versions=(0,))))


# -- a throwaway feature, declared here and nowhere else ----------------------------


@dataclass(frozen=True, slots=True)
class Ping(Command):
    """Adds `count` to the pings of `name`."""

    name: str
    count: int


PINGS = "zz_pings"


def _apply_ping(state: State, command: Ping, context: Context) -> Ack | Rejected:
    if command.count < 0:
        return Rejected("invalid_request", "count must not be negative", {"field": "count"})
    pings: dict[str, int] = state.sections[PINGS]
    before = pings.get(command.name)
    context.savepoint.on_rollback(lambda: _put(pings, command.name, before))
    pings[command.name] = (before or 0) + command.count
    if command.name == "boom":
        raise RuntimeError("a bug after the change")
    return Ack()


def _put(pings: dict[str, int], name: str, count: int | None) -> None:
    if count is None:
        pings.pop(name, None)
    else:
        pings[name] = count


def _encode(state: State) -> Any:
    return sorted(state.sections[PINGS].items())


def _decode(state: State, data: Any) -> None:
    state.sections[PINGS] = dict(data)


def _decode_shout(value: object) -> str:
    if type(value) is not str or value != value.upper():
        raise CodecError("a shout is upper case")
    return value.lower()


def _check(state: State) -> list[str]:
    return [f"pings of {name} below 0" for name, n in state.sections[PINGS].items() if n < 0]


PING_FEATURE = Feature(
    name="pings",
    sections=(Section(PINGS, dict, _encode, _decode),),
    commands=(CommandKind(Ping, 900, ("shout", "int"), _apply_ping, since=2),),
    field_kinds=(FieldKind("shout", str.upper, _decode_shout),),
    next_due_ms=lambda state: 123 if state.sections[PINGS] else None,
    check=_check,
)


def test_a_feature_declared_in_one_place_is_dispatched_encoded_and_stored() -> None:
    registry = Registry((*FEATURES, PING_FEATURE))
    assert registry.command_versions[Ping] == 2
    state = new_state(registry)
    entry = Entry(1, 1_000, (Ping("a", 2), Ping("a", 3), Ping("b", -1)))
    data = codec.encode_entry(entry, registry)
    assert codec.decode_entry(data, registry) == entry
    results = apply.apply_encoded(state, data, registry)
    assert results[:2] == [Ack(), Ack()]
    assert isinstance(results[2], Rejected)
    assert state.sections[PINGS] == {"a": 5}
    assert tick.next_due_ms(state, registry) == 123
    assert invariants.check_invariants(state, registry) == []
    copy = codec.decode_state(codec.encode_state(state, registry), registry)
    assert copy.sections[PINGS] == {"a": 5}
    assert copy.hooks is registry.hooks
    assert codec.state_digest(copy, registry) == codec.state_digest(state, registry)


def test_a_throwaway_features_bug_is_rolled_back_like_any_other() -> None:
    registry = Registry((*FEATURES, PING_FEATURE))
    state = new_state(registry)
    apply.apply_entry(state, Entry(1, 1_000, (Ping("boom", 1),)), registry)
    assert state.sections[PINGS] == {}


def test_the_default_registry_knows_nothing_of_it() -> None:
    entry = Entry(1, 1_000, (Ping("a", 1),))
    with pytest.raises(CodecError):
        codec.encode_entry(entry, REGISTRY)
    registry = Registry((*FEATURES, PING_FEATURE))
    data = codec.encode_entry(entry, registry)
    with pytest.raises(CodecError, match="unknown command tag 900"):
        codec.decode_entry(data, REGISTRY)
    state = new_state(REGISTRY)
    [result] = apply.apply_entry(state, entry, REGISTRY)
    assert isinstance(result, Rejected) and result.code == "invalid_request"


def test_a_state_section_of_another_build_does_not_decode() -> None:
    registry = Registry((*FEATURES, PING_FEATURE))
    data = codec.encode_state(new_state(registry), registry)
    with pytest.raises(CodecError, match="sections"):
        codec.decode_state(data, REGISTRY)


def test_jobs_hooks_reach_finish_through_the_state() -> None:
    calls: list[str] = []
    spy = JobFinishedHook(15, lambda state, job, savepoint: calls.append(job.id))
    spying = replace(jobs.FEATURE, on_job_finished=(*jobs.FEATURE.on_job_finished, spy))
    registry = Registry(tuple(spying if f is jobs.FEATURE else f for f in FEATURES))
    assert [hook.__name__ for hook in registry.hooks.on_job_finished][:2] == [
        "emit_job_event",
        "<lambda>",
    ]
    state = new_state(registry)
    commands = (SubmitJobs((JobSpec("q"),), ("job_1",)), CancelJob("job_1", "", "op"))
    apply.apply_entry(state, Entry(1, 1_000, commands), registry)
    assert calls == ["job_1"]
    assert isinstance(apply.apply_entry(state, Entry(1, 2_000, (Tick(),)), registry)[0], Ticked)


# -- fields a later version adds to a kind (`CommandKind.tail`) ---------------------


@dataclass(frozen=True, slots=True)
class Noted(Command):
    """A kind of version 2 to which version 3 added `note` and `by`."""

    name: str
    note: str | None = None
    by: str | None = None


NOTED = CommandKind(Noted, 901, ("str", "str?", "str?"), _handler, since=2, tail=2, tail_since=3)


def test_a_kinds_later_fields_are_encoded_only_when_set_and_raise_its_version() -> None:
    registry = Registry((*FEATURES, _feature("x", commands=(NOTED,))))
    assert registry.command_tails[Noted] == (("note", "by"), 3)
    assert registry.command_version_max >= 3
    tables = registry.codec
    assert codec._command_row(Noted("a"), tables) == [901, "a"]  # as version 2 wrote it
    assert codec._command_row(Noted("a", by="me"), tables) == [901, "a", None, "me"]
    for command in (Noted("a"), Noted("a", "n"), Noted("a", None, "me")):
        entry = Entry(1, 1_000, (command,))
        assert codec.decode_entry(codec.encode_entry(entry, registry), registry) == entry
    assert codec._decode_command((901, "a"), tables.by_tag) == Noted("a")
    for bad in ((901,), (901, "a", "n"), (901, "a", "n", "me", "x"), (901, "a", 7, None)):
        with pytest.raises(CodecError):
            codec._decode_command(bad, tables.by_tag)
    assert cluster_version.command_version(Noted("a"), registry) == 2
    assert cluster_version.command_version(Noted("a", "n"), registry) == 3
    assert cluster_version.newest_spec_field(Noted("a", None, "me"), registry) == "by"
    assert cluster_version.newest_spec_field(Noted("a"), registry) is None


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        (replace(NOTED, tail=3), "not all"),
        (replace(NOTED, tail=-1), "not all"),
        (replace(NOTED, tail_since=2), "a version after"),
        (replace(NOTED, fields=("str", "str?", "str")), "optional ones"),
        (CommandKind(Ping, 902, ("str", "int"), _handler, tail=1, tail_since=2), "default to None"),
    ],
)
def test_the_registry_refuses_a_tail_that_is_not_later_optional_fields(
    kind: CommandKind, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Registry((*FEATURES, _feature("x", commands=(kind,))))
