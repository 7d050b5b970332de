"""GenRM rewards for verl's reward loop (docs/trainers.md, "verl"): a reward manager that verl
loads by its `importlib` source, for verl 0.9 (the `reward.*` config tree).

    reward.num_workers=1
    reward.reward_manager.source=importlib
    reward.reward_manager.name=GenRMRewardManager
    reward.reward_manager.module.path=pkg://genrm_trio.verl
    +reward.reward_kwargs.genrm_url=http://127.0.0.1:8100

verl's reward loop scores one sample per call: `RewardLoopWorker.compute_score` awaits
`run_single(data)` with one row, whether the agent loop streams rewards as rollouts finish or
the trainer scores a batch (`compute_score_batch`, one task per row, all at once). A row carries
its group's `uid` (the same for the `actor_rollout_ref.rollout.n` rollouts of one prompt), its
`raw_prompt` (chat messages) and its response tokens, but no index within the group. So the
manager gives each row of a `uid` the next rollout index as it arrives, and sends it alone under
the group id `verl-{uid}`: genrm-trio's `/verify` waits for the whole group, so the `n` calls
are judged together, and each returns when the group does. Both need every row of a group in
one process, so `reward.num_workers` must be 1, and that worker's concurrency (Ray's default,
1,000 calls at once for an async actor) must hold every row of a step.

verl cannot leave a rollout out of GRPO's group baseline: a reward is a number on the last
response token, `None` fails in the reward tensor, and NaN turns the whole group's advantages
into NaN. So a masked rollout gets the mean of its group's scored rewards (0.0 when the whole
group is masked): its advantage is 0 and the group mean is the scored members' mean. The
standard deviation does include it (smaller than the scored members' own); under
`algorithm.norm_adv_by_std_in_grpo=false` (Dr. GRPO) the scored members' advantages are exactly
those of the scored members alone. Each row's `reward_extra_info` holds `genrm_masked` (1.0 or
0.0) and `genrm_scored_mean`, which verl logs with the step's reward metrics.

Nothing here imports verl at import time: the manager reads verl's rows and config by their
names, and borrows verl's `RewardManagerBase.assemble_rm_scores` when verl calls it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, final

from genrm_trio.client import (
    AsyncGenRMClient,
    GenRMError,
    GroupSettings,
    GroupSizeError,
    MaskedRollout,
    RolloutResult,
    ScoredRollout,
    group_size_message,
    loop_client,
    scored_mean,
)

__all__ = ["API_KEY_ENV", "GenRMRewardManager", "check_verl_config", "impute_masked"]

API_KEY_ENV = "GENRM_TRIO_API_KEY"
"""The environment variable with the server's bearer token, if it wants one."""


def impute_masked(results: Sequence[RolloutResult]) -> list[dict[str, float]]:
    """verl's rewards of one group: a scored member's reward; a masked member's the mean of the
    scored ones (0.0 when none is scored), so its advantage is 0 and the group mean is the
    scored members' mean (pure)."""
    mean = scored_mean(results)
    return [
        {
            "score": result.reward if type(result) is ScoredRollout else mean,
            "genrm_masked": 1.0 if type(result) is MaskedRollout else 0.0,
            "genrm_scored_mean": mean,
        }
        for result in results
    ]


def _get(config: Any, path: str, default: Any = None) -> Any:
    """`config.a.b.c` of verl's OmegaConf tree (or a plain mapping), `default` when absent."""
    value = config
    for name in path.split("."):
        getter = getattr(value, "get", None)
        if getter is None:
            return default
        value = getter(name)
        if value is None:
            return default
    return value


def check_verl_config(config: Any, settings: GroupSettings) -> None:
    """Refuse a verl config whose groups would not be the server's: the rollouts of one prompt
    (`actor_rollout_ref.rollout.n`, and `val_kwargs.n` when verl validates) must be the server's
    `num_rollouts_per_prompt`, and every row of a group must reach one reward worker (pure)."""
    size = settings.num_rollouts_per_prompt
    workers = _get(config, "reward.num_workers", 1)
    if workers != 1:
        raise GroupSizeError(
            f"reward.num_workers is {workers}: genrm-trio's verl reward manager numbers a "
            "group's rollouts in one process, so set reward.num_workers=1"
        )
    n = _get(config, "actor_rollout_ref.rollout.n", 1)
    if n != size:
        raise GroupSizeError(group_size_message(n, size, "actor_rollout_ref.rollout.n"))
    validates = _get(config, "trainer.val_before_train", True) or (
        _get(config, "trainer.test_freq", -1) > 0
    )
    val_n = _get(config, "actor_rollout_ref.rollout.val_kwargs.n", 1)
    if validates and val_n != size:
        raise GroupSizeError(
            f"actor_rollout_ref.rollout.val_kwargs.n is {val_n} but the genrm-trio server scores "
            f"groups of num_rollouts_per_prompt={size}: set "
            f"actor_rollout_ref.rollout.val_kwargs.n={size}, or turn validation off "
            "(trainer.val_before_train=False trainer.test_freq=-1)"
        )


