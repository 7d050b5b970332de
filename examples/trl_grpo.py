"""TRL's GRPOTrainer on genrm-trio rewards, runnable on a CPU with nothing downloaded
(docs/trainers.md, "TRL").

    pip install torch '.[trl]'       # from a clone; torch's CPU wheel is enough
    python examples/trl_grpo.py

It builds a tiny policy here (a random-weights Llama, 2 layers, with a byte-level BPE tokenizer
trained on a few hundred made-up lines), starts genrm-trio's simulated judge (which fails a fifth
of the pairs, the same pairs every time) and a server in front of it on 127.0.0.1, trains 3 GRPO
steps with `genrm_reward`, and prints how many completions were scored and how many masked.
A masked completion's reward is None: TRL leaves it out of its group's statistics. Nothing
here is specific to a tiny model: point `model=` at your policy and `genrm_reward` at your server.
"""

from __future__ import annotations

import logging
import random
import sys
import tempfile
from pathlib import Path

from genrm_trio.client import MaskedRollout, RolloutResult
from genrm_trio.testing.procs import Proc, start
from genrm_trio.trl import TRL_LOGGER, MaskedRowWarningFilter, genrm_reward

GROUP = 4  # TRL's num_generations, and the server's num_rollouts_per_prompt
STEPS = 3
WORDS = "ice water cold warm slippery layer melts pressure thin friction surface why".split()


def build_policy(directory: Path) -> Path:
    """A tiny causal LM and its tokenizer, saved where `from_pretrained` loads them."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(300)]
    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    bpe = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<unk>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(lines, trainer=bpe)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        chat_template=(
            "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
        ),
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def start_genrm(directory: Path) -> tuple[Proc, Proc]:
    """The simulated judge (a fifth of the pairs refused with a 401, the same ones on every
    retry) and `genrm-trio serve` in front of it, both on 127.0.0.1 with a free port."""
    judge = start(
        [
            "sim-judge",
            "--port",
            "0",
            "--fault-rate",
            "0.2",
            "--fault-kind",
            "http_401",
            "--sticky-faults",
            "--seed",
            "0",
        ],
        directory / "judge.err",
    )
    config = directory / "genrm.yaml"
    config.write_text(f"num_rollouts_per_prompt: {GROUP}\ncomparison_strategy: circular\n")
    try:
        server = start(
            [
                "serve",
                "--config",
                str(config),
                "--port",
                "0",
                "--judge-url",
                judge.url + "/v1",
                "--judge-api",
                "genrm_model",
            ],
            directory / "serve.err",
        )
    except BaseException:
        judge.close()
        raise
    return judge, server


def main() -> int:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    # TRL warns about every batch with a row that every reward function gave None: for
    # genrm-trio that is a masked completion, not a mistake (docs/trainers.md)
    logging.getLogger(TRL_LOGGER).addFilter(MaskedRowWarningFilter())
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        policy = build_policy(directory / "policy")
        judge, server = start_genrm(directory)
        try:
            reward = genrm_reward(server.url)
            seen: list[RolloutResult] = []

            def keep(prompts: list[str], completions: list[str], **kwargs: object) -> list:
                rewards = reward(prompts, completions, **kwargs)
                seen.extend(reward.last_results)
                return rewards

            keep.__name__ = "genrm"  # TRL's name in its logs: rewards/genrm/mean
            trainer = GRPOTrainer(
                model=str(policy),
                reward_funcs=[keep],
                args=GRPOConfig(
                    output_dir=str(directory / "out"),
                    per_device_train_batch_size=2 * GROUP,
                    num_generations=GROUP,
                    max_completion_length=8,
                    max_steps=STEPS,
                    logging_steps=1,
                    report_to="none",
                    save_strategy="no",
                    use_cpu=True,
                    seed=0,
                    activation_checkpointing=False,
                ),
                train_dataset=Dataset.from_dict(
                    {"prompt": [f"question {i}: why is ice slippery?" for i in range(8)]}
                ),
            )
            trainer.train()
        finally:
            server.close()
            judge.close()
    masked = sum(1 for result in seen if type(result) is MaskedRollout)
    print(
        f"steps={trainer.state.global_step} completions={len(seen)} "
        f"scored={len(seen) - masked} masked={masked}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
