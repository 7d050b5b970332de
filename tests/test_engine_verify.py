"""`/verify` through the engine: keys, formation, replay and conflicts (docs/architecture.md)."""

from __future__ import annotations

import logging

import pytest
import trio
from judges import (
    ScriptedJudge,
    compare_input,
    gather,
    member,
    probe,
    running,
    settings,
    verify,
)
from trio.testing import MockClock

from genrm_trio.domain.model import GroupFailed, Masked, Rejection, RequestRejected, Scored
from genrm_trio.domain.text import shown_id
from genrm_trio.engine import engine as engine_module


def rewards(replies: list[object]) -> list[float]:
    out = []
    for reply in replies:
        assert isinstance(reply, Scored), reply
        out.append(reply.result["reward"])
    return out


def rejected(reply: object, reason: Rejection, text: str) -> None:
    assert isinstance(reply, RequestRejected), reply
    assert reply.reason is reason, reply.detail
    assert text in reply.detail, reply.detail


# --- request models and the attempt-omitted log line ------------------------------------------


async def test_missing_group_attempt_logs_once_and_is_attempt_zero(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "_legacy_attempt_logged", False)
    judge = ScriptedJudge()
    caplog.set_level(logging.INFO, "genrm_trio")
    async with running(settings(num_rollouts_per_prompt=1), judge) as engine:
        for i in range(20):
            reply = await engine.verify(member(0, group=f"g{i}", attempt_given=False))
            assert isinstance(reply, Scored)
        await engine.verify(member(0, group=None, attempt_given=False))
    lines = [r for r in caplog.records if "group attempt omitted" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].getMessage() == (
        "GenRM group attempt omitted; treating legacy requests as group attempt zero"
    )


async def test_no_group_id_needs_no_attempt(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "_legacy_attempt_logged", False)
    judge = ScriptedJudge()
    async with running(settings(num_rollouts_per_prompt=1), judge) as engine:
        await engine.verify(member(0, group=None, attempt_given=False))
    assert not [r for r in caplog.records if "group attempt omitted" in r.getMessage()]


