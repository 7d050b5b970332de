"""Decoding a request body a member at a time (`decode_json_in_steps`, for large bodies off the
event loop; issue #40 item 3): the same value and the same refusals as the one-call decode."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrm_trio.domain.codec import InvalidJSON, decode_json, decode_json_in_steps, release_in_steps

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=30,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(value=_JSON, indent=st.sampled_from([None, 0, 2]))
def test_decoding_in_steps_gives_the_one_call_value(value: Any, indent: int | None) -> None:
    text = json.dumps(value, indent=indent).encode()
    assert decode_json_in_steps(b" \n" + text + b"\t ") == decode_json(text) == value


@pytest.mark.parametrize(
    "text",
    [b"", b"[1,]", b"{1: 2}", b'{"a" 1}', b'{"a": 1,}', b"[1 2]", b"[NaN]", b'{"a": [1e400]}',
     b"[1] x", b"\xef\xbb\xbf[1]", b"[" * 600 + b"]" * 600, b'{"a": "\xff"}', b"[[1]", b'{"a":'],
)  # fmt: skip
def test_decoding_in_steps_refuses_what_the_one_call_refuses(text: bytes) -> None:
    with pytest.raises(InvalidJSON) as one_call:
        decode_json(text)
    with pytest.raises(InvalidJSON) as in_steps:
        decode_json_in_steps(text)
    assert str(in_steps.value) == str(one_call.value)


def test_release_in_steps_empties_two_levels() -> None:
    inner = [[1], {"a": 2}]
    value: Any = {"x": inner, "y": [3]}
    release_in_steps(value)
    assert value == {} and inner == []
