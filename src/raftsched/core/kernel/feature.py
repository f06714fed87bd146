"""A feature as one record, and the registry that derives the core's tables.

A feature (jobs, schedules, workflows, events) declares everything it adds
to the state machine in one `Feature` value: its state sections, its
commands (type, codec tag, field schema, handler, the version that
introduced it), the codec field kinds it owns, its share of `Tick`, when it
next needs a Tick, its invariants, and the hooks it hangs on a job's life
cycle. `raftsched.core.registry` lists the features in order, and a
`Registry` built from that list derives what used to be written out by hand
in five places: the dispatcher, the codec's tag and schema tables, the Tick
work list, `next_due_ms`, `check_invariants` and the state sections.

The kernel never imports a feature: the functions that need the features
(`apply_entry`, the codec, `new_state`, `check_invariants`) take a registry
as a parameter, and `raftsched.core` binds them to the one registry. A state
keeps a reference to its registry's `Hooks` (not replicated, never encoded),
so that code deep inside a job's life cycle (`lifecycle.finish`) reaches the
other features without importing them.

Building a registry checks that no two commands share a type or a tag, no
two sections or field kinds share a name, and no two pieces of Tick work or
job-finished hooks share a rank; a mistake there fails at import, on every
node, before any entry is applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Final, TypeVar

from raftsched.core.kernel import codec
from raftsched.core.kernel.commands import Command, Tick
from raftsched.core.kernel.model import Job
from raftsched.core.kernel.results import Result, Ticked
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.sections import Section

if TYPE_CHECKING:
    from raftsched.core.kernel.state import State


@dataclass(frozen=True, slots=True)
class Context:
    """What a handler gets beside the state and its command; one per entry."""

    # The entry was proposed under an epoch older than one already applied.
    stale: bool
    # Undo log of the command being applied (reset before each command).
    savepoint: Savepoint
    registry: Registry


Handler = Callable[["State", Any, Context], Result]


@dataclass(frozen=True, slots=True)
class AuditSubject:
    """What an operator command acts on, as the audit trail records it."""

    # The id or name it acts on (job id, schedule id, queue name, ...).
    target: str | None
    # The tenant whose data it touches; None for what no tenant owns
    # (queue settings, subscriptions), which only all-tenant readers see.
    tenant: str | None
    # A few words on what was asked (a reason, the new settings); short.
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Audit:
    """How a command kind is audited when it arrives wrapped in `Audited`."""

    # Its stable name in the trail, e.g. "job.cancel"; never renamed, since
    # replicas store it.
    kind: str
    # Called before the command is applied (a deleted schedule's tenant is
    # gone after); reads the state, never changes it.
    describe: Callable[[State, Any], AuditSubject]


@dataclass(frozen=True, slots=True)
class CommandKind:
    """One command type: how it is encoded and who applies it."""

    type: type[Command]
    # Stable codec tag; never renumbered, never reused once retired.
    tag: int
    # Codec field kinds in dataclass field order (`codec.KERNEL_FIELD_KINDS`
    # or a feature's `FieldKind`).
    fields: tuple[str, ...]
    handler: Handler
    # The cluster version that introduced the command.
    since: int = 1
    # Set for operator commands: they may be wrapped in `Audited`.
    audit: Audit | None = None
    # How many of the last fields a later cluster version, `tail_since`,
    # added to the kind (optional ones, None unless set): a command that
    # leaves them all None is encoded without them, exactly as the release
    # before wrote it, and a row without them decodes to None; a command
    # that sets one needs `tail_since` (`cluster_version.command_version`).
    tail: int = 0
    tail_since: int = 1


@dataclass(frozen=True, slots=True)
class FieldKind:
    """A codec field kind a feature owns, e.g. "schedule" for a ScheduleSpec."""

    name: str
    # The value as plain msgpack data (lists, ints, strings, bytes, None).
    encode: Callable[[Any], Any]
    # That data (as msgpack decodes it: tuples) back into the value; raises
    # `codec.CodecError` on anything malformed.
    decode: Callable[[object], Any]
    # Whether the value holds job specs (a schedule's template, a workflow's
    # steps): a spec's newer fields raise its command's version.
    holds_specs: bool = False


@dataclass(frozen=True, slots=True)
class TickWork:
    """One step of `Tick`. Steps run in rank order, each within what is left
    of the Tick's `max_items` budget, and return how many items they did."""

    rank: int
    run: Callable[[State, int, Tick, Context], int]
    # The `Ticked` field that reports this step's count, if any.
    reports: str | None = None


@dataclass(frozen=True, slots=True)
class JobFinishedHook:
    """Called in the command that made a job final, in rank order."""

    rank: int
    run: Callable[[State, Job, Savepoint], None]


