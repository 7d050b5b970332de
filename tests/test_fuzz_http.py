"""Bad input against `/verify` and `/compare`: hypothesis through Quart's test client.

The replies checked are those of docs/http-api.md, "Errors".

The real engine (`open_engine`) with the in-process simulated judge, in virtual time (MockClock
autojump: the test client and the simulated judge do no real I/O), so a member that waits for its
group gets the collection-deadline 503 at once. Whatever the bytes: never a 500, never a crash,
every reply JSON (`application/json`, no NaN/Infinity) with a status the route can give, every
non-200 reply `{"detail": ...}`, nothing logged at ERROR, and nothing left running afterwards.

schemathesis is not part of the suite: its ASGI runner drives the app under asyncio (quart-trio
needs trio), so it needs a served process; it installs a pytest plugin that loads into every test
run (with filterwarnings=error); and it brings about 30 packages. A one-off run against a served
/openapi.json is reported in docs/reliability.md.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, get_args

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from genrm_trio.config import Settings, settings_from_mapping
from genrm_trio.domain.codec import MAX_DEPTH
from genrm_trio.domain.model import Unavailable
from genrm_trio.engine.engine import open_engine
from genrm_trio.http.app import create_app
from genrm_trio.testing import SimConfig, SimJudge

LIMIT = 16_384
N = 2
SETTINGS: Settings = settings_from_mapping(
    {
        "num_rollouts_per_prompt": N,
        "cohort_collection_timeout_s": 5.0,
        "cohort_evaluation_timeout_s": 5.0,
        "judge_request_timeout_s": 1.0,
        "server": {"max_body_bytes": LIMIT, "max_active_cohorts": 8},
    }
)
ALLOWED = {"/verify": {200, 409, 413, 422, 503}, "/compare": {200, 413, 422}}
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass(frozen=True)
class Sent:
    path: str
    data: bytes
    headers: dict[str, str] | None = None


@dataclass(frozen=True)
class Got:
    sent: Sent
    status: int
    content_type: str
    body: bytes
    retry_after: str | None


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def _no_error_logs() -> Iterator[_Errors]:
    handler = _Errors()
    logger = logging.getLogger("genrm_trio")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
    assert not handler.records, [r.getMessage() for r in handler.records]


def exchange(requests: Sequence[Sent], *, concurrent: bool = True) -> list[Got]:
    """Send every request to a fresh engine + app (concurrently, so groups can fill), in virtual
    time; check that the engine is empty after closing."""
    replies: list[Got | None] = [None] * len(requests)

    async def main() -> None:
        judge = SimJudge(SimConfig(record_calls=False))
        async with open_engine(SETTINGS, judge) as engine:
            app = create_app(engine, SETTINGS)
            client: Any = app.test_client()

            async def one(i: int, sent: Sent) -> None:
                response = await client.post(sent.path, data=sent.data, headers=sent.headers)
                replies[i] = Got(
                    sent,
                    response.status_code,
                    response.headers.get("content-type", ""),
                    await response.get_data(as_text=False),
                    response.headers.get("retry-after"),
                )

            with trio.fail_after(60):
                if concurrent:
                    async with trio.open_nursery() as nursery:
                        for i, sent in enumerate(requests):
                            nursery.start_soon(one, i, sent)
                else:
                    for i, sent in enumerate(requests):
                        await one(i, sent)
        stats = engine.statistics()
        assert (stats.active_cohorts, stats.waiters, stats.running_tasks) == (0, 0, 0)
        assert stats.compares_in_flight == 0
        assert (stats.judge.in_flight, stats.judge.queued) == (0, 0)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    got = [r for r in replies if r is not None]
    assert len(got) == len(requests)
    for reply in got:
        check(reply)
    return got


def _no_constants(name: str) -> None:
    raise AssertionError(f"{name} in a reply")


def check(reply: Got) -> Any:
    """The invariants every reply keeps; returns the decoded body."""
    path = reply.sent.path
    if currently_in_test_context():  # pytest --hypothesis-show-statistics shows the spread
        event(f"{path} {reply.status}")
    assert reply.status in ALLOWED[path], (reply.status, reply.body[:500])
    assert reply.content_type == "application/json", reply.content_type
    reply.body.decode("ascii")  # ASCII-safe JSON
    value = json.loads(reply.body, parse_constant=_no_constants)
    if reply.status != 200:
        # a 503 names its machine-readable reason too (docs/http-api.md, "503 reasons")
        keys = ["detail", "reason"] if reply.status == 503 else ["detail"]
        assert isinstance(value, dict) and list(value) == keys, value
        if reply.status == 503:
            assert value["reason"] in get_args(Unavailable), value
        detail = value["detail"]
        if reply.status == 422 and isinstance(detail, list):
            assert 1 <= len(detail) <= 64
            for item in detail:
                assert set(item) == {"type", "loc", "msg"}
                assert item["loc"][0] == "body"
        else:
            assert isinstance(detail, str) and detail
        if reply.status == 413:
            assert detail == f"request body exceeds {LIMIT} bytes"
        if reply.status == 503 and detail.startswith("GenRM server is at capacity"):
            assert reply.retry_after == "1"
    elif path == "/verify":
        assert isinstance(value, dict)
        assert isinstance(value["reward"], float) and math.isfinite(value["reward"])
        assert type(value["mask_sample"]) is bool
        if value["mask_sample"]:
            assert value["failure_kind"] == "judge_failed"
            assert len(value["failure_reason"]) <= 2000
    else:
        assert isinstance(value, dict)
        assert all(isinstance(r, float) and math.isfinite(r) for r in value["rewards"])
    return value


# --- strategies ---------------------------------------------------------------------------------

KEYS = (
    "responses_create_params",
    "response",
    "principle",
    "_ng_task_index",
    "task_index",
    "_ng_group_id",
    "group_id",
    "_ng_group_attempt",
    "group_attempt",
    "_ng_rollout_index",
    "rollout_index",
    "prompt_id",
    "expected_rubric_ids",
    "_ng_rollout_id",
    "instance_config",
)
text = st.text(
    alphabet=st.characters(codec=None, exclude_categories=()), max_size=20
)  # lone surrogates included
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | text, children, max_size=4)
    ),
    max_leaves=12,
)


def _answer(response_text: str, marker: str = "") -> dict[str, Any]:
    return {
        "id": f"resp-{marker}",
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": response_text}],
            }
        ],
    }


@st.composite
def verify_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A plausible /verify body, then random damage: wrong types, deletions, extra keys."""
    body: dict[str, Any] = {
        "responses_create_params": {
            "input": draw(
                st.sampled_from(
                    [
                        "2+2?",
                        [{"role": "user", "content": "2+2?", "type": "message", "phase": None}],
                        [{"role": "user", "content": [{"type": "input_text", "text": "2+2?"}]}],
                    ]
                )
            ),
            "tools": [],
        },
        "response": _answer(draw(text), draw(text)),
        "_ng_group_id": draw(st.sampled_from(["g1", "g2", "g3"]) | text),
        "_ng_group_attempt": draw(st.integers(-1, 2)),
        "_ng_rollout_index": draw(st.sampled_from(range(N)) | st.integers(-1, N) | st.integers()),
    }
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=4)):
        action = draw(st.sampled_from(["delete", "replace", "null"]))
        if action == "delete":
            body.pop(key, None)
        elif action == "null":
            body[key] = None
        else:
            body[key] = draw(json_values)
    if draw(st.booleans()):
        params = body.get("responses_create_params")
        if isinstance(params, dict):
            inner = draw(st.sampled_from(["input", "metadata", "tools", "bogus", "model"]))
            params[inner] = draw(json_values)
    body.update(draw(st.dictionaries(text, json_values, max_size=3)))
    return body


