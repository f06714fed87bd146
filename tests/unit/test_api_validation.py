"""The field helpers every request body goes through: type first, then range."""

from __future__ import annotations

from typing import Any

import pytest

from raftsched.api.errors import ApiError
from raftsched.api.leases import claim_request, next_request
from raftsched.api.validation import (
    boolean,
    choice,
    integer,
    number,
    parse_job,
    query_integer,
    seconds_ms,
)
from raftsched.node.lease_ops import ClaimRequest

POLICIES = frozenset({"skip", "all"})


def _field_of(call: Any) -> str:
    with pytest.raises(ApiError) as caught:
        call()
    assert caught.value.code == "invalid_request"
    return str(caught.value.details["field"])


@pytest.mark.parametrize("value", [{}, [], ["skip"], 1, True, "latest"])
def test_choice_rejects_other_types_and_strings_naming_the_field(value: Any) -> None:
    body = {"policy": value}
    assert _field_of(lambda: choice(body, "policy", POLICIES, prefix="catchup.")) == (
        "catchup.policy"
    )


def test_choice_null_or_absent_is_the_default() -> None:
    assert choice({"policy": None}, "policy", POLICIES, default="skip") == "skip"
    assert choice({}, "policy", POLICIES) is None
    assert choice({"policy": "all"}, "policy", POLICIES) == "all"


@pytest.mark.parametrize("value", [1e308, -1e308, 1_000.5, -0.5, True, "1", [], {}])
def test_number_checks_type_and_range_before_any_arithmetic(value: Any) -> None:
    body = {"rate": value}
    assert _field_of(lambda: number(body, "rate", 0, 1_000)) == "rate"
    assert _field_of(lambda: seconds_ms(body, "rate", 0, 1_000)) == "rate"


def test_number_and_seconds_accept_ints_and_fractions_in_range() -> None:
    assert number({"rate": 0.001}, "rate", 0.001, 10) == 0.001
    assert seconds_ms({"wait_s": 2.5}, "wait_s", 0, 60) == 2_500
    assert seconds_ms({"wait_s": None}, "wait_s", 0, 60) is None


@pytest.mark.parametrize("value", [5.0, True, "5", 1e308, 101, -101])
def test_integer_rejects_floats_bools_and_out_of_range(value: Any) -> None:
    assert _field_of(lambda: integer({"priority": value}, "priority", -100, 100)) == "priority"


@pytest.mark.parametrize("value", [0, 1, "true", [], {}])
def test_boolean_is_only_true_or_false(value: Any) -> None:
    assert _field_of(lambda: boolean({"paused": value}, "paused", False)) == "paused"
    assert boolean({"paused": None}, "paused", True) is True


@pytest.mark.parametrize("raw", ["²", "٣", "-1", "1.5", " 5", "0", "1001", "9" * 5000, ""])
def test_query_integer_takes_only_ascii_digits_in_range(raw: str) -> None:
    assert _field_of(lambda: query_integer({"limit": raw}, "limit", 1, 1000)) == "limit"


def test_query_integer_default_and_value() -> None:
    assert query_integer({}, "limit", 1, 1000, default=50) == 50
    assert query_integer({"limit": "1000"}, "limit", 1, 1000) == 1000


# -- a claim's fields, at the top of POST /v1/leases and as `next` ----------------


