"""Member results are packed as JSON (records.PackedResult) and a retained cohort's members as one
compressed text (records.PackedMembers): exact, comparable, smaller."""

from __future__ import annotations

import math
import tracemalloc

import pytest

from genrm_trio.domain.records import (
    MemberRecord,
    PackedMembers,
    PackedResult,
    TerminalRecord,
    members_json,
    result_dict,
)

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


def _answer(index: int) -> str:
    # sixteen answers to one prompt: shared wording, different details
    return " ".join(
        f"step {i}: the value is {(i * 7 + index) % 23} so we add {index}" for i in range(40)
    )


def _members(masked: frozenset[int] = frozenset()) -> dict[int, MemberRecord]:
    members: dict[int, MemberRecord] = {}
    for index in range(16):
        digest = f"{index:02x}" * 32
        if index in masked:
            members[index] = MemberRecord(
                digest, masked_alone=True, failure_reason=f"{LONE} {index}"
            )
        else:
            result = {**RESULT, "reward": index / 7, "answer_text": _answer(index)}
            members[index] = MemberRecord(digest, result=result)
    return members


def _record(members: dict[int, MemberRecord]) -> TerminalRecord:
    return TerminalRecord("k", "g", 0, False, "p" * 64, "completed", members=members)


def test_packed_members_read_back_exactly_and_compare_as_mappings() -> None:
    members = _members(masked=frozenset({3, 11}))
    packed = PackedMembers(members)
    assert packed == members and members == packed  # dict.__eq__ defers to it
    assert packed.unpack() == members and list(packed) == list(range(16)) and len(packed) == 16
    assert dict(packed.items()) == members and list(packed.values()) == list(members.values())
    assert packed[3] == members[3] and packed[3].failure_reason == f"{LONE} 3"
    assert packed[5].result is not None and packed[5].result["reward"].hex() == (5 / 7).hex()
    assert packed.get(16) is None and packed.get(-1) is None and 3 in packed and 16 not in packed
    with pytest.raises(KeyError):
        packed[16]
    assert packed.masked == 2
    assert packed.json_text() == members_json(members) == members_json(packed)  # the store's text
    assert packed != _members(masked=frozenset({3})) and packed != 3
    assert PackedMembers(members) == packed


def test_a_compacted_record_is_equal_and_far_smaller() -> None:
    members = _members(masked=frozenset({4}))
    record = _record(members)
    compacted = record.compacted()
    assert type(compacted.members) is PackedMembers and compacted.compacted() is compacted
    assert compacted == record and compacted.masked == record.masked == 1
    assert compacted.state == "partially_masked" and compacted.retained

    def traced(build: object) -> int:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            kept = build()  # type: ignore[operator]
            size = tracemalloc.get_traced_memory()[0] - before
            del kept
            return size
        finally:
            tracemalloc.stop()

    plain = traced(lambda: _members(masked=frozenset({4})))
    packed = traced(lambda: PackedMembers(_members(masked=frozenset({4}))))
    assert packed * 8 < plain, (packed, plain)


def test_nothing_to_pack_keeps_the_record_as_it_is() -> None:
    failed = TerminalRecord("k", "g", 0, False, "p", "failed", "boom", "judge")
    assert failed.compacted() is failed
    bad = _record({0: MemberRecord("d" * 64, result={"reward": math.nan})})
    assert bad.compacted() is bad  # the store's own check reports it
    with pytest.raises(ValueError):
        PackedMembers({})


def test_a_result_json_cannot_hold_stays_a_plain_mapping() -> None:
    bad = {"reward": math.nan}
    record = MemberRecord("d" * 64, result=bad)
    assert record.result is bad  # the store's own check reports it (test_store)
    with pytest.raises(ValueError):
        PackedResult(bad)