async def test_singleton_answers_defaults_without_judging(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    config = settings(num_rollouts_per_prompt=1, default_score=3.0)
    async with running(config, judge) as engine:
        reply = await engine.verify(member(None, reasoning="think"))
        assert isinstance(reply, Scored)
        assert reply.result == {
            "reward": 3.0,
            "mask_sample": False,
            "failure_kind": None,
            "failure_reason": None,
            "reasoning_text": "think",
            "answer_text": "aNone",
            "reward_score_raw": 3.0,
            "reward_rubric_aggregate_valid": None,
            "reward_overall_score_raw": 3.0,
            "reward_overall_score": 3.0,
            "reward_length_adjustment": 0.0,
            "genrm_parse_failure_rate_per_group": 0.0,
            "genrm_rubric_parse_failure_rate_per_group": 0.0,
            "genrm_input_tokens_per_comparison_mean": None,
            "genrm_input_tokens_per_comparison_p50": None,
            "genrm_input_tokens_per_comparison_p95": None,
            "genrm_output_tokens_per_comparison_mean": None,
            "genrm_output_tokens_per_comparison_p50": None,
            "genrm_output_tokens_per_comparison_p95": None,
            "genrm_output_tokens_total_per_group": None,
            "genrm_max_output_tokens_hit_rate_per_group": None,
            "genrm_failed_comparison_rate_per_group": 0.0,
            "genrm_masked_rollout_rate_per_group": 0.0,
            "genrm_eager_comparison_rate_per_group": 0.0,  # eager_comparisons (the default)
        }
    assert judge.calls == []


async def test_singleton_under_alternate_carries_the_disagreement_key(
    autojump_clock: MockClock,
) -> None:
    config = settings(num_rollouts_per_prompt=1, position_balance="alternate")
    async with running(config, ScriptedJudge()) as engine:
        reply = await engine.verify(member(0))
        assert isinstance(reply, Scored)
        assert reply.result["genrm_position_disagreement_rate_per_group"] is None


async def test_rubric_mean_without_ids_is_422_before_anything(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(score_source="rubric_mean"), judge) as engine:
        reply = await verify(engine, member(0))
        rejected(reply, Rejection.INVALID, "score_source=rubric_mean requires expected_rubric_ids")
        assert engine.statistics().cohorts == 0


async def test_fixed_baseline_needs_a_baseline(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(comparison_mode="fixed_baseline"), judge) as engine:
        for baseline in (None, "   "):
            reply = await verify(engine, member(0, baseline=baseline))
            rejected(
                reply,
                Rejection.INVALID,
                "fixed_baseline requires responses_create_params.metadata.baseline_response",
            )
        assert engine.statistics().cohorts == 0


async def test_bad_history_role_is_422_and_touches_nothing(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    prompt = [{"type": "message", "role": "wizard", "content": "Hi"}]
    async with running(settings(), judge) as engine:
        reply = await verify(engine, member(0, prompt=prompt))
        assert isinstance(reply, RequestRejected) and reply.reason is Rejection.INVALID
        stats = engine.statistics()
        assert stats.cohorts == 0 and stats.watermarks == 0


# --- keys, digests, prompt handling -------------------------------------------------------------


async def test_cohort_key_formats_and_group_id_wins(autojump_clock: MockClock) -> None:
    from genrm_trio.domain.text import prompt_digest

    judge = ScriptedJudge()
    digest = prompt_digest("Hello", None)
    async with running(settings(), judge) as engine, trio.open_nursery() as nursery:
        for item in (
            member(0, group=None, task_index=7),
            member(0, group=None, prompt_id="prompt-123"),
            member(0, group=None),
            member(0, group="grp", task_index=7),
        ):
            nursery.start_soon(verify, engine, item)
            await trio.testing.wait_all_tasks_blocked()
        keys = [view.key for view in engine.active_cohorts()]
        assert keys == [
            f"task_idx::7::{digest}::group_attempt::0",
            f"prompt_id::prompt-123::{digest}::group_attempt::0",
            f"{digest}::group_attempt::0",
            "group_id::grp::group_attempt::0",
        ]
        await engine.aclose()


async def test_key_suffixes_for_baseline_and_rubrics(autojump_clock: MockClock) -> None:
    from genrm_trio.domain.text import digest_text

    judge = ScriptedJudge()
    config = settings(comparison_mode="fixed_baseline", num_rollouts_per_prompt=2)
    async with running(config, judge) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(
            verify, engine, member(0, group="grp", baseline="base", rubric_ids=(1, 2))
        )
        await trio.testing.wait_all_tasks_blocked()
        [view] = engine.active_cohorts()
        assert view.key == (f"group_id::grp::group_attempt::0:{digest_text('base')}:rubrics:1,2")
        await engine.aclose()


@pytest.mark.parametrize(
    "prompt",
    [
        "Hello",
        [{"role": "user", "content": "Hello"}],
        [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]}],
    ],
)
async def test_judge_receives_normalized_prompt(autojump_clock: MockClock, prompt: object) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        await gather(engine, [member(0, prompt=prompt), member(1, prompt=prompt)])
    assert [c.call.history for c in judge.calls] == [[{"role": "user", "content": "Hello"}]] * 2


async def test_reasoning_is_not_a_fake_user_message(autojump_clock: MockClock) -> None:
    prompt = [
        {"type": "message", "role": "user", "content": "Q1"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "secret"}]},
        {"type": "message", "role": "assistant", "content": "A1"},
        {"type": "message", "role": "user", "content": "Q2"},
    ]
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        await gather(engine, [member(0, prompt=prompt), member(1, prompt=prompt)])
    assert judge.calls[0].call.history == [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
    ]


async def test_shared_judging_sees_no_request_context(autojump_clock: MockClock) -> None:
    """Judge calls of /verify run in a fresh context: nothing set by a request leaks in."""
    judge = ScriptedJudge()

    async def send(i: int) -> object:
        probe.set(f"rollout-{i}")
        return await verify(engine, member(i))

    async with running(settings(), judge) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(send, 0)
        nursery.start_soon(send, 1)
    assert len(judge.calls) == 2
    assert [c.probe for c in judge.calls] == [None, None]


