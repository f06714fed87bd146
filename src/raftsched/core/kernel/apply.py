"""The one entry point: apply a committed Raft entry to the state.

`apply_entry` first lets time and epoch advance (the takeover), then applies
each command in order through the handler its feature declared for its type
(`registry.handlers`: one dict lookup per command). Nothing
escapes: pysyncobj re-applies a raising entry forever on every replica, so a
bug becomes a recorded `Rejected(internal_error)` after the savepoint has put
the state back as it was. The one exception is an entry that this code cannot
decode (`apply_encoded` raises `CodecError`): rejecting it would leave this
replica behind every replica that applied it, so the node stops applying.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from raftsched.core.kernel.codec import CodecError, decode_entry
from raftsched.core.kernel.commands import Command, Entry
from raftsched.core.kernel.feature import Context, Handler, Registry
from raftsched.core.kernel.results import INTERNAL_ERROR, INVALID_REQUEST, Rejected, Result
from raftsched.core.kernel.savepoint import Savepoint
from raftsched.core.kernel.state import State
from raftsched.core.kernel.validate import TIME_MS_MAX, TOKEN_MAX
from raftsched.core.kernel.wheel import hydrate_for_command

COMMANDS_PER_ENTRY_MAX = 100_000


def apply_encoded(state: State, data: bytes, registry: Registry) -> list[Result]:
    """Decode one committed entry and apply it. This is what the Raft adapter calls.

    Raises `CodecError`, with the state untouched, when this code cannot
    decode the entry: most likely a newer release proposed a command kind
    this one does not know. The caller must stop applying (node.machine):
    every replica that could decode the entry applied it, so skipping or
    rejecting it here would diverge from them without a word.
    """
    try:
        entry = decode_entry(data, registry)
    except CodecError:
        raise
    except Exception as error:  # a codec bug: this code cannot read the entry either
        raise CodecError(f"undecodable entry: {type(error).__name__}: {error}") from error
    return apply_entry(state, entry, registry)


def apply_entry(state: State, entry: Entry, registry: Registry) -> list[Result]:
    """Apply one entry: one result per command, in order. Never raises."""
    problem = _check_entry(entry)
    if problem is not None:
        count = len(entry.commands) if type(entry) is Entry and type(entry.commands) is tuple else 1
        return [Rejected(INVALID_REQUEST, problem, {"field": "entry"})] * max(count, 1)
    try:
        _advance(state, entry, registry)
    except Exception as error:  # a bug; every replica meets it at the same entry
        message = f"advancing time failed: {type(error).__name__}: {error}"[:1000]
        return [Rejected(INTERNAL_ERROR, message, {})] * max(len(entry.commands), 1)
    context = Context(entry.epoch < state.epoch, Savepoint(state), registry)
    handlers = registry.handlers
    results = [_apply_command(state, command, handlers, context) for command in entry.commands]
    # A bug in tidying touches derived data only, and Tick settles the heaps anyway.
    with suppress(Exception):
        commands = _command_count(entry.commands, registry)
        for after_entry in registry.after_entry:
            after_entry(state, commands)
    return results


def apply_command(state: State, command: Command, context: Context) -> Result:
    """Apply one command exactly as if it were the next command of the entry
    being applied: its own savepoint (reset here), its handler, a raising
    handler rolled back and recorded as `internal_error`. For the handler of
    a command that carries commands (`jobs.lease_batch`); never raises."""
    return _apply_command(state, command, context.registry.handlers, context)


def _command_count(commands: tuple[Command, ...], registry: Registry) -> int:
    """The entry's commands, a batch counted as the commands it carries (so
    that tidying after it keeps pace with the leases its ops ended)."""
    count = len(commands)
    nested = registry.nested
    for command in commands:
        if type(command) in nested:
            count += max(1, len(registry.inner_commands(command))) - 1
    return count


def _check_entry(entry: object) -> str | None:
    if type(entry) is not Entry:
        return "not an Entry"
    if type(entry.epoch) is not int or not 0 <= entry.epoch <= TOKEN_MAX:
        return "entry epoch must be a non-negative integer"
    if type(entry.now_ms) is not int or not 0 <= entry.now_ms <= TIME_MS_MAX:
        return "entry now_ms must be a non-negative integer"
    if type(entry.commands) is not tuple or len(entry.commands) > COMMANDS_PER_ENTRY_MAX:
        return "entry commands must be a tuple"
    return None


def _advance(state: State, entry: Entry, registry: Registry) -> None:
    """Replicated time never runs backwards; a higher epoch is a takeover."""
    if entry.now_ms > state.now_ms:
        state.now_ms = entry.now_ms
    if entry.epoch > state.epoch:
        state.epoch = entry.epoch
        for on_new_epoch in registry.on_new_epoch:
            on_new_epoch(state)


def _apply_command(
    state: State, command: Command, handlers: dict[type[Any], Handler], context: Context
) -> Result:
    handler = handlers.get(type(command))
    if handler is None:
        return Rejected(INVALID_REQUEST, "unknown command type", {"field": "command"})
    savepoint = context.savepoint
    try:
        # Packed jobs the command names become live first (kernel.wheel);
        # this is part of applying the entry, not undone by a rejection.
        hydrate_for_command(state, command, context.registry)
    except Exception as error:  # a bug; every replica meets it here
        return Rejected(INTERNAL_ERROR, f"hydrating failed: {error}"[:1000], {})
    savepoint.reset()
    try:
        return handler(state, command, context)
    except Exception as error:
        # If even the rollback fails there is nothing better to do than to
        # record the failure; every replica fails the same way.
        with suppress(Exception):
            savepoint.rollback()
        return Rejected(
            INTERNAL_ERROR,
            f"{type(command).__name__} failed: {type(error).__name__}: {error}"[:1000],
            {},
        )
