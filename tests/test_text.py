"""Text extraction, history and digests (docs/scoring.md section 7, docs/architecture.md, D16)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from genrm_trio.domain.text import (
    ALLOWED_ROLES,
    ID_SHOWN_LIMIT,
    HistoryError,
    answer_text,
    digest_text,
    judge_text,
    normalize_history,
    prompt_digest,
    reasoning_text,
    response_digest,
    shown_id,
)


def message(*parts: object, role: str = "assistant") -> dict[str, object]:
    return {"type": "message", "role": role, "content": list(parts)}


def output_text(text: object) -> dict[str, object]:
    return {"type": "output_text", "text": text, "annotations": []}


def reasoning(*texts: object) -> dict[str, object]:
    return {"type": "reasoning", "summary": [{"type": "summary_text", "text": t} for t in texts]}


# ---------------------------------------------------------------------------------------------
# Answer and reasoning text (reference TestExtractFromResponseObj)


def test_extract_output_text_from_message() -> None:
    response = {"id": "r", "output": [message(output_text("Hello"), output_text(" world"))]}
    assert answer_text(response) == "Hello world"


def test_answer_concatenates_messages_without_separator() -> None:
    response = {"output": [message(output_text("a")), message(output_text("b"), output_text("c"))]}
    assert answer_text(response) == "abc"


def test_extract_reasoning_and_output() -> None:
    response = {
        "output": [
            reasoning("Think ", "hard."),
            message(output_text("Answer")),
            reasoning(" Again."),
        ]
    }
    assert reasoning_text(response) == "Think hard. Again."
    assert answer_text(response) == "Answer"


def test_answer_ignores_everything_but_string_output_text_in_messages() -> None:
    response = {
        "output": [
            "not a dict",
            None,
            {"type": "function_call", "content": [output_text("tool")]},
            reasoning("thinking"),
            {"role": "assistant", "content": [output_text("untyped item")]},
            message(
                {"type": "refusal", "refusal": "no"},
                {"type": "input_text", "text": "input"},
                output_text(None),
                output_text(42),
                output_text(["x"]),
                {"type": "output_text"},
                {"type": ["output_text"], "text": "unhashable type"},
                "bare string",
                output_text("kept"),
            ),
            {"type": "message", "content": "a string content"},
            {"type": "message"},
        ]
    }
    assert answer_text(response) == "kept"


def test_reasoning_ignores_non_string_and_malformed_summaries() -> None:
    response = {
        "output": [
            reasoning("a", None, 3, "b"),
            {"type": "reasoning", "summary": "not a list"},
            {"type": "reasoning"},
            {"type": "reasoning", "summary": ["bare", {"no_text": 1}]},
            message(output_text("answer")),
        ]
    }
    assert reasoning_text(response) == "ab"


@pytest.mark.parametrize(
    "response",
    [None, "text", 3, [], {}, {"output": None}, {"output": "text"}, {"output": {"a": 1}}],
)
def test_missing_or_invalid_output_is_empty(response: object) -> None:
    assert answer_text(response) == ""
    assert reasoning_text(response) == ""


@pytest.mark.parametrize("answer", ["", " ", "\n\t ", "\u3000"])
def test_extract_empty_returns_placeholder(answer: str) -> None:
    assert judge_text(answer) == "None"


@pytest.mark.parametrize("answer", ["x", " padded ", "None", "0"])
def test_judge_text_keeps_non_blank_answers_verbatim(answer: str) -> None:
    assert judge_text(answer) == answer


def test_judge_text_of_a_response_without_answer() -> None:
    assert judge_text(answer_text({"output": [reasoning("only thoughts")]})) == "None"


# ---------------------------------------------------------------------------------------------
# Conversation history (D16)


def test_string_input_is_one_user_message() -> None:
    assert normalize_history("Hello") == [{"role": "user", "content": "Hello"}]


def test_list_input_keeps_message_items() -> None:
    history = normalize_history(
        [
            {"role": "system", "content": "Be brief."},
            {"type": "message", "role": "user", "content": "Hello"},
            {"type": "message", "role": "developer", "content": "dev"},
        ]
    )
    assert history == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
        {"role": "developer", "content": "dev"},
    ]


def test_reasoning_is_not_a_fake_user_message() -> None:
    history = normalize_history(
        [
            {"type": "message", "role": "user", "content": "Q"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
            {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"},
            {"type": "function_call_output", "call_id": "c", "output": "42"},
            message(output_text("A")),
        ]
    )
    assert history == [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]


def test_content_parts_join_input_and_output_text_only() -> None:
    item = {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "Look "},
            {"type": "input_image", "image_url": "data:..."},
            {"type": "output_text", "text": "here"},
            {"type": "input_text", "text": None},
            {"type": "refusal", "text": "nope"},
            {"text": "untyped part"},
            {"type": ["input_text"], "text": "unhashable type"},
            {"type": {"k": 1}, "text": "object type"},
            "bare",
        ],
    }
    assert normalize_history([item]) == [{"role": "user", "content": "Look here"}]


@pytest.mark.parametrize("content", [None, 5, {"text": "dict"}])
def test_missing_or_odd_content_is_empty(content: object) -> None:
    assert normalize_history([{"role": "user", "content": content}]) == [
        {"role": "user", "content": ""}
    ]


def test_missing_content_is_empty() -> None:
    assert normalize_history([{"role": "assistant"}]) == [{"role": "assistant", "content": ""}]


def test_role_defaults_to_user() -> None:
    assert normalize_history([{"content": "hi"}, {"type": "message", "content": "yo"}]) == [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": "yo"},
    ]


def test_null_type_counts_as_absent() -> None:
    assert normalize_history([{"type": None, "role": "user", "content": "hi"}]) == [
        {"role": "user", "content": "hi"}
    ]


def test_non_object_items_are_dropped() -> None:
    assert normalize_history(["text", 3, None, {"content": "kept"}]) == [
        {"role": "user", "content": "kept"}
    ]


@pytest.mark.parametrize("value", [None, 3, {"role": "user", "content": "x"}])
def test_other_inputs_give_no_history(value: object) -> None:
    assert normalize_history(value) == []


def test_allowed_roles() -> None:
    assert frozenset({"user", "assistant", "system", "developer"}) == ALLOWED_ROLES


@pytest.mark.parametrize("role", ["tool", "response_1", "principle", "User", ""])
def test_bad_role_is_a_history_error_naming_it(role: str) -> None:
    items = [{"role": "user", "content": "ok"}, {"type": "message", "role": role, "content": "x"}]
    with pytest.raises(HistoryError, match=r"input\[1\]") as raised:
        normalize_history(items)
    assert repr(role) in str(raised.value)
    assert "allowed roles: assistant, developer, system, user" in str(raised.value)
    assert isinstance(raised.value, ValueError)  # the wire layer maps it to 422


@pytest.mark.parametrize("role", [None, 1, ["user"], {"r": "user"}])
def test_non_string_role_is_a_history_error(role: object) -> None:
    with pytest.raises(HistoryError):
        normalize_history([{"role": role, "content": "x"}])


def test_huge_bad_role_is_not_echoed_in_full() -> None:
    with pytest.raises(HistoryError) as raised:
        normalize_history([{"role": "x" * 10_000}])
    assert len(str(raised.value)) < 200


def test_bad_role_in_dropped_item_is_ignored() -> None:
    items = [{"type": "reasoning", "role": "tool"}, {"role": "user", "content": "q"}]
    assert normalize_history(items) == [{"role": "user", "content": "q"}]


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(alphabet=st.characters(codec=None, exclude_categories=())),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["type", "role", "content", "text", "output", "summary", "x"]),
            children,
            max_size=5,
        )
    ),
    max_leaves=20,
)
_roles = st.sampled_from([*sorted(ALLOWED_ROLES), "tool", None])
_history_items = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["message", "reasoning", None]),
        "role": _roles,
        "content": _json_values,
    },
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_history_items | _json_values, max_size=5) | _json_values)
def test_history_is_role_content_strings_or_a_history_error(value: object) -> None:
    try:
        history = normalize_history(value)
    except HistoryError:
        return
    for entry in history:
        assert set(entry) == {"role", "content"}
        assert entry["role"] in ALLOWED_ROLES
        assert isinstance(entry["content"], str)


@settings(max_examples=150, deadline=None)
@given(_json_values)
def test_extraction_never_raises(value: object) -> None:
    assert isinstance(answer_text(value), str)
    assert isinstance(reasoning_text(value), str)
    assert isinstance(answer_text({"output": value}), str)
    assert isinstance(reasoning_text({"output": value}), str)


# ---------------------------------------------------------------------------------------------
# Digests (and the baseline key suffix)


def test_prompt_digest_formula_is_pinned() -> None:
    # json.dumps default separators, sorted keys: '{"input": "Hello", "principle": null}'.
    expected = "a6ff245f96362682d2150643fdfb7cea80d7202b1db90c84043a849a72b7ba77"
    assert prompt_digest("Hello", None) == expected
    raw = json.dumps({"principle": None, "input": "Hello"}, sort_keys=True).encode()
    assert prompt_digest("Hello", None) == hashlib.sha256(raw).hexdigest()


def test_prompt_digest_ignores_key_order_and_sees_every_difference() -> None:
    a = [{"type": "message", "role": "user", "content": "hi"}]
    b = [{"content": "hi", "role": "user", "type": "message"}]
    assert prompt_digest(a, None) == prompt_digest(b, None)
    assert prompt_digest(a, None) != prompt_digest(a, "")
    assert prompt_digest(a, "be kind") != prompt_digest(a, "be fair")
    assert prompt_digest("hi", None) != prompt_digest(a, None)
    assert prompt_digest(a, None) != prompt_digest([{"role": "user", "content": "hi"}], None)


class _InputMessage(BaseModel):
    """A pydantic message shaped like Gym's Responses input items."""

    type: Literal["message"] = "message"
    role: str
    content: str | list[dict[str, Any]]
    id: str | None = None
    status: str | None = None


