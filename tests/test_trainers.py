"""The trainer adapters (docs/trainers.md), each called as its trainer calls it, with a batch
built here, against a live `genrm-trio serve` (tests/genrm_server.py): TRL's reward function
(`genrm_trio.trl`) and slime's `--group-rm` function and reward post-processing
(`genrm_trio.slime`). None of them needs the trainer installed; the real GRPO run is
tests/test_grpo.py, verl's reward manager is tests/test_verl.py."""

from __future__ import annotations

import asyncio
import socket
import statistics
import threading
from argparse import Namespace
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from genrm_server import FAIL, PROMPT, N, Server, answers, server
from procs import Proc, start_server

from genrm_trio.client import (
    GenRMClient,
    GenRMUnavailable,
    GroupSettings,
    GroupSizeError,
    MaskedRollout,
    ScoredRollout,
    loop_client,
)
from genrm_trio.slime import group_rm, post_process_rewards
from genrm_trio.trl import BatchGroup, GenRMReward, batch_groups, genrm_reward, masked_by

pytestmark = pytest.mark.slow
__all__ = ["server"]  # the module's live server (a fixture)

OTHER = "What melts ice?"


def reference(server: Server, prompt: Any, completions: list[str]) -> list[float | None]:
    """The rewards of one group through the client: what every adapter must hand on."""
    return GenRMClient(server.url).score_group(prompt, completions)


# --- TRL ------------------------------------------------------------------------------------------


def test_batch_groups_follow_trls_layout() -> None:
    prompts = ["a"] * 4 + ["b"] * 4
    assert batch_groups(prompts, group_size=4) == [
        BatchGroup(0, "a", ((0, 0), (1, 1), (2, 2), (3, 3))),
        BatchGroup(1, "b", ((4, 0), (5, 1), (6, 2), (7, 3))),
    ]
    # process 1 of 2, with 6 of the 12: the second half of group 1 and all of group 2
    local = ["b", "b", "c", "c", "c", "c"]
    assert batch_groups(local, group_size=4, process_index=1, num_processes=2) == [
        BatchGroup(1, "b", ((0, 2), (1, 3))),
        BatchGroup(2, "c", ((2, 0), (3, 1), (4, 2), (5, 3))),
    ]
    with pytest.raises(GroupSizeError, match=r"a batch of 6 completions \(1 process\(es\) x 6\)"):
        batch_groups(["a"] * 6, group_size=4)
    with pytest.raises(GroupSizeError, match="completions 0 and 2 of the batch are in group 0"):
        batch_groups(["a", "a", "b", "b"], group_size=4)


def test_trl_reward_scores_each_group_and_masks_with_none(server: Server) -> None:
    reward = genrm_reward(server.url)
    assert reward.__name__ == "genrm"
    first, second = answers("trl-a"), answers("trl-b", failing={1})
    prompts = [PROMPT] * N + [OTHER] * N
    rewards = reward(prompts=prompts, completions=first + second, completion_ids=[[1]] * 8)
    assert rewards[:N] == reference(server, PROMPT, first)
    # member 1's pairs (0, 1) and (1, 2) fail: 0, 1 and 2 are None, 3 keeps its score
    assert rewards[N : N + 3] == [None, None, None]
    assert rewards[N + 3] == reference(server, OTHER, second)[3]
    assert [type(result) for result in reward.last_results[N:]] == [MaskedRollout] * 3 + [
        ScoredRollout
    ]
    assert reward.calls == 1


class FakeTrainer:
    """What `genrm_reward` reads of TRL's `GRPOTrainer`, through the bound `log_metric` TRL
    passes to reward functions (trl/trainer/grpo_trainer.py, `_calculate_rewards`)."""

    def __init__(self, num_generations: int, num_generations_eval: int) -> None:
        self.num_generations = num_generations
        self.num_generations_eval = num_generations_eval
        self.model = Namespace(training=True)

    def _log_metric(self, name: str, value: float) -> None:
        raise AssertionError("not called")  # pragma: no cover


@pytest.fixture(scope="module")
def servers_of_8_and_1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, Proc]]:
    """Two more servers with the simulated judge: groups of 8, and the default (groups of 1)."""
    started: dict[int, Proc] = {}
    try:
        for size in (8, 1):
            directory = tmp_path_factory.mktemp(f"n{size}")
            config = {"num_rollouts_per_prompt": size} if size > 1 else {}
            started[size] = start_server(directory, config)
        yield started
    finally:
        for proc in started.values():
            proc.close()


