"""The simulated judge's length model (`LengthModel`, `[need=N]` markers): how many output tokens
each attempt's verdict needs, deterministically, and what a budget below it answers — in process
and over both HTTP APIs."""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest
import trio
import trio.testing
from sim_bodies import chat_body, client, responses_body, responses_text

from genrm_trio.app.cli import main
from genrm_trio.judge.base import JudgeCall, ReplyStatus
from genrm_trio.testing import FaultRule, LengthModel, SimConfig, SimJudge, sim_asgi_app
from genrm_trio.testing.flags import sim_config_from_args
from genrm_trio.testing.verdicts import LENGTH_PRESETS, forced_need

HISTORY = [{"role": "user", "content": "Which answer is better?"}]
VALIDATION = LENGTH_PRESETS["validation"]


def call(r1: str, r2: str, budget: int | None = None) -> JudgeCall:
    return JudgeCall(HISTORY, r1, r2, None, max_output_tokens=budget)


async def needs(judge: SimJudge, calls: list[JudgeCall]) -> list[int | None]:
    for c in calls:
        await judge.attempt(c)
    return [c.need for c in judge.calls[-len(calls) :]]


# --- the distribution -----------------------------------------------------------------------------


async def test_validation_preset_fits_the_run() -> None:
    """Single attempts: 531-2,981 tokens, 1,341 near the 55th percentile; a pair's attempts vary."""
    judge = SimJudge(SimConfig(length_model=VALIDATION))
    pairs = 3000
    drawn = await needs(judge, [call(f"a{i}", f"b{i}", 10**6) for i in range(pairs) for _ in "12"])
    first = [n for n in drawn[0::2] if n is not None]
    second = [n for n in drawn[1::2] if n is not None]
    assert len(first) == len(second) == pairs
    assert (min(first), max(first)) == (531, 2981)  # clipped to the run's range, reached
    share_within = sum(n <= 1341 for n in first) / pairs
    assert 0.53 <= share_within <= 0.57
    assert sum(a != b for a, b in zip(first, second, strict=True)) / pairs > 0.95
    rho = statistics.correlation([math.log(a) for a in first], [math.log(b) for b in second])
    assert 0.05 < rho < 0.3  # same difficulty, fresh sample: positively but weakly correlated


async def test_long_tail_preset_is_long_tailed() -> None:
    judge = SimJudge(SimConfig(length_model=LENGTH_PRESETS["long_tail"]))
    drawn = [n for n in await needs(judge, [call(f"x{i}", f"y{i}") for i in range(3000)]) if n]
    over = sum(n > 16384 for n in drawn) / len(drawn)
    beyond_cap = sum(n > 32768 for n in drawn) / len(drawn)
    assert 0.38 < over < 0.50
    assert 0.07 < beyond_cap < 0.13


async def test_needs_are_deterministic_and_order_free() -> None:
    calls = [call("alpha", "beta"), call("alpha", "beta"), call("gamma", "delta")]
    one = await needs(SimJudge(SimConfig(length_model=VALIDATION, seed=7)), calls)
    two = await needs(SimJudge(SimConfig(length_model=VALIDATION, seed=7)), calls)
    other_seed = await needs(SimJudge(SimConfig(length_model=VALIDATION, seed=8)), calls)
    assert one == two
    assert one != other_seed
    # the pair shown the other way round is the same pair and the same attempt sequence
    swapped = await needs(
        SimJudge(SimConfig(length_model=VALIDATION, seed=7)),
        [call("beta", "alpha"), call("alpha", "beta"), call("delta", "gamma")],
    )
    assert swapped == one


def test_length_model_validation() -> None:
    with pytest.raises(ValueError, match="median"):
        LengthModel(0.0, 0.1, 0.1)
    with pytest.raises(ValueError, match="attempt_sigma"):
        LengthModel(100.0, 0.1, -0.1)
    with pytest.raises(ValueError, match="low <= high"):
        LengthModel(100.0, 0.1, 0.1, low=10, high=5)
    with pytest.raises(TypeError, match="length_model"):
        SimConfig(length_model="validation")  # type: ignore[arg-type]
    assert LengthModel(1000.0, 0.0, 0.0).need(3.0, -3.0) == 1000
    assert LengthModel(1000.0, 1.0, 0.0, low=1, high=2000).need(5.0, 0.0) == 2000


# --- markers --------------------------------------------------------------------------------------


def test_forced_need_marker() -> None:
    assert forced_need("plain", "plain", 0) is None
    assert forced_need("hard [need=2000]", "easy", 0) == 2000
    assert forced_need("easy", "hard [need=2000]", 5) == 2000
    assert [forced_need("[need=3000/1000]", "b", k) for k in range(3)] == [3000, 1000, 1000]
    assert forced_need("[need=900]", "[need=1500/100]", 0) == 1500  # the larger of the two
    assert forced_need("[need=900]", "[need=1500/100]", 1) == 900


