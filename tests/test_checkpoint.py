"""Checkpoint v1 (docs/durable-state.md): export, strict parsing, and restore/merge into an engine.

No worker threads here, so engine tests run in virtual time.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from judges import (
    ScriptedJudge,
    gather,
    http_error,
    member,
    running,
    settings,
    verify,
)
from trio.testing import MockClock

from genrm_trio.domain.checkpoint import (
    CheckpointError,
    checkpoint,
    export_checkpoint,
    parse_checkpoint,
    report_body,
    restore,
)
from genrm_trio.domain.codec import decode_json, encode_json
from genrm_trio.domain.model import Rejection, RequestRejected, Scored
from genrm_trio.domain.records import MemberRecord, TerminalRecord, WatermarkRecord
from genrm_trio.engine.engine import Engine

N = 4
P = "a" * 64
R = "b" * 64
SCORED = {"reward": 2.5, "mask_sample": False, "answer_text": "x"}


def wire(data: Any) -> Any:
    """Through JSON bytes, as the HTTP layer sees it."""
    return decode_json(encode_json(data))


def failing_judge() -> ScriptedJudge:
    """(a0, a1) fails with 500; any answer containing "doomed" fails every comparison."""

    def script(r1: str, r2: str, n: int) -> Any:
        return http_error() if "doomed" in r1 + r2 else None

    return ScriptedJudge(pairs={("a0", "a1"): http_error()}, script=script)


async def populate(engine: Engine) -> list[Any]:
    """Every kind of retained record, with watermarks; returns the replies."""
    replies: list[Any] = []
    replies += await gather(engine, [member(i) for i in range(N)])  # 0, 1 masked; 2, 3 scored
    for attempt in (0, 2):
        replies += await gather(engine, [member(i, group="s", attempt=attempt) for i in range(N)])
    doomed = [member(i, group="f", answer=f"doomed{i}") for i in range(N)]
    replies += await gather(engine, doomed)  # every comparison failed: judge-kind failure
    replies.append(await verify(engine, member(0, group=None, task_index=7)))  # legacy fence
    legacy = [member(i, group=None, prompt_id="p::1", rubric_ids=(1, 3)) for i in range(N)]
    replies += await gather(engine, legacy)  # D33: legacy with masked members is kept
    # A completed legacy cohort without masked members is not retained (and not exported).
    replies += await gather(engine, [member(i, group=None, answer=f"c{i}") for i in range(N)])
    return replies


async def test_export_restore_round_trips_and_replays(autojump_clock: MockClock) -> None:
    config = settings(num_rollouts_per_prompt=N)
    async with running(config, failing_judge()) as engine:
        replies = await populate(engine)
        exported = checkpoint(engine)
    assert exported["version"] == 1
    assert [c["group_id"] for c in exported["cohorts"]] == ["g", "s", "s", "f", None, None]
    assert [c["phase"] for c in exported["cohorts"]] == ["completed"] * 3 + ["failed"] * 2 + [
        "completed"
    ]
    assert exported["watermarks"] == {
        "g": {"latest_attempt": 0, "prompt_digest": exported["cohorts"][0]["prompt_digest"]},
        "s": {"latest_attempt": 2, "prompt_digest": exported["cohorts"][0]["prompt_digest"]},
        "f": {"latest_attempt": 0, "prompt_digest": exported["cohorts"][0]["prompt_digest"]},
    }
    masked = exported["cohorts"][0]["members"]["0"]
    assert masked["masked_alone"] is True and masked["result"] is None
    assert masked["failure_reason"] == replies[0].reason
    assert exported["cohorts"][0]["members"]["2"]["result"] == replies[2].result
    assert "terminal_at" not in json.dumps(exported) and "updated_at" not in json.dumps(exported)

    judge = ScriptedJudge()
    async with running(config, judge) as engine:
        report = await restore(engine, wire(exported), num_rollouts=N)
        assert report_body(report) == {
            "added": 6,
            "unchanged": 0,
            "watermarks_updated": 3,
            "superseded": 0,
            "conflicts": [],
        }
        assert encode_json(checkpoint(engine)) == encode_json(exported)
        again = await populate(engine)
        assert again[:N] == replies[:N]
        assert all(
            isinstance(r, RequestRejected) and r.reason is Rejection.CONFLICT
            for r in again[N : 2 * N]
        )
        assert again[2 * N : -N] == replies[2 * N : -N]
        # Only the unretained legacy group (answers c0..c3) was judged again.
        assert judge.calls
        assert {c.call.response_1 for c in judge.calls} <= {f"c{i}" for i in range(N)}
        # Late and repeated requests (replay, masked-alone failures) after a restore.
        assert await verify(engine, member(0, answer="regenerated")) == replies[0]
        refused = await verify(engine, member(3, answer="regenerated"))
        assert isinstance(refused, RequestRejected) and refused.reason is Rejection.CONFLICT
        stale = await verify(engine, member(0, group="s", attempt=0))
        assert isinstance(stale, RequestRejected) and "superseded by attempt 2" in stale.detail
        # Restoring the same checkpoint again changes nothing.
        report = await restore(engine, wire(exported), num_rollouts=N)
        assert report_body(report) == {
            "added": 0,
            "unchanged": 6,
            "watermarks_updated": 0,
            "superseded": 0,
            "conflicts": [],
        }


async def test_retention_applies_right_after_a_restore(autojump_clock: MockClock) -> None:
    # (#40 item 7) a restore beyond max_terminal_cohorts kept every record it added until the
    # next group ended (244,096 records over the cap, 1.07 GB, in the review)
    async with running(settings(num_rollouts_per_prompt=N), failing_judge()) as engine:
        await populate(engine)
        exported = checkpoint(engine)
    assert len(exported["cohorts"]) == 6 and len(exported["watermarks"]) == 3
    capped = settings(num_rollouts_per_prompt=N, max_terminal_cohorts=2)
    async with running(capped, ScriptedJudge()) as engine:
        report = await restore(engine, wire(exported), num_rollouts=N)
        assert (report.added, report.watermarks_updated) == (6, 3)
        kept = checkpoint(engine)
        # the newest two of each, at once (restored records are equally old: the last added)
        assert [c["key"] for c in kept["cohorts"]] == [c["key"] for c in exported["cohorts"][-2:]]
        assert len(kept["watermarks"]) == 2
        assert engine.statistics().terminal_records == 2


async def test_restore_merge_reports_conflicts(autojump_clock: MockClock) -> None:
    config = settings(num_rollouts_per_prompt=N)
    async with running(config, failing_judge()) as engine:
        await populate(engine)
        exported = checkpoint(engine)
    digest = exported["cohorts"][0]["prompt_digest"]

    async with running(config, ScriptedJudge()) as engine, trio.open_nursery() as nursery:
        # B already has group "s" at attempt 0 with the same prompt, group "f" with another
        # prompt, a different completed record under the key of group "g", and an active
        # (collecting) cohort under the key of the legacy fence.
        await gather(engine, [member(i, group="s") for i in range(N)])
        await gather(engine, [member(i, group="f", prompt="Other") for i in range(N)])
        changed = copy.deepcopy(exported)
        changed["cohorts"][0]["members"]["3"]["result"]["reward"] = 1.25
        await restore(
            engine,
            wire({**changed, "cohorts": changed["cohorts"][:1], "watermarks": {}}),
            num_rollouts=N,
        )
        nursery.start_soon(verify, engine, member(1, group=None, task_index=7))
        await trio.testing.wait_all_tasks_blocked()

        report = report_body(await restore(engine, wire(exported), num_rollouts=N))
        keys = [c["key"] for c in exported["cohorts"]]
        assert report["conflicts"] == [
            {"key": keys[0], "reason": "different record"},  # B's own record of group "g"
            {"key": keys[1], "reason": "different record"},  # B judged "s" attempt 0 itself
            {"key": keys[3], "reason": "different record"},  # B's "f" had another prompt
            {"key": keys[4], "reason": "active cohort"},
            {"group_id": "f", "reason": "different prompt digest"},
        ]
        assert (report["added"], report["unchanged"], report["watermarks_updated"]) == (2, 0, 2)
        # "s" was raised from 0 to 2: attempt 1 is now stale, attempt 2 replays.
        stale = await verify(engine, member(0, group="s", attempt=1))
        assert isinstance(stale, RequestRejected) and "superseded by attempt 2" in stale.detail
        assert engine.watermark_records()[0] == WatermarkRecord("s", 2, digest)
        # The conflicting record was kept as it was (not overwritten).
        kept = await verify(engine, member(3))
        assert isinstance(kept, Scored) and kept.result["reward"] == 1.25
        nursery.cancel_scope.cancel()


async def test_a_lower_watermark_is_not_a_conflict(autojump_clock: MockClock) -> None:
    config = settings()
    async with running(config, ScriptedJudge()) as engine:
        await gather(engine, [member(i, attempt=5) for i in range(2)])
        [mark] = engine.watermark_records()
        lower = {"latest_attempt": 1, "prompt_digest": mark.prompt_digest}
        report = await restore(
            engine, {"version": 1, "cohorts": [], "watermarks": {"g": lower}}, num_rollouts=2
        )
        assert report_body(report) == {
            "added": 0,
            "unchanged": 0,
            "watermarks_updated": 0,
            "superseded": 0,
            "conflicts": [],
        }
        assert engine.watermark_records() == [mark]


async def test_an_invalid_checkpoint_changes_nothing(autojump_clock: MockClock) -> None:
    config = settings(num_rollouts_per_prompt=N)
    async with running(config, failing_judge()) as engine:
        await populate(engine)
        exported = checkpoint(engine)
    broken = copy.deepcopy(exported)
    broken["cohorts"][-1]["members"]["1"]["masked_alone"] = "yes"  # the last record is bad
    async with running(config, ScriptedJudge()) as engine:
        with pytest.raises(CheckpointError, match="masked_alone"):
            await restore(engine, broken, num_rollouts=N)
        assert engine.statistics().terminal_records == 0
        assert engine.watermark_records() == []


# --- pure export / parse --------------------------------------------------------------------


def records() -> tuple[list[TerminalRecord], list[WatermarkRecord]]:
    explicit = TerminalRecord(
        key="group_id::g\ud800::group_attempt::1:rubrics:-2,5",
        group_id="g\ud800",
        group_attempt=1,
        legacy=False,
        prompt_digest=P + ":rubrics:-2,5",
        phase="completed",
        members={
            0: MemberRecord(R, result={"reward": 0.1 + 0.2, "third": 1 / 3, "t": "\udc80"}),
            1: MemberRecord(R, masked_alone=True, failure_reason="lost a comparison"),
        },
    )
    fence = TerminalRecord(
        key=f"task_idx::-3::{P}::group_attempt::0:{R}",
        group_id=None,
        group_attempt=0,
        legacy=True,
        prompt_digest=f"{P}:{R}",
        phase="failed",
        failure="GenRM cohort evaluation deadline exceeded after 1.0s",
        failure_kind="judge",
    )
    by_prompt = TerminalRecord(
        key=f"prompt_id::a::b::{P}::group_attempt::3",
        group_id=None,
        group_attempt=3,
        legacy=True,
        prompt_digest=P,
        phase="failed",
        failure="interrupted",
        failure_kind="cohort",
        members={1: MemberRecord(R, result={"reward": 1})},
    )
    plain = TerminalRecord(
        key=f"{P}::group_attempt::0",
        group_id=None,
        group_attempt=0,
        legacy=True,
        prompt_digest=P,
        phase="failed",
        failure="x",
        failure_kind="cohort",
    )
    marks = [WatermarkRecord("g\ud800", 4, P + ":rubrics:-2,5"), WatermarkRecord("h", 0, P)]
    return [explicit, fence, by_prompt, plain], marks


def test_parse_inverts_export_exactly() -> None:
    recs, marks = records()
    data = export_checkpoint(recs, marks)
    assert parse_checkpoint(wire(data), num_rollouts=2) == (recs, marks)
    parsed = parse_checkpoint(wire(data), num_rollouts=2)[0][0].members[0].result
    assert parsed is not None and parsed["reward"].hex() == (0.1 + 0.2).hex()
    assert json.loads(encode_json(data))["cohorts"][0]["members"]["0"]["result"]["t"] == "\udc80"


def valid() -> dict[str, Any]:
    recs, marks = records()
    return wire(export_checkpoint(recs[:1], marks[:1]))  # type: ignore[no-any-return]


def cohort(data: dict[str, Any]) -> dict[str, Any]:
    return data["cohorts"][0]  # type: ignore[no-any-return]


def m0(data: dict[str, Any]) -> dict[str, Any]:
    return cohort(data)["members"]["0"]  # type: ignore[no-any-return]


def set_in(getter: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: Any) -> Any:
    def mutate(data: dict[str, Any]) -> None:
        getter(data)[key] = value

    return mutate


def drop(getter: Callable[[dict[str, Any]], dict[str, Any]], key: str) -> Any:
    def mutate(data: dict[str, Any]) -> None:
        del getter(data)[key]

    return mutate


def top(data: dict[str, Any]) -> dict[str, Any]:
    return data


def wm(data: dict[str, Any]) -> dict[str, Any]:
    return data["watermarks"]["g\ud800"]  # type: ignore[no-any-return]


def members(data: dict[str, Any]) -> dict[str, Any]:
    return cohort(data)["members"]  # type: ignore[no-any-return]


def twice(data: dict[str, Any]) -> None:
    data["cohorts"].append(copy.deepcopy(cohort(data)))


def failed_cohort(**fields: Any) -> Any:
    def mutate(data: dict[str, Any]) -> None:
        cohort(data).update({"phase": "failed", "members": {}, **fields})

    return mutate


INVALID: list[tuple[str, Any, str]] = [
    ("version 2", set_in(top, "version", 2), "unsupported version 2"),
    ("version text", set_in(top, "version", "1"), "unsupported version '1'"),
    ("version bool", set_in(top, "version", True), "unsupported version True"),
    ("no version", drop(top, "version"), "missing version"),
    ("no watermarks", drop(top, "watermarks"), "missing watermarks"),
    ("unknown field", set_in(top, "extra", 1), "unknown field 'extra'"),
    ("cohorts object", set_in(top, "cohorts", {}), "cohorts: expected an array"),
    ("cohort not object", set_in(top, "cohorts", [1]), "cohorts[0]: expected an object"),
    ("cohort field missing", drop(cohort, "legacy"), "missing legacy"),
    ("key number", set_in(cohort, "key", 5), "key: expected a string"),
    ("key empty", set_in(cohort, "key", ""), "must not be empty"),
    ("attempt bool", set_in(cohort, "group_attempt", True), "expected an integer"),
    ("attempt negative", set_in(cohort, "group_attempt", -1), "must be >= 0"),
    ("attempt mismatch", set_in(cohort, "group_attempt", 2), "does not match its group"),
    ("group mismatch", set_in(cohort, "group_id", "h"), "does not match its group"),
    ("suffix mismatch", set_in(cohort, "prompt_digest", P), "does not match its group"),
    ("legacy with group", set_in(cohort, "legacy", True), "true exactly when group_id is null"),
    ("legacy not bool", set_in(cohort, "legacy", 0), "legacy: expected a boolean"),
    ("digest upper", set_in(cohort, "prompt_digest", P.upper()), "64 lowercase hex"),
    ("digest short", set_in(cohort, "prompt_digest", P[:63]), "64 lowercase hex"),
    ("rubrics unsorted", set_in(cohort, "prompt_digest", P + ":rubrics:5,-2"), "sorted"),
    ("phase open", set_in(cohort, "phase", "open"), "expected 'completed' or 'failed'"),
    ("completed failure", set_in(cohort, "failure", "x"), "null failure and failure_kind"),
    ("completed kind", set_in(cohort, "failure_kind", "judge"), "null failure and failure_kind"),
    ("failed no message", failed_cohort(failure_kind="judge"), "needs its failure message"),
    ("failed bad kind", failed_cohort(failure="x", failure_kind="oops"), "'judge' or 'cohort'"),
    ("members list", set_in(cohort, "members", []), "members: expected an object"),
    ("index N", set_in(members, "2", None), "rollout index '2' is outside [0, 2)"),
    ("index negative", set_in(members, "-1", None), "rollout index '-1' is outside"),
    ("index padded", set_in(members, "01", None), "rollout index '01' is outside"),
    ("missing member", drop(members, "1"), "missing [1]"),
    ("member not object", set_in(members, "0", 1), "expected an object"),
    ("member field missing", drop(m0, "failure_reason"), "missing failure_reason"),
    ("both outcomes", set_in(m0, "masked_alone", True), "both a result and masked_alone"),
    ("neither outcome", set_in(m0, "result", None), "neither a result nor masked_alone"),
    ("scored with reason", set_in(m0, "failure_reason", "x"), "must be null for a scored"),
    ("masked bool", set_in(m0, "masked_alone", 1), "masked_alone: expected a boolean"),
    ("digest bad", set_in(m0, "response_digest", "B" * 64), "64 lowercase hex"),
    ("result list", set_in(m0, "result", [1]), "expected an object or null"),
    ("result echo", set_in(m0, "result", {"reward": 1.0, "response": {}}), "echo field 'response'"),
    ("no reward", set_in(m0, "result", {"x": 1.0}), "reward: expected a finite number"),
    ("bool reward", set_in(m0, "result", {"reward": True}), "reward: expected a finite number"),
    # as strictly as a fresh result (#40 item 7): exact numbers, false mask_sample, typed texts
    ("huge reward", set_in(m0, "result", {"reward": 10**4000}), "reward: integer out of range"),
    (
        "mask_sample evil",
        set_in(m0, "result", {"reward": 1.0, "mask_sample": "evil"}),
        "members[0].result.mask_sample: a scored member's is false",
    ),
    (
        "mask_sample true",
        set_in(m0, "result", {"reward": 1.0, "mask_sample": True}),
        "mask_sample: a scored member's is false",
    ),
    (
        "result reason",
        set_in(m0, "result", {"reward": 1.0, "failure_reason": "x"}),
        "result.failure_reason: a scored member's is null",
    ),
    (
        "answer not text",
        set_in(m0, "result", {"reward": 1.0, "answer_text": 3}),
        "result.answer_text: expected a string",
    ),
    (
        "nested nan",
        set_in(m0, "result", {"reward": 1.0, "m": [{"x": math.nan}]}),
        "result.m[0].x: expected a finite number",
    ),
    ("key twice", twice, "appears twice"),
    ("watermarks list", set_in(top, "watermarks", []), "watermarks: expected an object"),
    ("watermark attempt", set_in(wm, "latest_attempt", -2), "must be >= 0"),
    ("watermark bool", set_in(wm, "latest_attempt", False), "expected an integer"),
    ("watermark digest", set_in(wm, "prompt_digest", "x"), "64 lowercase hex"),
    ("watermark field", set_in(wm, "updated_at", 1.0), "unknown field 'updated_at'"),
]


@pytest.mark.parametrize(
    ("mutate", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_checkpoints_are_rejected(mutate: Any, message: str) -> None:
    data = valid()
    parse_checkpoint(data, num_rollouts=2)
    mutate(data)
    with pytest.raises(CheckpointError) as caught:
        parse_checkpoint(data, num_rollouts=2)
    assert message in caught.value.message


@pytest.mark.parametrize("body", [None, [], "x", 1])
def test_a_non_object_body_is_rejected(body: Any) -> None:
    with pytest.raises(CheckpointError, match="expected an object"):
        parse_checkpoint(body, num_rollouts=2)


@pytest.mark.parametrize(
    "key",
    [
        f"foo::{P}::group_attempt::0",
        f"task_idx::01::{P}::group_attempt::0",
        f"task_idx::x::{P}::group_attempt::0",
        f"prompt_id::{P}::group_attempt::0",
        f"{P}::group_attempt::1",
        f"{'c' * 64}::group_attempt::0",
    ],
)
def test_legacy_keys_must_match_their_prompt_and_attempt(key: str) -> None:
    data = wire(export_checkpoint([records()[0][3]], []))
    cohort(data)["key"] = key
    with pytest.raises(CheckpointError, match="does not match its prompt digest"):
        parse_checkpoint(data, num_rollouts=2)


def test_failed_cohorts_may_carry_members_but_they_are_checked() -> None:
    recs, _ = records()
    data = wire(export_checkpoint([recs[2]], []))
    assert parse_checkpoint(data, num_rollouts=2)[0] == [recs[2]]
    with pytest.raises(CheckpointError, match="outside"):
        parse_checkpoint(data, num_rollouts=1)


def test_export_holds_the_raw_masked_reason() -> None:
    """The export carries the stored reason; the engine adds the legacy advice on reply."""
    recs, _ = records()
    assert export_checkpoint(recs[:1], [])["cohorts"][0]["members"]["1"] == {
        "response_digest": R,
        "masked_alone": True,
        "failure_reason": "lost a comparison",
        "result": None,
    }


async def test_engine_library_methods_export_and_restore(autojump_clock: MockClock) -> None:
    """`engine.checkpoint()` / `engine.restore(data)`, the engine's checkpoint methods."""
    config = settings(num_rollouts_per_prompt=N)
    async with running(config, failing_judge()) as engine:
        await populate(engine)
        exported = engine.checkpoint()
        assert exported == checkpoint(engine)
    async with running(config, ScriptedJudge()) as engine:
        report = await engine.restore(wire(exported))
        assert report_body(report)["added"] == len(exported["cohorts"])
        assert encode_json(engine.checkpoint()) == encode_json(exported)
        with pytest.raises(CheckpointError):
            await engine.restore({"version": 2, "cohorts": [], "watermarks": {}})