AttemptEndedHook = Callable[["State", Job, str, bool, Savepoint], None]
LeaseInputs = Callable[["State", Job], "bytes | None"]


@dataclass(frozen=True, slots=True)
class Feature:
    name: str
    sections: tuple[Section, ...] = ()
    commands: tuple[CommandKind, ...] = ()
    field_kinds: tuple[FieldKind, ...] = ()
    tick: tuple[TickWork, ...] = ()
    # When this feature next needs a Tick (None: nothing waits on time).
    next_due_ms: Callable[[State], int | None] | None = None
    # Violations of this feature's invariants (empty when sound).
    check: Callable[[State], list[str]] | None = None
    on_job_finished: tuple[JobFinishedHook, ...] = ()
    # An attempt ended: (state, job, outcome, counted, savepoint).
    on_attempt_ended: AttemptEndedHook | None = None
    # The `inputs` a lease of a workflow job carries (first non-None wins).
    lease_inputs: LeaseInputs | None = None
    # The first entry of a higher epoch was applied (the takeover).
    on_new_epoch: Callable[[State], None] | None = None
    # After every entry, with its number of commands (tidying derived data).
    after_entry: Callable[[State, int], None] | None = None
    # A restored state was renamed to its new cluster (`SetClusterId` with
    # `previous`): forget what belonged to the old cluster's processes.
    on_renamed: Callable[[State, Savepoint], None] | None = None
    # Cluster versions that change what existing commands do, without a
    # command kind of their own (paced hydration of the time wheel, 8): a
    # replica of older code would apply the same entries differently, so
    # this code reports them as understood (`Registry.command_version_max`)
    # and they take effect only once the cluster version is raised to them.
    versions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Hooks:
    """The life-cycle hooks of every feature, in order; `State.hooks`."""

    on_job_finished: tuple[Callable[[State, Job, Savepoint], None], ...] = ()
    on_attempt_ended: tuple[AttemptEndedHook, ...] = ()
    lease_inputs: tuple[LeaseInputs, ...] = ()
    on_renamed: tuple[Callable[[State, Savepoint], None], ...] = ()


# The counts a `TickWork` may report, by field name.
TICKED_COUNTS: Final = tuple(item.name for item in fields(Ticked) if item.name != "more")
T = TypeVar("T")


