"""verl's reward loop with `genrm_trio.verl.GenRMRewardManager` (docs/trainers.md, "verl"), on a
batch of two groups against a live `genrm-trio serve` whose simulated judge fails the pairs of
tagged answers every time (tests/genrm_server.py): rewards and masks row by row.

With verl installed (the `verl` extra; `.ci/run` installs it on the 3.11 leg and sets
GENRM_TRIO_REQUIRE_VERL=1, so a missing verl fails there instead of skipping), the rows go
through verl's own code: `RewardLoopWorker` built from a verl config, its manager resolved and
loaded by verl (`reward.reward_manager.source=importlib`), `compute_score_batch` as the trainer's
`RewardLoopManager.compute_rm_score` calls it, `compute_score` per row as the agent loop streams
rewards, and the manager's `assemble_rm_scores` placing each score on its last response token.
Without verl, the manager is called as verl's worker calls it (`run_single` on one-row batches,
by verl's source signatures) with rows built here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
from genrm_server import FAIL, PROMPT, N, Server, answers, server
from tiny_models import require_packages

import genrm_trio.verl
from genrm_trio.client import (
    AsyncGenRMClient,
    GenRMError,
    GenRMRequestError,
    GroupSettings,
    GroupSizeError,
    verify_body,
)
from genrm_trio.domain.text import response_digest
from genrm_trio.verl import GenRMRewardManager, check_verl_config

pytestmark = pytest.mark.slow
__all__ = ["server"]  # the module's live server (a fixture)

REQUIRE_VERL_ENV: Final = "GENRM_TRIO_REQUIRE_VERL"
OTHER = "What melts ice?"
RESPONSE_LENGTH = 64
SETTINGS = GroupSettings(N, 10.0, 10.0)


def require(*modules: str) -> None:
    """Skip without `modules`; fail instead when GENRM_TRIO_REQUIRE_VERL is set (CI's verl
    leg), as tests/tiny_models.py's `require_ml` does."""
    require_packages(modules, extras="verl", env=REQUIRE_VERL_ENV)


def verl_config(url: str, **reward: Any) -> dict[str, Any]:
    """The keys of verl's config that its reward loop and the manager read (docs/trainers.md)."""
    return {
        "actor_rollout_ref": {
            "model": {"path": None, "tokenizer_path": None},
            "rollout": {"n": N, "val_kwargs": {"n": N}},
        },
        "trainer": {"val_before_train": True, "test_freq": -1},
        "reward": {
            "num_workers": 1,
            "custom_reward_function": {"path": None, "name": "compute_score"},
            "reward_manager": {
                "source": "importlib",
                "name": "GenRMRewardManager",
                "module": {"path": "pkg://genrm_trio.verl", "name": "custom_reward_manager"},
            },
            "reward_model": {"enable": False},
            "sandbox_fusion": {"url": None},
            "reward_kwargs": {"genrm_url": url},
            **reward,
        },
    }


class Tokens:
    """A tokenizer of whole texts: token i is the i-th text seen (what `decode` must undo)."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def encode(self, text: str) -> int:
        self.texts.append(text)
        return len(self.texts)

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return "".join(self.texts[int(i) - 1] for i in ids if int(i) > 0)


def server_rewards(server: Server, group_id: str) -> dict[str, float | None]:
    """The server's own record of a group (`GET /checkpoint`), by response digest: the reward
    of each member, None for a masked one. The manager numbers a group's rows as they arrive,
    so which pairs the circular plan compares is known only from the record."""
    export = httpx.get(server.url + "/checkpoint", timeout=30).json()
    [cohort] = [c for c in export["cohorts"] if c["group_id"] == group_id]
    assert cohort["phase"] == "completed"
    return {
        member["response_digest"]: None if member["masked_alone"] else member["result"]["reward"]
        for member in cohort["members"].values()
    }


def batch_texts(tag: str) -> list[tuple[str, str, str]]:
    """(uid, prompt, response) of the batch: two groups (uids new for each `tag`: verl's are
    new each step), their rows interleaved as after verl's `balance_batch`; the second group's
    member 1 fails every comparison."""
    clean, failing = answers(f"{tag}-a"), answers(f"{tag}-b", failing={1})
    rows = []
    for i in range(N):
        rows.append((f"{tag}-a", PROMPT, clean[i]))
        rows.append((f"{tag}-b", OTHER, failing[i]))
    return rows


def check_rows(server: Server, rows: Sequence[tuple[str, str, str]], outputs: list[Any]) -> None:
    """Row by row, against the server's record: a scored row gets its reward; a masked row the
    mean of its group's scored rewards (0.0 when none), with `genrm_masked` 1.0."""
    for uid in dict.fromkeys(uid for uid, _, _ in rows):
        expected = server_rewards(server, f"verl-{uid}")
        assert len(expected) == N
        scored = [r for r in expected.values() if r is not None]
        mean = sum(scored) / len(scored) if scored else 0.0
        for position, (row_uid, _, text) in enumerate(rows):
            if row_uid != uid:
                continue
            reward = expected[digest(text)]
            output = outputs[position]
            info = output["reward_extra_info"]
            if reward is None:
                assert (output["reward_score"], info["genrm_masked"]) == (mean, 1.0), position
            else:
                assert (output["reward_score"], info["genrm_masked"]) == (reward, 0.0), position
            assert info["genrm_scored_mean"] == mean
    # the failing member's pairs are masked: uid-b has masked and scored rows
    masks = [o["reward_extra_info"]["genrm_masked"] for o in outputs[1::2]]
    assert 0.0 in masks and 1.0 in masks
    assert FAIL in rows[3][2]


