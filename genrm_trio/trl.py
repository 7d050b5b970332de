"""GenRM rewards for TRL's `GRPOTrainer` (docs/trainers.md, "TRL").

    from genrm_trio.trl import genrm_reward
    trainer = GRPOTrainer(..., reward_funcs=[genrm_reward("http://127.0.0.1:8100")])

`genrm_reward(base_url)` is a reward function with TRL's signature (`prompts, completions,
**kwargs -> list[float | None]`). TRL repeats each prompt `num_generations` times in a row; the
function cuts the batch into those groups (each must be one prompt repeated), scores every group
at once through the client (`genrm_trio.client`), and returns None for a masked completion.
`num_generations` must be the server's `num_rollouts_per_prompt`: the function reads it from the
trainer (TRL passes its bound `log_metric` among the kwargs; `num_generations_eval` while
evaluating) or from its own `num_generations` argument, and refuses a batch, before sending
anything, when the two differ (consecutive groups of one prompt would otherwise be judged as
smaller groups, and TRL would normalise over its own). TRL turns
None into NaN; a row whose every reward function gave None is left out of its group's mean and
standard deviation, its advantage is 0 and it is left out of the logged reward statistics.

Beside other reward functions a None row still counts as scored (the others' rewards), and the
None counts as 0.0 in the row's sum. `masked_by(genrm, func)` returns `func`'s rewards with
None wherever genrm-trio masked the completion, so the whole row stays out of the baseline.

Several processes (accelerate, torchrun): TRL gives each process a contiguous slice of the
global batch, all slices the same length, so a prompt's generations may be split between
processes. Each process knows its index, the slice length and how many times it has been
called (the processes call reward functions in lockstep), so the global position of each of its
completions gives the group (`position // N`) and the rollout index (`position % N`), and the
group id is `{run_id}-{call}-{group}`: the same on every process, and the server's group
barrier joins the parts. `run_id` must be the same on every process and new for every run:
given, or broadcast from process 0 through `torch.distributed` on the first call.

Nothing here imports TRL: the extra `genrm-trio[trl]` installs it for you.
"""

from __future__ import annotations

import inspect
import logging
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, final

import trio

from genrm_trio.client import (
    RESENDS,
    AsyncGenRMClient,
    Completion,
    GroupSettings,
    GroupSizeError,
    Prompt,
    RolloutResult,
    all_at_once,
    group_size_message,
    rewards_of,
)

__all__ = [
    "TRL_LOGGER",
    "BatchGroup",
    "GenRMReward",
    "MaskedRowWarningFilter",
    "batch_groups",
    "genrm_reward",
    "masked_by",
    "trainer_num_generations",
]

RewardFunc = Callable[..., Any]


@final
@dataclass(frozen=True, slots=True)
class BatchGroup:
    """The part of one group that a process holds: the group's number in the global batch,
    its prompt, and its members as `(position in the local batch, rollout index)`."""

    number: int
    prompt: Prompt
    members: tuple[tuple[int, int], ...]


def batch_groups(
    prompts: Sequence[Prompt],
    *,
    group_size: int,
    process_index: int = 0,
    num_processes: int = 1,
) -> list[BatchGroup]:
    """Cut a process's slice of TRL's batch into groups of `group_size` consecutive
    completions of one prompt (pure; the layout is TRL's `RepeatSampler`'s)."""
    local = len(prompts)
    if (local * num_processes) % group_size:
        raise GroupSizeError(
            f"a batch of {local * num_processes} completions ({num_processes} process(es) x "
            f"{local}) is not whole groups of num_rollouts_per_prompt={group_size}: set TRL's "
            "num_generations to the server's num_rollouts_per_prompt"
        )
    offset = process_index * local
    groups: dict[int, list[tuple[int, int]]] = {}
    for position in range(local):
        number, index = divmod(offset + position, group_size)
        groups.setdefault(number, []).append((position, index))
    out: list[BatchGroup] = []
    for number, members in groups.items():
        prompt = prompts[members[0][0]]
        for position, _ in members[1:]:
            if prompts[position] != prompt:
                raise GroupSizeError(
                    f"completions {members[0][0]} and {position} of the batch are in group "
                    f"{number} but have different prompts: TRL repeats each prompt "
                    f"num_generations times in a row; set num_generations to the server's "
                    f"num_rollouts_per_prompt={group_size}"
                )
        out.append(BatchGroup(number, prompt, tuple(members)))
    return out