@pytest.mark.parametrize(
    ("claim", "field"),
    [
        ({}, "queues"),
        ({"queues": []}, "queues"),
        ({"queues": "payments"}, "queues"),
        ({"queues": [""]}, "queues"),
        ({"queues": ["q"] * 101}, "queues"),
        ({"queues": [{}]}, "queues"),
        ({"queues": ["q"], "max_jobs": 0}, "max_jobs"),
        ({"queues": ["q"], "max_jobs": 1001}, "max_jobs"),
        ({"queues": ["q"], "max_jobs": 1.5}, "max_jobs"),
        ({"queues": ["q"], "wait_s": 60.001}, "wait_s"),
        ({"queues": ["q"], "wait_s": -1}, "wait_s"),
        ({"queues": ["q"], "lease_s": 0.05}, "lease_s"),
        ({"queues": ["q"], "lease_s": 86_401}, "lease_s"),
        ({"queues": ["q"], "worker_id": 7}, "worker_id"),
        ({"queues": ["q"], "worker_id": ""}, "worker_id"),
        ({"queues": ["q"], "fencing_token": 1}, "fencing_token"),
        ({"queues": ["q"], "kinds": []}, "kinds"),
        ({"queues": ["q"], "kinds": "charge"}, "kinds"),
        ({"queues": ["q"], "kinds": ["a b"]}, "kinds"),
        ({"queues": ["q"], "kinds": ["a", "a"]}, "kinds"),
        ({"queues": ["q"], "kinds": [None, None]}, "kinds"),
        ({"queues": ["q"], "kinds": ["*", "*"]}, "kinds"),
        ({"queues": ["q"], "kinds": ["**"]}, "kinds"),
        ({"queues": ["q"], "kinds": ["k" * 129]}, "kinds"),
        ({"queues": ["q"], "kinds": [f"k{i}" for i in range(101)]}, "kinds"),
        ({"queues": ["q"], "kind_max_jobs": {"a": 1}}, "kind_max_jobs"),
        ({"queues": ["q"], "kinds": ["a"], "kind_max_jobs": {"b": 1}}, "kind_max_jobs"),
        ({"queues": ["q"], "kinds": ["a"], "kind_max_jobs": []}, "kind_max_jobs"),
        ({"queues": ["q"], "kinds": ["a"], "kind_max_jobs": {"a": -1}}, "kind_max_jobs.a"),
        ({"queues": ["q"], "kinds": ["a"], "kind_max_jobs": {"a": "2"}}, "kind_max_jobs.a"),
    ],
)
def test_next_claim_fields_are_checked_as_a_claims_and_named_next(
    claim: dict[str, Any], field: str
) -> None:
    assert _field_of(lambda: claim_request(claim, prefix="", worker_required=False)) == field
    body = {"fencing_token": 1, "next": claim}
    assert _field_of(
        lambda: next_request(body, worker_required=False, after_success_only=True)
    ) == ("next." + field)


@pytest.mark.parametrize("value", [[], "q", 1, True])
def test_next_that_is_not_an_object_is_400_next(value: Any) -> None:
    body = {"next": value}
    field = _field_of(lambda: next_request(body, worker_required=False, after_success_only=True))
    assert field == "next"


def test_next_defaults_and_worker_id() -> None:
    assert next_request({}, worker_required=True, after_success_only=False) is None
    assert next_request({"next": None}, worker_required=True, after_success_only=False) is None
    wanted = next_request(
        {"next": {"queues": ["b", "a", "b"]}}, worker_required=False, after_success_only=True
    )
    assert wanted == ClaimRequest(("b", "a"), 1, 0.0, None, None, True)
    # A lease batch's claim names its worker.
    batch = {"next": {"queues": ["q"]}}
    assert (
        _field_of(lambda: next_request(batch, worker_required=True, after_success_only=False))
        == "next.worker_id"
    )
    full = {"queues": ["q"], "max_jobs": 7, "wait_s": 2.5, "lease_s": 30, "worker_id": "w1"}
    assert next_request(
        {"next": full}, worker_required=True, after_success_only=False
    ) == ClaimRequest(("q",), 7, 2.5, 30_000, "w1", False)


def test_a_claims_kinds_become_pairs_capped_by_max_jobs() -> None:
    """null names the jobs without a kind; a cap above max_jobs is max_jobs."""
    body = {"queues": ["q"], "max_jobs": 5, "kinds": ["charge", None, "refund"],
            "kind_max_jobs": {"charge": 2, "refund": 50}}  # fmt: skip
    wanted = claim_request(body, prefix="", worker_required=False)
    assert wanted.kinds == (("charge", 2), (None, 5), ("refund", 5))
    assert claim_request({"queues": ["q"]}, prefix="", worker_required=False).kinds is None
    every = {"queues": ["q"], "max_jobs": 3, "kinds": ["a", "*"], "kind_max_jobs": {"*": 1}}
    assert claim_request(every, prefix="", worker_required=False).kinds == (("a", 3), ("*", 1))


@pytest.mark.parametrize("value", ["", "k" * 129, "two words", "é", "a/b", 7, ["a"]])
def test_a_jobs_kind_is_checked_as_the_core_checks_it(value: Any) -> None:
    assert _field_of(lambda: parse_job({"queue": "q", "kind": value})) == "kind"
    step = {"queue": "q", "kind": value}
    assert _field_of(lambda: parse_job(step, prefix="steps[0].")) == "steps[0].kind"


def test_a_jobs_kind_is_sent_only_when_given() -> None:
    assert parse_job({"queue": "q"}).kind is None
    assert parse_job({"queue": "q", "kind": None}).kind is None
    assert parse_job({"queue": "q", "kind": "email.send:v2"}).kind == "email.send:v2"
    assert parse_job({"queue": "q", "kind": "k" * 128}).kind == "k" * 128
