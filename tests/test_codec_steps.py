"""Decoding a request body a member at a time (`decode_json_in_steps`, for large bodies off the
event loop; issue #40 item 3): the same value and the same refusals as the one-call decode."""

from __future__ import annotations

import json
import zlib
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import genrm_trio.domain.codec as codec_module
from genrm_trio.domain.codec import (
    InvalidJSON,
    decode_json,
    decode_json_in_steps,
    encode_json,
    encode_json_in_steps,
    pack_members,
    release_in_steps,
    split_object_in_steps,
    values_outside_strings_at_most,
)

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


_KEEP = frozenset({"a", "b"})
_UNPACKED = frozenset({"b", "c"})


def _split(text: bytes) -> tuple[Any, Any]:
    kept, packed = split_object_in_steps(text, keep=_KEEP, pack_all_but=_UNPACKED)
    return kept, decode_json(zlib.decompress(packed))


@settings(max_examples=300, deadline=None)
@given(
    members=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d", "é", "\\u00e9"]), _JSON)),
    spaces=st.sampled_from(["", " ", "\n\t "]),
)
def test_splitting_an_object_gives_its_kept_and_packed_members(
    members: list[tuple[str, Any]], spaces: str
) -> None:
    # (#40 item 2) duplicates and escaped keys included: the packed text decodes to what the
    # body's decode holds, in its order, and the kept members are the decoded ones
    pairs = [f'"{key}"{spaces}:{spaces}{json.dumps(value)}' for key, value in members]
    text = ("{" + spaces + ("," + spaces).join(pairs) + spaces + "}").encode()
    whole = decode_json(text)
    assert type(whole) is dict
    kept, rest = _split(text)
    assert kept == {key: value for key, value in whole.items() if key in _KEEP}
    assert list(rest.items()) == [(k, v) for k, v in whole.items() if k not in _UNPACKED]


@pytest.mark.parametrize("text", [b"[1, 2]", b'"x"', b"3", b" null "])
def test_splitting_a_body_that_is_not_an_object_decodes_it(text: bytes) -> None:
    assert _split(text) == (decode_json(text), {})


@pytest.mark.parametrize(
    "text",
    [b"", b"{1: 2}", b'{"a" 1}', b'{"a": 1,}', b'{"d": [NaN]}', b'{"d": [1e400]}', b'{"a": 1} x',
     b'{"d": ' + b"[" * 600 + b"]" * 600 + b"}", b'{"d": "\xff"}', b'{"a":', b'{"d": [[1]}'],
)  # fmt: skip
def test_splitting_refuses_what_the_one_call_refuses(text: bytes) -> None:
    with pytest.raises(InvalidJSON) as one_call:
        decode_json(text)
    with pytest.raises(InvalidJSON) as split:
        split_object_in_steps(text, keep=_KEEP, pack_all_but=_UNPACKED)
    assert str(split.value) == str(one_call.value)


def test_packing_members_is_compact_json() -> None:
    members = {"a": [1, {"b": None}], "é": "x"}
    assert zlib.decompress(pack_members(members)) == encode_json(members)
    assert zlib.decompress(pack_members({})) == b"{}"


@settings(max_examples=300, deadline=None)
@given(value=_JSON, levels=st.integers(0, 3))
def test_encoding_in_steps_is_the_one_call_encoding(value: Any, levels: int) -> None:
    assert encode_json_in_steps(value, levels) == encode_json(value)


def test_encoding_in_steps_keeps_escapes_and_empty_containers() -> None:
    members = {"a": [1, {"b": None}, [], {}], "\ud800": "x", "c": 1.5}
    assert encode_json_in_steps(members) == encode_json(members)
    assert encode_json_in_steps({}) == b"{}" and encode_json_in_steps([]) == b"[]"


@pytest.mark.parametrize("depth", [512, 513])
def test_the_depth_limit_holds_past_the_first_chunk_of_brackets(depth: int) -> None:
    # the running depth is summed 65,536 brackets at a time: the limit holds across chunks
    text = b"[" + b"[]," * 40_000 + b"[" * (depth - 1) + b"]" * (depth - 1) + b"]"
    if depth > 512:
        with pytest.raises(InvalidJSON, match="nesting deeper than 512"):
            decode_json(text)
    else:
        assert len(decode_json(text)) == 40_001  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "limit", "values"),
    [
        (b'{"a": [1, 2], "b": {}}', 100, 8),  # under the limit: the plain count
        (b'{"a": [1, 2], "b": {}}', 2, 8),  # over it: counted outside strings, the same here
        (b'{"a": "{{{{,,,,::::[[[["}', 3, 3),  # marks inside a string are not values
        (b'{"a": "x\\\\", "b": "\\"{,:"}', 4, 5),  # escaped backslash, escaped quote
        (b'["", "", "", ""]', 1, 4),  # past the limit in strings alone: their count
    ],
)
def test_values_outside_strings(text: bytes, limit: int, values: int) -> None:
    assert values_outside_strings_at_most(text, limit) == values


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_STRINGS_WITH_MARKS = st.text(alphabet='[]{}"\\ab', max_size=6)
_NESTED = st.recursive(
    st.none() | st.integers() | _STRINGS_WITH_MARKS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(_STRINGS_WITH_MARKS, inner, max_size=3)
    ),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(value=_NESTED, chunk=st.sampled_from([1, 2, 3, 5, 64]))
def test_the_depth_check_cuts_strings_across_chunks(value: Any, chunk: int) -> None:
    # strings full of brackets, quotes and backslashes, cut anywhere by a chunk's end: the
    # brackets counted are exactly those outside strings
    text = json.dumps(value).encode()
    with (
        mock.patch.object(codec_module, "MAX_DEPTH", 3),
        mock.patch.object(codec_module, "_DEPTH_CHUNK", chunk),
    ):
        assert codec_module._too_deep(text) is (_depth(value) > 3)