def digest(text: str) -> str:
    return response_digest(verify_body(PROMPT, text, group_id="-", rollout_index=0)["response"])


# --- without verl: the manager as verl's worker calls it ------------------------------------------


class Row:
    """One row of a verl `DataProto` as `run_single` reads it: `batch` tensors and
    `non_tensor_batch` values (verl/experimental/reward_loop/reward_manager/naive.py)."""

    def __init__(self, batch: dict[str, Any], non_tensor_batch: dict[str, Any]) -> None:
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch


class OneRow:
    """`data[i : i + 1]`: a batch of one row (`len`, and `data[0]`)."""

    def __init__(self, row: Row) -> None:
        self.row = row

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> Row:
        assert index == 0
        return self.row


def fake_rows(tokens: Tokens, tag: str) -> tuple[list[tuple[str, str, str]], list[OneRow]]:
    require("torch")
    import torch

    rows = batch_texts(tag)
    batches = []
    for uid, prompt, text in rows:
        responses = torch.zeros(RESPONSE_LENGTH, dtype=torch.int64)
        responses[0] = tokens.encode(text)
        mask = torch.cat([torch.ones(4, dtype=torch.int64), (responses > 0).long()])
        row = Row(
            {"responses": responses, "attention_mask": mask},
            {"uid": uid, "raw_prompt": [{"role": "user", "content": prompt}]},
        )
        batches.append(OneRow(row))
    return rows, batches


def test_the_manager_scores_rows_as_verls_worker_calls_it(server: Server) -> None:
    tokens = Tokens()
    rows, batches = fake_rows(tokens, "by-hand")
    manager = GenRMRewardManager(verl_config(server.url), tokens, None)

    async def worker() -> list[Any]:  # RewardLoopWorker.compute_score_batch: a task per row
        return list(await asyncio.gather(*(manager.run_single(b) for b in batches)))

    outputs = asyncio.run(worker())
    check_rows(server, rows, outputs)
    assert manager._groups == {}  # every group answered: nothing kept


def test_a_verl_config_with_other_group_sizes_is_refused() -> None:
    settings = GroupSettings(8, 60.0, 60.0)
    config = verl_config("http://x")
    config["actor_rollout_ref"]["rollout"] = {"n": 8, "val_kwargs": {"n": 8}}
    check_verl_config(config, settings)  # the same sizes: accepted
    config["actor_rollout_ref"]["rollout"]["n"] = 16
    with pytest.raises(GroupSizeError, match=r"actor_rollout_ref\.rollout\.n is 16 but .*=8: set "):
        check_verl_config(config, settings)
    config["actor_rollout_ref"]["rollout"] = {"n": 8, "val_kwargs": {"n": 1}}
    with pytest.raises(GroupSizeError, match=r"val_kwargs\.n is 1 .* or turn validation off"):
        check_verl_config(config, settings)
    config["trainer"] = {"val_before_train": False, "test_freq": -1}
    check_verl_config(config, settings)  # no validation: its n does not matter
    config["reward"]["num_workers"] = 8
    with pytest.raises(GroupSizeError, match=r"set reward\.num_workers=1"):
        check_verl_config(config, settings)
    with pytest.raises(ValueError, match=r"\+reward\.reward_kwargs\.genrm_url="):
        GenRMRewardManager(verl_config(""), Tokens(), None)


def test_a_uid_with_more_rows_than_the_group_is_refused(server: Server) -> None:
    tokens = Tokens()
    rows, batches = fake_rows(tokens, "extra-row")
    manager = GenRMRewardManager(verl_config(server.url), tokens, None)
    group_a = [b for (uid, _, _), b in zip(rows, batches, strict=True) if uid == "extra-row-a"]

    async def worker() -> None:  # N + 1 rows of one uid at once: the last has no index
        await asyncio.gather(*(manager.run_single(b) for b in [*group_a, group_a[0]]))

    with pytest.raises(GroupSizeError, match=r"more than num_rollouts_per_prompt=4 rollouts"):
        asyncio.run(worker())


