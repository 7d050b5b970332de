"""The wire: JSON decoding edge cases, schema checks with exact locs, rows (docs/http-api.md)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrm_trio.config import RESPONSES_CREATE_PARAM_KEYS
from genrm_trio.domain.codec import encode_json
from genrm_trio.domain.model import Scored
from genrm_trio.domain.records import MemberRecord, PackedResult
from genrm_trio.http.openapi import openapi_document
from genrm_trio.http.rows import FAILSAFE_REASON_LIMIT, HeldVerify, failsafe_row, success_row
from genrm_trio.http.schema import (
    VERIFY_FIELDS,
    ResponsesCreateParams,
    WireError,
    parse_compare,
    parse_verify,
    split_verify_body,
)

# The request-body decoder: the codec's refusals as the 422 items these tests read.
from genrm_trio.http.schema import decode_body as decode_json

SECRET = "s3cr3t-value-never-echoed"


def body(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "responses_create_params": {
            "input": [
                {"role": "user", "content": "What is 2+2?", "type": "message", "phase": None}
            ],
            "tools": [],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "metadata": None,
        },
        "response": {"id": "resp_1", "output": [{"type": "message", "content": []}]},
    }
    base.update(extra)
    return base


def errors_of(value: Any, *, compare: bool = False) -> list[dict[str, Any]]:
    with pytest.raises(WireError) as info:
        if compare:
            parse_compare(value)
        else:
            parse_verify(value)
    for item in info.value.errors:
        assert set(item) == {"type", "loc", "msg"}
        assert item["loc"][0] == "body"
        assert SECRET not in json.dumps(item)
    return info.value.errors


def locs(value: Any, *, compare: bool = False) -> list[list[str | int]]:
    return [item["loc"] for item in errors_of(value, compare=compare)]


def json_invalid(raw: bytes) -> str:
    with pytest.raises(WireError) as info:
        decode_json(raw)
    [item] = info.value.errors
    assert item["type"] == "json_invalid"
    assert item["loc"] == ["body"]
    msg = item["msg"]
    assert isinstance(msg, str)
    return msg


# --- decoding -----------------------------------------------------------------------------------


def test_decode_plain_value() -> None:
    assert decode_json(b' {"a": [1, 2.5, true, null, "x"]} ') == {"a": [1, 2.5, True, None, "x"]}
    assert decode_json(bytearray(b"[]")) == []


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff{}",  # not UTF-8
        b'{"a": "\xc3"}',  # truncated UTF-8 sequence
        b'"\xed\xa0\x80"',  # a UTF-8-encoded surrogate is not UTF-8
        b"\xef\xbb\xbf{}",  # byte order mark
        b"",
        b'{"a": 1',  # truncated
        b'{"a": 1} x',  # trailing data
        b"{} {}",
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": -Infinity}',
        b"1e400",  # overflows a double
        b"[-1.5e999]",
        b"9" * 5000,  # beyond Python's integer digit limit
        b"{'a': 1}",
    ],
)
def test_decode_rejects(raw: bytes) -> None:
    json_invalid(raw)


def test_decode_messages_are_short_and_specific() -> None:
    assert "UTF-8" in json_invalid(b"\xff")
    assert "Extra data" in json_invalid(b"{} 1")
    assert "not valid JSON" in json_invalid(b"[NaN]")


def test_depth_512_accepted_513_rejected() -> None:
    assert decode_json(b"[" * 512 + b"]" * 512) is not None
    deep_obj = b'{"a":' * 512 + b"1" + b"}" * 512
    assert decode_json(deep_obj) is not None
    assert "deeper than 512" in json_invalid(b"[" * 513 + b"]" * 513)
    assert "deeper than 512" in json_invalid(b'{"a":' * 513 + b"1" + b"}" * 513)


def test_depth_counts_no_brackets_inside_strings() -> None:
    tricky = json.dumps({"s": "[{" * 2000 + '\\"[', "t": ["]" * 3000]}).encode()
    assert decode_json(tricky)["s"].startswith("[{")
    nested_with_strings = b'[" [ ",' * 512 + b"1" + b"]" * 512
    assert decode_json(nested_with_strings) is not None


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


_tricky_text = st.text(alphabet='[]{}"\\ax\u00e9\udc80', max_size=8)
_json_values = st.recursive(
    st.none() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _tricky_text,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(_tricky_text, children, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(value=_json_values, pad=st.integers(min_value=495, max_value=515), noise=st.booleans())
def test_depth_limit_matches_the_true_depth(value: Any, pad: int, noise: bool) -> None:
    wrapped = value
    for level in range(pad):
        wrapped = [wrapped, "]]}{[\\\\"] if noise and level % 2 else {"k[": wrapped}
    raw = json.dumps(wrapped).encode()
    if _depth(wrapped) <= 512:
        assert decode_json(raw) == wrapped
    else:
        assert "deeper than 512" in json_invalid(raw)


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_very_deep_never_raises_recursion_error(depth: int) -> None:
    json_invalid(b"[" * depth + b"]" * depth)
    json_invalid(b"[" * depth)  # truncated as well


def test_duplicate_keys_last_wins() -> None:
    assert decode_json(b'{"a": 1, "a": 2}') == {"a": 2}


def test_lone_surrogate_accepted_and_echoed_as_the_same_escape() -> None:
    value = decode_json(b'{"s": "x\\udc80y", "t": "\\ud83d"}')
    assert value == {"s": "x\udc80y", "t": "\ud83d"}
    assert encode_json(value) == b'{"s":"x\\udc80y","t":"\\ud83d"}'


def test_huge_numbers() -> None:
    big = "1" + "0" * 400
    assert decode_json(big.encode()) == 10**400
    assert encode_json(decode_json(big.encode())) == big.encode()
    assert decode_json(b"1e308") == 1e308
    assert decode_json(b"1e-400") == 0.0
    assert decode_json(b"[0.1, 1.5e300]") == [0.1, 1.5e300]
    long_fraction = b"0." + b"1" * 300
    assert isinstance(decode_json(long_fraction), float)
    json_invalid(b"1" + b"0" * 400 + b".0")


def test_encode_is_ascii_and_compact() -> None:
    out = encode_json({"k": "é✓😀", "n": [1, 2.5, None, True]})
    assert out == b'{"k":"\\u00e9\\u2713\\ud83d\\ude00","n":[1,2.5,null,true]}'
    assert json.loads(out) == {"k": "é✓😀", "n": [1, 2.5, None, True]}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_encode_refuses_non_finite(bad: float) -> None:
    with pytest.raises(ValueError):
        encode_json({"reward": bad})


# --- /verify validation -------------------------------------------------------------------------


def test_minimal_verify() -> None:
    parsed = parse_verify({"responses_create_params": {"input": "hi"}, "response": {}})
    inp = parsed.input
    assert inp.input == "hi"
    assert inp.response == {}
    assert (inp.principle, inp.metadata, inp.task_index, inp.group_id) == (None, None, None, None)
    assert (inp.group_attempt, inp.group_attempt_given, inp.rollout_index) == (0, False, None)
    assert (inp.prompt_id, inp.expected_rubric_ids) == (None, None)


def test_verify_fields_by_alias_and_by_name() -> None:
    raw = body(
        principle="be kind",
        prompt_id="p",
        _ng_task_index=3,
        _ng_group_id="g",
        _ng_group_attempt=2,
        _ng_rollout_index=5,
        _ng_rollout_id="cap",
        expected_rubric_ids=[3, 1, 3, 2],
    )
    inp = parse_verify(raw).input
    assert (inp.principle, inp.prompt_id, inp.task_index, inp.group_id) == ("be kind", "p", 3, "g")
    assert (inp.group_attempt, inp.group_attempt_given, inp.rollout_index) == (2, True, 5)
    assert inp.expected_rubric_ids == (1, 2, 3)
    assert inp.input is raw["responses_create_params"]["input"]
    assert inp.response is raw["response"]

    by_name = parse_verify(
        body(task_index=3, group_id="g", group_attempt=0, rollout_index=5, capture_rollout_id="c")
    ).input
    assert (by_name.task_index, by_name.group_id, by_name.rollout_index) == (3, "g", 5)
    assert (by_name.group_attempt, by_name.group_attempt_given) == (0, True)


def test_alias_wins_over_field_name() -> None:
    inp = parse_verify(body(_ng_group_attempt=4, group_attempt="ignored")).input
    assert inp.group_attempt == 4


def test_metadata_reaches_the_engine_only_as_an_object() -> None:
    raw = body()
    raw["responses_create_params"]["metadata"] = {"baseline_response": "b"}
    assert parse_verify(raw).input.metadata == {"baseline_response": "b"}
    raw["responses_create_params"]["metadata"] = "opaque"
    assert parse_verify(raw).input.metadata is None


def test_nulls_for_nullable_fields() -> None:
    inp = parse_verify(
        body(principle=None, _ng_task_index=None, _ng_group_id=None, _ng_rollout_index=None)
    ).input
    assert inp.group_id is None and inp.rollout_index is None


@pytest.mark.parametrize(
    ("key", "value", "kind"),
    [
        ("_ng_group_attempt", -1, "greater_than_equal"),
        ("group_attempt", -3, "greater_than_equal"),
        ("_ng_group_attempt", True, "int_type"),
        ("_ng_group_attempt", None, "int_type"),
        ("_ng_group_attempt", 1.0, "int_type"),
        ("_ng_group_attempt", "1", "int_type"),
        ("_ng_rollout_index", False, "int_type"),
        ("rollout_index", 2.5, "int_type"),
        ("_ng_task_index", SECRET, "int_type"),
        ("_ng_group_id", 7, "string_type"),
        ("principle", ["x"], "string_type"),
        ("prompt_id", {"a": SECRET}, "string_type"),
        ("_ng_rollout_id", 1, "string_type"),
        ("expected_rubric_ids", SECRET, "list_type"),
        ("response", [SECRET], "dict_type"),
        ("responses_create_params", SECRET, "dict_type"),
    ],
)
def test_top_level_type_errors(key: str, value: Any, kind: str) -> None:
    [item] = errors_of(body(**{key: value}))
    assert item["type"] == kind
    assert item["loc"] == ["body", key]


def test_rubric_id_items_are_ints_not_bools() -> None:
    [item] = errors_of(body(expected_rubric_ids=[1, True, 2]))
    assert item["loc"] == ["body", "expected_rubric_ids", 1]
    assert item["type"] == "int_type"


def test_missing_required_fields_and_non_object() -> None:
    assert locs({}) == [["body", "responses_create_params"], ["body", "response"]]
    assert errors_of([1, 2]) == [
        {"type": "dict_type", "loc": ["body"], "msg": "Input should be a valid dictionary"}
    ]


def test_create_params_keys_and_input() -> None:
    raw = body()
    raw["responses_create_params"]["frobnicate"] = SECRET
    del raw["responses_create_params"]["input"]
    assert locs(raw) == [
        ["body", "responses_create_params", "frobnicate"],
        ["body", "responses_create_params", "input"],
    ]
    for key in RESPONSES_CREATE_PARAM_KEYS - {"input"}:
        raw = body()
        raw["responses_create_params"][key] = {"opaque": [SECRET, None]}
        parse_verify(raw)
    raw = body()
    raw["responses_create_params"]["input"] = 5
    [item] = errors_of(raw)
    assert item["loc"] == ["body", "responses_create_params", "input"]
    assert item["type"] == "input_type"


def test_message_items() -> None:
    raw = body()
    raw["responses_create_params"]["input"] = [
        {"role": "user", "content": "ok"},
        {"type": "message", "role": "developer", "content": [{"type": "input_text"}]},
        {"type": "function_call", "name": "f", "role": 42},  # opaque item type
        {"type": "reasoning", "summary": []},
        SECRET,
        {"role": "tool", "content": "x"},
        {"type": "message", "content": "no role"},
        {"role": 1, "content": "x"},
        {"role": "assistant"},
        {"role": "system", "content": 3},
        {"role": "user", "content": ["text", {"type": "input_text"}]},
    ]
    assert locs(raw) == [
        ["body", "responses_create_params", "input", 4],
        ["body", "responses_create_params", "input", 5, "role"],
        ["body", "responses_create_params", "input", 6, "role"],
        ["body", "responses_create_params", "input", 7, "role"],
        ["body", "responses_create_params", "input", 8, "content"],
        ["body", "responses_create_params", "input", 9, "content"],
        ["body", "responses_create_params", "input", 10, "content", 0],
    ]
    kinds = [item["type"] for item in errors_of(raw)]
    assert kinds == [
        "dict_type",
        "literal_error",
        "missing",
        "literal_error",
        "missing",
        "content_type",
        "dict_type",
    ]


def test_errors_are_capped() -> None:
    raw = body()
    raw["responses_create_params"]["input"] = [1] * 1000
    assert len(errors_of(raw)) == 64


def test_response_and_create_params_are_opaque_and_not_copied() -> None:
    raw = body()
    raw["response"] = {"anything": [float("1.5"), {"deep": None}], "usage": "weird"}
    parsed = parse_verify(raw)
    assert parsed.body is raw
    assert parsed.input.response is raw["response"]


# --- /compare validation ------------------------------------------------------------------------


def compare_body(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "conversation_history": [{"role": "user", "content": "hi"}],
        "response_objs": [{"id": "a"}, {"id": "b"}],
    }
    base.update(extra)
    return base


def test_compare_valid() -> None:
    item = parse_compare(compare_body(principle="p", expected_rubric_ids=[2, 2, 1], extra=1))
    assert item.history == [{"role": "user", "content": "hi"}]
    assert item.responses == [{"id": "a"}, {"id": "b"}]
    assert item.principle == "p"
    assert item.expected_rubric_ids == (1, 2)
    assert parse_compare(compare_body(response_objs=[])).responses == []


def test_compare_errors() -> None:
    assert locs({}, compare=True) == [
        ["body", "conversation_history"],
        ["body", "response_objs"],
    ]
    raw = compare_body(
        conversation_history=[
            {"role": "tool", "content": "x"},
            {"role": "user", "content": [{"type": "input_text"}]},
            SECRET,
            {"content": "x"},
            {"role": "user"},
        ],
        response_objs=[{"id": 1}, SECRET],
        principle=5,
        expected_rubric_ids=[False],
    )
    assert locs(raw, compare=True) == [
        ["body", "conversation_history", 0, "role"],
        ["body", "conversation_history", 1, "content"],
        ["body", "conversation_history", 2],
        ["body", "conversation_history", 3, "role"],
        ["body", "conversation_history", 4, "content"],
        ["body", "response_objs", 1],
        ["body", "principle"],
        ["body", "expected_rubric_ids", 0],
    ]
    assert locs(compare_body(conversation_history={}, response_objs="x"), compare=True) == [
        ["body", "conversation_history"],
        ["body", "response_objs"],
    ]
    assert locs(None, compare=True) == [["body"]]


# --- rows ---------------------------------------------------------------------------------------

RESULT: dict[str, Any] = {
    "reward": 4.0,
    "mask_sample": False,
    "failure_kind": None,
    "failure_reason": None,
    "reasoning_text": "",
    "answer_text": "4",
    "genrm_failed_comparison_rate_per_group": 0.0,
}


def test_success_row_shape_and_order() -> None:
    raw = body(
        _ng_group_id="g",
        _ng_rollout_index=2,
        _ng_task_index=9,
        principle="p",
        prompt_id="q",
        _ng_rollout_id="cap",
        expected_rubric_ids=[1],
        agent_ref={"name": "a"},
    )
    parsed = parse_verify(raw)
    row = success_row(parsed, Scored(RESULT))
    assert list(row) == [
        "responses_create_params",
        "response",
        *RESULT,
        "_ng_group_id",
        "_ng_group_attempt",
        "_ng_rollout_index",
    ]
    assert row["responses_create_params"] is raw["responses_create_params"]
    assert row["response"] is raw["response"]
    assert (row["_ng_group_id"], row["_ng_group_attempt"], row["_ng_rollout_index"]) == ("g", 0, 2)
    legacy = success_row(parse_verify(body(group_attempt=3)), Scored(RESULT))
    assert (legacy["_ng_group_id"], legacy["_ng_group_attempt"]) == (None, 3)
    assert legacy["_ng_rollout_index"] is None


def test_success_row_echo_is_byte_exact() -> None:
    raw_bytes = (
        b'{"responses_create_params":{"input":"caf\\u00e9 \\udc80","temperature":1e-7,'
        b'"metadata":{"k":"v"}},"response":{"id":"r","n":123456789012345678901234567890,'
        b'"f":0.30000000000000004}}'
    )
    parsed = parse_verify(decode_json(raw_bytes))
    out = encode_json(success_row(parsed, Scored({"reward": 1.0})))
    assert out.startswith(
        b'{"responses_create_params":{"input":"caf\\u00e9 \\udc80","temperature":1e-07,'
        b'"metadata":{"k":"v"}},"response":{"id":"r","n":123456789012345678901234567890,'
        b'"f":0.30000000000000004},"reward":1.0,'
    )


def test_success_row_json_splices_a_packed_result_byte_for_byte() -> None:
    lone = "\udc80 caf\u00e9"
    result = {**RESULT, "answer_text": "x" * 2000 + lone, "reward": 0.1 + 0.2, "n": -0.0}
    for raw in (body(_ng_group_id=lone, _ng_rollout_index=1), body(group_attempt=2**70)):
        parsed = parse_verify(raw)
        packed = MemberRecord("d" * 64, result=result).result
        assert type(packed) is PackedResult and packed == result
        expected = encode_json(success_row(parsed, Scored(result)))
        held = HeldVerify.of(parsed)
        assert held.success_json(Scored(packed)) == expected
        assert held.success_json(Scored(result)) == expected  # a plain mapping too


FAILURE_KEYS = [
    "reward",
    "mask_sample",
    "failure_kind",
    "failure_reason",
    "instance_config",
    "_ng_failure_class",
    "_ng_failure_judge_error",
]


def test_failsafe_row_minimal_request() -> None:
    raw = body()
    row = failsafe_row(parse_verify(raw).body, "GenRM judge unavailable")
    assert row == {
        "responses_create_params": raw["responses_create_params"],
        "response": raw["response"],
        "principle": None,
        "prompt_id": None,
        "_ng_task_index": None,
        "_ng_group_id": None,
        "_ng_group_attempt": 0,
        "_ng_rollout_index": None,
        "expected_rubric_ids": None,
        "reward": 0.0,
        "mask_sample": True,
        "failure_kind": "judge_failed",
        "failure_reason": "GenRM judge unavailable",
        "instance_config": {"mask_sample": True},
        "_ng_failure_class": "judge_failed",
        "_ng_failure_judge_error": "GenRM judge unavailable",
    }
    assert list(row)[-7:] == FAILURE_KEYS


def test_failsafe_row_full_request() -> None:
    instance_config = {"mask_sample": False, "x": [1]}
    raw = body(
        principle="p",
        prompt_id="q",
        task_index=4,
        _ng_group_id="g",
        group_attempt=2,
        _ng_rollout_index=1,
        expected_rubric_ids=[3, 1, 3],
        _ng_rollout_id="capture",
        _ng_attempt_index=7,
        agent_ref={"type": "responses_api_agents", "name": "a"},
        dataset="hs3",
        instance_config=instance_config,
        reward=9.0,
    )
    before = copy.deepcopy(raw)
    row = failsafe_row(parse_verify(raw).body, "boom")
    assert raw == before  # the request is never mutated
    assert "_ng_rollout_id" not in row
    assert "task_index" not in row and "group_attempt" not in row
    assert row["_ng_task_index"] == 4
    assert row["_ng_group_attempt"] == 2
    assert row["expected_rubric_ids"] == [3, 1, 3]  # as sent, not canonicalised
    assert row["_ng_attempt_index"] == 7
    assert row["dataset"] == "hs3"
    assert row["agent_ref"] is raw["agent_ref"]
    assert row["reward"] == 0.0
    assert row["instance_config"] == {"mask_sample": True, "x": [1]}
    assert row["instance_config"] is not instance_config
    assert instance_config == {"mask_sample": False, "x": [1]}
    assert list(row)[:9] == [
        "responses_create_params",
        "response",
        "principle",
        "prompt_id",
        "_ng_task_index",
        "_ng_group_id",
        "_ng_group_attempt",
        "_ng_rollout_index",
        "expected_rubric_ids",
    ]


def test_failsafe_row_capture_id_by_name_and_alias_shadowing() -> None:
    raw = body(capture_rollout_id="cap", _ng_group_attempt=5, group_attempt="shadowed")
    row = failsafe_row(parse_verify(raw).body, "x")
    assert "capture_rollout_id" not in row and "_ng_rollout_id" not in row
    assert row["_ng_group_attempt"] == 5
    assert "group_attempt" not in row


@pytest.mark.parametrize("instance_config", [None, "x", [1], 3])
def test_failsafe_instance_config_not_an_object(instance_config: Any) -> None:
    row = failsafe_row(parse_verify(body(instance_config=instance_config)).body, "x")
    assert row["instance_config"] == {"mask_sample": True}


HELD_BODIES = [
    body(),
    body(_ng_group_id="\udc80", _ng_rollout_index=3, extra={"f": 0.1 + 0.2, "n": 2**70}),
    body(
        capture_rollout_id="cap",
        _ng_group_attempt=5,
        group_attempt="shadowed",
        instance_config={"mask_sample": False, "x": [1]},
        principle="p",
        agent_ref={"name": "a"},
    ),
]


def _held(raw: dict[str, Any], pack_rest: bool) -> HeldVerify:
    """As the server holds `raw`: from a small body decoded, from a large one split."""
    if not pack_rest:
        return HeldVerify.of(parse_verify(decode_json(encode_json(raw))))
    declared, packed_rest = split_verify_body(encode_json(raw))
    return HeldVerify.of(parse_verify(declared), packed_rest=packed_rest)


@pytest.mark.parametrize("pack_rest", [False, True])
@pytest.mark.parametrize("raw", HELD_BODIES)
def test_a_held_request_replies_as_the_decoded_one(raw: dict[str, Any], pack_rest: bool) -> None:
    parsed = parse_verify(decode_json(encode_json(raw)))
    held = _held(raw, pack_rest)
    assert type(held.rest) is (bytes if pack_rest else dict)
    assert held.packed is pack_rest
    assert held.body() == parsed.body
    result = Scored({"reward": 1.5, "answer_text": "a\udc80", "n": -0.0})
    assert held.success_json(result) == encode_json(success_row(parsed, result))
    message = "GenRM judge unavailable"
    assert held.failsafe_row(message) == failsafe_row(parsed.body, message)
    assert list(held.failsafe_row(message)) == list(failsafe_row(parsed.body, message))
    assert encode_json(held.failsafe_row(message)) == encode_json(
        failsafe_row(parsed.body, message)
    )
    assert held.failsafe_json_in_steps(message) == encode_json(failsafe_row(parsed.body, message))


def test_a_large_held_request_keeps_its_extra_keys_encoded_and_compressed() -> None:
    # (#40 item 2) a waiting /verify with a 20 MiB `[[],…]` extra key held +424 MB decoded
    raw = HELD_BODIES[0] | {"extra": [[] for _ in range(200_000)]}
    held = _held(raw, pack_rest=True)
    assert type(held.rest) is bytes and len(held.rest) < 10_000  # 600 KB of JSON, compressed
    assert held.rest_dict()["extra"] == raw["extra"]


def test_a_held_request_keeps_far_less_than_the_decoded_body() -> None:
    import tracemalloc

    from genrm_trio.app import bench

    # shaped like NeMo Gym's simple agent's body: many keys, most of them null
    raw = encode_json(
        bench.verify_body(
            task=1, rollout=2, group_id="g", attempt=0, prompt="Q?", answer="word " * 200
        )
    )
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        parsed = parse_verify(decode_json(raw))
        decoded = tracemalloc.get_traced_memory()[0] - before
        held = HeldVerify.of(parsed)
        del parsed
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert not held.echo_compressed and held.echo.startswith(b'{"responses_create_params":')
    assert kept < decoded / 2


def test_a_long_echo_is_held_compressed_and_replies_byte_for_byte() -> None:
    import tracemalloc

    from genrm_trio.app import bench

    words = [f"w{(i * 7919) % 1013}" for i in range(3000)]  # ~16 KB of varied text
    answer = " ".join(words) + " \udc80 café"
    raw = encode_json(
        bench.verify_body(task=1, rollout=2, group_id="g", attempt=0, prompt="Q?", answer=answer)
    )
    parsed = parse_verify(decode_json(raw))
    plain = encode_json({key: parsed.body[key] for key in ("responses_create_params", "response")})
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = HeldVerify.of(parsed)
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held.echo_compressed and held.echo_json() == plain
    assert kept < len(plain) / 2  # the answer text the cohort also holds, not a second copy
    assert held.body() == parsed.body
    result = Scored({"reward": 1.5, "answer_text": answer, "n": -0.0})
    assert held.success_json(result) == encode_json(success_row(parsed, result))
    message = "GenRM judge unavailable"
    assert encode_json(held.failsafe_row(message)) == encode_json(
        failsafe_row(parsed.body, message)
    )
    assert held.failsafe_json_in_steps(message) == encode_json(failsafe_row(parsed.body, message))


def test_failsafe_reason_truncated_to_2000() -> None:
    message = "é" * 1999 + "xyz"
    row = failsafe_row(parse_verify(body()).body, message)
    assert row["failure_reason"] == message[:FAILSAFE_REASON_LIMIT]
    assert len(row["failure_reason"]) == 2000
    assert row["_ng_failure_judge_error"] == row["failure_reason"]


# --- the request models are the validator: every refusal is a wire item ----------------------


def test_models_declare_the_same_fields() -> None:
    assert set(ResponsesCreateParams.model_fields) == RESPONSES_CREATE_PARAM_KEYS
    assert VERIFY_FIELDS == {
        "responses_create_params": "responses_create_params",
        "response": "response",
        "principle": "principle",
        "prompt_id": "prompt_id",
        "_ng_task_index": "task_index",
        "_ng_group_id": "group_id",
        "_ng_group_attempt": "group_attempt",
        "_ng_rollout_index": "rollout_index",
        "_ng_rollout_id": "capture_rollout_id",
        "expected_rubric_ids": "expected_rubric_ids",
    }


WIRE_TYPES = {
    "dict_type",
    "list_type",
    "string_type",
    "int_type",
    "missing",
    "extra_forbidden",
    "greater_than_equal",
    "literal_error",
    "input_type",
    "content_type",
}


def assert_wire_items(raw: Any, errors: list[dict[str, Any]]) -> None:
    """Each item has a documented type and a `loc` that is a key path of the body (pydantic's
    union tags removed): every step exists, except the last of a `missing` item."""
    assert errors
    for item in errors:
        assert set(item) == {"type", "loc", "msg"}
        assert item["type"] in WIRE_TYPES
        assert isinstance(item["msg"], str)
        assert item["loc"][0] == "body"
        value = raw
        path = item["loc"][1:]
        for depth, step in enumerate(path):
            last = depth == len(path) - 1
            in_dict = isinstance(value, dict) and step in value
            in_list = isinstance(value, list) and isinstance(step, int) and 0 <= step < len(value)
            if not (in_dict or in_list):
                assert last and item["type"] == "missing", item
                break
            value = value[step]


def _verify_bodies() -> list[Any]:
    cases: list[Any] = [
        body(),
        {"responses_create_params": {"input": "hi"}, "response": {}},
        {"responses_create_params": {"input": "hi"}},
        {"response": {}},
        [],
    ]
    for key, value in [
        ("_ng_group_attempt", -1),
        ("_ng_group_attempt", 0),
        ("group_attempt", True),
        ("_ng_group_attempt", None),
        ("_ng_rollout_index", 1.0),
        ("rollout_index", 3),
        ("_ng_task_index", "1"),
        ("task_index", None),
        ("_ng_group_id", 1),
        ("group_id", "g"),
        ("principle", 1),
        ("prompt_id", None),
        ("expected_rubric_ids", [1, 2]),
        ("expected_rubric_ids", [1, False]),
        ("expected_rubric_ids", "1"),
        ("_ng_rollout_id", 3),
        ("capture_rollout_id", "c"),
        ("response", []),
        ("extra_key", {"anything": 1}),
    ]:
        cases.append(body(**{key: value}))
    for items in [
        "text",
        5,
        None,
        [],
        [{"role": "user", "content": "x"}],
        [{"role": "tool", "content": "x"}],
        [{"type": "message", "role": "assistant", "content": [{"type": "output_text"}]}],
        [{"type": "message", "role": "assistant", "content": ["x"]}],
        [{"type": "message", "content": "x"}],
        [{"role": "user"}],
        [{"role": "user", "content": 1}],
        [{"type": "function_call_output", "output": 1}],
        [{"type": 7, "role": "nobody"}],
        ["x"],
    ]:
        raw = body()
        raw["responses_create_params"]["input"] = items
        cases.append(raw)
    raw = body()
    raw["responses_create_params"]["bogus"] = 1
    cases.append(raw)
    raw = body()
    del raw["responses_create_params"]["input"]
    cases.append(raw)
    return cases


@pytest.mark.parametrize("raw", _verify_bodies())
def test_verify_refusals_are_wire_items(raw: Any) -> None:
    try:
        parse_verify(raw)
    except WireError as exc:
        assert_wire_items(raw, exc.errors)


@pytest.mark.parametrize(
    "raw",
    [
        compare_body(),
        compare_body(principle=None, expected_rubric_ids=None),
        compare_body(principle=3),
        compare_body(conversation_history=[{"role": "x", "content": "y"}]),
        compare_body(conversation_history=[{"role": "user", "content": 1}]),
        compare_body(conversation_history=[{"role": "user"}]),
        compare_body(response_objs=[1]),
        compare_body(expected_rubric_ids=[True]),
        {"conversation_history": []},
        {},
    ],
)
def test_compare_refusals_are_wire_items(raw: Any) -> None:
    try:
        parse_compare(raw)
    except WireError as exc:
        assert_wire_items(raw, exc.errors)


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        found = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return found + [ref for item in value.values() for ref in _refs(item)]
    if isinstance(value, list):
        return [ref for item in value for ref in _refs(item)]
    return []


@pytest.mark.parametrize("auth", [False, True])
def test_openapi_document(auth: bool) -> None:
    doc = openapi_document(title="genrm-trio", version="1", auth=auth)
    assert doc["openapi"] == "3.1.0"
    assert set(doc["paths"]) == {
        "/verify",
        "/compare",
        "/seed_session",
        "/close_session",
        "/aggregate_metrics",
        "/reverify_mode",
        "/cohorts",
        "/judge/replicas",
        "/group_settings",
        "/metrics",
        "/openapi.json",
        "/checkpoint",
        "/",
        "/health",
        "/healthz",
        "/readyz",
        "/livez",
    }
    schemas = doc["components"]["schemas"]
    for ref in _refs(doc):
        assert ref.startswith("#/components/schemas/")
        assert ref.rsplit("/", 1)[1] in schemas
    verify = schemas["VerifyBody"]
    assert {"_ng_group_attempt", "_ng_rollout_index", "responses_create_params"} <= set(
        verify["properties"]
    )
    assert verify["properties"]["_ng_group_attempt"]["minimum"] == 0
    assert ("securitySchemes" in doc["components"]) is auth
    assert set(doc["paths"]["/checkpoint"]) == {"get", "post"}
    json.dumps(doc, allow_nan=False)
