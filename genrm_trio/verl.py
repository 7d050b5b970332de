"""GenRM rewards for verl's batch reward manager (docs/trainers.md, "verl").

    reward_model:
      reward_manager: batch
    custom_reward_function:
      path: pkg://genrm_trio.verl
      name: compute_score
      reward_kwargs:
        base_url: http://127.0.0.1:8100

verl calls `compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=,
**reward_kwargs)` once per batch and puts each reward on the last token of its response. It
passes no prompt and no group id, and it may reorder the batch first (`trainer.balance_batch`),
so the groups are found from `extra_infos`: the prompt text under `prompt_key` (default
`question`, which verl's example preprocessing scripts write) and, when present, the dataset
row's `index`. The completions of one row (`actor_rollout_ref.rollout.n` of them, which must be
the server's `num_rollouts_per_prompt`) form a group, in batch order.

verl has no way to leave a rollout out of GRPO's group baseline: `None` fails when written into
the reward tensor, NaN turns the whole group's mean, standard deviation and advantages into NaN,
and there is no mask flag. So a masked rollout gets the mean of its group's scored rewards
(0.0 when the whole group is masked): its advantage is 0 and the group's mean is the scored
members' mean. The standard deviation does include it (smaller than the scored members'
own); with `algorithm.norm_adv_by_std_in_grpo: false` (Dr. GRPO) the scored members'
advantages are exactly those of the scored members alone. Each reward is a dict: `score`,
`genrm_masked` (1.0 or 0.0) and `genrm_scored_mean` for verl's reward metrics.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import trio

from genrm_trio.client import (
    AsyncGenRMClient,
    GroupSizeError,
    MaskedRollout,
    RolloutResult,
    ScoredRollout,
    all_at_once,
    scored_mean,
)

__all__ = ["compute_score", "group_positions", "impute_masked"]


def group_positions(
    extra_infos: Sequence[Mapping[str, Any] | None], *, prompt_key: str, group_size: int
) -> list[tuple[Any, list[int]]]:
    """The batch's groups as `(prompt, positions)`: the completions of one dataset row (its
    `index` and prompt), cut into groups of `group_size` in batch order (pure)."""
    rows: dict[str, tuple[Any, list[int]]] = {}
    for position, info in enumerate(extra_infos):
        if not isinstance(info, Mapping) or prompt_key not in info:
            raise KeyError(
                f"completion {position}: extra_info has no {prompt_key!r}; genrm-trio needs the "
                "prompt there (custom_reward_function.reward_kwargs.prompt_key names the key)"
            )
        prompt = info[prompt_key]
        key = json.dumps([info.get("index"), prompt], sort_keys=True, default=str)
        rows.setdefault(key, (prompt, []))[1].append(position)
    groups: list[tuple[Any, list[int]]] = []
    for prompt, positions in rows.values():
        if len(positions) % group_size:
            raise GroupSizeError(
                f"{len(positions)} completions of one prompt; the server scores groups of "
                f"num_rollouts_per_prompt={group_size}: set actor_rollout_ref.rollout.n to it "
                "(and val_kwargs.n for validation)"
            )
        for start in range(0, len(positions), group_size):
            groups.append((prompt, positions[start : start + group_size]))
    return groups


def impute_masked(results: Sequence[RolloutResult]) -> list[dict[str, float]]:
    """verl's rewards of one group: a scored member's reward; a masked member's the mean of the
    scored ones (0.0 when none is scored), so its advantage is 0 and the group mean is the
    scored members' mean."""
    mean = scored_mean(results)
    return [
        {
            "score": result.reward if type(result) is ScoredRollout else mean,
            "genrm_masked": 1.0 if type(result) is MaskedRollout else 0.0,
            "genrm_scored_mean": mean,
        }
        for result in results
    ]


async def _score(
    solution_strs: Sequence[str],
    extra_infos: Sequence[Mapping[str, Any] | None],
    *,
    base_url: str,
    api_key: str | None,
    group_timeout: float | None,
    principle: str | None,
    prompt_key: str,
) -> list[dict[str, float]]:
    rewards: list[dict[str, float] | None] = [None] * len(solution_strs)
    async with AsyncGenRMClient(base_url, api_key=api_key, timeout=group_timeout) as client:
        size = await client.num_rollouts_per_prompt()
        groups = group_positions(extra_infos, prompt_key=prompt_key, group_size=size)

        async def one(prompt: Any, positions: list[int]) -> None:
            completions = [solution_strs[position] for position in positions]
            results = await client.score_group_results(prompt, completions, principle=principle)
            for position, reward in zip(positions, impute_masked(results), strict=True):
                rewards[position] = reward

        await all_at_once(partial(one, prompt, positions) for prompt, positions in groups)
    return [reward for reward in rewards if reward is not None]


def compute_score(
    data_sources: Sequence[Any],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Mapping[str, Any] | None],
    *,
    base_url: str,
    api_key: str | None = None,
    timeout: float | None = None,
    principle: str | None = None,
    prompt_key: str = "question",
    **_: Any,
) -> list[dict[str, float]]:
    """verl's batch `custom_reward_function` (see the module docstring); `data_sources` and
    `ground_truths` are not used: the judge compares the completions with each other."""
    return trio.run(
        partial(
            _score,
            solution_strs,
            extra_infos,
            base_url=base_url,
            api_key=api_key,
            group_timeout=timeout,
            principle=principle,
            prompt_key=prompt_key,
        )
    )
