"""The commands of membership (tags 93-99, all since cluster version 4)."""

from __future__ import annotations

from dataclasses import dataclass

from raftsched.core.kernel.commands import Command


@dataclass(frozen=True, slots=True)
class Member:
    """One coordinator as every node must know it: its id, the address its
    peers reach its Raft port at, and the URL of its HTTP API (redirects,
    version polls, `GET /v1/cluster`)."""

    node_id: str
    raft_address: str
    http_url: str


@dataclass(frozen=True, slots=True)
class AddMember(Command):
    """Record a new member. `known` is the membership as the proposer knew
    it from its start-up flags; it is read only while the replicated
    directory is still empty (a cluster started from `--peer` flags), so
    that the first change records every member, not only the new one."""

    node_id: str
    raft_address: str
    http_url: str
    known: tuple[Member, ...] = ()


@dataclass(frozen=True, slots=True)
class RemoveMember(Command):
    """Remove a member from the directory and remember that it was removed
    (a removed node that applies this stops serving and never stands for
    election again). `known` as for `AddMember`."""

    node_id: str
    known: tuple[Member, ...] = ()
