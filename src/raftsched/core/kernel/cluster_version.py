"""The cluster version: which command kinds every replica can decode.

Theory of operation. Each command kind carries the version that introduced it
(`CommandKind.since`, collected in `registry.command_versions`); each node's
code understands commands up to the highest of them
(`registry.command_version_max`, `raftsched.core.COMMAND_VERSION_MAX`).
During a rolling upgrade some replicas run the previous release, and an
entry they cannot decode would stop them (see `node.machine`). So a command
is proposed only when its version is at most the replicated cluster
version, which the leader raises with
`RaiseClusterVersion` once every member reports that it understands the new
version (`node.versions`). The version only goes up: a member that is later
replaced by an older release is an operator error that the halting replica
reports, never a silent divergence.

The version lives in the `cluster_version` section, which is optional: at
its default (1, the first release's commands) it is not encoded at all, so a
state that never raised the version keeps the bytes and the digest that
release 0.1.0 gave it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import TYPE_CHECKING, Any, Final

from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.commands import Command, JobSpec, RaiseClusterVersion
from raftsched.core.kernel.results import INVALID_REQUEST, Ack, Rejected
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State

if TYPE_CHECKING:
    from raftsched.core.kernel.feature import Context, Registry

CLUSTER_VERSION: Final = "cluster_version"
# What a cluster of the first release runs, and what a state that does not
# name its cluster version holds.
CLUSTER_VERSION_DEFAULT: Final = 1


@dataclass(slots=True)
class ClusterVersion:
    version: int = CLUSTER_VERSION_DEFAULT


def cluster_version(state: State) -> int:
    """The highest command version that may be proposed."""
    record: ClusterVersion = state.sections[CLUSTER_VERSION]
    return record.version


def command_version(command: Command, registry: Registry) -> int:
    """The version that introduced the command's kind; for a command that
    holds commands (`Audited`, `LeaseBatch`), the highest of its own and its
    inner commands'; at least the version that added a job spec field that
    a spec inside sets (`spec_version`: older replicas cannot decode such a
    spec), or a field a later version added to its kind that it sets
    (`CommandKind.tail`)."""
    version = _kind_version(command, registry)
    holders = [command] if type(command) in registry.spec_holders else []
    if type(command) in registry.nested:
        for inner in registry.inner_commands(command):
            if type(inner) in registry.command_versions:
                version = max(version, _kind_version(inner, registry))
            if type(inner) in registry.spec_holders:
                holders.append(inner)
    for holder in holders:
        if version >= SPEC_FIELDS_VERSION_MAX:
            break  # no spec field is newer
        version = max(version, _specs_version(holder))
    return version


def _kind_version(command: Command, registry: Registry) -> int:
    """The version of the command's kind, or of the later fields of its
    kind that it sets (`CommandKind.tail`)."""
    version = registry.command_versions[type(command)]
    tail = registry.command_tails.get(type(command))
    if tail is not None and tail[1] > version and _tail_set(command, tail[0]) is not None:
        version = tail[1]
    return version


def _tail_set(command: Command, names: tuple[str, ...]) -> str | None:
    """The first of `names` that `command` sets (not None), if any."""
    return next((name for name in names if getattr(command, name, None) is not None), None)


def newest_kind(command: Command, registry: Registry) -> str:
    """The name of the kind that gives `command` its version, for the
    gate's answer: an inner command's kind when it is newer than the
    holder's (an audited `ConfigureWheel` names `ConfigureWheel`, not
    `Audited`), else the command's own."""
    versions = registry.command_versions
    kind = type(command)
    for inner in registry.inner_commands(command):
        if versions.get(type(inner), 0) > versions[kind]:
            kind = type(inner)
    return kind.__name__


def newest_spec_field(command: Command, registry: Registry) -> str | None:
    """`kind` when a job spec's kind gives `command` its version (for the
    gate's answer, which otherwise names only `SubmitJobs`), `traceparent`
    when a spec's trace context does; the first field a later version added
    to the command's kind (`CommandKind.tail`: a workflow's `traceparent`)
    when it sets one that does; else None."""
    versions = registry.command_versions
    commands = [command, *registry.inner_commands(command)]
    kind_version = max(versions.get(type(each), 1) for each in commands)
    holders = [each for each in commands if type(each) in registry.spec_holders]
    spec = max(map(_specs_version, holders), default=CLUSTER_VERSION_DEFAULT)
    for each in commands:
        tail = registry.command_tails.get(type(each))
        if tail is not None and tail[1] > kind_version and tail[1] >= spec:
            field = _tail_set(each, tail[0])
            if field is not None:
                return field
    if not spec > kind_version:
        return None
    if spec == SPEC_KIND_VERSION and any(_sets_kind(each) for each in holders):
        return "kind"
    return "traceparent" if spec == SPEC_TRACE_VERSION else None