@st.composite
def compare_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {
        "conversation_history": [{"role": "user", "content": draw(text)}],
        "response_objs": [_answer(draw(text), str(i)) for i in range(draw(st.integers(0, 3)))],
    }
    for key in draw(
        st.lists(
            st.sampled_from(
                ["conversation_history", "response_objs", "principle", "expected_rubric_ids"]
            ),
            max_size=3,
        )
    ):
        if draw(st.booleans()):
            body.pop(key, None)
        else:
            body[key] = draw(json_values)
    body.update(draw(st.dictionaries(text, json_values, max_size=3)))
    return body


def encode(value: Any) -> bytes:
    """JSON as a client might send it: lone surrogates as escapes, never NaN."""
    return json.dumps(value, ensure_ascii=True, allow_nan=False).encode()


RAW_TOKENS = (
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"1e400",
    b"-1e999",
    b"9" * 5000,
    b'"\\ud800"',
    b'"\\udfff\\ud800"',
    b"\xff",
    b"\xc0\xaf",
    b"\xed\xa0\x80",
    b"\x00",
    b"[" * (MAX_DEPTH + 5),
    b"{" * 3,
    b"}",
    b'"',
    b",",
    b'"_ng_rollout_index": "x", ',
)


@st.composite
def damaged(draw: st.DrawFn, source: st.SearchStrategy[dict[str, Any]]) -> bytes:
    """Valid-looking JSON bytes with byte-level damage: tokens spliced in, truncation, nesting,
    duplicate keys."""
    raw = encode(draw(source))
    kind = draw(st.sampled_from(["splice", "truncate", "nest", "duplicate", "replace_value"]))
    if kind == "splice":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from(RAW_TOKENS) | st.binary(max_size=8)) + raw[at:]
    elif kind == "truncate":
        raw = raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    elif kind == "nest":
        depth = draw(st.integers(MAX_DEPTH - 3, MAX_DEPTH + 3) | st.integers(1, 20_000))
        raw = b"[" * depth + raw + b"]" * depth
    elif kind == "duplicate":
        key = draw(st.sampled_from(KEYS))
        value = draw(json_values)
        raw = b"{" + encode(key) + b":" + encode(value) + b"," + raw[1:]
    else:
        token = draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e400", b"9" * 5000]))
        raw = raw.replace(b"0", token, 1) if b"0" in raw else raw + token
    return raw


