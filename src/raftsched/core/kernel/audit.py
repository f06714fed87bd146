"""The audit trail: who did which operator action, replicated with the action.

Theory of operation. An operator command (cancel, replay, pause, settings,
schedule and subscription changes, ...) reaches the core wrapped in
`Audited(actor, command)` once the cluster version in force allows it (3;
before that the node sends the bare command, which an older replica can
decode). `apply_audited` asks the command's kind how it is audited
(`CommandKind.audit`, collected in `registry.audits`), applies the inner
command through its own handler, and, unless the handler rejected it,
appends one `AuditEntry` in the same command. So the action and its record
commit together or not at all: a rejected command leaves no entry, and a
handler that raises takes the action and the entry with it (savepoint).

Rules
-----
1. Only kinds that declare an `Audit` may be wrapped, never `Audited`
   itself; anything else is `Rejected(invalid_request)` with nothing changed.
2. An entry is `(seq, at_ms, actor, kind, target, tenant, detail)`, stamped
   with replicated time. `seq` starts at 1, strictly increases and is never
   reused, even after old entries leave.
3. The trail is bounded: it keeps the newest `AUDIT_ENTRIES_MAX` entries; an
   older one leaves when a newer one arrives. Details are cut to
   `DETAIL_CHARS_MAX` characters.
4. The section is optional: while nothing was ever audited it is not
   encoded, so every earlier state keeps its bytes and digest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.commands import Audited, Command
from raftsched.core.kernel.results import INVALID_REQUEST, Rejected, Result
from raftsched.core.kernel.sections import Section
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import check_name

if TYPE_CHECKING:
    from raftsched.core.kernel.feature import Context

AUDIT: Final = "audit"
AUDIT_ENTRIES_MAX: Final = 10_000
DETAIL_CHARS_MAX: Final = 200
ACTOR_CHARS_MAX: Final = 200


class AuditEntry(NamedTuple):
    seq: int
    at_ms: int
    actor: str
    kind: str
    target: str | None
    tenant: str | None
    detail: str | None


class AuditTrail:
    """The newest entries, oldest first."""

    __slots__ = ("entries", "next_seq")

    def __init__(self) -> None:
        self.entries: deque[AuditEntry] = deque()
        self.next_seq = 1


def trail(state: State) -> AuditTrail:
    record: AuditTrail = state.sections[AUDIT]
    return record


def apply_audited(state: State, command: Audited, context: Context) -> Result:
    """Apply the inner command; record it unless it was rejected."""
    inner = command.command
    audit = context.registry.audits.get(type(inner))
    if not isinstance(inner, Command) or type(inner) is Audited or audit is None:
        return Rejected(
            INVALID_REQUEST, "only an operator command can be audited", {"field": "command"}
        )
    rejected = check_name(command.actor, "actor", ACTOR_CHARS_MAX)
    if rejected is not None:
        return rejected
    subject = audit.describe(state, inner)
    result = context.registry.handlers[type(inner)](state, inner, context)
    if isinstance(result, Rejected):
        return result
    detail = subject.detail[:DETAIL_CHARS_MAX] if subject.detail else None
    record = trail(state)
    entry = AuditEntry(
        record.next_seq,
        state.now_ms,
        command.actor,
        audit.kind,
        subject.target,
        subject.tenant,
        detail,
    )
    dropped = record.entries[0] if len(record.entries) >= AUDIT_ENTRIES_MAX else None
    context.savepoint.on_rollback(lambda: _undo_append(record, entry.seq, dropped))
    if dropped is not None:
        record.entries.popleft()
    record.entries.append(entry)
    record.next_seq = entry.seq + 1
    return result


def _undo_append(record: AuditTrail, seq: int, dropped: AuditEntry | None) -> None:
    """Put the trail back as it was before entry `seq`, however far the
    append got."""
    entries = record.entries
    if entries and entries[-1].seq == seq:
        entries.pop()
    if dropped is not None and (not entries or entries[0].seq != dropped.seq):
        entries.appendleft(dropped)
    record.next_seq = seq


# -- queries --------------------------------------------------------------------


def audit_entries(
    state: State,
    *,
    actor: str | None = None,
    kind: str | None = None,
    tenants: frozenset[str] | None = None,
    limit: int = 50,
    before_seq: int | None = None,
) -> tuple[list[AuditEntry], int | None]:
    """Entries newest first, filtered; the second value is the seq to pass as
    `before_seq` for the next page (None on the last page).

    `tenants` None means every entry; otherwise only entries of those
    tenants (an entry of no tenant is left out)."""
    found: list[AuditEntry] = []
    for entry in reversed(trail(state).entries):
        if before_seq is not None and entry.seq >= before_seq:
            continue
        if (
            (actor is not None and entry.actor != actor)
            or (kind is not None and entry.kind != kind)
            or (tenants is not None and entry.tenant not in tenants)
        ):
            continue
        if len(found) == limit:
            return found, found[-1].seq
        found.append(entry)
    return found, None


def check(state: State) -> list[str]:
    record = trail(state)
    problems: list[str] = []
    entries = record.entries
    if len(entries) > AUDIT_ENTRIES_MAX:
        problems.append("audit: holds more than AUDIT_ENTRIES_MAX entries")
    for earlier, later in zip(entries, list(entries)[1:], strict=False):
        if later.seq != earlier.seq + 1:
            problems.append(f"audit: seq {later.seq} follows {earlier.seq}")
            break
    if entries and entries[-1].seq != record.next_seq - 1:
        problems.append("audit: next_seq is not one above the newest entry")
    if entries and entries[-1].at_ms > state.now_ms:
        problems.append("audit: entry from the future")
    return problems


# -- encoding -------------------------------------------------------------------


def _at_default(state: State) -> bool:
    record = trail(state)
    return record.next_seq == 1 and not record.entries


def _encode(state: State) -> Any:
    record = trail(state)
    return [record.next_seq, [list(entry) for entry in record.entries]]


_OPTIONAL_TEXT: Final[tuple[type, ...]] = (str, type(None))
_ROW_KINDS: Final[tuple[tuple[type, ...], ...]] = (
    (int,),
    (int,),
    (str,),
    (str,),
    _OPTIONAL_TEXT,
    _OPTIONAL_TEXT,
    _OPTIONAL_TEXT,
)


def _decode(state: State, data: Any) -> None:
    if type(data) not in (list, tuple) or len(data) != 2:
        raise CodecError("the audit section is [next_seq, entries]")
    next_seq, rows = data
    if type(next_seq) is not int or next_seq < 1 or type(rows) not in (list, tuple):
        raise CodecError("the audit section is [next_seq, entries]")
    record = AuditTrail()
    record.next_seq = next_seq
    record.entries = deque(_decode_rows(rows))
    state.sections[AUDIT] = record


def _decode_rows(rows: Iterable[Any]) -> Iterable[AuditEntry]:
    for row in rows:
        if (
            type(row) not in (list, tuple)
            or len(row) != len(_ROW_KINDS)
            or not all(type(v) in k for v, k in zip(row, _ROW_KINDS, strict=True))
        ):
            raise CodecError("an audit entry is [seq, at_ms, actor, kind, target, tenant, detail]")
        yield AuditEntry(*row)


SECTION: Final = Section(AUDIT, AuditTrail, _encode, _decode, at_default=_at_default)