@pytest.mark.parametrize(
    ("trl", "server_size", "error"),
    [
        (
            16,
            8,
            r"num_generations is 16 but the genrm-trio server scores groups of "
            r"num_rollouts_per_prompt=8: set num_generations to 8, or start the server with "
            r"--num-rollouts-per-prompt 16 \(nothing was sent\)",
        ),
        (
            4,
            1,
            r"num_generations is 4 but the genrm-trio server scores groups of "
            r"num_rollouts_per_prompt=1 \(a server started without it scores groups of one\): "
            r"set num_generations to 1, or start the server with --num-rollouts-per-prompt 4",
        ),
    ],
)
def test_trl_refuses_a_num_generations_other_than_the_servers_before_sending(
    servers_of_8_and_1: dict[int, Proc], trl: int, server_size: int, error: str
) -> None:
    url = servers_of_8_and_1[server_size].url
    trainer = FakeTrainer(trl, num_generations_eval=server_size)
    texts = answers("size", n=2 * trl)
    prompts = [PROMPT] * trl + [OTHER] * trl  # two of TRL's groups: whole groups of the server's
    with pytest.raises(GroupSizeError, match=error):
        genrm_reward(url)(prompts=prompts, completions=texts, log_metric=trainer._log_metric)
    with pytest.raises(GroupSizeError, match=f"num_generations is {trl} but"):
        genrm_reward(url, num_generations=trl)(prompts=prompts, completions=texts)
    assert httpx.get(url + "/cohorts").json() == []  # nothing was sent
    # evaluating, TRL's groups are num_generations_eval (here the server's): scored
    trainer.model.training = False
    prompts = [PROMPT] * server_size + [OTHER] * server_size
    rewards = genrm_reward(url)(
        prompts=prompts, completions=texts[: 2 * server_size], log_metric=trainer._log_metric
    )
    assert len(rewards) == 2 * server_size and all(isinstance(r, float) for r in rewards)


def test_trl_conversational_format(server: Server) -> None:
    reward = genrm_reward(server.url, name="judge")
    texts = answers("trl-chat")
    prompt = [{"role": "user", "content": PROMPT}]
    rewards = reward(
        prompts=[prompt] * N, completions=[[{"role": "assistant", "content": t}] for t in texts]
    )
    assert rewards == reference(server, PROMPT, texts)
    assert reward.__name__ == "judge"


def test_trl_refuses_a_batch_of_partial_groups(server: Server) -> None:
    with pytest.raises(GroupSizeError, match="set TRL's num_generations"):
        genrm_reward(server.url)(prompts=[PROMPT] * 6, completions=answers("six", n=6))