# --- properties ---------------------------------------------------------------------------------


@FUZZ
@given(body=verify_bodies(), partner_index=st.integers(0, N - 1))
def test_verify_with_random_damage(body: dict[str, Any], partner_index: int) -> None:
    # A well-formed partner shares the group so that damaged-but-valid bodies can complete.
    partner = {
        "responses_create_params": {"input": "2+2?"},
        "response": _answer("partner"),
        "_ng_group_id": body.get("_ng_group_id")
        if isinstance(body.get("_ng_group_id"), str)
        else "g1",
        "_ng_group_attempt": 0,
        "_ng_rollout_index": partner_index,
    }
    if isinstance(body.get("responses_create_params"), dict):
        partner["responses_create_params"] = body["responses_create_params"]  # same prompt
    if isinstance(body.get("principle"), str):
        partner["principle"] = body["principle"]
    index = body.get("_ng_rollout_index")
    if type(index) is int and 0 <= index < N:
        partner["_ng_rollout_index"] = (index + 1) % N
    exchange([Sent("/verify", encode(body)), Sent("/verify", encode(partner))])


@FUZZ
@given(body=compare_bodies())
def test_compare_with_random_damage(body: dict[str, Any]) -> None:
    exchange([Sent("/compare", encode(body))])


@FUZZ
@given(raw=damaged(verify_bodies()))
@example(raw=b"[" * 100_000)
@example(raw=b'{"a": NaN}')
@example(raw=b"\xff\xfe")
@example(raw=b"")
def test_verify_with_damaged_bytes(raw: bytes) -> None:
    exchange([Sent("/verify", raw)])


@FUZZ
@given(raw=damaged(compare_bodies()))
def test_compare_with_damaged_bytes(raw: bytes) -> None:
    exchange([Sent("/compare", raw)])


@FUZZ
@given(
    raw=st.binary(max_size=64)
    | st.text(max_size=64).map(lambda s: s.encode("utf-8", "surrogatepass"))
)
def test_arbitrary_bytes(raw: bytes) -> None:
    exchange([Sent("/verify", raw), Sent("/compare", raw)])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(
        st.tuples(
            st.sampled_from(["g1", "g2"]),
            st.integers(0, 2),  # attempt
            st.integers(0, N - 1),  # rollout index
            st.sampled_from(["a", "b"]),  # answer
            st.sampled_from(["2+2?", "3+3?"]),  # prompt
        ),
        min_size=1,
        max_size=8,
    ),
    concurrent=st.booleans(),
)
def test_sequences_of_valid_requests_on_one_engine(
    requests: list[tuple[str, int, int, str, str]], concurrent: bool
) -> None:
    """Conflicts, replays, supersession and stale attempts: only 200, 409 or 503."""
    sent = [
        Sent(
            "/verify",
            encode(
                {
                    "responses_create_params": {"input": prompt},
                    "response": _answer(f"answer {answer}", answer),
                    "_ng_group_id": group,
                    "_ng_group_attempt": attempt,
                    "_ng_rollout_index": index,
                }
            ),
        )
        for group, attempt, index, answer, prompt in requests
    ]
    for reply in exchange(sent, concurrent=concurrent):
        assert reply.status in (200, 409, 503)


