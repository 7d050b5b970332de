"""Plain records of cohort state: what the durable store commits and a checkpoint exports.

A :class:`TerminalRecord` is built once, when a cohort reaches a terminal state, and is the only
thing a replay reads afterwards: the same record serves the in-memory registry, the durable
store and checkpoint v1 (docs/durable-state.md). Records hold no timestamps; the store stamps
wall-clock times itself and the registry keeps monotonic ones.
"""

from __future__ import annotations

import json
import math
import zlib
from array import array
from collections.abc import ItemsView, Iterator, Mapping, ValuesView
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, assert_never, final

from genrm_trio.domain.codec import compact_json
from genrm_trio.domain.model import FailureKind, JSONValue

__all__ = [
    "COMPRESS_FROM",
    "InvalidResult",
    "MemberRecord",
    "OpenRecord",
    "PackedMembers",
    "PackedResult",
    "TerminalRecord",
    "WatermarkRecord",
    "check_result",
    "compressed",
    "members_from_json",
    "members_json",
    "result_dict",
    "result_json",
]


COMPRESS_FROM: Final = 4096
"""Bytes from which text kept while a request waits (its echo, a member's texts) is compressed."""


def compressed(data: bytes) -> bytes | None:
    """``data`` at zlib level 1 when it is at least :data:`COMPRESS_FROM` bytes and that saves a
    quarter, else None: short or dense text is cheaper kept as it is."""
    if len(data) < COMPRESS_FROM:
        return None
    packed = zlib.compress(data, 1)
    return packed if len(packed) * 4 <= len(data) * 3 else None


EXACT_INT: Final = 2**53
"""The largest integer reward a result may hold: beyond it a JSON number is no longer exact in
a float (a restored 4,001-digit reward would reach the trainer as a float overflow)."""

_RESULT_TEXTS: Final = ("reasoning_text", "answer_text")
_RESULT_NULLS: Final = ("failure_kind", "failure_reason")


def _number_problem(value: object) -> str | None:
    """Why ``value`` is not a number a result can hold, or None."""
    if type(value) is float:
        return None if math.isfinite(value) else "expected a finite number"
    if type(value) is int:
        return None if -EXACT_INT <= value <= EXACT_INT else "integer out of range"
    return "expected a finite number"