def test_trl_processes_sharing_a_group_are_joined_by_the_servers_barrier(server: Server) -> None:
    """Two processes, each with half of one group (TRL's slices): the same run id and call
    number give both halves one group id, and each half its rollout indices."""
    texts = answers("split")
    halves = [texts[:2], texts[2:]]
    got: dict[int, list[float | None]] = {}

    def process(rank: int) -> None:
        reward = genrm_reward(server.url, run_id="run-1")
        reward.process_index, reward.num_processes = rank, 2
        got[rank] = reward(prompts=[PROMPT] * 2, completions=halves[rank])

    threads = [threading.Thread(target=process, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert got[0] + got[1] == reference(server, PROMPT, texts)


def test_trl_raises_the_clients_error_not_an_exception_group() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    reward = GenRMReward(f"http://127.0.0.1:{port}", resends=0)
    reward._settings = GroupSettings(N, 10.0, 10.0)  # known: the members' requests fail
    with pytest.raises(GenRMUnavailable, match="unreachable after 1 tries: ConnectError"):
        reward(prompts=[PROMPT] * N + [OTHER] * N, completions=answers("a") + answers("b"))


def test_trl_processes_without_a_process_group_need_a_run_id() -> None:
    reward = genrm_reward("http://127.0.0.1:1")
    reward.process_index, reward.num_processes = 0, 2  # set by hand, as a launcher might
    with pytest.raises(RuntimeError, match=r"pass run_id=\.\.\., the same on every process"):
        reward(prompts=[PROMPT] * 2, completions=answers("x")[:2])
    assert reward.calls == 0  # nothing was sent


def test_masked_by_gives_the_whole_row_none(server: Server) -> None:
    genrm = genrm_reward(server.url)

    def length(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]:
        return [float(len(text)) for text in completions]

    async def async_length(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        return length(prompts, completions)

    texts = answers("combined", failing={3})
    masked_length = masked_by(genrm, length)
    assert masked_length.__name__ == "length"
    with pytest.raises(RuntimeError, match="has not scored this batch"):
        masked_length(prompts=[PROMPT] * N, completions=texts)
    rewards = genrm(prompts=[PROMPT] * N, completions=texts)
    # 3's pairs (2, 3) and (3, 0) fail: 0, 2 and 3 are masked; 1 is scored
    assert [reward is None for reward in rewards] == [True, False, True, True]
    expected = [None, float(len(texts[1])), None, None]
    assert masked_length(prompts=[PROMPT] * N, completions=texts) == expected
    wrapped = masked_by(genrm, async_length)
    assert asyncio.run(wrapped(prompts=[PROMPT] * N, completions=texts)) == expected


# --- slime ----------------------------------------------------------------------------------------


@dataclass
class Sample:
    """The fields of slime's `slime.utils.types.Sample` that its reward path reads and writes."""

    prompt: str | list[dict[str, str]]
    response: str
    reward: float | None = None
    remove_sample: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)

    def get_reward_value(self, args: Namespace) -> float:
        assert self.reward is not None
        return self.reward


def slime_args(server: Server, **extra: Any) -> Namespace:
    values: dict[str, Any] = {
        "rm_url": server.url,
        "group_rm": True,
        "n_samples_per_prompt": N,
        "advantage_estimator": "grpo",
        "rewards_normalization": True,
        "grpo_std_normalization": True,
    }
    return Namespace(**{**values, **extra})


def test_slime_group_rm_and_post_processing(server: Server) -> None:
    args = slime_args(server)
    clean = [Sample(PROMPT, text) for text in answers("slime-a")]
    failing = [Sample(OTHER, text) for text in answers("slime-b", failing={2})]

    async def rollout() -> None:  # slime awaits one group_rm per group on its asyncio loop
        for group in (clean, failing):
            for sample, reward in zip(group, await group_rm(args, group), strict=True):
                sample.reward = reward

    asyncio.run(rollout())
    assert [s.reward for s in clean] == reference(server, PROMPT, answers("slime-a"))
    expected = reference(server, OTHER, answers("slime-b", failing={2}))
    # 2's pairs (1, 2) and (2, 3) fail: 1, 2 and 3 are masked and get 0's reward (the mean)
    assert expected[1:] == [None, None, None]
    assert [s.reward for s in failing] == [expected[0]] * N
    assert [s.remove_sample for s in failing] == [False, True, True, True]
    assert "genrm_masked" not in failing[0].metadata
    assert all(s.metadata["genrm_masked"] for s in failing[1:])

    samples = clean + failing
    raw, rewards = post_process_rewards(args, samples)
    assert raw == [s.reward for s in samples]
    scored = [s.reward for s in clean]
    mean, std = statistics.fmean(scored), statistics.stdev(scored)  # type: ignore[arg-type]
    assert rewards[:N] == pytest.approx([(r - mean) / (std + 1e-6) for r in scored])  # type: ignore[operator]
    assert rewards[N:] == [0.0] * N  # one scored member: its own baseline; masked ones 0
    _, centred = post_process_rewards(slime_args(server, grpo_std_normalization=False), samples)
    assert centred[:N] == pytest.approx([r - mean for r in scored])  # type: ignore[operator]
    _, plain = post_process_rewards(slime_args(server, rewards_normalization=False), samples)
    assert plain == raw


def test_slime_group_rm_refuses_mixed_prompts(server: Server) -> None:
    group = [Sample(PROMPT, "a"), Sample(OTHER, "b")]
    with pytest.raises(ValueError, match="different prompts"):
        asyncio.run(group_rm(slime_args(server), group))


def test_the_fail_tag_is_what_the_judge_fails_on() -> None:
    assert FAIL in answers("x", failing={0})[0] and FAIL not in answers("x")[0]


def test_slime_refuses_a_group_of_another_size_and_samples_per_rollout(server: Server) -> None:
    group = [Sample(PROMPT, text) for text in answers("slime-size", n=N + 1)]
    with pytest.raises(
        GroupSizeError,
        match=rf"--n-samples-per-prompt is {N + 1} but the genrm-trio server scores groups of "
        rf"num_rollouts_per_prompt={N}",
    ):
        asyncio.run(group_rm(slime_args(server), group))
    nested: list[Any] = [[Sample(PROMPT, "a"), Sample(PROMPT, "b")]] * N
    with pytest.raises(GroupSizeError, match="rollout 0 of the group is 2 samples"):
        asyncio.run(group_rm(slime_args(server), nested))
    with pytest.raises(GroupSizeError, match=rf"not whole groups of --n-samples-per-prompt={N}"):
        post_process_rewards(slime_args(server), [Sample(PROMPT, "a", reward=1.0)] * (N + 1))
    assert httpx.get(server.url + "/cohorts").json() == []  # nothing was sent


def test_slime_keeps_one_client_per_event_loop_and_url(server: Server) -> None:
    args = slime_args(server)
    clients: list[object] = []

    async def rollout(tag: str) -> None:  # several groups of one run, on one loop
        for number in range(3):
            group = [Sample(PROMPT, text) for text in answers(f"{tag}-{number}")]
            await group_rm(args, group)
            clients.append(loop_client(server.url))

    asyncio.run(rollout("loop-1"))
    asyncio.run(rollout("loop-2"))
    assert len({id(client) for client in clients[:3]}) == 1  # one client for the loop's groups
    assert clients[3] is not clients[0]  # a new loop, a new client (the old pool was its loop's)