@settings(max_examples=40, deadline=None)
@given(pad=st.integers(LIMIT - 400, LIMIT + 400))
def test_body_limit_is_exact(pad: int) -> None:
    body = {"responses_create_params": {"input": "q"}, "response": {}, "_ng_rollout_index": 0}
    base = encode({**body, "pad": ""})
    raw = encode({**body, "pad": "x" * max(0, pad - len(base))})
    [verify, compare] = exchange([Sent("/verify", raw), Sent("/compare", raw)])
    for reply in (verify, compare):
        if len(raw) > LIMIT:
            assert reply.status == 413
        else:
            assert reply.status != 413


# --- the named cases, one by one -----------------------------------------------------------------


def _valid(**extra: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": "2+2?"},
        "response": _answer("four"),
        "_ng_group_id": "g",
        "_ng_rollout_index": 0,
        **extra,
    }


def _detail_type(reply: Got) -> str:
    detail = json.loads(reply.body)["detail"]
    return str(detail[0]["type"]) if isinstance(detail, list) else str(detail)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"[" * 8000 + b"]" * 8000, "json_invalid"),  # deeply nested, within the body limit
        (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), "json_invalid"),
        (b'{"x": "\xff"}', "json_invalid"),  # invalid UTF-8
        (b'{"x": "\xed\xa0\x80"}', "json_invalid"),  # a surrogate encoded in UTF-8
        (b'{"x": NaN}', "json_invalid"),
        (b'{"x": Infinity}', "json_invalid"),
        (b'{"x": -Infinity}', "json_invalid"),
        (b'{"x": 1e400}', "json_invalid"),  # overflows a double
        (b'{"x": ' + b"9" * 5000 + b"}", "json_invalid"),  # beyond Python's int digit limit
        (b'{"x": 1} trailing', "json_invalid"),
        (b"", "json_invalid"),
        (b"[]", "dict_type"),
        (encode(_valid(_ng_rollout_index=10**30)), "_ng_rollout_index must be in [0, 2); got"),
        (encode(_valid(_ng_rollout_index=True)), "int_type"),
        (encode(_valid(_ng_group_attempt=-1)), "greater_than_equal"),
        (encode(_valid(response=[])), "dict_type"),
        (encode(_valid(responses_create_params={"input": 3})), "input"),
    ],
)
def test_named_bad_inputs_are_422(raw: bytes, expected: str) -> None:
    [reply] = exchange([Sent("/verify", raw)])
    assert reply.status == 422
    detail = json.loads(reply.body)["detail"]
    assert expected in json.dumps(detail) or _detail_type(reply) == expected


def test_duplicate_keys_last_wins() -> None:
    first = encode(_valid())
    raw = b'{"_ng_rollout_index": "not an int", ' + first[1:]
    body = dict(_valid(_ng_rollout_index=1))
    body["response"] = _answer("five")
    [a, b] = exchange([Sent("/verify", raw), Sent("/verify", encode(body))])
    assert (a.status, b.status) == (200, 200)
    assert json.loads(a.body)["_ng_rollout_index"] == 0


def test_lone_surrogates_are_accepted_and_echoed_as_escapes() -> None:
    member = _valid(response=_answer("\ud800 four \udfff"))
    other = _valid(_ng_rollout_index=1, response=_answer("five \udc80"))
    [a, b] = exchange([Sent("/verify", encode(member)), Sent("/verify", encode(other))])
    assert (a.status, b.status) == (200, 200)
    assert b"\\ud800 four \\udfff" in a.body
    compare = {
        "conversation_history": [{"role": "user", "content": "\udc00?"}],
        "response_objs": [member["response"], other["response"]],
    }
    [c] = exchange([Sent("/compare", encode(compare))])
    assert c.status == 200


def test_huge_numbers_in_opaque_places_are_fine() -> None:
    member = _valid(response={**_answer("four"), "usage": {"input_tokens": 10**300}})
    member["_ng_task_index"] = 10**4000
    other = _valid(_ng_rollout_index=1, response=_answer("five"), instance_config={"n": -(10**50)})
    replies = exchange([Sent("/verify", encode(member)), Sent("/verify", encode(other))])
    assert [r.status for r in replies] == [200, 200]


Extra = Callable[[dict[str, Any]], None]


@pytest.mark.parametrize(
    "headers",
    [
        {"content-type": "text/plain"},
        {"content-type": "application/x-www-form-urlencoded"},
        {"content-type": "multipart/form-data; boundary=x"},
        {"content-encoding": "gzip"},
    ],
)
def test_content_type_is_ignored(headers: dict[str, str]) -> None:
    body = encode({"conversation_history": [], "response_objs": []})
    [reply] = exchange([Sent("/compare", body, headers)])
    assert reply.status == 200
    assert json.loads(reply.body) == {"rewards": [], "comparison_results": None, "metrics": None}