@pytest.mark.parametrize("model", [None, VALIDATION], ids=["no-model", "model"])
async def test_marker_forces_the_need_in_process(model: LengthModel | None) -> None:
    judge = SimJudge(SimConfig(length_model=model))
    short = await judge.attempt(call("[need=2000] a", "b", 1341))
    enough = await judge.attempt(call("[need=2000] a", "b", 2000))
    assert (short.status, short.output_tokens) == (ReplyStatus.BUDGET_EXHAUSTED, 1341)
    assert short.text == ""
    assert (enough.status, enough.output_tokens) == (ReplyStatus.COMPLETED, 2000)
    assert '"score_1"' in enough.text
    assert [(c.max_output_tokens, c.need) for c in judge.calls] == [(1341, 2000), (2000, 2000)]
    assert judge.statistics().exhausted == 1
    assert judge.statistics().faults == 0  # a length cut-off is not a fault


async def test_without_model_or_marker_nothing_changes() -> None:
    judge = SimJudge(SimConfig())
    reply = await judge.attempt(call("a", "b", 5))  # a tiny budget: still answered, as before
    assert reply.status is ReplyStatus.COMPLETED
    assert reply.output_tokens == len(reply.text) // 4
    assert judge.calls[0].need is None


async def test_call_without_budget_uses_the_default_budget() -> None:
    judge = SimJudge(SimConfig())
    cut = await judge.attempt(call("[need=20000]", "b"))
    assert (cut.status, cut.output_tokens) == (ReplyStatus.BUDGET_EXHAUSTED, 16384)


async def test_faulted_attempt_is_still_a_sample_of_its_pair() -> None:
    """A fault decides the reply, but the pair's attempt counter moves on."""
    judge = SimJudge(SimConfig(rules=[FaultRule("garbage", match="[need", times=1)]))
    first = await judge.attempt(call("[need=3000/1000]", "b", 1341))
    second = await judge.attempt(call("[need=3000/1000]", "b", 1341))
    assert first.status is ReplyStatus.COMPLETED and "cannot decide" in first.text
    assert (second.status, second.output_tokens) == (ReplyStatus.COMPLETED, 1000)
    assert [c.need for c in judge.calls] == [None, 1000]


# --- over HTTP ------------------------------------------------------------------------------------


def with_budget(body: dict[str, Any], key: str, budget: int) -> dict[str, Any]:
    return {**body, key: budget}


async def test_responses_api_reads_max_output_tokens(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = sim_asgi_app(SimConfig(length_model=VALIDATION))
    body = responses_body("[need=2000] x", "y")
    async with client(app) as http:
        with trio.fail_after(10):
            cut = await http.post("/responses", json=with_budget(body, "max_output_tokens", 1341))
            done = await http.post("/responses", json=with_budget(body, "max_output_tokens", 2682))
    cut_body, done_body = cut.json(), done.json()
    assert cut_body["status"] == "incomplete"
    assert cut_body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert cut_body["usage"]["output_tokens"] == 1341
    assert done_body["status"] == "completed"
    assert done_body["usage"]["output_tokens"] == 2000
    assert '"score_1"' in responses_text(done_body)
    assert [(c.max_output_tokens, c.need) for c in app.sim.calls] == [(1341, 2000), (2682, 2000)]


async def test_chat_api_reads_max_tokens(autojump_clock: trio.testing.MockClock) -> None:
    app = sim_asgi_app(SimConfig())
    body = chat_body("x", "[need=1500/900] y")
    async with client(app) as http:
        with trio.fail_after(10):
            cut = await http.post("/chat/completions", json=with_budget(body, "max_tokens", 1000))
            done = await http.post("/chat/completions", json=with_budget(body, "max_tokens", 1000))
    assert cut.json()["choices"][0]["finish_reason"] == "length"
    assert cut.json()["usage"]["completion_tokens"] == 1000
    assert done.json()["choices"][0]["finish_reason"] == "stop"  # the second attempt needs 900
    assert done.json()["usage"]["completion_tokens"] == 900
    assert app.sim.statistics().exhausted == 1


def test_sim_config_from_args_length_model() -> None:
    assert sim_config_from_args(length_model="validation").length_model == VALIDATION
    assert sim_config_from_args().length_model is None
    with pytest.raises(ValueError, match="unknown length model"):
        sim_config_from_args(length_model="gigantic")


def test_sim_judge_length_model_flag_reaches_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import genrm_trio.testing.flags as flags

    seen: dict[str, Any] = {}

    def capture(**kwargs: Any) -> SimConfig:
        seen.update(kwargs)
        raise ValueError("stop here")  # reported as a usage error: no server starts

    monkeypatch.setattr(flags, "sim_config_from_args", capture)
    assert main(["sim-judge", "--length-model", "long_tail"]) == 2
    assert seen["length_model"] == "long_tail"
    seen.clear()
    assert main(["sim-judge"]) == 2
    assert seen["length_model"] is None


def test_sim_judge_rejects_an_unknown_length_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim-judge", "--length-model", "gigantic"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: genrm-trio sim-judge [-h]")  # a usage mistake
    assert err.splitlines()[-1].startswith(
        "genrm-trio sim-judge: error: argument --length-model: invalid choice: 'gigantic'"
    )