TRL_LOGGER = "trl.trainer.grpo_trainer"
"""The logger of TRL's `GRPOTrainer`, which warns about rows every reward function gave None."""


class MaskedRowWarningFilter(logging.Filter):
    """Drops TRL's warning "All reward functions returned None for the following kwargs: ...
    Please ensure that at least one reward function returns a valid reward.", written for
    every batch with such a row. For genrm-trio such a row is a masked completion, which TRL
    leaves out of its group's statistics as it should: not a mistake. Every other record
    passes. `logging.getLogger(TRL_LOGGER).addFilter(MaskedRowWarningFilter())`."""

    def filter(self, record: logging.LogRecord) -> bool:
        # accelerate's logger adapter puts "[RANK 0] " first
        return "All reward functions returned None for the following" not in str(record.msg)


def trainer_num_generations(kwargs: Mapping[str, Any]) -> int | None:
    """The group size of TRL's batch, read from the trainer behind the `log_metric` it passes
    to reward functions: `num_generations` while training, `num_generations_eval` while
    evaluating; None when called otherwise (by hand, or by a TRL without it)."""
    trainer = getattr(kwargs.get("log_metric"), "__self__", None)
    if trainer is None:
        return None
    training = getattr(getattr(trainer, "model", None), "training", True)
    value = getattr(trainer, "num_generations" if training else "num_generations_eval", None)
    return value if type(value) is int else None


def _distributed() -> tuple[int, int]:
    """This process's index and the number of processes (torch.distributed, when a process
    group is up; a single process otherwise). TRL has imported torch already when a process
    group exists, so a process without `torch.distributed` loaded is a single process."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return int(dist.get_rank()), int(dist.get_world_size())


def _broadcast_run_id() -> str:
    """A run id from process 0, the same on every process (a collective: every process calls
    it, as they call reward functions, in lockstep)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "genrm_reward: several processes but no torch.distributed process group to share a "
            "run id through: pass run_id=..., the same on every process"
        )
    value = [uuid.uuid4().hex]
    dist.broadcast_object_list(value, src=0)
    return str(value[0])


class GenRMReward:
    """TRL's reward function over genrm-trio (see the module docstring). `last_results` holds
    the last batch's `ScoredRollout` / `MaskedRollout` per completion (the reasons of the Nones)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float | None = None,
        principle: str | None = None,
        name: str = "genrm",
        run_id: str | None = None,
        process_index: int | None = None,
        num_processes: int | None = None,
        num_generations: int | None = None,
        resends: int = RESENDS,
    ) -> None:
        self.__name__ = name  # TRL's name for its logs (rewards/<name>/mean)
        self.base_url = base_url
        self.api_key = api_key
        self.timeout = timeout
        self.principle = principle
        self.run_id = run_id
        self.process_index = process_index
        self.num_processes = num_processes
        self.num_generations = num_generations
        self.resends = resends
        self.calls = 0
        self.last_completions: Sequence[Completion] | None = None
        self.last_results: list[RolloutResult] = []
        self._settings: GroupSettings | None = None

    def __call__(
        self, prompts: Sequence[Prompt], completions: Sequence[Completion], **kwargs: Any
    ) -> list[float | None]:
        num_generations = self.num_generations or trainer_num_generations(kwargs)
        return rewards_of(self.score_batch(prompts, completions, num_generations=num_generations))

    def score_batch(
        self,
        prompts: Sequence[Prompt],
        completions: Sequence[Completion],
        *,
        num_generations: int | None = None,
    ) -> list[RolloutResult]:
        """A `ScoredRollout` or `MaskedRollout` per completion of TRL's batch; every group at
        once. `num_generations`: TRL's group size, refused (nothing sent) unless it is the
        server's."""
        if len(prompts) != len(completions):
            raise GroupSizeError(f"{len(prompts)} prompts but {len(completions)} completions")
        rank, world = _distributed()
        rank = rank if self.process_index is None else self.process_index
        world = world if self.num_processes is None else self.num_processes
        if self.run_id is None:
            self.run_id = _broadcast_run_id() if world > 1 else uuid.uuid4().hex
        call = self.calls
        self.calls += 1
        results = trio.run(
            partial(self._score, prompts, completions, rank, world, call, num_generations)
        )
        self.last_completions = completions
        self.last_results = results
        return results

    async def _score(
        self,
        prompts: Sequence[Prompt],
        completions: Sequence[Completion],
        rank: int,
        world: int,
        call: int,
        num_generations: int | None,
    ) -> list[RolloutResult]:
        results: list[RolloutResult | None] = [None] * len(completions)
        async with AsyncGenRMClient(
            self.base_url,
            api_key=self.api_key,
            timeout=self.timeout,
            group_settings=self._settings,
            resends=self.resends,
        ) as client:
            settings = self._settings = await client.group_settings()
            size = settings.num_rollouts_per_prompt
            if num_generations is not None and num_generations != size:
                raise GroupSizeError(group_size_message(num_generations, size, "num_generations"))
            groups = batch_groups(
                prompts,
                group_size=settings.num_rollouts_per_prompt,
                process_index=rank,
                num_processes=world,
            )

            async def one(group: BatchGroup) -> None:
                members = [(index, completions[position]) for position, index in group.members]
                scored = await client.score_members(
                    group.prompt,
                    members,
                    group_id=f"trl-{self.run_id}-{call}-{group.number}",
                    principle=self.principle,
                )
                for (position, _), result in zip(group.members, scored, strict=True):
                    results[position] = result

            await all_at_once(partial(one, group) for group in groups)
        return [result for result in results if result is not None]