@final
@dataclass(slots=True)
class _Group:
    """The rows of one `uid` seen so far in this process, and their results."""

    size: int
    arrived: int = 0
    results: dict[int, RolloutResult] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    failed: BaseException | None = None


class GenRMRewardManager:
    """verl's reward manager over genrm-trio (see the module docstring). verl constructs it
    in each reward worker with its config and the policy's tokenizer; `reward.reward_kwargs`
    holds `genrm_url` (required), `genrm_timeout` and `genrm_principle` (optional)."""

    def __init__(
        self,
        config: Any,
        tokenizer: Any,
        compute_score: Any = None,
        reward_router_address: str | None = None,
        reward_model_tokenizer: Any = None,
        **_: Any,
    ) -> None:
        kwargs = _get(config, "reward.reward_kwargs", {})
        url = kwargs.get("genrm_url")
        if not url:
            raise ValueError(
                "GenRMRewardManager: set the server's URL with "
                "+reward.reward_kwargs.genrm_url=http://127.0.0.1:8100"
            )
        self.config = config
        self.tokenizer = tokenizer
        self.base_url = str(url)
        self.timeout: float | None = kwargs.get("genrm_timeout")
        self.principle: str | None = kwargs.get("genrm_principle")
        self._groups: dict[str, _Group] = {}
        self._checked = False

    def _client(self) -> AsyncGenRMClient:
        return loop_client(
            self.base_url, api_key=os.environ.get(API_KEY_ENV) or None, timeout=self.timeout
        )

    async def run_single(self, data: Any) -> dict[str, Any]:
        """One row of verl's batch (a `DataProto` of length 1; the last row of a multi-row
        trajectory, as verl's own managers read it): `{"reward_score", "reward_extra_info"}`."""
        row = data[len(data) - 1]
        responses = row.batch["responses"]
        length = int(row.batch["attention_mask"][-responses.shape[-1] :].sum())
        text = self.tokenizer.decode(responses[:length], skip_special_tokens=True)
        uid = str(row.non_tensor_batch["uid"])
        prompt = [dict(message) for message in row.non_tensor_batch["raw_prompt"]]
        reward = await self._score(uid, prompt, text)
        return {
            "reward_score": reward["score"],
            "reward_extra_info": {
                "genrm_masked": reward["genrm_masked"],
                "genrm_scored_mean": reward["genrm_scored_mean"],
            },
        }

    async def _score(
        self, uid: str, prompt: list[dict[str, Any]], text: str
    ) -> Mapping[str, float]:
        client = self._client()
        settings = await client.group_settings()
        if not self._checked:
            check_verl_config(self.config, settings)
            self._checked = True
        size = settings.num_rollouts_per_prompt
        group = self._groups.setdefault(uid, _Group(size))
        index = group.arrived
        if index >= size:
            raise GroupSizeError(
                f"uid {uid}: more than num_rollouts_per_prompt={size} rollouts of one prompt: "
                f"set actor_rollout_ref.rollout.n={size}"
            )
        group.arrived += 1
        request = asyncio.ensure_future(
            client.score_members(
                prompt, [(index, text)], group_id=f"verl-{uid}", principle=self.principle
            )
        )
        stopped = asyncio.ensure_future(group.done.wait())
        try:
            # a row whose group failed elsewhere stops at once, not at the server's deadline
            await asyncio.wait((request, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            answered = request.done()
            if not answered:  # the group failed, or verl cancelled this row
                request.cancel()
        if answered:
            try:
                [result] = request.result()
            except BaseException as exc:
                group.failed = exc  # the group's other rows stop too
                group.done.set()
                self._groups.pop(uid, None)
                raise
            group.results[index] = result
        if len(group.results) == size:
            group.done.set()
            self._groups.pop(uid, None)
        # the server answers a group's rows together: the others are recorded at once
        await group.done.wait()
        if group.failed is not None:
            raise GenRMError(
                f"uid {uid}: another rollout of the group failed: {group.failed}"
            ) from group.failed
        ordered = [group.results[i] for i in range(size)]
        return impute_masked(ordered)[index]

    @classmethod
    def assemble_rm_scores(cls, data: Any, scores: list[float]) -> Any:
        """verl's own placement: each score on the last response token of its row."""
        from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

        base: Any = RewardManagerBase  # verl is not typed
        return base.assemble_rm_scores.__func__(cls, data, scores)
