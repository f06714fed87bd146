"""msgpack encoding of entries, commands and whole states (snapshots).

Every command type has a stable integer tag, declared with the command by its
feature (`feature.CommandKind`); a tag is never reused, and a new command type
takes a new one. The tables come from the registry the functions are given.
An entry is `[ENTRY_FORMAT, epoch, now_ms, [[tag, field, ...], ...]]` with
fields in dataclass order; the optional fields a later version added to a
kind (`CommandKind.tail`) are left out while none is set, so such a command
keeps the bytes the release before wrote. Decoding checks
every field's type exactly, so garbage becomes a `CodecError`, never a
half-built command.

A state is flat arrays, not maps: a header of scalars, then the jobs in
submission order as chunks of columns, one column per slot in
`model.JOB_FIELDS` order (see `encode_state`), then the sections. Everything
derived (counters, heaps, the idempotency and effects maps) is rebuilt on
decode. Arrays in a fixed order keep the encoding deterministic:
the same state always gives the same bytes. No pickle anywhere.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from hashlib import sha256
from itertools import chain, compress, count, starmap
from operator import attrgetter, is_not
from typing import TYPE_CHECKING, Any, Final

import msgpack

from raftsched.core.kernel.commands import Backoff, Command, Entry, JobSpec
from raftsched.core.kernel.model import (
    JOB_EVENTS,
    JOB_FIELDS,
    JOB_STATUSES,
    OUTCOMES,
    Attempt,
    HistoryRecord,
    Job,
    JobColumns,
    JobLease,
    StoredEffect,
    uniform,
)
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State, intern, rebuild_indexes

if TYPE_CHECKING:
    from raftsched.core.kernel.feature import Registry


class CodecError(ValueError):
    """Bytes that are not a valid encoding."""


ENTRY_FORMAT: Final = 1
STATE_FORMAT: Final = 3

# The field kinds the kernel knows; a feature adds its own (`feature.FieldKind`).
KERNEL_FIELD_KINDS: Final = (
    "int", "int?", "str", "str?", "bytes", "bytes?", "bool",
    "strs", "specs", "backoff", "labels", "command", "command?", "commands",
)  # fmt: skip
# The kinds that hold commands (`Audited`, `LeaseBatch`): each nested command
# is encoded as its row in an entry is. One level only: a command of a kind
# that holds commands may not itself be nested (refused on both sides).
NESTING_KINDS: Final = ("command", "command?", "commands")
_SPEC_KINDS: Final = (
    "str", "str", "bytes", "int", "int?", "int?", "int", "backoff",
    "int", "int?", "str?", "str?", "str?", "labels",
)  # fmt: skip
_SPEC_KINDS_V5: Final = (*_SPEC_KINDS, "str?", "str?")  # on_unknown, reconcile_queue
_SPEC_KINDS_V8: Final = (*_SPEC_KINDS_V5, "str?")  # kind
_SPEC_KINDS_V8_TRACE: Final = (*_SPEC_KINDS_V8, "str?", "str?")  # traceparent, tracestate

Encode = Callable[[Any], Any]
Decode = Callable[[object], Any]


class CommandCodec:
    """A registry's command tables: tag, field names and per-field encoders
    by type; type and per-field decoders by tag. Built once, so encoding or
    decoding a command is one dict lookup and a loop over its fields."""

    __slots__ = ("by_type", "by_tag", "nesting_types", "nesting_tags")

    def __init__(
        self,
        kinds: Iterable[tuple[type[Any], int, tuple[str, ...], int]],
        custom: dict[str, tuple[Encode, Decode]],
    ) -> None:
        kinds = list(kinds)
        # type -> (tag, field names, encoders, tail); tag -> (type, decoders,
        # tail): `tail` is how many of the last fields a later version added,
        # encoded only when one of them is set (`feature.CommandKind.tail`).
        self.by_type: dict[
            type[Any], tuple[int, tuple[str, ...], tuple[Encode | None, ...], int]
        ] = {}
        self.by_tag: dict[int, tuple[type[Any], tuple[Decode, ...], int]] = {}
        # The kinds that hold commands: never nested themselves.
        nesting = [(cls, tag) for cls, tag, fields, _ in kinds if set(fields) & set(NESTING_KINDS)]
        self.nesting_types = frozenset(cls for cls, _ in nesting)
        self.nesting_tags = frozenset(tag for _, tag in nesting)
        for cls, tag, field_kinds, tail in kinds:
            for kind in field_kinds:
                if kind not in KERNEL_FIELD_KINDS and kind not in custom:
                    raise ValueError(f"{cls.__name__}: unknown field kind {kind}")
            names = tuple(cls.__dataclass_fields__)
            encoders = tuple(self._encoder(kind, custom) for kind in field_kinds)
            self.by_type[cls] = (tag, names, encoders, tail)
            decoders = tuple(self._decoder(kind, custom) for kind in field_kinds)
            self.by_tag[tag] = (cls, decoders, tail)

    def _encoder(self, kind: str, custom: dict[str, tuple[Encode, Decode]]) -> Encode | None:
        if kind == "command":
            return self._nested_row
        if kind == "command?":
            return self._optional_row
        if kind == "commands":
            return self._nested_rows
        return _encoder(kind, custom)

    def _decoder(self, kind: str, custom: dict[str, tuple[Encode, Decode]]) -> Decode:
        if kind == "command":
            return self._nested_command
        if kind == "command?":
            return self._optional_command
        if kind == "commands":
            return self._nested_commands
        return _decoder(kind, custom)

    def _nested_row(self, command: Command) -> list[Any]:
        """A command inside a command (`Audited`, `LeaseBatch`): its row, as
        in an entry. Only one level: a nested command may not itself nest one."""
        cls = type(command)
        if cls not in self.by_type:
            raise CodecError(f"cannot encode {cls.__name__}")
        if cls in self.nesting_types:
            raise CodecError("a nested command cannot nest another")
        return _command_row(command, self)

    def _optional_row(self, command: Command | None) -> list[Any] | None:
        return None if command is None else self._nested_row(command)

    def _nested_rows(self, commands: tuple[Command, ...]) -> list[list[Any]]:
        if type(commands) is not tuple:
            raise CodecError("nested commands must be a tuple")
        return [self._nested_row(command) for command in commands]

    def _nested_command(self, row: object) -> Command:
        # The tag is checked before anything inside is decoded, so a deep
        # nest of rows fails at its second level, never in a recursion.
        if type(row) is tuple and row and type(row[0]) is int and row[0] in self.nesting_tags:
            raise CodecError("a nested command cannot nest another")
        return _decode_command(row, self.by_tag)

    def _optional_command(self, row: object) -> Command | None:
        return None if row is None else self._nested_command(row)

    def _nested_commands(self, rows: object) -> tuple[Command, ...]:
        if type(rows) is not tuple:
            raise CodecError("nested commands must be an array")
        return tuple(self._nested_command(row) for row in rows)


def _encoder(kind: str, custom: dict[str, tuple[Encode, Decode]]) -> Encode | None:
    if kind in custom:
        return custom[kind][0]
    if kind == "specs":
        return _spec_rows
    if kind == "strs":
        return list
    return None  # plain data as it is


def _spec_rows(specs: tuple[JobSpec, ...]) -> list[list[Any]]:
    return [spec_row(spec) for spec in specs]


def _decoder(kind: str, custom: dict[str, tuple[Encode, Decode]]) -> Decode:
    if kind in custom:
        return custom[kind][1]
    plain = _PLAIN.get(kind)
    if plain is None:
        return lambda value: decode_field(value, kind)
    expected_type, optional = plain

    def decode_plain(value: object) -> Any:
        if type(value) is expected_type or (value is None and optional):
            return value
        raise CodecError(f"expected {kind}, got {type(value).__name__}")

    return decode_plain


def spec_row(spec: JobSpec) -> list[Any]:
    """A spec as plain data: 14 fields, 16 when it sets the reconcile fields
    that version 5 added, 17 when it sets the `kind` that version 8 added,
    19 when it sets the trace context that version 8 added (the fields
    before it then as they are, None or not), so that a spec without them
    encodes, and fingerprints, as before."""
    backoff = spec.backoff
    row = [
        spec.queue,
        spec.tenant,
        spec.payload,
        spec.priority,
        spec.run_at_ms,
        spec.delay_ms,
        spec.max_attempts,
        [backoff.initial_ms, backoff.max_ms, backoff.jitter_ms],
        spec.lease_ms,
        spec.deadline_ms,
        spec.idempotency_key,
        spec.ordering_key,
        spec.correlation_id,
        [list(pair) for pair in spec.labels],
    ]
    if spec.traceparent is not None or spec.tracestate is not None:
        row += [spec.on_unknown, spec.reconcile_queue, spec.kind]  # since versions 5 and 8
        row += [spec.traceparent, spec.tracestate]  # since version 8
    elif spec.kind is not None:
        row += [spec.on_unknown, spec.reconcile_queue, spec.kind]  # since version 8
    elif spec.on_unknown is not None or spec.reconcile_queue is not None:
        row += [spec.on_unknown, spec.reconcile_queue]  # since version 5
    return row


def _command_row(command: Command, tables: CommandCodec) -> list[Any]:
    tag, names, encoders, tail = tables.by_type[type(command)]
    row: list[Any] = [tag]
    for name, encode in zip(names, encoders, strict=True):
        value = getattr(command, name)
        row.append(value if encode is None else encode(value))
    if tail and all(value is None for value in row[-tail:]):
        del row[-tail:]  # the fields a later version added, unset: as before it
    return row


def encode_entry(entry: Entry, registry: Registry) -> bytes:
    tables = registry.codec
    try:
        rows = [_command_row(command, tables) for command in entry.commands]
        packed: bytes = msgpack.packb([ENTRY_FORMAT, entry.epoch, entry.now_ms, rows])
    except Exception as error:
        raise CodecError(f"cannot encode entry: {error}") from error
    return packed


def decode_entry(data: bytes, registry: Registry) -> Entry:
    try:
        doc = msgpack.unpackb(data, use_list=False)
    except Exception as error:
        raise CodecError(f"not msgpack: {type(error).__name__}") from error
    if type(doc) is not tuple or len(doc) != 4 or doc[0] != ENTRY_FORMAT:
        raise CodecError("not an entry")
    _, epoch, now_ms, rows = doc
    expect(epoch, "int")
    expect(now_ms, "int")
    if type(rows) is not tuple:
        raise CodecError("entry commands must be an array")
    by_tag = registry.codec.by_tag
    return Entry(epoch, now_ms, tuple(_decode_command(row, by_tag) for row in rows))


def _decode_command(
    row: object, by_tag: dict[int, tuple[type[Any], tuple[Decode, ...], int]]
) -> Command:
    if type(row) is not tuple or not row or type(row[0]) is not int:
        raise CodecError("a command is [tag, fields...]")
    found = by_tag.get(row[0])
    if found is None:
        raise CodecError(f"unknown command tag {row[0]}")
    cls, decoders, tail = found
    if len(row) != len(decoders) + 1:
        if not tail or len(row) != len(decoders) + 1 - tail:
            raise CodecError(f"{cls.__name__} has {len(decoders)} fields")
        decoders = decoders[:-tail]  # written without the later fields: they are None
    values = [decode(value) for decode, value in zip(decoders, row[1:], strict=True)]
    command: Command = cls(*values)
    return command


_PLAIN: Final[dict[str, tuple[type[Any], bool]]] = {
    "int": (int, False),
    "int?": (int, True),
    "str": (str, False),
    "str?": (str, True),
    "bytes": (bytes, False),
    "bytes?": (bytes, True),
    "bool": (bool, False),
}
_DEFAULT_BACKOFF: Final = Backoff()
_DEFAULT_BACKOFF_ROW: Final = (
    _DEFAULT_BACKOFF.initial_ms,
    _DEFAULT_BACKOFF.max_ms,
    _DEFAULT_BACKOFF.jitter_ms,
)


def decode_field(value: object, kind: str) -> Any:
    """One field of a kernel kind (`KERNEL_FIELD_KINDS`), type-checked exactly."""
    plain = _PLAIN.get(kind)
    if plain is not None:
        if type(value) is plain[0] or (value is None and plain[1]):
            return value
        raise CodecError(f"expected {kind}, got {type(value).__name__}")
    if kind == "specs":
        if type(value) is not tuple:
            raise CodecError("specs must be an array")
        return tuple(_decode_spec(row) for row in value)
    if kind == "strs":
        if type(value) is not tuple or any(type(item) is not str for item in value):
            raise CodecError("expected an array of strings")
        return value
    if kind == "backoff":
        return _decode_backoff(value)
    if kind == "labels":
        if type(value) is not tuple:
            raise CodecError("labels must be an array")
        for pair in value:
            if type(pair) is not tuple or len(pair) != 2:
                raise CodecError("a label is [key, value]")
            expect(pair[0], "str")
            expect(pair[1], "str")
        return value
    raise CodecError(f"unknown field kind {kind}")  # a bug in the schemas


def _decode_backoff(value: object) -> Backoff:
    if type(value) is not tuple or len(value) != 3:
        raise CodecError("backoff is [initial_ms, max_ms, jitter_ms]")
    if value == _DEFAULT_BACKOFF_ROW:
        return _DEFAULT_BACKOFF  # one shared object for the common case
    for item in value:
        expect(item, "int")
    return Backoff(*value)


def expect(value: object, kind: str) -> None:
    expected_type, optional = _PLAIN[kind]
    if type(value) is not expected_type and not (optional and value is None):
        raise CodecError(f"expected {kind}, got {type(value).__name__}")


def decode_spec(row: object) -> JobSpec:
    """A `spec_row` back into a JobSpec (rows as msgpack decodes them: tuples)."""
    return _decode_spec(row)


_SPEC_KINDS_BY_LENGTH: Final = {
    len(kinds): kinds
    for kinds in (_SPEC_KINDS, _SPEC_KINDS_V5, _SPEC_KINDS_V8, _SPEC_KINDS_V8_TRACE)
}


def _decode_spec(row: object) -> JobSpec:
    if type(row) is not tuple or (kinds := _SPEC_KINDS_BY_LENGTH.get(len(row))) is None:
        raise CodecError("a job spec has 14, 16, 17 or 19 fields")
    values = [decode_field(value, kind) for value, kind in zip(row, kinds, strict=True)]
    return JobSpec(*values)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Building or walking a million objects with the cyclic GC on costs
    several times the work itself; none of these objects form cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_STATUS_NAMES: Final = {status: status for status in JOB_STATUSES}
_EVENT_NAMES: Final = {event: event for event in JOB_EVENTS}
_OUTCOME_NAMES: Final = {outcome: outcome for outcome in OUTCOMES}
_attempt_fields = attrgetter(*Attempt.__slots__)
_effect_fields = attrgetter(*StoredEffect.__slots__)
_lease_fields = attrgetter(*JobLease.__slots__)


def _pack_record(value: object) -> tuple[Any, ...]:
    """msgpack's hook for the few objects that are not plain data."""
    kind = type(value)
    if kind is JobLease:
        return _lease_fields(value)
    if kind is Attempt:
        return _attempt_fields(value)
    if kind is StoredEffect:
        return _effect_fields(value)
    raise TypeError(f"cannot encode {kind.__name__}")