def genrm_reward(
    base_url: str,
    *,
    api_key: str | None = None,
    timeout: float | None = None,
    principle: str | None = None,
    name: str = "genrm",
    run_id: str | None = None,
    num_generations: int | None = None,
) -> GenRMReward:
    """TRL's reward function: GenRM pairwise rewards from the genrm-trio server at
    `base_url`, None for a masked completion. `timeout`: the bound of each group's wait, and
    so of the batch's, whose groups wait at once (default: the server's deadlines plus a
    margin); `principle`: sent with every group; `name`: the name in TRL's logs; `run_id`: the
    same on every process of a multi-process run (default: new, and shared through
    torch.distributed); `num_generations`: TRL's, checked against the server's group size
    (default: read from the trainer at each call)."""
    return GenRMReward(
        base_url,
        api_key=api_key,
        timeout=timeout,
        principle=principle,
        name=name,
        run_id=run_id,
        num_generations=num_generations,
    )


def _mask(
    genrm: GenRMReward, completions: Sequence[Completion], rewards: Sequence[Any]
) -> list[Any]:
    if genrm.last_completions is None or not (
        genrm.last_completions is completions or list(genrm.last_completions) == list(completions)
    ):
        raise RuntimeError(
            f"masked_by: {genrm.__name__} has not scored this batch; list it before the "
            "functions masked_by wraps in reward_funcs"
        )
    masked = rewards_of(genrm.last_results)
    return [None if mask is None else reward for mask, reward in zip(masked, rewards, strict=True)]


def masked_by(genrm: GenRMReward, func: RewardFunc) -> RewardFunc:
    """`func`'s rewards, None wherever `genrm` masked the completion in the same batch, so a
    row genrm-trio masked is None for every reward function and TRL leaves it out of the
    group's statistics. `genrm` must come first in `reward_funcs` (TRL calls synchronous
    functions in order, asynchronous ones after them)."""
    name = getattr(func, "__name__", type(func).__name__)
    wrapped: RewardFunc
    if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004 - an async callable instance
    ):

        async def async_masked(
            prompts: Sequence[Prompt], completions: Sequence[Completion], **kwargs: Any
        ) -> list[Any]:
            rewards = await func(prompts=prompts, completions=completions, **kwargs)
            return _mask(genrm, completions, rewards)

        wrapped = async_masked
    else:

        def sync_masked(
            prompts: Sequence[Prompt], completions: Sequence[Completion], **kwargs: Any
        ) -> list[Any]:
            rewards = func(prompts=prompts, completions=completions, **kwargs)
            return _mask(genrm, completions, rewards)

        wrapped = sync_masked
    wrapped.__name__ = name
    wrapped.__qualname__ = name
    return wrapped
