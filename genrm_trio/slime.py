"""GenRM rewards for slime's group reward model (docs/trainers.md, "slime").

    --group-rm --rm-url http://127.0.0.1:8100 \\
    --custom-rm-path genrm_trio.slime.group_rm \\
    --custom-reward-post-process-path genrm_trio.slime.post_process_rewards

With `--group-rm`, slime awaits `group_rm(args, samples)` on its asyncio loop with the
`--n-samples-per-prompt` samples of one prompt (which must be the server's
`num_rollouts_per_prompt`; another size is refused before anything is sent) and sets each
`sample.reward` to what it returns. The prompt is `sample.prompt` (a string or chat messages),
the completion `sample.response`; the group is scored through the async client at
`args.rm_url` (the bearer token, if the server wants one, from the environment variable
`GENRM_TRIO_API_KEY`), one client (and so one connection pool) per event loop and URL, kept
for the loop's life. A custom generate function that returns several samples per rollout
gives slime a group of lists; `group_rm` refuses it (a group is one sample per rollout).

slime has no reward that means "no score": `None` fails in its reward tensor and NaN turns the
group's normalised rewards into NaN. `sample.remove_sample` zeroes a sample's loss mask but,
in slime's words, "does not determine whether the sample participates in advantage
normalization". So a masked sample gets `remove_sample = True`, its reason in
`sample.metadata["genrm_masked"]`, and as reward the mean of its group's scored rewards (0.0
when the whole group is masked), which keeps the group mean of slime's default normalisation
the scored members' mean. `post_process_rewards` (`--custom-reward-post-process-path`)
normalises each group over its scored members only (the samples without
`metadata["genrm_masked"]`): the mean, and the standard deviation unless
`--disable-grpo-std-normalization` is given, as slime's default does over all (nothing unless
the estimator normalises and `--disable-rewards-normalization` is absent), and gives a masked
sample 0.0. Its batch must be whole groups of `--n-samples-per-prompt`.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from typing import Any

from genrm_trio.client import (
    GroupSizeError,
    MaskedRollout,
    group_size_message,
    loop_client,
    scored_mean,
)

__all__ = ["API_KEY_ENV", "group_rm", "post_process_rewards"]

API_KEY_ENV = "GENRM_TRIO_API_KEY"
_GROUP_NORMALISED = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
_STD_NORMALISED = ("grpo", "gspo", "cispo")
_EPSILON = 1e-6  # slime's
_MASKED = "genrm_masked"  # the metadata key of a masked sample: its reason


async def group_rm(args: Any, samples: Sequence[Any], **kwargs: Any) -> list[float]:
    """slime's `--custom-rm-path` function under `--group-rm`: one reward per sample."""
    if not samples:
        return []
    nested = [i for i, sample in enumerate(samples) if isinstance(sample, list | tuple)]
    if nested:
        raise GroupSizeError(
            f"group_rm: rollout {nested[0]} of the group is {len(samples[nested[0]])} samples: "
            "the custom generate function returns several samples per rollout, but a "
            "genrm-trio group is one sample per rollout (return one Sample)"
        )
    prompts = {repr(sample.prompt) for sample in samples}
    if len(prompts) != 1:
        raise GroupSizeError(f"group_rm: a group of {len(samples)} samples with different prompts")
    client = loop_client(args.rm_url, api_key=os.environ.get(API_KEY_ENV) or None)
    size = await client.num_rollouts_per_prompt()
    if len(samples) != size:
        raise GroupSizeError(group_size_message(len(samples), size, "--n-samples-per-prompt"))
    results = await client.score_group_results(
        samples[0].prompt, [sample.response for sample in samples]
    )
    mean = scored_mean(results)
    rewards: list[float] = []
    for sample, result in zip(samples, results, strict=True):
        if type(result) is MaskedRollout:
            sample.remove_sample = True
            sample.metadata[_MASKED] = result.reason
            rewards.append(mean)
        else:
            rewards.append(result.reward)
    return rewards


def post_process_rewards(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """slime's reward post-processing with masked samples left out of their group's
    statistics: `(raw_rewards, rewards)`, as slime's `_post_process_rewards` returns."""
    raw = [float(sample.get_reward_value(args)) for sample in samples]
    if args.advantage_estimator not in _GROUP_NORMALISED or not args.rewards_normalization:
        return raw, raw
    size = args.n_samples_per_prompt
    if len(samples) % size:
        raise GroupSizeError(
            f"post_process_rewards: a batch of {len(samples)} samples is not whole groups of "
            f"--n-samples-per-prompt={size} (is a generator returning several samples per "
            "rollout, or were samples dropped?)"
        )
    divide = args.advantage_estimator in _STD_NORMALISED and args.grpo_std_normalization
    rewards: list[float] = []
    for start in range(0, len(samples), size):
        group = range(start, start + size)
        masked = {i for i in group if _MASKED in samples[i].metadata}
        kept = [raw[i] for i in group if i not in masked]
        mean = sum(kept) / len(kept) if kept else 0.0
        std = statistics.stdev(kept) if divide and len(kept) > 1 else None
        for i in group:
            if i in masked:
                rewards.append(0.0)
            elif std is None:
                rewards.append(raw[i] - mean)
            else:
                rewards.append((raw[i] - mean) / (std + _EPSILON))
    return raw, rewards
