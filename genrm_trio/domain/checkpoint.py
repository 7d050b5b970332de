"""Checkpoint v1: the JSON export of terminal cohorts and watermarks, and its parser.

The format and the restore rules are docs/durable-state.md, "Checkpoint format, version 1".

``export_checkpoint`` and ``parse_checkpoint`` are pure functions over
:class:`~genrm_trio.domain.records.TerminalRecord` and
:class:`~genrm_trio.domain.records.WatermarkRecord`. The parser accepts exactly the v1 shape and
checks every record for internal consistency (keys against their group id, attempt and prompt
digest; one outcome per member; indices in ``[0, N)``); any problem is a
:class:`CheckpointError` (HTTP 422) and nothing is returned, so nothing is applied.

``checkpoint(engine)`` and ``restore(engine, data, num_rollouts=)`` are the library entry points
over an engine.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, final

from genrm_trio.domain.records import (
    InvalidResult,
    MemberRecord,
    TerminalRecord,
    WatermarkRecord,
    check_result,
    result_dict,
)
from genrm_trio.domain.text import shown_id

__all__ = [
    "CHECKPOINT_VERSION",
    "CheckpointError",
    "RecordsEngine",
    "RestoreReport",
    "checkpoint",
    "export_checkpoint",
    "parse_checkpoint",
    "report_body",
    "restore",
]

CHECKPOINT_VERSION: Final = 1


@final
@dataclass(frozen=True, slots=True)
class RestoreReport:
    """What a restore merged (docs/durable-state.md, "Restore rules"); `restore_records` result."""

    added: int = 0
    unchanged: int = 0
    watermarks_updated: int = 0
    conflicts: list[dict[str, str]] = field(default_factory=list)
    superseded: int = 0  # active older attempts of the groups whose watermark was raised


ECHO_KEYS: Final = frozenset(
    {
        "responses_create_params",
        "response",
        "_ng_group_id",
        "_ng_group_attempt",
        "_ng_rollout_index",
        "_ng_task_index",
        "_ng_rollout_id",
        "prompt_id",
        "principle",
        "expected_rubric_ids",
    }
)
_TOP_KEYS: Final = frozenset({"version", "cohorts", "watermarks"})
_COHORT_KEYS: Final = frozenset(
    {
        "key",
        "group_id",
        "group_attempt",
        "legacy",
        "prompt_digest",
        "phase",
        "failure",
        "failure_kind",
        "members",
    }
)
_MEMBER_KEYS: Final = frozenset({"response_digest", "masked_alone", "failure_reason", "result"})
_WATERMARK_KEYS: Final = frozenset({"latest_attempt", "prompt_digest"})
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_INT: Final = r"(?:0|-?[1-9][0-9]*)"
# A prompt digest: sha256 hex, then the optional baseline and rubric suffixes
# (docs/architecture.md, "Keys, digests and replay").
_PROMPT_DIGEST: Final = re.compile(
    rf"(?P<base>[0-9a-f]{{64}})(?P<suffix>(?::[0-9a-f]{{64}})?(?::rubrics:(?P<ids>{_INT}(?:,{_INT})*)?)?)"
)
_TASK_PREFIX: Final = re.compile(rf"task_idx::{_INT}::")
_INDEX: Final = re.compile(r"0|[1-9][0-9]*")


class CheckpointError(ValueError):
    """An invalid checkpoint v1 body (HTTP 422); ``message`` names the offending field."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RecordsEngine(Protocol):
    """What checkpoints need of :class:`genrm_trio.engine.engine.Engine`."""

    def terminal_records(self) -> list[TerminalRecord]: ...

    def watermark_records(self) -> list[WatermarkRecord]: ...

    async def restore_records(
        self,
        records: Iterable[TerminalRecord],
        watermarks: Iterable[WatermarkRecord] = (),
    ) -> RestoreReport: ...


# --- export ------------------------------------------------------------------------------------


def _member_json(member: MemberRecord) -> dict[str, Any]:
    return {
        "response_digest": member.response_digest,
        "masked_alone": member.masked_alone,
        "failure_reason": member.failure_reason,
        "result": None if member.result is None else result_dict(member.result),
    }


def _cohort_json(record: TerminalRecord) -> dict[str, Any]:
    return {
        "key": record.key,
        "group_id": record.group_id,
        "group_attempt": record.group_attempt,
        "legacy": record.legacy,
        "prompt_digest": record.prompt_digest,
        "phase": record.phase,
        "failure": record.failure,
        "failure_kind": record.failure_kind,
        "members": {
            str(index): _member_json(member) for index, member in sorted(record.members.items())
        },
    }


def export_checkpoint(
    records: Iterable[TerminalRecord], watermarks: Iterable[WatermarkRecord]
) -> dict[str, Any]:
    """Checkpoint v1 of ``records`` (in the given order) and ``watermarks``; no timestamps.

    The caller passes what its registry retains: terminal explicit cohorts, legacy fences and
    legacy cohorts with masked members (D33). Results are copied, never recomputed.
    """
    return {
        "version": CHECKPOINT_VERSION,
        "cohorts": [_cohort_json(record) for record in records],
        "watermarks": {
            mark.group_id: {
                "latest_attempt": mark.latest_attempt,
                "prompt_digest": mark.prompt_digest,
            }
            for mark in watermarks
        },
    }