async def test_compare_runs_in_the_request_context(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        probe.set("compare-caller")
        await engine.compare(compare_input(["a0", "a1"]))
    assert [c.probe for c in judge.calls] == ["compare-caller"] * 2


async def test_group_attempt_two_maps_results_by_index(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        replies = await gather(engine, [member(1, attempt=2), member(0, attempt=2)])
        assert rewards(replies) == [2.0, 1.0]


# --- formation, replay, conflicts ---------------------------------------------------------------


async def test_full_cohort_matches_compare_and_circular_order(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    n = 16
    async with running(settings(num_rollouts_per_prompt=n), judge) as engine:
        replies = await gather(engine, [member(i) for i in range(n)])
        verify_calls = sorted(c.shown for c in judge.calls)
        direct = await engine.compare(compare_input([f"a{i}" for i in range(n)]))
    assert rewards(replies) == direct.rewards
    assert verify_calls == sorted((f"a{i}", f"a{(i + 1) % n}") for i in range(n))
    assert direct.comparison_results is not None
    assert [
        (r["response_i"], r["response_j"], r["judge_idx"]) for r in direct.comparison_results
    ] == [(i, (i + 1) % n, 0) for i in range(n)]


async def test_rewards_follow_rollout_index_not_arrival(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    t0 = trio.current_time()
    # Pins that every comparison waits for the last member (eager: (2,0) starts at 0.1).
    config = settings(num_rollouts_per_prompt=3, eager_comparisons=False)
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(2), member(0), member(1)], stagger=0.1)
    # circular over a0(q1), a1(q2), a2(q3): (0,1) (1,2) (2,0)
    assert rewards(replies) == [3.0, 1.0, 2.0]
    assert sorted(c.shown for c in judge.calls) == [("a0", "a1"), ("a1", "a2"), ("a2", "a0")]
    assert [c.started - t0 for c in judge.calls] == pytest.approx([0.2] * 3)


async def test_identical_duplicate_attaches_to_its_slot(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        replies = await gather(
            engine, [member(0, group=None), member(0, group=None), member(1, group=None)]
        )
        assert rewards(replies) == [1.0, 1.0, 2.0]
        assert len(judge.calls) == 2
        assert engine.statistics().cohorts == 0  # completed legacy cohorts are not retained


async def test_conflicting_duplicate_is_rejected_without_growing_cohort(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(verify, engine, member(0))
            await trio.testing.wait_all_tasks_blocked()
            reply = await verify(engine, member(0, answer="other"))
            rejected(
                reply,
                Rejection.CONFLICT,
                "GenRM cohort 'group_id::g::group_attempt::0' already has a different response "
                "for rollout_index=0",
            )
            [view] = engine.active_cohorts()
            assert view.members_present == 1
            assert rewards([await verify(engine, member(1))]) == [2.0]
        assert len(judge.calls) == 2


async def test_legacy_prompt_only_cohort(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        replies = await gather(engine, [member(0, group=None), member(1, group=None)])
    assert rewards(replies) == [1.0, 2.0]


async def test_completed_legacy_cohort_does_not_block_sequential_rerun(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        first = await gather(engine, [member(0, group=None), member(1, group=None)])
        second = await gather(engine, [member(0, group=None), member(1, group=None)])
    assert rewards(first) == rewards(second) == [1.0, 2.0]
    assert len(judge.calls) == 4


async def test_invalid_coordinates_are_422_and_touch_nothing(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        rejected(
            await verify(engine, member(None)),
            Rejection.INVALID,
            "_ng_rollout_index is required for cohort comparison",
        )
        rejected(
            await verify(engine, member(2)),
            Rejection.INVALID,
            "_ng_rollout_index must be in [0, 2); got 2",
        )
        rejected(
            await verify(engine, member(-1)),
            Rejection.INVALID,
            "_ng_rollout_index must be in [0, 2); got -1",
        )
        stats = engine.statistics()
        assert stats.cohorts == 0 and stats.watermarks == 0


async def test_late_identical_duplicate_replays_without_judging(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        first = await gather(engine, [member(0), member(1)])
        assert engine.statistics().waiters == 0
        replay = await verify(engine, member(1))
        assert replay == first[1]
        assert len(judge.calls) == 2


async def test_judging_waits_for_full_group_then_exact_retry_replays(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(verify, engine, member(0))
            await trio.sleep(0.5)
            assert judge.calls == []
            await verify(engine, member(1))
        assert len(judge.calls) == 2
        assert rewards([await verify(engine, member(0))]) == [1.0]
        assert len(judge.calls) == 2


async def test_simultaneous_groups_do_not_mix(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        replies = await gather(
            engine,
            [
                member(0, group="x", answer="a0"),
                member(0, group="y", answer="a3"),
                member(1, group="x", answer="a1"),
                member(1, group="y", answer="a4"),
            ],
        )
    assert rewards(replies) == [1.0, 4.0, 2.0, 5.0]


async def test_engines_do_not_share_cohorts(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with (
        running(settings(), judge) as one,
        running(settings(), judge) as two,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(verify, one, member(0))
        nursery.start_soon(verify, two, member(1))
        await trio.testing.wait_all_tasks_blocked()
        assert [v.members_present for v in one.active_cohorts()] == [1]
        assert [v.members_present for v in two.active_cohorts()] == [1]
        await one.aclose()
        await two.aclose()
    assert judge.calls == []


# --- attempts, supersession, prompt consistency -------------------------------------------------


async def test_new_attempt_is_isolated_from_completed_cohort(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        await gather(engine, [member(0), member(1)])
        await gather(engine, [member(0, attempt=1, answer="a3"), member(1, attempt=1)])
        assert len(judge.calls) == 4
        assert engine.statistics().terminal_records == 2


async def test_partial_old_attempt_is_superseded_by_new_attempt(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        async with trio.open_nursery() as nursery:
            old: list[object] = []

            async def old_member() -> None:
                old.append(await verify(engine, member(0)))

            nursery.start_soon(old_member)
            await trio.testing.wait_all_tasks_blocked()
            new = await gather(engine, [member(0, attempt=1), member(1, attempt=1)])
        assert old == [
            GroupFailed(
                "cohort", "GenRM group 'g' attempt 0 was superseded by attempt 1", "superseded"
            )
        ]
        assert rewards(new) == [1.0, 2.0]
        by_state = engine.statistics().cohorts_by_state
        assert by_state == {"failed": 1, "scored": 1}


async def test_late_older_attempt_is_rejected(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        await gather(engine, [member(0, attempt=1), member(1, attempt=1)])
        rejected(
            await verify(engine, member(0, attempt=0)),
            Rejection.CONFLICT,
            "GenRM group 'g' attempt 0 was superseded by attempt 1",
        )
        assert [(w.group_id, w.latest_attempt) for w in engine.watermark_records()] == [("g", 1)]


async def test_exact_replay_of_older_completed_attempt_is_superseded(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        await gather(engine, [member(0), member(1)])
        await gather(engine, [member(0, attempt=1), member(1, attempt=1)])
        rejected(await verify(engine, member(0)), Rejection.CONFLICT, "was superseded by attempt 1")


async def test_prompt_mismatch_cannot_supersede_active_attempt(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(verify, engine, member(0))
        await trio.testing.wait_all_tasks_blocked()
        rejected(
            await verify(engine, member(0, attempt=1, prompt="Other")),
            Rejection.CONFLICT,
            "GenRM group 'g' received inconsistent prompt or principle content",
        )
        assert [(w.latest_attempt) for w in engine.watermark_records()] == [0]
        [view] = engine.active_cohorts()
        assert view.state == "collecting" and view.group_attempt == 0
        await verify(engine, member(1))


async def test_prompt_mismatch_in_same_attempt_is_rejected(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(verify, engine, member(0))
        await trio.testing.wait_all_tasks_blocked()
        for changed in (member(1, prompt="Other"), member(1, principle="be terse")):
            rejected(await verify(engine, changed), Rejection.CONFLICT, "inconsistent prompt")
        await verify(engine, member(1))


async def test_legacy_cohort_prompt_conflict_uses_cohort_template(
    autojump_clock: MockClock,
) -> None:
    """A legacy key embeds the digest, so only a suffix mismatch could differ; an explicit key
    reused with another rubric contract hits the group template first."""
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(verify, engine, member(0, rubric_ids=(1,)))
        await trio.testing.wait_all_tasks_blocked()
        rejected(
            await verify(engine, member(1, rubric_ids=(2,))),
            Rejection.CONFLICT,
            "GenRM group 'g' received inconsistent prompt or principle content",
        )
        await verify(engine, member(1, rubric_ids=(1,)))


async def test_late_judge_result_cannot_publish_after_supersession(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge(latency=0.15)
    async with running(settings(), judge) as engine:
        async with trio.open_nursery() as nursery:
            old: list[object] = []

            async def old_member(i: int) -> None:
                old.append(await verify(engine, member(i)))

            nursery.start_soon(old_member, 0)
            nursery.start_soon(old_member, 1)
            await trio.sleep(0.1)  # attempt 0 is judging; its calls would end at 0.15
            new = await gather(
                engine, [member(0, attempt=1, answer="a3"), member(1, attempt=1, answer="a4")]
            )
        message = "GenRM group 'g' attempt 0 was superseded by attempt 1"
        assert old == [GroupFailed("cohort", message, "superseded")] * 2
        assert rewards(new) == [4.0, 5.0]
        assert [c.cancelled for c in judge.calls] == [True, True, False, False]
        assert engine.statistics().cohorts_by_state == {"failed": 1, "scored": 1}


async def test_masked_member_replays_its_reason_for_any_answer(autojump_clock: MockClock) -> None:
    """A masked-alone member replays its judge failure, even for a regenerated answer."""
    from judges import http_error

    judge = ScriptedJudge(pairs={("a0", "a1"): http_error()})
    async with running(settings(num_rollouts_per_prompt=4), judge) as engine:
        first = await gather(engine, [member(i) for i in range(4)])
        assert isinstance(first[0], Masked)
        assert await verify(engine, member(0)) == first[0]
        assert await verify(engine, member(0, answer="regenerated")) == first[0]
        assert await verify(engine, member(2)) == first[2]
        rejected(
            await verify(engine, member(2, answer="regenerated")),
            Rejection.CONFLICT,
            "already has a different response for rollout_index=2",
        )
        assert len(judge.calls) == 4


# --- rubric contracts, metrics denominators, principles ----------------------------------------


def rubric_text(entries: list[tuple[int, float, float, float]], overall: tuple[float, ...]) -> str:
    import json

    return json.dumps(
        {
            "rubric_evaluations": [
                {"rubric_id": rid, "score_1": s1, "score_2": s2, "ranking": r}
                for rid, s1, s2, r in entries
            ],
            "overall": dict(zip(("score_1", "score_2", "ranking"), overall, strict=True)),
        }
    )


async def test_rubric_mean_scores_and_validity(autojump_clock: MockClock) -> None:
    from judges import Step

    judge = ScriptedJudge(
        pairs={
            ("a0", "a1"): Step(text=rubric_text([(1, 4, 2, 2), (2, 2, 2, 3)], (5, 1, 1))),
            ("a1", "a2"): Step(text='{"score_1": 4, "score_2": 2, "ranking": 2}'),  # no rubric
            ("a2", "a0"): Step(text=rubric_text([(1, 3, 3, 2), (2, 5, 1, 1)], (3, 3, 3.5))),
        }
    )
    config = settings(num_rollouts_per_prompt=3, score_source="rubric_mean")
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i, rubric_ids=(1, 2)) for i in range(3)])
    rows = [r.result for r in replies if isinstance(r, Scored)]
    assert len(rows) == 3
    # selected triples: (0,1) -> (3, 2, 2.5); (1,2) -> fallback (3, 3, 3.5) tie, d=0;
    # (2,0) -> (4, 2, 1.5). member 0: (3 + 2) / 2; member 1: (2 + 3) / 2; member 2: (3 + 4) / 2
    assert [row["reward"] for row in rows] == [2.5, 2.5, 3.5]
    # overall triples: (5,1,1), (4,2,2), (3,3,3.5)->tie d=0: m0 (5+3)/2, m1 (1+4)/2, m2 (2+3)/2
    assert [row["reward_overall_score"] for row in rows] == [4.0, 2.5, 2.5]
    # validity: (1,2) failed rubric parsing, so members 1 and 2 are None; member 0 from the rest
    assert [row["reward_rubric_aggregate_valid"] for row in rows] == [2.5, None, None]
    assert rows[0]["genrm_rubric_parse_failure_rate_per_group"] == 1 / 3
    assert rows[0]["genrm_parse_failure_rate_per_group"] == 0.0


async def test_failed_comparisons_count_in_token_metrics_only(autojump_clock: MockClock) -> None:
    """D32: parse-failure rates over successful comparisons; token metrics over every comparison
    that reported usage, failed ones included."""
    from judges import Step

    from genrm_trio.judge.base import ReplyStatus

    judge = ScriptedJudge(
        pairs={
            ("a0", "a1"): Step(text="", status=ReplyStatus.UNUSABLE, output_tokens=50),
            ("a1", "a2"): Step(text="no verdict here", output_tokens=30),
        }
    )
    async with running(settings(num_rollouts_per_prompt=4), judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
    rows = {i: r.result for i, r in enumerate(replies) if isinstance(r, Scored)}
    assert sorted(rows) == [2, 3]
    row = rows[2]
    assert row["genrm_parse_failure_rate_per_group"] == 1 / 3  # (1,2) fell back, of 3 successful
    assert row["genrm_output_tokens_total_per_group"] == 50 + 30 + 10 + 10
    assert row["genrm_output_tokens_per_comparison_mean"] == 25.0
    assert row["genrm_input_tokens_per_comparison_mean"] == 100.0
    assert row["genrm_max_output_tokens_hit_rate_per_group"] == 0.0
    assert row["genrm_failed_comparison_rate_per_group"] == 0.25


async def test_principle_reaches_verify_judging_only_when_enabled(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge()
    config = settings(use_principle=True, default_principle="DEFAULT")
    async with running(config, judge) as engine:
        await gather(engine, [member(0, principle="be kind"), member(1, principle="be kind")])
        await gather(engine, [member(0, group="h"), member(1, group="h")])
    assert [c.call.principle for c in judge.calls] == ["be kind"] * 2 + ["DEFAULT"] * 2
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        await gather(engine, [member(0, principle="be kind"), member(1, principle="be kind")])
    assert [c.call.principle for c in judge.calls] == [None, None]


async def test_empty_answer_is_shown_as_none(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        replies = await gather(engine, [member(0, answer="  "), member(1)])
    assert sorted(c.shown for c in judge.calls) == [("None", "a1"), ("a1", "None")]
    assert isinstance(replies[0], Scored) and replies[0].result["answer_text"] == "  "


# --- a client's long group id in the texts ------------------------------------------------------


async def test_a_long_group_id_is_cut_in_every_detail_and_stored_failure(
    autojump_clock: MockClock,
) -> None:
    """A 10,000-character group id shows its first 1,000 characters (`shown_id`) in the 409 and
    503 details and in the stored failure, which so stay within failure_reason's 2,000."""
    group = "g" * 10_000
    key = f"group_id::{group}::group_attempt::1"
    config = settings(num_rollouts_per_prompt=2, cohort_collection_timeout_s=5.0)
    async with running(config, ScriptedJudge()) as engine:
        replies: dict[str, object] = {}

        async def send(name: str, item: object) -> None:
            replies[name] = await verify(engine, item)  # type: ignore[arg-type]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "first", member(0, group=group, attempt=1))
            await trio.sleep(1.0)
            stale = await verify(engine, member(0, group=group, attempt=0))
            other_prompt = await verify(engine, member(0, group=group, attempt=1, prompt="Bye"))
            other_answer = await verify(engine, member(0, group=group, attempt=1, answer="b0"))
            nursery.start_soon(send, "newer", member(0, group=group, attempt=2))
        late = await verify(engine, member(1, group=group, attempt=2))
    shown, shown_key = shown_id(group), shown_id(key)
    shown_newer = shown_id(f"group_id::{group}::group_attempt::2")
    assert shown == repr("g" * 1000) + "… (10000 characters)"
    rejected(
        stale, Rejection.CONFLICT, f"GenRM group {shown} attempt 0 was superseded by attempt 1"
    )
    rejected(
        other_prompt,
        Rejection.CONFLICT,
        f"GenRM group {shown} received inconsistent prompt or principle content",
    )
    rejected(
        other_answer,
        Rejection.CONFLICT,
        f"GenRM cohort {shown_key} already has a different response for rollout_index=0",
    )
    assert replies["first"] == GroupFailed(
        "cohort", f"GenRM group {shown} attempt 1 was superseded by attempt 2", "superseded"
    )
    collection = GroupFailed(
        "cohort",
        f"GenRM cohort {shown_newer} did not collect 2 unique rollout indices within 5.0s",
    )
    assert replies["newer"] == collection
    assert late == collection  # the stored failure, replayed
    texts = [stale.detail, other_prompt.detail, other_answer.detail]  # type: ignore[union-attr]
    texts += [replies["first"].message, collection.message]  # type: ignore[union-attr]
    assert all(len(text) < 2000 for text in texts)