def test_accepts_pydantic_messages() -> None:
    # X is the input dumped in JSON mode with None fields omitted, so a model hashes like its dict.
    models = [_InputMessage(role="system", content="S"), _InputMessage(role="user", content="Q")]
    dumped = [m.model_dump(mode="json", exclude_none=True) for m in models]
    dicts = [
        {"role": "system", "content": "S", "type": "message"},
        {"type": "message", "content": "Q", "role": "user"},
    ]
    assert prompt_digest(dumped, "p") == prompt_digest(dicts, "p")
    hex_digest = prompt_digest(dicts, "p")
    assert len(hex_digest) == 64 and hex_digest == hex_digest.lower()
    int(hex_digest, 16)


@pytest.mark.parametrize("lone", ["\ud800", "\udfff", "a\udc80b"])
def test_digests_accept_lone_surrogates(lone: str) -> None:
    prompt = prompt_digest([{"role": "user", "content": lone}], lone)
    response = response_digest({"output": [message(output_text(lone))]})
    text = digest_text(lone)
    assert len({prompt, response, text}) == 3
    assert prompt != prompt_digest([{"role": "user", "content": "\ufffd"}], lone)
    assert response != response_digest({"output": [message(output_text("\ufffd"))]})


def test_response_digest_formula_is_pinned() -> None:
    expected = "b8456a292b82f26728555c8d44d6c4717050c54b032d37cdfeaba741525d2230"
    assert response_digest({"output": [], "id": "r1"}) == expected  # '{"id":"r1","output":[]}'