# --- parse -------------------------------------------------------------------------------------


def _where(path: str, message: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {path}: {message}")


def _object(value: object, path: str, keys: frozenset[str]) -> dict[str, Any]:
    if type(value) is not dict:
        raise _where(path, f"expected an object, got {_type(value)}")
    missing = sorted(keys - value.keys())
    if missing:
        raise _where(path, f"missing {', '.join(missing)}")
    extra = sorted(str(k) for k in value.keys() - keys)
    if extra:
        raise _where(path, f"unknown field {', '.join(repr(k) for k in extra[:5])}")
    return value


def _type(value: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _str(value: object, path: str, *, nullable: bool = False, nonempty: bool = False) -> Any:
    if value is None and nullable:
        return None
    if type(value) is not str:
        expected = "a string or null" if nullable else "a string"
        raise _where(path, f"expected {expected}, got {_type(value)}")
    if nonempty and not value:
        raise _where(path, "must not be empty")
    return value


def _attempt(value: object, path: str) -> int:
    if type(value) is not int:
        raise _where(path, f"expected an integer, got {_type(value)}")
    if value < 0:
        raise _where(path, f"must be >= 0, got {value}")
    return value


def _prompt_digest(value: object, path: str) -> tuple[str, str, str]:
    """(digest, sha256 base, suffix); rubric ids in the suffix must be sorted and unique."""
    digest = _str(value, path)
    match = _PROMPT_DIGEST.fullmatch(digest)
    if match is None:
        raise _where(
            path,
            "expected 64 lowercase hex digits, optionally followed by :{baseline sha256} and "
            ":rubrics:{sorted ids}",
        )
    ids = match.group("ids")
    if ids:
        numbers = [int(i) for i in ids.split(",")]
        if any(a >= b for a, b in itertools.pairwise(numbers)):
            raise _where(path, "rubric ids must be sorted and unique")
    return digest, match.group("base"), match.group("suffix")


def _check_key(
    key: str, group_id: str | None, attempt: int, base: str, suffix: str, path: str
) -> None:
    """The key must be the one the engine derives from the group id / prompt."""
    if group_id is not None:
        expected = f"group_id::{group_id}::group_attempt::{attempt}{suffix}"
        if key != expected:
            raise _where(
                path, f"key {shown_id(key)} does not match its group: expected {shown_id(expected)}"
            )
        return
    tail = f"{base}::group_attempt::{attempt}{suffix}"
    if key == tail:
        return
    if key.endswith("::" + tail):
        head = key[: len(key) - len(tail)]
        if _TASK_PREFIX.fullmatch(head) or (
            head.startswith("prompt_id::") and len(head) >= len("prompt_id::::")
        ):
            return
    raise _where(
        path,
        f"legacy key {shown_id(key)} does not match its prompt digest and attempt: expected "
        f"{tail!r}, optionally after task_idx::{{index}}:: or prompt_id::{{id}}::",
    )


def _result(value: object, path: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise _where(path, f"expected an object or null, got {_type(value)}")
    echoed = sorted(ECHO_KEYS & value.keys())
    if echoed:
        raise _where(path, f"holds request echo field {echoed[0]!r}; a result has none")
    try:
        check_result(value)
    except InvalidResult as exc:  # under this result's path
        raise _where(path + exc.field, exc.problem) from None
    return value


def _member(value: object, path: str) -> MemberRecord:
    body = _object(value, path, _MEMBER_KEYS)
    digest = _str(body["response_digest"], f"{path}.response_digest")
    if not _HEX64.fullmatch(digest):
        raise _where(f"{path}.response_digest", "expected 64 lowercase hex digits")
    masked = body["masked_alone"]
    if type(masked) is not bool:
        raise _where(f"{path}.masked_alone", f"expected a boolean, got {_type(masked)}")
    reason = _str(body["failure_reason"], f"{path}.failure_reason", nullable=True)
    raw = body["result"]
    if masked:
        if raw is not None:
            raise _where(path, "holds both a result and masked_alone: true")
        if not reason:
            raise _where(f"{path}.failure_reason", "a masked member needs its failure reason")
        return MemberRecord(digest, masked_alone=True, failure_reason=reason)
    if raw is None:
        raise _where(path, "holds neither a result nor masked_alone: true")
    if reason is not None:
        raise _where(f"{path}.failure_reason", "must be null for a scored member")
    return MemberRecord(digest, result=_result(raw, f"{path}.result"))


def _cohort(value: object, path: str, num_rollouts: int) -> TerminalRecord:
    body = _object(value, path, _COHORT_KEYS)
    key = _str(body["key"], f"{path}.key", nonempty=True)
    path = f"cohort {shown_id(key)}"
    group_id = _str(body["group_id"], f"{path}.group_id", nullable=True)
    attempt = _attempt(body["group_attempt"], f"{path}.group_attempt")
    legacy = body["legacy"]
    if type(legacy) is not bool:
        raise _where(f"{path}.legacy", f"expected a boolean, got {_type(legacy)}")
    if legacy != (group_id is None):
        raise _where(f"{path}.legacy", "must be true exactly when group_id is null")
    digest, base, suffix = _prompt_digest(body["prompt_digest"], f"{path}.prompt_digest")
    _check_key(key, group_id, attempt, base, suffix, f"{path}.key")
    phase = body["phase"]
    if phase not in ("completed", "failed"):
        raise _where(f"{path}.phase", f"expected 'completed' or 'failed', got {phase!r}")
    failure = _str(body["failure"], f"{path}.failure", nullable=True)
    kind = body["failure_kind"]
    if phase == "failed":
        if not failure:
            raise _where(f"{path}.failure", "a failed cohort needs its failure message")
        if kind not in ("judge", "cohort"):
            raise _where(f"{path}.failure_kind", f"expected 'judge' or 'cohort', got {kind!r}")
    elif failure is not None or kind is not None:
        raise _where(path, "a completed cohort has null failure and failure_kind")
    raw_members = body["members"]
    if type(raw_members) is not dict:
        raise _where(f"{path}.members", f"expected an object, got {_type(raw_members)}")
    members: dict[int, MemberRecord] = {}
    for name, raw in raw_members.items():
        if not _INDEX.fullmatch(name) or int(name) >= num_rollouts:
            raise _where(
                f"{path}.members", f"rollout index {name!r} is outside [0, {num_rollouts})"
            )
        members[int(name)] = _member(raw, f"{path}.members[{name}]")
    if phase == "completed" and len(members) != num_rollouts:
        missing = sorted(set(range(num_rollouts)) - members.keys())
        raise _where(f"{path}.members", f"a completed cohort has every index; missing {missing}")
    return TerminalRecord(
        key=key,
        group_id=group_id,
        group_attempt=attempt,
        legacy=legacy,
        prompt_digest=digest,
        phase=phase,
        failure=failure,
        failure_kind=kind,
        members=dict(sorted(members.items())),
    )


def parse_checkpoint(
    data: object, *, num_rollouts: int
) -> tuple[list[TerminalRecord], list[WatermarkRecord]]:
    """Validate a decoded checkpoint v1 body; ``num_rollouts`` is the server's N.

    Raises :class:`CheckpointError` for anything that is not a consistent v1 checkpoint (unknown
    version, wrong types, unknown fields, a member with both or neither outcome, an index
    outside ``[0, N)``, a key not matching its group id, attempt and prompt digest, a key twice).
    """
    if type(data) is dict and "version" in data:
        version = data["version"]
        if type(version) is not int or version != CHECKPOINT_VERSION:
            raise _where("version", f"unsupported version {version!r}; this server reads 1")
    body = _object(data, "body", _TOP_KEYS)
    cohorts = body["cohorts"]
    if type(cohorts) is not list:
        raise _where("cohorts", f"expected an array, got {_type(cohorts)}")
    records: list[TerminalRecord] = []
    seen: set[str] = set()
    for position, raw in enumerate(cohorts):
        record = _cohort(raw, f"cohorts[{position}]", num_rollouts)
        if record.key in seen:
            raise _where("cohorts", f"key {shown_id(record.key)} appears twice")
        seen.add(record.key)
        records.append(record)
    marks_raw = body["watermarks"]
    if type(marks_raw) is not dict:
        raise _where("watermarks", f"expected an object, got {_type(marks_raw)}")
    marks: list[WatermarkRecord] = []
    for group_id, raw in marks_raw.items():
        path = f"watermarks[{shown_id(group_id)}]"
        mark = _object(raw, path, _WATERMARK_KEYS)
        attempt = _attempt(mark["latest_attempt"], f"{path}.latest_attempt")
        digest, _, _ = _prompt_digest(mark["prompt_digest"], f"{path}.prompt_digest")
        marks.append(WatermarkRecord(group_id, attempt, digest))
    return records, marks


# --- over an engine ----------------------------------------------------------------------------


def checkpoint(engine: RecordsEngine) -> dict[str, Any]:
    """``GET /checkpoint``: every retained terminal record (oldest first) and every watermark."""
    return export_checkpoint(engine.terminal_records(), engine.watermark_records())


async def restore(engine: RecordsEngine, data: object, *, num_rollouts: int) -> RestoreReport:
    """``POST /checkpoint``: validate all of ``data`` first (CheckpointError → nothing applied),
    then merge it into the engine (docs/durable-state.md: added / unchanged / conflict)."""
    records, marks = parse_checkpoint(data, num_rollouts=num_rollouts)
    return await engine.restore_records(records, marks)


def report_body(report: RestoreReport) -> dict[str, Any]:
    """The ``POST /checkpoint`` reply (docs/durable-state.md, "Restore rules")."""
    return {
        "added": report.added,
        "unchanged": report.unchanged,
        "watermarks_updated": report.watermarks_updated,
        "superseded": report.superseded,
        "conflicts": [dict(conflict) for conflict in report.conflicts],
    }
