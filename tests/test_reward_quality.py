"""The simulated judge's noisy-judge modes (genrm_trio.testing.judgment) and the reward-quality
benchmark (benchmarks/reward_quality.py, docs/benchmarks.md "Reward quality"): deterministic
draws, the families' calibration, the wiring through both front ends and the flags, and the
benchmark's direct path against the engine."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from loading import load_script

from genrm_trio.app.cli import main
from genrm_trio.domain.verdict import parse_overall
from genrm_trio.judge.base import JudgeCall
from genrm_trio.testing import SimConfig, SimJudge, sim_asgi_app
from genrm_trio.testing.flags import judgment_from_args, sim_config_from_args
from genrm_trio.testing.judgment import (
    JUDGMENT_PRESETS,
    JudgmentModel,
    call_key,
    judged_verdict,
    latent_quality,
)

HISTORY = [{"role": "user", "content": "Which is better?"}]


def verdict_of(text: str) -> tuple[float, ...]:
    return tuple(parse_overall(text, default_score=3.0, default_ranking=3.5, validate_range=True))


def swap_statistics(model: JudgmentModel, pairs: int = 20000) -> dict[str, float]:
    """Position-swap outcomes of random pairs of one group (q ~ N(0, 1) each), judged once in
    each order: consistent, first both times, second both times; and single-call accuracy."""
    rng = random.Random(7)
    counts = {"consistent": 0, "first": 0, "second": 0, "accurate": 0}
    for n in range(pairs):
        qa, qb = rng.gauss(0, 1), rng.gauss(0, 1)
        ab = judged_verdict(model, 0, b"ab%d" % n, 0, qa, qb)
        ba = judged_verdict(model, 0, b"ba%d" % n, 0, qb, qa)
        a_in_ab, a_in_ba = ab[2] < 3.5, ba[2] > 3.5
        if a_in_ab == a_in_ba:
            counts["consistent"] += 1
        elif a_in_ab:
            counts["first"] += 1
        else:
            counts["second"] += 1
        counts["accurate"] += a_in_ab == (qa > qb)
    return {k: v / pairs for k, v in counts.items()}


class TestJudgment:
    @pytest.mark.parametrize("family", ["comparative", "pointwise"])
    def test_presets_reproduce_the_mt_bench_swap_figures(self, family: str) -> None:
        """GPT-4 on MT-Bench (Zheng et al. 2023, Table 2): consistent 65 %, biased to the first
        answer 30 %, to the second 5 %; each family's preset is fitted to those."""
        stats = swap_statistics(JUDGMENT_PRESETS[family])
        assert stats["consistent"] == pytest.approx(0.65, abs=0.015)
        assert stats["first"] == pytest.approx(0.30, abs=0.015)
        assert stats["second"] == pytest.approx(0.05, abs=0.01)
        assert stats["accurate"] == pytest.approx(0.77, abs=0.015)

    def test_comparative_scores_and_ranking_tell_one_story(self) -> None:
        model = JUDGMENT_PRESETS["comparative"]
        for n in range(500):
            s1, s2, r = judged_verdict(model, 3, b"k%d" % n, 0, 0.3, -0.2)
            assert s1 + s2 == 6 and 1 <= r <= 6
            level = abs(s1 - 3)
            assert r == (3 - level if s1 >= s2 and r < 3.5 else 4 + level)

    def test_without_noise_and_bias_the_better_answer_wins(self) -> None:
        clean = JudgmentModel("comparative", noise=0.0, bias=0.0)
        assert judged_verdict(clean, 0, b"k", 0, 2.0, 0.0) == (5, 1, 1)  # |z| = 2 ≥ 2 steps
        assert judged_verdict(clean, 0, b"k", 0, 0.0, 1.0) == (2, 4, 5)
        assert judged_verdict(clean, 0, b"k", 0, 0.1, 0.0) == (3, 3, 3)
        pointwise = JudgmentModel("pointwise", noise=0.0, bias=0.0, beta=1e6)
        assert judged_verdict(pointwise, 0, b"k", 0, 1.2, -0.9) == (4, 2, 1)

    def test_draws_are_deterministic_and_fresh_per_occurrence(self) -> None:
        model = JUDGMENT_PRESETS["pointwise"]
        first = [judged_verdict(model, 1, b"key", k, 0.0, 0.0) for k in range(40)]
        again = [judged_verdict(model, 1, b"key", k, 0.0, 0.0) for k in range(40)]
        assert first == again
        assert len(set(first)) > 5  # each occurrence is a fresh sample
        assert judged_verdict(model, 2, b"key", 0, 0.0, 0.0) != first[0] or first[1] != first[0]

    def test_latent_quality_is_a_standard_normal_of_seed_and_text(self) -> None:
        values = [latent_quality(0, f"answer {i}") for i in range(4000)]
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / len(values)
        assert abs(mean) < 0.06 and abs(var - 1.0) < 0.08
        assert latent_quality(0, "x") == latent_quality(0, "x") != latent_quality(1, "x")

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"family": "ranked", "noise": 1.0, "bias": 0.0}, "unknown judgment family"),
            ({"family": "comparative", "noise": -1.0, "bias": 0.0}, "noise must be"),
            ({"family": "pointwise", "noise": 1.0, "bias": float("nan")}, "bias must be finite"),
            ({"family": "pointwise", "noise": 1.0, "bias": 0.0, "beta": -2.0}, "beta must be"),
        ],
    )
    def test_bad_models(self, kwargs: dict[str, Any], message: str) -> None:
        with pytest.raises(ValueError, match=message):
            JudgmentModel(**kwargs)


