"""Retained member results are packed (records.PackedResult): exact, comparable, smaller."""

from __future__ import annotations

import math
import sys

import pytest

from genrm_trio.cohort.records import MemberRecord, PackedResult, result_dict

LONE = "\ud800 caf\u00e9 \udfff"
RESULT = {
    "reward": 0.1 + 0.2,
    "third": 1 / 3,
    "tiny": 5e-324,
    "negative_zero": -0.0,
    "integer": 2**70,
    "text": LONE,
    "nested": {"list": [1, 2.5, None, True], LONE: LONE},
    "failure_reason": None,
}


@pytest.mark.parametrize("answer", ["short", "word " * 400])  # below and above compression
def test_a_packed_result_reads_back_exactly(answer: str) -> None:
    result = {**RESULT, "answer_text": answer}
    packed = PackedResult(result)
    unpacked = packed.unpack()
    assert unpacked == result and list(unpacked) == list(result)
    for name in ("reward", "third", "tiny"):
        assert unpacked[name].hex() == result[name].hex()  # type: ignore[attr-defined]
    assert math.copysign(1.0, unpacked["negative_zero"]) == -1.0
    assert packed["integer"] == 2**70 and len(packed) == len(result)
    assert dict(packed) == result and result_dict(packed) == result
    assert packed.json_text().startswith('{"reward":0.30000000000000004,')


def test_equality_is_that_of_the_mappings() -> None:
    packed = PackedResult(RESULT)
    assert packed == RESULT and RESULT == packed  # noqa: SIM300 (dict.__eq__ defers to it)
    assert packed == PackedResult(dict(reversed(list(RESULT.items()))))  # key order aside
    assert packed != PackedResult({**RESULT, "reward": 0.3})
    assert packed != {**RESULT, "extra": 1}
    assert packed != 3


def test_member_records_pack_their_result_and_stay_equal() -> None:
    record = MemberRecord("d" * 64, result=RESULT)
    assert type(record.result) is PackedResult
    assert record == MemberRecord("d" * 64, result=dict(RESULT))
    assert MemberRecord("d" * 64, result=record.result).result is record.result


def test_a_long_result_takes_far_less_memory_packed() -> None:
    answer = " ".join(f"word{i % 97} and more text" for i in range(60))  # ~1,400 chars
    result = {**RESULT, "answer_text": answer, "reasoning_text": ""}
    packed = PackedResult(result)
    plain = sys.getsizeof(result) + sum(sys.getsizeof(v) for v in result.values())
    assert sys.getsizeof(packed) + sys.getsizeof(packed._data) < plain / 2


def test_a_result_json_cannot_hold_stays_a_plain_mapping() -> None:
    bad = {"reward": math.nan}
    record = MemberRecord("d" * 64, result=bad)
    assert record.result is bad  # the store's own check reports it (test_store)
    with pytest.raises(ValueError):
        PackedResult(bad)