def _sets_kind(value: object, depth: int = 0) -> bool:
    """Whether a job spec anywhere in `value` has a kind (the gate's
    answer only, when a command was refused)."""
    if isinstance(value, JobSpec):
        return value.kind is not None
    if depth > 4:
        return False
    if isinstance(value, tuple):
        return any(_sets_kind(item, depth + 1) for item in value)
    if is_dataclass(value) and not isinstance(value, type):
        return any(_sets_kind(getattr(value, field.name), depth + 1) for field in fields(value))
    return False


SPEC_RECONCILE_VERSION: Final = 5
"""The version that added `JobSpec.on_unknown` and `reconcile_queue`."""
SPEC_KIND_VERSION: Final = 8
"""The version that added `JobSpec.kind` (and `ClaimJobsOfKinds`, the claim
of the kinds a worker has handlers for)."""
SPEC_TRACE_VERSION: Final = 8
"""The version that added `JobSpec.traceparent` and `tracestate` (the
W3C trace context of a submission, `jobs.trace_book`)."""
SPEC_FIELDS_VERSION_MAX: Final = max(SPEC_KIND_VERSION, SPEC_TRACE_VERSION)
"""The newest version that added a job spec field."""


def spec_version(spec: JobSpec) -> int:
    """The version that added the newest field `spec` sets (1: none)."""
    if spec.traceparent is not None or spec.tracestate is not None:
        return SPEC_TRACE_VERSION
    if spec.kind is not None:
        return SPEC_KIND_VERSION
    if spec.on_unknown is not None or spec.reconcile_queue is not None:
        return SPEC_RECONCILE_VERSION
    return CLUSTER_VERSION_DEFAULT


def _specs_version(value: object, depth: int = 0) -> int:
    """The highest `spec_version` of a job spec anywhere in `value` (a
    command, or a schedule or a workflow step inside one); 1 without one.
    Runs only when a command is proposed, never on apply."""
    if isinstance(value, JobSpec):
        return spec_version(value)
    version = CLUSTER_VERSION_DEFAULT
    if depth > 4:
        return version
    if isinstance(value, tuple):
        items: Any = value
    elif is_dataclass(value) and not isinstance(value, type):
        items = (getattr(value, field.name) for field in fields(value))
    else:
        return version
    for item in items:
        version = max(version, _specs_version(item, depth + 1))
        if version >= SPEC_FIELDS_VERSION_MAX:
            break  # the newest there is
    return version


def needs_upgrade(state: State, command: Command, registry: Registry) -> bool:
    """Whether proposing `command` must wait until every node is upgraded.

    `RaiseClusterVersion` never waits: it is what opens the gate, and the
    leader proposes it only once every member understands its version."""
    if type(command) is RaiseClusterVersion:
        return False
    return command_version(command, registry) > cluster_version(state)


def apply_raise_cluster_version(
    state: State, command: RaiseClusterVersion, context: Context
) -> Ack | Rejected:
    """Raise the cluster version to `command.version`; a lower one changes
    nothing (a retried or late proposal), a version this code does not know
    is refused (the proposer's code is newer than this replica's)."""
    version, version_max = command.version, context.registry.command_version_max
    if type(version) is not int or not 1 <= version <= version_max:
        return Rejected(
            INVALID_REQUEST,
            f"cluster version must be from 1 to {version_max}",
            {"field": "version"},
        )
    record: ClusterVersion = state.sections[CLUSTER_VERSION]
    before = record.version
    context.savepoint.on_rollback(lambda: setattr(record, "version", before))
    record.version = max(before, version)
    return Ack()


def check(state: State) -> list[str]:
    """Invariants of the section."""
    version = cluster_version(state)
    if type(version) is not int or version < CLUSTER_VERSION_DEFAULT:
        return [f"cluster version {version!r} is below {CLUSTER_VERSION_DEFAULT}"]
    return []


def _at_default(state: State) -> bool:
    return cluster_version(state) == CLUSTER_VERSION_DEFAULT


def _encode(state: State) -> Any:
    return cluster_version(state)


def _decode(state: State, data: Any) -> None:
    if type(data) is not int or data < CLUSTER_VERSION_DEFAULT:
        raise CodecError("the cluster version is a positive integer")
    state.sections[CLUSTER_VERSION] = ClusterVersion(data)


SECTION: Final = Section(CLUSTER_VERSION, ClusterVersion, _encode, _decode, at_default=_at_default)
