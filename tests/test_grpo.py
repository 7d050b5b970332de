"""A real GRPO run: TRL's `GRPOTrainer` for 2 steps on CPU with a tiny policy built here (random
weights, a tokenizer trained here, no hub: tests/tiny_models.py), rewarded by
`genrm_trio.trl.genrm_reward` from a live `genrm-trio serve` whose simulated judge fails a
fixed share of the pairs, the same pairs on every retry (`--sticky-faults`).

It checks what docs/trainers.md promises a TRL user: the steps ran; every completion the server
masked got None and TRL left it out of its group's statistics (the logged reward mean and
standard deviation, and the advantages: a masked row's is 0, the others' use the mean and
standard deviation of the scored rows alone); every scored completion got the server's reward
exactly (the server's own record of the group, `GET /checkpoint`, is the reference).

Needs torch, transformers, tokenizers, trl, accelerate and datasets: skipped without them,
failed instead when GENRM_TRIO_REQUIRE_ML=1 (`.ci/run` sets it on the leg that installs them).
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from procs import Proc, start_judge, start_server
from tiny_models import ML_PACKAGES, build_tiny_model, require_packages

from genrm_trio.client import (
    Completion,
    GenRMClient,
    MaskedRollout,
    Prompt,
    RolloutResult,
    ScoredRollout,
    verify_body,
)
from genrm_trio.domain.text import response_digest
from genrm_trio.trl import GenRMReward

pytestmark = [
    pytest.mark.slow,
    # TRL 1.16 still uses transformers' deprecated gradient_checkpointing names internally
    pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.* is deprecated:FutureWarning"),
]

N = 4  # TRL's num_generations and the server's num_rollouts_per_prompt
STEPS = 2
BATCH = 8  # completions per step: two groups
TRL_PACKAGES = ("trl", "accelerate", "datasets")
CONFIG: dict[str, Any] = {
    "num_rollouts_per_prompt": N,
    "comparison_strategy": "circular",
    "cohort_collection_timeout_s": 60.0,
    "cohort_evaluation_timeout_s": 60.0,
    "judge_request_timeout_s": 10.0,
}
# A 401 is not retried: a failed pair is masked at once. With these, each of the two steps'
# four groups holds masked and scored completions side by side (at least one is checked).
JUDGE_FLAGS = ("--fault-rate", "0.2", "--fault-kind", "http_401", "--sticky-faults", "--seed", "0")


def require_trl() -> None:
    """Skip without the packages of the run (fail with GENRM_TRIO_REQUIRE_ML=1, as
    tests/tiny_models.py's `require_ml` does)."""
    require_packages(ML_PACKAGES + TRL_PACKAGES, extras="serve-tests,trl")


class Recording(GenRMReward):
    """genrm_reward's function, keeping every batch it scored (what TRL gave it, what it gave
    back) for the checks."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url)
        self.batches: list[tuple[list[Completion], list[RolloutResult]]] = []
        self.num_generations_seen: list[int | None] = []

    def score_batch(
        self,
        prompts: Sequence[Prompt],
        completions: Sequence[Completion],
        *,
        num_generations: int | None = None,
    ) -> list[RolloutResult]:
        self.num_generations_seen.append(num_generations)  # read from the trainer
        results = super().score_batch(prompts, completions, num_generations=num_generations)
        self.batches.append((list(completions), results))
        return results


@pytest.fixture
def genrm(tmp_path: Path) -> Iterator[Proc]:
    judge = start_judge(tmp_path, *JUDGE_FLAGS)
    try:
        serve = start_server(tmp_path, CONFIG, judge_url=judge.url + "/v1")
        try:
            yield serve
        finally:
            serve.close()
    finally:
        judge.close()


def server_records(url: str, run_id: str) -> dict[tuple[int, int], dict[str, Any] | None]:
    """The server's record of every member of this run's groups, by (call, group number) and
    rollout index: its result row, or None for a masked member."""
    export = httpx.get(url + "/checkpoint", timeout=30).json()
    records: dict[tuple[int, int], dict[str, Any] | None] = {}
    prefix = f"trl-{run_id}-"
    for cohort in export["cohorts"]:
        if not cohort["group_id"].startswith(prefix):
            continue
        call, number = map(int, cohort["group_id"][len(prefix) :].split("-"))
        for index in range(N):
            member = cohort["members"].get(str(index))  # none at all in a failed group
            records[(call * BATCH // N + number, index)] = member and member["result"]
    return records


def float32(value: float) -> float:
    import torch

    return float(torch.tensor(value, dtype=torch.float32))


def expected_advantages(rewards: Sequence[float | None]) -> list[float]:
    """TRL 1.16's group advantages with None rows left out: (r - mean) / (std + 1e-4) over the
    group's scored rows (sample std), 0 for a None row and where the std is undefined."""
    out: list[float] = []
    for start in range(0, len(rewards), N):
        group = rewards[start : start + N]
        scored = [float32(r) for r in group if r is not None]
        mean = statistics.fmean(scored) if scored else math.nan
        std = statistics.stdev(scored) if len(scored) > 1 else math.nan
        for reward in group:
            value = (float32(reward) - mean) / (std + 1e-4) if reward is not None else math.nan
            out.append(0.0 if math.isnan(value) else value)
    return out


def test_grpo_trains_two_steps_on_genrm_rewards_with_masked_rows_left_out(
    tmp_path: Path, genrm: Proc
) -> None:
    require_trl()
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    logs: list[tuple[list[float], list[float]]] = []  # each step's advantages and rewards

    class KeepLogs(TrainerCallback):  # type: ignore[misc]
        """TRL's logs hold the last generation batch only: keep each step's."""

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            advantages = list(trainer._logs["advantages"])
            logs.append((advantages, list(trainer._logs["rewards"]["genrm"])))

    policy = build_tiny_model(tmp_path / "policy", seed=0)
    prompts = [f"question {i}: which answer is better for the user?" for i in range(8)]
    reward = Recording(genrm.url)
    trainer = GRPOTrainer(
        model=str(policy.path),
        reward_funcs=[reward],
        args=GRPOConfig(
            output_dir=str(tmp_path / "out"),
            per_device_train_batch_size=BATCH,
            num_generations=N,
            max_completion_length=8,
            max_steps=STEPS,
            logging_steps=1,
            learning_rate=1e-3,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            seed=0,
            data_seed=0,
            activation_checkpointing=False,  # not the deprecated gradient_checkpointing TRL sets
        ),
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        callbacks=[KeepLogs()],
    )
    trainer.train()

    # the steps ran, one scored batch each
    assert trainer.state.global_step == STEPS
    logged = [entry for entry in trainer.state.log_history if "rewards/genrm/mean" in entry]
    assert len(logged) == STEPS == len(reward.batches)
    assert reward.num_generations_seen == [N] * STEPS  # TRL's, through its log_metric

    # every completion got the server's answer: None where it masked, its reward exactly
    records = server_records(genrm.url, str(reward.run_id))
    assert len(records) == STEPS * BATCH
    masked = scored = 0
    for call, (completions, results) in enumerate(reward.batches):
        assert len(completions) == len(results) == BATCH
        for position, (completion, result) in enumerate(zip(completions, results, strict=True)):
            record = records[(call * BATCH // N + position // N, position % N)]
            if record is None:
                assert type(result) is MaskedRollout
                masked += 1
            else:
                assert type(result) is ScoredRollout and result.reward == record["reward"]
                assert record["answer_text"] == completion
                scored += 1
    # the run held masked and scored completions side by side in one group (with these flags
    # and seeds, every group of both steps): what the statistics below must keep apart
    mixed = [
        {type(result) for result in results[start : start + N]} == {MaskedRollout, ScoredRollout}
        for _, results in reward.batches
        for start in range(0, BATCH, N)
    ]
    assert any(mixed), (masked, scored)

    # TRL's statistics leave the None rows out: each step's logged mean and std are over the
    # scored rows (counting a None as 0 would change them wherever a step masked one)
    for entry, (_, results) in zip(logged, reward.batches, strict=True):
        values = [float32(r.reward) for r in results if type(r) is ScoredRollout]
        assert entry["rewards/genrm/mean"] == pytest.approx(statistics.fmean(values), abs=1e-6)
        if len(values) > 1:
            assert entry["rewards/genrm/std"] == pytest.approx(statistics.stdev(values), abs=1e-5)
        assert entry["reward"] == pytest.approx(statistics.fmean(values), abs=1e-6)

    # and each step's advantages: 0 for a masked row, the scored rows' own group statistics
    # for the others; TRL's logged rewards are the server's, NaN for a masked row
    assert len(logs) == STEPS
    for (advantages, logged_rewards), (_, results) in zip(logs, reward.batches, strict=True):
        rewards = [r.reward if type(r) is ScoredRollout else None for r in results]
        assert advantages == pytest.approx(expected_advantages(rewards), abs=1e-4)
        for value, expected in zip(logged_rewards, rewards, strict=True):
            if expected is None:
                assert math.isnan(value)
            else:
                assert value == float32(expected)


# One process of a two-process run: torch.distributed (gloo, env://) as accelerate sets it up;
# genrm_reward finds its rank and the number of processes there, and process 0's run id is
# broadcast on the first call. Each process holds half of one group (TRL's slices).
PROCESS = """
import json, sys
import torch.distributed as dist
from genrm_trio.trl import genrm_reward

dist.init_process_group("gloo")
url, texts = sys.argv[1], json.loads(sys.argv[2])
rank = dist.get_rank()
reward = genrm_reward(url)
rewards = reward(prompts=["the prompt"] * 2, completions=texts[2 * rank : 2 * rank + 2])
print(json.dumps({"rank": rank, "run_id": reward.run_id, "rewards": rewards}))
dist.destroy_process_group()
"""


def test_two_processes_split_a_group_and_the_server_joins_it(genrm: Proc) -> None:
    require_trl()
    texts = [f"answer {i}: a thin liquid-like layer makes ice slippery" for i in range(N)]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS, genrm.url, json.dumps(texts)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
        assert proc.returncode == 0, err
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    first, second = outputs
    assert (first["rank"], second["rank"]) == (0, 1)
    assert first["run_id"] == second["run_id"]  # broadcast from process 0
    joined = first["rewards"] + second["rewards"]
    assert joined == GenRMClient(genrm.url).score_group("the prompt", texts)
    # one group on the server, its members from both processes
    export = httpx.get(genrm.url + "/checkpoint", timeout=30).json()
    [cohort] = [c for c in export["cohorts"] if c["group_id"] == f"trl-{first['run_id']}-0-0"]
    digests = [cohort["members"][str(i)]["response_digest"] for i in range(N)]
    sent = [verify_body("the prompt", text, group_id="g", rollout_index=0) for text in texts]
    assert digests == [response_digest(body["response"]) for body in sent]


def test_the_trl_example_trains_three_steps_and_counts_masked_rows() -> None:
    """examples/trl_grpo.py, as a user runs it (README, "With TRL"): its own tiny policy, the
    simulated judge and a server; TRL's warning about masked rows is filtered out."""
    require_trl()
    example = Path(__file__).resolve().parent.parent / "examples" / "trl_grpo.py"
    done = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, timeout=600, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    fields = dict(field.split("=") for field in last.split())
    assert fields["steps"] == "3" and fields["completions"] == "24", last
    assert int(fields["scored"]) + int(fields["masked"]) == 24
    assert int(fields["scored"]) > 0 and int(fields["masked"]) > 0  # the judge's faults masked
    assert "All reward functions returned None" not in output


def test_the_masked_row_filter_drops_only_trls_all_none_warning() -> None:
    import logging

    from genrm_trio.trl import MaskedRowWarningFilter

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("trl", logging.WARNING, __file__, 1, message, None, None)

    quiet = MaskedRowWarningFilter()
    warning = (
        "[RANK 0] All reward functions returned None for the following kwargs:\n{}\n"
        "Please ensure that at least one reward function returns a valid reward."
    )
    assert not quiet.filter(record(warning))
    assert not quiet.filter(record(warning.removeprefix("[RANK 0] ")))
    assert quiet.filter(record("Some other warning about reward functions"))
