"""The principal a request acts as: scope checks and how it is named."""

from __future__ import annotations

from raftsched.api.principal import ANONYMOUS, Principal, Role


def test_anonymous_is_an_admin_over_everything_while_auth_is_off() -> None:
    assert not ANONYMOUS.authenticated
    assert ANONYMOUS.role is Role.ADMIN
    assert ANONYMOUS.all_tenants
    assert ANONYMOUS.sees_tenant("acme") and ANONYMOUS.may_use_queue("payments")
    assert ANONYMOUS.actor == "anonymous"


def test_a_scoped_token_sees_only_its_tenants_and_queues() -> None:
    caller = Principal("tok_1", "payments-api", Role.SUBMITTER, frozenset({"acme"}), None)
    assert caller.authenticated and not caller.all_tenants
    assert caller.sees_tenant("acme") and not caller.sees_tenant("globex")
    assert caller.may_use_queue("anything")
    worker = Principal("tok_2", "w", Role.WORKER, None, frozenset({"payments"}))
    assert worker.may_use_queue("payments") and not worker.may_use_queue("email")


def test_the_actor_names_the_token_by_name_and_id() -> None:
    caller = Principal("tok_9", "alice", Role.OPERATOR, None, None)
    assert caller.actor == "alice (tok_9)"