def test_response_digest_escapes_non_ascii() -> None:
    payload = {"text": "é", "b": [1, 2.5, None, True]}
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert response_digest(payload) == hashlib.sha256(canonical.encode("ascii")).hexdigest()
    assert (
        response_digest(payload)
        != hashlib.sha256(
            json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        ).hexdigest()
    )


def test_response_digest_identity_is_the_whole_payload() -> None:
    base = {"id": "a", "output": [message(output_text("same"))], "usage": {"output_tokens": 3}}
    reordered = {"usage": {"output_tokens": 3}, "output": base["output"], "id": "a"}
    assert response_digest(base) == response_digest(reordered)
    assert response_digest(base) != response_digest({**base, "id": "b"})  # regenerated answer
    assert response_digest(base) != response_digest({**base, "usage": {"output_tokens": 4}})


def test_digest_text() -> None:
    assert digest_text("abc") == hashlib.sha256(b"abc").hexdigest()
    assert digest_text("é\ud800") == (
        "549a1e715e0f64a03efa8402c2c10f31a31a6ef546ece1aa9766c8d511024fb4"
    )
    assert digest_text("é") == hashlib.sha256("é".encode()).hexdigest()
    assert digest_text("\ud800") != digest_text("\ud801")


@settings(max_examples=150, deadline=None)
@given(_json_values, st.none() | st.text(alphabet=st.characters(codec=None, exclude_categories=())))
def test_digests_never_raise_on_json_data(value: object, principle: str | None) -> None:
    for digest in (prompt_digest(value, principle), response_digest(value)):
        assert len(digest) == 64
        int(digest, 16)
    if isinstance(principle, str):
        assert len(digest_text(principle)) == 64


def test_an_id_is_shown_quoted_and_a_long_one_cut() -> None:
    assert shown_id("g") == "'g'" == repr("g")
    assert shown_id("x" * ID_SHOWN_LIMIT) == repr("x" * ID_SHOWN_LIMIT)  # at the limit: whole
    long = "x" * 10_000
    assert shown_id(long) == repr("x" * ID_SHOWN_LIMIT) + "… (10000 characters)"
    assert shown_id(long, 160) == repr("x" * 160) + "… (10000 characters)"


def test_escapes_count_toward_the_limit() -> None:
    """A short id whose quoted form is long (control characters, lone surrogates) is cut too."""
    assert shown_id("\x01" * 5, 10) == "'\\x01\\x01\\x'… (5 characters)"
    shown = shown_id("\udc00" * 5000)
    assert len(shown) == ID_SHOWN_LIMIT + 2 + len("… (5000 characters)")