class InvalidResult(ValueError):
    """A stored or restored result that the engine would never have built: `field` is its path
    below the result (``.reward``, ``.rubric[2]``), `problem` what is wrong there; the text
    reads ``result.reward: expected a finite number``."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"result{field}: {problem}")
        self.field = field
        self.problem = problem


def check_result(result: Mapping[str, Any]) -> None:
    """A restored or loaded scored member's result, checked as strictly as the engine builds
    one (engine/evaluation.py): a finite ``reward``; ``mask_sample`` false; null
    ``failure_kind`` and ``failure_reason``; string texts; every float anywhere finite.
    Raises InvalidResult naming the field (``result.reward: expected a finite number``)."""
    problem = _number_problem(result.get("reward"))
    if problem is not None:
        raise InvalidResult(".reward", problem)
    if "mask_sample" in result and result["mask_sample"] is not False:
        raise InvalidResult(".mask_sample", "a scored member's is false")
    for name in _RESULT_NULLS:
        if result.get(name) is not None:
            raise InvalidResult(f".{name}", "a scored member's is null")
    for name in _RESULT_TEXTS:
        if name in result and type(result[name]) is not str:
            raise InvalidResult(f".{name}", "expected a string")
    # every other value: floats finite at any depth (an explicit stack: no recursion)
    stack: list[tuple[str, object]] = [(f".{k}", v) for k, v in result.items()]
    while stack:
        path, value = stack.pop()
        if type(value) is float:
            if not math.isfinite(value):
                raise InvalidResult(path, "expected a finite number")
        elif type(value) is dict:
            stack.extend((f"{path}.{k}", v) for k, v in value.items())
        elif type(value) is list:
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))


@final
class PackedResult(Mapping[str, JSONValue]):
    """A scored member's result row, held as its compact JSON text.

    The reply to each waiting request and the durable store splice this text as it is, so a
    result is encoded once, at terminal time, and never decoded on the hot path. Reading it as a
    mapping decodes the JSON again (``unpack()`` once, not per key). Equality is that of the
    decoded mappings. A result JSON cannot hold (NaN) stays a plain dict, so that the store's
    own check reports it. A retained record keeps all its members in one compressed
    :class:`PackedMembers` instead (see :meth:`TerminalRecord.compacted`).
    """

    __slots__ = ("_text",)

    def __init__(self, result: Mapping[str, JSONValue]) -> None:
        self._text = compact_json(dict(result))

    @staticmethod
    def of(result: Mapping[str, JSONValue]) -> Mapping[str, JSONValue]:
        """``result`` packed, or as it is when it is packed already or not JSON."""
        if type(result) is PackedResult:
            return result
        try:
            return PackedResult(result)
        except (TypeError, ValueError):
            return result

    def json_text(self) -> str:
        """The compact ASCII JSON object this result was packed from."""
        return self._text

    def unpack(self) -> dict[str, Any]:
        """A fresh dict of the result (floats, ints and strings exactly as packed)."""
        value: dict[str, Any] = json.loads(self._text)
        return value

    def __getitem__(self, key: str) -> JSONValue:
        return self.unpack()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.unpack())

    def __len__(self) -> int:
        return len(self.unpack())

    def __eq__(self, other: object) -> bool:
        if type(other) is PackedResult and self._text == other._text:
            return True
        if isinstance(other, Mapping):
            return self.unpack() == (other.unpack() if type(other) is PackedResult else other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedResult({self.unpack()!r})"


def result_dict(result: Mapping[str, JSONValue]) -> dict[str, Any]:
    """A plain dict of a result mapping (one decode for a :class:`PackedResult`)."""
    return result.unpack() if type(result) is PackedResult else dict(result)


def result_json(result: Mapping[str, JSONValue]) -> str:
    """A result mapping as :func:`compact_json` text (as stored, for a :class:`PackedResult`)."""
    return result.json_text() if type(result) is PackedResult else compact_json(dict(result))


@final
@dataclass(frozen=True, slots=True)
class MemberRecord:
    """One member of a completed cohort: exactly one of ``result`` or ``masked_alone``.

    ``result`` is kept as a :class:`PackedResult` whatever mapping it was given.
    """

    response_digest: str
    result: Mapping[str, JSONValue] | None = None  # every non-echo key of its success row
    masked_alone: bool = False
    failure_reason: str | None = None  # the member reason when masked_alone

    def __post_init__(self) -> None:
        if (self.result is None) == (not self.masked_alone):
            raise ValueError("a member record holds exactly one of result or masked_alone")
        if self.masked_alone and not self.failure_reason:
            raise ValueError("a masked member record needs its failure_reason")
        if self.result is not None:
            object.__setattr__(self, "result", PackedResult.of(self.result))


def members_json(members: Mapping[int, MemberRecord]) -> str | None:
    """A cohort's members as one compact JSON object, index → the checkpoint v1 member shape
    (``None`` for none): the store's ``members`` column and what :class:`PackedMembers` keeps.
    Results are spliced as the JSON they are packed as, not decoded and re-encoded. Raises
    ValueError for a result JSON cannot hold."""
    if type(members) is PackedMembers:
        return members.json_text()
    if not members:
        return None
    encode = compact_json
    parts = []
    for index, member in sorted(members.items()):
        text = "null" if member.result is None else result_json(member.result)
        parts.append(
            f'"{index}":{{"response_digest":{encode(member.response_digest)},"result":{text},'
            f'"masked_alone":{encode(member.masked_alone)},'
            f'"failure_reason":{encode(member.failure_reason)}}}'
        )
    return "{" + ",".join(parts) + "}"


def _member_from_json(index: str, item: object) -> MemberRecord:
    if not index.isdigit() or type(item) is not dict:
        raise ValueError(f"member {index!r} is malformed")
    digest, result, masked, reason = (
        item.get("response_digest"),
        item.get("result"),
        item.get("masked_alone"),
        item.get("failure_reason"),
    )
    if type(digest) is not str or type(masked) is not bool:
        raise ValueError(f"member {index}: response_digest or masked_alone is malformed")
    if (result is not None and type(result) is not dict) or (
        reason is not None and type(reason) is not str
    ):
        raise ValueError(f"member {index}: result or failure_reason is malformed")
    return MemberRecord(
        response_digest=digest, result=result, masked_alone=masked, failure_reason=reason
    )


def _refuse_constant(name: str) -> object:
    raise ValueError(f"holds {name}, which JSON cannot")


def _members_object(text: str) -> dict[str, Any]:
    try:
        decoded = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if type(decoded) is not dict:
        raise ValueError("members is not a JSON object")
    return decoded


def members_from_json(text: str) -> dict[int, MemberRecord]:
    """The inverse of :func:`members_json`; raises ValueError or TypeError for a bad value."""
    decoded = _members_object(text)
    members = {int(index): _member_from_json(index, item) for index, item in decoded.items()}
    return dict(sorted(members.items()))


@final
class PackedMembers(Mapping[int, MemberRecord]):
    """A retained cohort's members as one zlib-compressed :func:`members_json` text.

    A replayable record lives for `cohort_result_ttl_s` (up to `max_terminal_cohorts` of them),
    so its size is most of a long run's memory. One small object per member record, packed result
    and digest would be scattered between short-lived request objects; this is three objects, and
    compresses across members (the answers to one prompt share most of their words; the sizes are
    in docs/benchmarks.md, "Retained cohorts"). Reading a member decompresses and decodes the
    whole text (a replay, a checkpoint or a restore; never the first reply, which is handed its
    outcome before the record is compacted); ``unpack()`` gives all members at once.
    """

    __slots__ = ("_data", "_indexes", "masked")

    def __init__(self, members: Mapping[int, MemberRecord]) -> None:
        text = members_json(members)
        if text is None:
            raise ValueError("no members to pack")
        self._data = zlib.compress(text.encode("ascii"), 1)
        self._indexes = array("I", sorted(members))
        self.masked = sum(1 for m in members.values() if m.masked_alone)

    def json_text(self) -> str:
        """The :func:`members_json` text this was packed from."""
        return zlib.decompress(self._data).decode("ascii")

    def unpack(self) -> dict[int, MemberRecord]:
        """A fresh dict of every member record, in index order."""
        return members_from_json(self.json_text())

    def __getitem__(self, index: int) -> MemberRecord:
        if type(index) is not int or index < 0:
            raise KeyError(index)
        item = _members_object(self.json_text()).get(str(index))
        if item is None:
            raise KeyError(index)
        return _member_from_json(str(index), item)

    def __iter__(self) -> Iterator[int]:
        return iter(self._indexes)

    def __len__(self) -> int:
        return len(self._indexes)

    def items(self) -> ItemsView[int, MemberRecord]:
        return self.unpack().items()

    def values(self) -> ValuesView[MemberRecord]:
        return self.unpack().values()

    def __eq__(self, other: object) -> bool:
        if type(other) is PackedMembers and self._data == other._data:
            return True
        if isinstance(other, Mapping):
            return self.unpack() == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedMembers({self.unpack()!r})"


@final
@dataclass(frozen=True, slots=True)
class TerminalRecord:
    """A cohort's end: per-member outcomes for ``completed``, the failure for ``failed``.

    Failed cohorts carry no members: their failure answers every later request of the key.
    """

    key: str
    group_id: str | None
    group_attempt: int
    legacy: bool
    prompt_digest: str
    phase: Literal["completed", "failed"]
    failure: str | None = None
    failure_kind: FailureKind | None = None
    members: Mapping[int, MemberRecord] = field(default_factory=dict)

    @property
    def masked(self) -> int:
        """How many members were masked alone."""
        members = self.members
        if type(members) is PackedMembers:
            return members.masked
        return sum(1 for m in members.values() if m.masked_alone)

    def compacted(self) -> TerminalRecord:
        """This record with its members in one :class:`PackedMembers` (itself when there is
        nothing to pack, or a result JSON cannot hold: the store reports that one)."""
        if not self.members or type(self.members) is PackedMembers:
            return self
        try:
            packed = PackedMembers(self.members)
        except ValueError:
            return self
        return replace(self, members=packed)

    @property
    def state(self) -> Literal["scored", "partially_masked", "failed"]:
        """The internal state machine name of this outcome."""
        match self.phase:  # exhaustive: mypy fails here until a new phase has its case
            case "failed":
                return "failed"
            case "completed":
                return "partially_masked" if self.masked else "scored"
            case _:
                assert_never(self.phase)

    @property
    def retained(self) -> bool:
        """Whether the registry keeps this record for replay (docs/differences.md, D33).

        A completed legacy cohort without masked members is deleted at publish; a store should
        then drop its ``open`` record and keep nothing.
        """
        return not (self.legacy and self.state == "scored")


@final
@dataclass(frozen=True, slots=True)
class OpenRecord:
    """Commit point 2 (docs/architecture.md, "Durable-state commit points"): a new cohort."""

    key: str
    group_id: str | None
    group_attempt: int
    legacy: bool
    prompt_digest: str


@final
@dataclass(frozen=True, slots=True)
class WatermarkRecord:
    """Commit point 1 (docs/architecture.md): the newest attempt of an explicit group."""

    group_id: str
    latest_attempt: int
    prompt_digest: str