def encode_state(state: State, registry: Registry) -> bytes:
    """The whole state as one bytes object; see `encode_state_pieces`."""
    # Each piece is copied into one growing buffer rather than kept for a
    # join, which would hold every piece and the result at once: a 1M-job
    # state is ~270 MB, and on this VM fresh memory costs more than copying.
    out = bytearray()
    for piece in encode_state_pieces(state, registry):
        out += piece
    return bytes(out)


def encode_state_pieces(state: State, registry: Registry) -> Iterator[memoryview]:
    """The encoded state in pieces, which joined in order are the bytes
    `decode_state` reads:

    `[STATE_FORMAT, now_ms, epoch, last_fencing_token, retention_ms, next_seq,
    chunks, sections]`; sections are `[name, data]` pairs in the
    registry's section order (sorted by name), an optional section left out
    while it holds its default.

    Jobs are stored in submission order, `_CHUNK_JOBS` to a chunk, column by
    column: a chunk is `[values, column, ...]` with one column per slot in
    `JOB_FIELDS` order, except that the last, `kind` (cluster version 8),
    is left out of a chunk none of whose jobs has one: a state without
    kinds keeps the bytes and digest of the release before. The columns in
    `_SHARED_COLUMNS` (names, statuses, backoffs, timestamps, and kinds when
    present) hold indexes into the chunk's `values`, each distinct value once
    in order of first use. Columns let both sides do
    their per-job work in C loops (`map`), and the shared values come back as
    shared objects rather than millions of equal ones.

    Each piece (about one chunk, ~1 MB) is a view of the encoder's buffer,
    valid only until the next piece is asked for, so a snapshot can be
    written or hashed without ever holding the whole encoding in memory.
    The state must not change while the pieces are read, and the cyclic
    collector stays off until the last one.
    """
    packer = msgpack.Packer(default=_pack_record, autoreset=False)
    header = (
        STATE_FORMAT,
        state.now_ms,
        state.epoch,
        state.last_fencing_token,
        state.retention_ms,
        state.next_seq,
    )
    packer.pack_array_header(8)
    for value in header:
        packer.pack(value)
    jobs = list(state.jobs.values())
    with _gc_paused():
        packer.pack_array_header((len(jobs) + _CHUNK_JOBS - 1) // _CHUNK_JOBS)
        for start in range(0, len(jobs), _CHUNK_JOBS):
            packer.pack(_job_columns(jobs[start : start + _CHUNK_JOBS]))
            yield from _taken(packer)
        packer.pack(
            [
                [section.name, section.encode(state)]
                for section in registry.sections
                if not section.omitted(state)
            ]
        )
        yield from _taken(packer)


def _taken(packer: msgpack.Packer) -> Iterator[memoryview]:
    """The packer's buffer as one piece; emptied once the consumer is done."""
    view = packer.getbuffer()
    try:
        yield view
    finally:
        view.release()
    packer.reset()


_CHUNK_JOBS: Final = 4096
# A chunk's arrays: its values and a column per slot, kind's left out or not.
_CHUNK_ARRAYS: Final = (len(JOB_FIELDS), len(JOB_FIELDS) + 1)
_SHARED_COLUMNS: Final = tuple(
    JOB_FIELDS.index(name)
    for name in (
        "queue", "tenant", "status", "backoff",
        "created_at_ms", "updated_at_ms", "run_at_ms", "next_run_at_ms",
    )
)  # fmt: skip
_SHARED_WITH_KIND: Final = (*_SHARED_COLUMNS, JOB_FIELDS.index("kind"))
_COLUMN_OF: Final = tuple(attrgetter(name) for name in JOB_FIELDS)
_ID, _QUEUE, _TENANT, _STATUS, _PRIORITY, _SEQ = (
    JOB_FIELDS.index(name) for name in ("id", "queue", "tenant", "status", "priority", "seq")
)
_LEASE, _ATTEMPTS, _HISTORY, _EFFECTS = (
    JOB_FIELDS.index(name) for name in ("lease", "attempts", "history", "effects")
)
_DEADLINE, _IDEMPOTENCY_KEY, _ORDERING_KEY = (
    JOB_FIELDS.index(name) for name in ("deadline_at_ms", "idempotency_key", "ordering_key")
)
_KIND: Final = JOB_FIELDS.index("kind")
assert len(JOB_FIELDS) - 1 == _KIND, "kind is the optional last column"
_ENCODED_BEFORE_KINDS: Final = len(JOB_FIELDS) - 1
"""Slots of a job as the releases before cluster version 8 encode it."""


def _job_columns(jobs: list[Job]) -> list[Any]:
    columns: list[Any] = [list(map(column_of, jobs)) for column_of in _COLUMN_OF]
    shared = _SHARED_COLUMNS
    if columns[_KIND].count(None) == len(jobs):
        del columns[_KIND]  # no job has a kind: encoded as before version 8
    else:
        shared = _SHARED_WITH_KIND
    # Only str, int, None and int tuples occur in shared columns, so equal
    # values are also of the same type.
    values = dict.fromkeys(chain.from_iterable(columns[i] for i in shared))
    position = dict(zip(values, count())).__getitem__
    for i in shared:
        columns[i] = list(map(position, columns[i]))
    return [list(values), *columns]


def state_digest(state: State, registry: Registry) -> str:
    digest = sha256()
    for piece in encode_state_pieces(state, registry):
        digest.update(piece)
    return digest.hexdigest()


def decode_state(data: bytes | memoryview, registry: Registry) -> State:
    """Rebuild a state from `encode_state` bytes (a snapshot).

    Snapshots come from this code on another replica or from the local disk,
    so decoding checks the structure, not every value; `check_invariants`
    gives a full check when wanted.
    """
    try:
        with _gc_paused():
            return _decode_state(data, registry)
    except CodecError:
        raise
    except Exception as error:
        raise CodecError(f"not a state: {type(error).__name__}: {error}") from error


def _decode_state(data: bytes | memoryview, registry: Registry) -> State:
    unpacker = msgpack.Unpacker(_Reader(data), use_list=False, read_size=1 << 20)
    if unpacker.read_array_header() != 8:
        raise CodecError("not a state")
    header = [unpacker.unpack() for _ in range(6)]
    if header[0] not in (STATE_FORMAT, _ROW_FORMAT):
        raise CodecError("unknown state format")
    for value in header[1:]:
        expect(value, "int")
    state = State(registry)
    _, state.now_ms, state.epoch, state.last_fencing_token, state.retention_ms = header[:5]
    state.next_seq = header[5]
    length = unpacker.read_array_header()
    columns = JobColumns()
    if header[0] == STATE_FORMAT:
        for _ in range(length):
            _decode_chunk(state, unpacker.unpack(), columns)
    else:
        columns = JobColumns.from_jobs(list(_decode_rows(state, unpacker.unpack, length)))
    rebuild_indexes(state, columns)
    if len(state.jobs) != len(columns.jobs):
        raise CodecError("duplicate job ids")
    _decode_sections(state, unpacker.unpack(), registry.sections)
    try:
        unpacker.unpack()
    except msgpack.OutOfData:
        return state
    raise CodecError("trailing data after the state")


class _Reader:
    """A file over a buffer without copying it (`BytesIO` copies a
    memoryview), for msgpack's Unpacker, which reads a piece at a time."""

    __slots__ = ("_view", "_at")

    def __init__(self, data: bytes | memoryview) -> None:
        self._view = memoryview(data)
        self._at = 0

    def read(self, size: int) -> bytes:
        start = self._at
        self._at = min(start + size, len(self._view))
        return bytes(self._view[start : self._at])


_ROW_FORMAT: Final = 2
"""The previous encoding, one row per job; still read, so that a node can
restart from a snapshot written before the upgrade."""


def _decode_chunk(state: State, chunk: object, into: JobColumns) -> None:
    """One chunk of columns back into jobs (see `encode_state`), appended to
    `into` with the columns that rebuilding the indexes reads."""
    if type(chunk) is not tuple or len(chunk) not in _CHUNK_ARRAYS:
        raise CodecError(f"a job chunk has {' or '.join(map(str, _CHUNK_ARRAYS))} arrays")
    if not all(type(column) is tuple for column in chunk):
        raise CodecError("a job chunk holds arrays")
    size = len(chunk[1])
    if any(len(column) != size for column in chunk[1:]):
        raise CodecError("the columns of a job chunk differ in length")
    values = [_shared_value(state, value) for value in chunk[0]]
    columns: list[Any] = list(chunk[1:])
    shared = _SHARED_WITH_KIND
    if len(columns) == _ENCODED_BEFORE_KINDS:
        columns.append((None,) * size)  # no job of the chunk has a kind
        shared = _SHARED_COLUMNS
    for i in shared:
        column = columns[i]
        if not column:
            continue
        if uniform(column):
            if column[0] < 0:
                raise CodecError("a negative value index")
            columns[i] = [values[column[0]]] * size
            continue
        if min(column) < 0:
            raise CodecError("a negative value index")
        columns[i] = list(map(values.__getitem__, column))
    # Records nested in a job are still plain tuples.
    if columns[_LEASE].count(None) != size:
        columns[_LEASE] = [None if lease is None else JobLease(*lease) for lease in columns[_LEASE]]
    if columns[_ATTEMPTS].count(()) != size:
        columns[_ATTEMPTS] = [_decode_attempts(rows) for rows in columns[_ATTEMPTS]]
    if columns[_HISTORY].count(None) != size:
        columns[_HISTORY] = [
            None if rows is None else _decode_history(rows) for rows in columns[_HISTORY]
        ]
    if columns[_EFFECTS].count(None) != size:
        columns[_EFFECTS] = [
            None if rows is None else [StoredEffect(*effect) for effect in rows]
            for rows in columns[_EFFECTS]
        ]
    jobs = list(starmap(Job, zip(*columns, strict=True)))
    into.jobs += jobs
    into.ids += columns[_ID]
    into.statuses += columns[_STATUS]
    into.queues += columns[_QUEUE]
    into.tenants += columns[_TENANT]
    into.priorities += columns[_PRIORITY]
    into.seqs += columns[_SEQ]
    marks = (columns[_DEADLINE], columns[_IDEMPOTENCY_KEY], columns[_EFFECTS])
    if any(column.count(None) != size for column in marks):
        into.marked += compress(jobs, map(_any_set, *marks))
    if columns[_ORDERING_KEY].count(None) != size:
        into.ordered += compress(jobs, map(_is_set, columns[_ORDERING_KEY]))
    if columns[_KIND].count(None) != size:
        into.kinded += compress(jobs, map(_is_set, columns[_KIND]))


_job_row_fields: Final = attrgetter(*JOB_FIELDS[:_ENCODED_BEFORE_KINDS])
_job_row_fields_with_kind: Final = attrgetter(*JOB_FIELDS)


def encode_job_row(job: Job) -> bytes:
    """One job as a row of the row encoding (`_decode_rows` reads it): the
    form the time wheel packs future jobs in (`kernel.wheel`). A job without
    a kind is the row of the releases before version 8, one field shorter."""
    fields = _job_row_fields(job) if job.kind is None else _job_row_fields_with_kind(job)
    packed: bytes = msgpack.packb(fields, default=_pack_record)
    return packed


def decode_job_rows(state: State, data: bytes, count: int) -> list[Job]:
    """Exactly `count` rows of `encode_job_row` (all of `data`) back into
    jobs; names are interned in `state.interned` (the only part of `state`
    this reads or writes)."""
    unpacker = msgpack.Unpacker(use_list=False)
    unpacker.feed(data)
    try:
        jobs = list(_decode_rows(state, unpacker.unpack, count))
    except CodecError:
        raise
    except Exception as error:
        raise CodecError(f"not job rows: {type(error).__name__}") from error
    if unpacker.tell() != len(data):
        raise CodecError(f"more than {count} job rows")
    return jobs


def encode_job_chunk(jobs: list[Job]) -> bytes:
    """Jobs as one chunk of columns, exactly as a snapshot stores them (see
    `encode_state_pieces`): the form of the time wheel's sealed chunks."""
    packed: bytes = msgpack.packb(_job_columns(jobs), default=_pack_record)
    return packed


def decode_job_chunk(state: State, data: bytes) -> list[Job]:
    """`encode_job_chunk` bytes back into jobs (names interned in
    `state.interned`, the only part of `state` this touches)."""
    columns = JobColumns()
    try:
        _decode_chunk(state, msgpack.unpackb(data, use_list=False), columns)
    except CodecError:
        raise
    except Exception as error:
        raise CodecError(f"not a job chunk: {type(error).__name__}") from error
    return columns.jobs


def encode_wheel_chunk(jobs: list[Job]) -> bytes:
    """A time wheel's sealed chunk before compression: the jobs' seqs, then
    the jobs as `encode_job_chunk` writes them. A listing orders a chunk by
    its seqs, read from the first bytes alone (`wheel_chunk_seqs`)."""
    seqs: bytes = msgpack.packb([job.seq for job in jobs])
    return seqs + encode_job_chunk(jobs)


def wheel_chunk_seqs(head: bytes) -> tuple[int, ...]:
    """The seqs of an `encode_wheel_chunk`, from its first bytes (at least
    `3 + 9 * count`; the rest is not read)."""
    unpacker = msgpack.Unpacker(use_list=False)
    unpacker.feed(head)
    try:
        seqs = unpacker.unpack()
    except Exception as error:
        raise CodecError(f"not a wheel chunk: {type(error).__name__}") from error
    if type(seqs) is not tuple:
        raise CodecError("not a wheel chunk: no seqs")
    return seqs


def decode_wheel_chunk(state: State, data: bytes) -> list[Job]:
    """`encode_wheel_chunk` bytes back into jobs (names interned in
    `state.interned`, the only part of `state` this touches)."""
    unpacker = msgpack.Unpacker(use_list=False)
    unpacker.feed(data)
    try:
        unpacker.skip()
    except Exception as error:
        raise CodecError(f"not a wheel chunk: {type(error).__name__}") from error
    return decode_job_chunk(state, data[unpacker.tell() :])


def _any_set(*values: object) -> bool:
    return any(value is not None for value in values)


_is_set: Final = partial(is_not, None)


def _shared_value(state: State, value: object) -> object:
    """Statuses become the model's own strings; names and backoffs are interned."""
    if type(value) is str:
        status = _STATUS_NAMES.get(value)
        return status if status is not None else intern(state, value)
    if type(value) is tuple:
        return intern(state, value)
    return value


def _decode_sections(state: State, rows: object, sections: tuple[Section, ...]) -> None:
    """The sections in the registry's order. An optional one may be absent
    (it keeps its default); every other must be there."""
    if type(rows) is not tuple or len(rows) > len(sections):
        raise CodecError("state sections do not match this version")
    at = 0
    for section in sections:
        row = rows[at] if at < len(rows) else None
        named = type(row) is tuple and len(row) == 2 and row[0] == section.name
        if not named:
            if section.optional:
                continue
            raise CodecError(f"expected state section {section.name}")
        assert type(row) is tuple
        section.decode(state, row[1])
        if section.omitted(state):
            # Encoded at its default: not what `encode_state` writes.
            raise CodecError(f"state section {section.name} holds its default")
        at += 1
    if at != len(rows):
        raise CodecError("state sections do not match this version")


_ROW_FIELDS: Final = (_ENCODED_BEFORE_KINDS, len(JOB_FIELDS))


def _decode_rows(state: State, next_row: Callable[[], Any], count: int) -> Iterator[Job]:
    """`_ROW_FORMAT` rows back into jobs."""
    names: dict[Any, Any] = state.interned
    statuses = _STATUS_NAMES
    make_job = Job
    for _ in range(count):
        row = next_row()
        if type(row) is not tuple or len(row) not in _ROW_FIELDS:
            raise CodecError("a job row has 32 fields, or 33 with a kind")
        job = make_job(*row)
        # Names, statuses and backoffs are shared objects in a live state.
        queue = names.get(job.queue)
        job.queue = queue if queue is not None else intern(state, job.queue)
        tenant = names.get(job.tenant)
        job.tenant = tenant if tenant is not None else intern(state, job.tenant)
        if job.backoff is not None:
            job.backoff = intern(state, job.backoff)
        job.status = statuses[job.status]
        # So are equal instants: a queued job's four timestamps are one int.
        created_at_ms = job.created_at_ms
        if job.updated_at_ms == created_at_ms:
            job.updated_at_ms = created_at_ms
        if job.run_at_ms == created_at_ms:
            job.run_at_ms = created_at_ms
        if job.next_run_at_ms == created_at_ms:
            job.next_run_at_ms = created_at_ms
        if job.kind is not None:
            job.kind = intern(state, job.kind)
        # Records nested in the row are still plain tuples.
        if row[17] is not None:
            job.lease = JobLease(*row[17])
        if row[23]:
            job.attempts = _decode_attempts(row[23])
        if row[30] is not None:
            job.history = _decode_history(row[30])
        if row[31] is not None:
            job.effects = [StoredEffect(*effect) for effect in row[31]]
        yield job


def _decode_attempts(rows: tuple[Any, ...]) -> tuple[Attempt, ...]:
    outcomes = _OUTCOME_NAMES
    return tuple(
        Attempt(number, worker, epoch, token, claimed, started, ended,
                None if outcome is None else outcomes[outcome], error)
        for number, worker, epoch, token, claimed, started, ended, outcome, error in rows
    )  # fmt: skip


def _decode_history(rows: tuple[Any, ...]) -> list[HistoryRecord]:
    events, statuses = _EVENT_NAMES, _STATUS_NAMES
    return [
        (
            at_ms,
            events[event],
            None if from_status is None else statuses[from_status],
            statuses[to_status],
            actor,
            epoch,
            token,
            detail,
        )
        for at_ms, event, from_status, to_status, actor, epoch, token, detail in rows
    ]
