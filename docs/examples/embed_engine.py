"""Embed the genrm-trio engine in a trio program: one group of 4 rollouts, one failed comparison.

The simulated judge answers every comparison from the `[quality=N]` markers in the answers, except
the comparison that shows the "Lyon" answer first, which gets HTTP 500 on every attempt. Under
`circular` that is comparison (2, 3): rollouts 2 and 3 are masked, 0 and 1 are scored from both
of their comparisons.

    python docs/examples/embed_engine.py
"""

from __future__ import annotations

import trio

from genrm_trio import (
    CompareInput,
    GroupFailed,
    Masked,
    MemberOutcome,
    Scored,
    Settings,
    VerifyInput,
    open_engine,
)
from genrm_trio.testing import FaultRule, SimConfig, SimJudge

SETTINGS = Settings.model_validate(
    {
        "num_rollouts_per_prompt": 4,
        "comparison_strategy": "circular",
        "cohort_collection_timeout_s": 60.0,
        "cohort_evaluation_timeout_s": 60.0,
        "judge_request_timeout_s": 10.0,
        "genrm_parse_retries": 1,  # two attempts per comparison, one shared budget
        "genrm_parse_retry_sleep_s": 0.0,
    }
)
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]
ANSWERS = [
    "Paris. [quality=5]",
    "The capital is Paris. [quality=4]",
    "Lyon, I think. [quality=2]",
    "Marseille. [quality=1]",
]


def response(i: int, answer: str) -> dict[str, object]:
    """A policy response as the trainer sends it (OpenAI Responses shape)."""
    return {
        "id": f"resp-{i}",
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": answer}],
            }
        ],
    }


async def main() -> dict[int, MemberOutcome]:
    rule = FaultRule(fault="http_500", match="Lyon", position="first", body="judge unavailable")
    judge = SimJudge(SimConfig(rules=[rule]))
    outcomes: dict[int, MemberOutcome] = {}
    try:
        async with open_engine(SETTINGS, judge) as engine:

            async def rollout(i: int) -> None:
                item = VerifyInput(
                    input=PROMPT,
                    response=response(i, ANSWERS[i]),
                    group_id="demo-group",
                    group_attempt=0,
                    group_attempt_given=True,
                    rollout_index=i,
                )
                outcomes[i] = await engine.verify(item)  # waits for the whole group

            async with trio.open_nursery() as nursery:
                for i in range(len(ANSWERS)):
                    nursery.start_soon(rollout, i)

            for i, outcome in sorted(outcomes.items()):
                if isinstance(outcome, Scored):
                    print(f"rollout {i}: reward {outcome.result['reward']:.2f}")
                elif isinstance(outcome, Masked):
                    print(f"rollout {i}: masked: {outcome.reason}")
                elif isinstance(outcome, GroupFailed):
                    print(f"rollout {i}: group failed ({outcome.kind}): {outcome.message}")

            pair = [response(0, ANSWERS[0]), response(1, ANSWERS[1])]
            result = await engine.compare(CompareInput(history=PROMPT, responses=pair))
            print(f"compare rewards: {result.rewards}")

            stats = engine.statistics()
            print(
                f"statistics: {stats.active_cohorts} active cohorts, "
                f"{stats.terminal_records} terminal record, {stats.judge.calls} judge calls, "
                f"{stats.judge.failures} failed comparison"
            )
    finally:
        await judge.aclose()  # open_engine never closes the judge: it belongs to the caller
    return outcomes


if __name__ == "__main__":
    trio.run(main)