class Registry:
    """The ordered features and every table derived from them. Built once at
    import; treat it as read-only."""

    __slots__ = (
        "features",
        "handlers",
        "kinds",
        "audits",
        "command_tags",
        "command_versions",
        "command_tails",
        "command_version_max",
        "codec",
        "sections",
        "tick_work",
        "next_due",
        "checks",
        "on_new_epoch",
        "after_entry",
        "hooks",
        "nested",
        "spec_holders",
    )

    def __init__(self, features: Sequence[Feature]) -> None:
        self.features = tuple(features)
        _unique("feature", (feature.name for feature in self.features))
        kinds = [kind for feature in self.features for kind in feature.commands]
        _unique("command type", (kind.type.__name__ for kind in kinds))
        _unique("command tag", (kind.tag for kind in kinds))
        for kind in kinds:
            if len(kind.type.__dataclass_fields__) != len(kind.fields):  # type: ignore[attr-defined]
                raise ValueError(f"{kind.type.__name__}: one field kind per dataclass field")
            if type(kind.since) is not int or kind.since < 1:
                raise ValueError(f"{kind.type.__name__}: since is a version from 1")
            _check_tail(kind)
        field_kinds = [each for feature in self.features for each in feature.field_kinds]
        _unique("field kind", [*codec.KERNEL_FIELD_KINDS, *(each.name for each in field_kinds)])
        sections = [section for feature in self.features for section in feature.sections]
        _unique("state section", (section.name for section in sections))
        tick_work = [work for feature in self.features for work in feature.tick]
        _unique("tick rank", (work.rank for work in tick_work))
        _unique("Ticked count", (work.reports for work in tick_work if work.reports))
        for work in tick_work:
            if work.reports is not None and work.reports not in TICKED_COUNTS:
                raise ValueError(f"Ticked has no count {work.reports}")
        finished = [hook for feature in self.features for hook in feature.on_job_finished]
        behaviours = [version for feature in self.features for version in feature.versions]
        for version in behaviours:
            if type(version) is not int or version < 1:
                raise ValueError(f"feature versions are versions from 1, not {version!r}")
        _unique("job-finished rank", (hook.rank for hook in finished))

        # The dispatcher: one dict lookup per command.
        self.handlers: dict[type[Any], Handler] = {kind.type: kind.handler for kind in kinds}
        self.kinds: dict[type[Any], CommandKind] = {kind.type: kind for kind in kinds}
        # The operator commands that `Audited` may wrap, and how.
        self.audits: dict[type[Any], Audit] = {
            kind.type: kind.audit for kind in kinds if kind.audit is not None
        }
        _unique("audit kind", (audit.kind for audit in self.audits.values()))
        self.command_tags: dict[type[Any], int] = {kind.type: kind.tag for kind in kinds}
        self.command_versions: dict[type[Any], int] = {kind.type: kind.since for kind in kinds}
        # The kinds with fields a later version added (`CommandKind.tail`):
        # those fields' names, and that version.
        self.command_tails: dict[type[Any], tuple[tuple[str, ...], int]] = {
            kind.type: (
                tuple(kind.type.__dataclass_fields__)[-kind.tail :],  # type: ignore[attr-defined]
                kind.tail_since,
            )
            for kind in kinds
            if kind.tail
        }
        # The highest cluster version this code understands (and reports to
        # its peers): its command kinds' and its features' other versions.
        self.command_version_max: int = max(
            [*(kind.since for kind in kinds), *(kind.tail_since for kind in kinds), *behaviours],
            default=1,
        )
        # The kinds that hold commands (`Audited`, `LeaseBatch`), and the
        # names of their fields that do: see `inner_commands`.
        self.nested: dict[type[Any], tuple[str, ...]] = {
            kind.type: names
            for kind in kinds
            if (
                names := tuple(
                    name
                    for name, field_kind in zip(
                        kind.type.__dataclass_fields__,  # type: ignore[attr-defined]
                        kind.fields,
                        strict=True,
                    )
                    if field_kind in codec.NESTING_KINDS
                )
            )
        }
        # The kinds whose fields may hold job specs (`cluster_version.command_version`).
        holding = {"specs", *(each.name for each in field_kinds if each.holds_specs)}
        self.spec_holders: frozenset[type[Any]] = frozenset(
            kind.type for kind in kinds if holding & set(kind.fields)
        )
        custom = {each.name: (each.encode, each.decode) for each in field_kinds}
        self.codec = codec.CommandCodec([(k.type, k.tag, k.fields, k.tail) for k in kinds], custom)
        # Encoding order: sorted by name (never import or feature order).
        self.sections = tuple(sorted(sections, key=lambda section: section.name))
        self.tick_work = tuple(sorted(tick_work, key=lambda work: work.rank))
        self.next_due = _present(feature.next_due_ms for feature in self.features)
        self.checks = _present(feature.check for feature in self.features)
        self.on_new_epoch = _present(feature.on_new_epoch for feature in self.features)
        self.after_entry = _present(feature.after_entry for feature in self.features)
        self.hooks = Hooks(
            tuple(hook.run for hook in sorted(finished, key=lambda hook: hook.rank)),
            _present(feature.on_attempt_ended for feature in self.features),
            _present(feature.lease_inputs for feature in self.features),
            _present(feature.on_renamed for feature in self.features),
        )

    def inner_commands(self, command: object) -> tuple[Command, ...]:
        """The commands a command holds (an `Audited`'s one, a `LeaseBatch`'s
        ops and claim), in field order; () for any other. Tolerates a
        malformed command (fields of the wrong type hold nothing)."""
        names = self.nested.get(type(command))
        if names is None:
            return ()
        inner: list[Command] = []
        for name in names:
            value = getattr(command, name, None)
            if isinstance(value, Command):
                inner.append(value)
            elif type(value) is tuple:
                inner += (item for item in value if isinstance(item, Command))
        return tuple(inner)

    def create_sections(self) -> dict[str, Any]:
        """Fresh, empty sections, in encoding order (what `new_state()` holds)."""
        return {section.name: section.create() for section in self.sections}


def _check_tail(kind: CommandKind) -> None:
    """A tail is optional fields (their codec kinds end in `?`, their
    defaults None) that a version after the kind's own added."""
    name = kind.type.__name__
    if kind.tail == 0:
        return
    if type(kind.tail) is not int or not 0 < kind.tail < len(kind.fields):
        raise ValueError(f"{name}: a tail is some of its last fields, not all")
    if type(kind.tail_since) is not int or kind.tail_since <= kind.since:
        raise ValueError(f"{name}: a tail comes in a version after the kind's own")
    for field in fields(kind.type)[-kind.tail :]:  # type: ignore[arg-type]
        if field.default is not None:
            raise ValueError(f"{name}: tail field {field.name} must default to None")
    if not all(each.endswith("?") for each in kind.fields[-kind.tail :]):
        raise ValueError(f"{name}: a tail's field kinds are optional ones")


def _present(items: Iterable[T | None]) -> tuple[T, ...]:
    return tuple(item for item in items if item is not None)


def _unique(what: str, values: Iterable[object]) -> None:
    seen: set[object] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"{what} {value!r} declared twice")
        seen.add(value)
