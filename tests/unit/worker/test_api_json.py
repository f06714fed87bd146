"""`api_json`: the worker refuses exactly the values the API would refuse in a
payload, result or progress, before they can fail a lease batch."""

from __future__ import annotations

from typing import Any

import pytest

from param_ids import stable_id
from raftsched.api.errors import ApiError
from raftsched.api.jsonbody import JsonError, loads
from raftsched.api.validation import pack_json
from raftsched.client._calls import Call, encode_body
from raftsched.limits import BODY_BYTES_MAX
from raftsched.worker._context import api_json


def _nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


# docs/api.md says integers outside 64 bits get 400; a node reads one that a
# double can hold as a float instead (orjson), the precision lost. The worker
# keeps to the documented rule.
REFUSED_AS_DOCUMENTED = [2**64, -(2**63) - 1]


VALUES: list[Any] = [
    None,
    True,
    {"done": 40, "of": 100, "label": "été ✓ 🚀"},
    ("a", "tuple", "is", "a", "list"),
    {1: "an int key becomes a string"},
    2**64 - 1,
    -(2**63),
    *REFUSED_AS_DOCUMENTED,
    10**400,  # a node cannot read it at all: the whole request gets 400
    1.5,
    float("nan"),
    float("inf"),
    -float("inf"),
    {"k": [float("nan")]},
    "\ud800",
    {"\udc00": 1},
    "\ud83d\ude80",  # a surrogate pair written out is one character
    _nested(64),
    _nested(65),
    {1, 2},
    {"at": object()},
    {(1, 2): "a tuple key"},
    b"bytes",
]


def _api_refuses(value: Any) -> bool:
    """What a node makes of the value in a request the client sent."""
    try:
        body = encode_body(Call("POST", "/", lambda data: data, body={"progress": value}))
    except (TypeError, ValueError):
        return True  # the client cannot even send it
    assert body is not None
    try:
        pack_json(loads(body)["progress"], "progress")
    except (JsonError, ApiError):
        return True
    return False


@pytest.mark.parametrize("value", VALUES, ids=stable_id)
def test_the_worker_refuses_what_the_api_refuses(value: Any) -> None:
    if _api_refuses(value) or any(value is big for big in REFUSED_AS_DOCUMENTED):
        with pytest.raises(TypeError, match="^progress must be JSON the API takes: "):
            api_json(value, "progress")
    else:
        assert api_json(value, "progress")


def test_a_value_over_the_body_limit_is_refused() -> None:
    fits = "x" * (BODY_BYTES_MAX - 2)  # with its quotes, exactly the limit
    assert len(api_json(fits, "result")) == BODY_BYTES_MAX
    with pytest.raises(TypeError, match="over the 1048576-byte request limit"):
        api_json(fits + "x", "result")
    # Counted as the client sends it: a non-ASCII character is escaped.
    with pytest.raises(TypeError, match="request limit"):
        api_json("é" * (BODY_BYTES_MAX // 4), "result")