class TestFrontEnds:
    async def test_in_process_judge_answers_the_noisy_verdicts(self) -> None:
        model = JUDGMENT_PRESETS["comparative"]
        judge = SimJudge(SimConfig(seed=5, judgment=model))
        call = JudgeCall(HISTORY, "answer a", "answer b", None)
        key = call_key(call)
        qa, qb = latent_quality(5, "answer a"), latent_quality(5, "answer b")
        for occurrence in range(3):  # the same content three times: three fresh samples
            reply = await judge.attempt(call)
            expected = judged_verdict(model, 5, key, occurrence, qa, qb)
            assert verdict_of(reply.text) == tuple(float(x) for x in expected)

    async def test_http_front_end_answers_the_same(self) -> None:
        model = JUDGMENT_PRESETS["pointwise"]
        app = sim_asgi_app(SimConfig(seed=2, judgment=model))
        body = {
            "model": "m",
            "input": HISTORY,
            "metadata": {"response_1": "one", "response_2": "two"},
        }
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://sim"
        ) as client:
            reply = await client.post("/v1/responses", json=body)
        text = reply.json()["output"][0]["content"][0]["text"]
        key = call_key(JudgeCall(HISTORY, "one", "two", None))
        expected = judged_verdict(
            model, 2, key, 0, latent_quality(2, "one"), latent_quality(2, "two")
        )
        assert verdict_of(text) == tuple(float(x) for x in expected)

    def test_judgment_flags(self) -> None:
        assert judgment_from_args(None) is None
        assert judgment_from_args("comparative") == JUDGMENT_PRESETS["comparative"]
        assert judgment_from_args("pointwise", bias=0.0) == JudgmentModel(
            "pointwise", noise=0.75, bias=0.0, beta=1.57
        )
        with pytest.raises(ValueError, match="--judgment-noise needs --judgment"):
            judgment_from_args(None, noise=1.0)
        config = sim_config_from_args(judgment=judgment_from_args("comparative", noise=0.5))
        assert config.judgment == JudgmentModel("comparative", noise=0.5, bias=0.57)
        with pytest.raises(TypeError, match="judgment must be a JudgmentModel"):
            SimConfig(judgment="comparative")  # type: ignore[arg-type]

    def test_cli_refuses_an_override_without_a_family(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["sim-judge", "--judgment-bias", "0.2"]) == 2
        err = capsys.readouterr().err
        # a usage mistake: the command's usage line, then the error
        assert err.startswith("usage: genrm-trio sim-judge [-h]")
        assert (
            err.splitlines()[-1] == "genrm-trio sim-judge: error: --judgment-bias needs --judgment"
        )


# --- the benchmark ------------------------------------------------------------------------------


def load_benchmark() -> Any:
    return load_script("benchmarks/reward_quality.py", "reward_quality_bench")


def test_kendall_tau_b() -> None:
    bench = load_benchmark()
    assert bench.kendall_tau_b([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert bench.kendall_tau_b([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert bench.kendall_tau_b([1, 1, 1], [1, 2, 3]) is None
    # 1,1,2 vs 1,2,3: concordant 2, discordant 0, one tie in x: 2 / sqrt(2 * 3)
    assert bench.kendall_tau_b([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / 6**0.5)


async def test_the_direct_path_is_the_engine(autojump_clock: trio.testing.MockClock) -> None:
    """Groups through open_engine with the in-process SimJudge (judgment mode plus the same
    failures) give exactly the rows of score_cohort and the rewards of the fast path."""
    bench = load_benchmark()
    names = ("circular-J1", "regular-d6", "all_pairs-J1-alternate")
    graphs = [g for g in bench.GRAPHS if g.name in names]
    checked = await bench.check_engine(2, 0, ("comparative", "pointwise"), graphs, rate=0.15)
    assert checked == 2 * 2 * 3 * 4


def test_cells_count_what_they_say() -> None:
    bench = load_benchmark()
    graph = next(g for g in bench.GRAPHS if g.name == "all_pairs-J1")
    cells, diffs = bench.run_cells("comparative", graph, 12, 0)
    by = {(c.rate, c.method, c.policy): c for c in cells}
    assert len(cells) == 3 * 2 * 2
    assert all(c.groups == 12 and c.calls_per_group == 120 for c in cells)
    for method in bench.METHODS:
        assert by[(0.0, method, "pair")].scored == by[(0.0, method, "component")].scored == 12 * 16
        assert by[(0.05, method, "component")].scored > by[(0.05, method, "pair")].scored
    assert len(by[(0.0, "bradley_terry", "pair")].cycles) == 12  # all_pairs has triangles
    assert by[(0.0, "simple_tiebreaker", "pair")].cycles == []
    assert len(diffs[(0.0, "pair")]) == 12
    record = bench.cell_record(by[(0.0, "bradley_terry", "pair")])
    assert record["share_scored"] == 1.0 and -1.0 <= record["kendall_tau"] <= 1.0


def test_main_writes_its_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    bench = load_benchmark()
    caplog.set_level(logging.INFO, logger="genrm_trio")
    out = tmp_path / "rq.json"
    code = bench.main(
        ["--groups", "3", "--only-family", "pointwise", "--only-graph", "circular-J1",
         "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    record = json.loads(out.read_text())
    assert record["groups"] == 3 and len(record["cells"]) == 12
    assert {c["calls_per_group"] for c in record["cells"]} == {16}
    printed = capsys.readouterr().out
    assert "| pointwise | circular-J1 | 0% | 16 |" in printed
    # main quiets the engine's log lines only while it runs: a later test in this process
    # still sees genrm_trio's records
    assert logging.getLogger("genrm_trio").level == logging.INFO