def test_a_refused_row_raises_the_clients_error_and_its_group_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        index = json.loads(request.content)["_ng_rollout_index"]
        if index == 2:
            return httpx.Response(409, json={"detail": "superseded"})
        return httpx.Response(503, json={"detail": "waiting", "reason": "at_capacity"})

    def client(*args: Any, **kwargs: Any) -> AsyncGenRMClient:
        http = httpx.AsyncClient(transport=httpx.MockTransport(refuse))
        return AsyncGenRMClient("http://genrm", http=http, group_settings=SETTINGS)

    monkeypatch.setattr(genrm_trio.verl, "loop_client", client)
    tokens = Tokens()
    rows, batches = fake_rows(tokens, "refused")
    manager = GenRMRewardManager(verl_config("http://genrm"), tokens, None)
    group_a = [b for (uid, _, _), b in zip(rows, batches, strict=True) if uid == "refused-a"]

    async def worker() -> list[Any]:
        return list(
            await asyncio.gather(*(manager.run_single(b) for b in group_a), return_exceptions=True)
        )

    errors = asyncio.run(worker())
    refused = [e for e in errors if isinstance(e, GenRMRequestError)]
    assert [(e.status, e.detail) for e in refused] == [(409, "superseded")]  # the error itself
    others = [e for e in errors if not isinstance(e, GenRMRequestError)]
    assert len(others) == N - 1
    for error in others:  # the rows waiting with it stop too, naming why
        assert type(error) is GenRMError
        assert str(error) == "uid refused-a: another rollout of the group failed: " + str(
            refused[0]
        )
    assert manager._groups == {}


# --- with verl: its own reward loop --------------------------------------------------------------


# verl's own imports: ray's deprecated state API path
@pytest.mark.filterwarnings("ignore:Ray state API is no longer experimental:DeprecationWarning")
def test_verls_reward_loop_with_the_genrm_manager(server: Server, tmp_path: Path) -> None:
    require("verl", "torch", "transformers", "tokenizers")
    from omegaconf import OmegaConf
    from tiny_models import build_tiny_model
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    policy = build_tiny_model(tmp_path / "policy")
    config = verl_config(server.url)
    config["actor_rollout_ref"]["model"]["path"] = str(policy.path)
    conf = OmegaConf.create(config)
    worker = RewardLoopWorker(conf)  # verl loads the manager from reward.reward_manager.*
    try:
        check_verls_worker(worker, conf, server)
    finally:
        worker.loop.close()  # verl's worker makes an event loop of its own; the test ends it


def check_verls_worker(worker: Any, conf: Any, server: Server) -> None:
    import numpy as np
    import torch
    from verl import DataProto
    from verl.trainer.ppo.reward import resolve_reward_manager_cls

    assert type(worker.reward_manager) is GenRMRewardManager
    tokenizer = worker.input_tokenizer

    def verl_batch(rows: list[tuple[str, str, str]]) -> tuple[Any, list[int]]:
        """verl's batch of `rows`: left-padded prompts, right-padded responses."""
        prompt_len = 8
        prompts = torch.zeros(len(rows), prompt_len, dtype=torch.int64)
        responses = torch.full((len(rows), RESPONSE_LENGTH), tokenizer.pad_token_id)
        mask = torch.zeros(len(rows), prompt_len + RESPONSE_LENGTH, dtype=torch.int64)
        mask[:, :prompt_len] = 1
        lengths = []
        for i, (_, _, text) in enumerate(rows):
            ids = tokenizer.encode(text, add_special_tokens=False)[:RESPONSE_LENGTH]
            assert tokenizer.decode(ids, skip_special_tokens=True) == text  # lossless
            responses[i, : len(ids)] = torch.tensor(ids)
            mask[i, prompt_len : prompt_len + len(ids)] = 1
            lengths.append(len(ids))
        chats = np.empty(len(rows), dtype=object)  # a list of messages per row, as verl keeps
        for i, (_, prompt, _) in enumerate(rows):
            chats[i] = [{"role": "user", "content": prompt}]
        data = DataProto.from_dict(
            tensors={"prompts": prompts, "responses": responses, "attention_mask": mask},
            non_tensors={
                "uid": np.array([uid for uid, _, _ in rows], dtype=object),
                "raw_prompt": chats,
                "data_source": np.array(["genrm"] * len(rows), dtype=object),
                "reward_model": np.array([{"ground_truth": None}] * len(rows), dtype=object),
                "extra_info": np.array([{} for _ in rows], dtype=object),
            },
        )
        return data, lengths

    async def batch(data: Any) -> list[Any]:  # RewardLoopManager.compute_rm_score, one worker
        return list(await worker.compute_score_batch(data))

    async def streamed(data: Any) -> list[Any]:  # the agent loop: compute_score per row
        return list(
            await asyncio.gather(*(worker.compute_score(data[i : i + 1]) for i in range(len(data))))
        )

    manager_cls = resolve_reward_manager_cls(conf)
    assert manager_cls is GenRMRewardManager
    for tag, run in (("verl-batch", batch), ("verl-streamed", streamed)):
        rows = batch_texts(tag)
        data, lengths = verl_batch(rows)
        outputs = asyncio.run(run(data))
        check_rows(server, rows, outputs)
        scores = [output["reward_score"] for output in outputs]
        rm_scores = manager_cls.assemble_rm_scores(data, scores)
        for i, length in enumerate(lengths):  # on the last response token, nowhere else
            assert rm_scores[i, length - 1].item() == pytest.approx(scores[i])
            assert rm_scores[i].count_nonzero() <= 1
