"""Tiny causal language models built at test time, with no hub download: the judge of the
real-server tests (`transformers serve`) and the policy of the GRPO
test.

A model is a random-weights Llama (hidden size 64, 2 layers) with a byte-level BPE tokenizer
trained with `tokenizers` on a few hundred generated lines, saved with `save_pretrained` in a
directory that `transformers serve` and `from_pretrained` load as a local path. Its
`generation_config` samples (`do_sample: true`): greedy decoding of random weights loops on one
token. Variants (`TinyModelSpec`):

- `SAMPLING`: random text that ends when it samples end of sequence (rarely: use a budget);
- `VERDICT`: always writes `VERDICT_TEXT` and stops. The verdict is one token of the
  vocabulary, forced first and then followed by end of sequence through
  `generation_config.sequence_bias`;
- `BUDGET`: never samples end of sequence, so every reply runs to the output budget;
- `VERDICT_BUDGET`: writes the verdict, then keeps writing it to the budget (a cut reply that
  holds a verdict);
- `STRICT`: a verdict model whose chat template accepts only `system`, `user` and `assistant`
  and raises on any other role, as many real chat templates do.

Every other template renders any role as `<|role|>content`.

The ML packages (torch, transformers, tokenizers) are optional: `require_ml()` skips a test
when one is missing, and fails it instead when GENRM_TRIO_REQUIRE_ML=1 (`.ci/run` sets it on
the leg that installs them), as tests/prom.py does for Prometheus.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

REQUIRE_ML_ENV: Final = "GENRM_TRIO_REQUIRE_ML"
ML_PACKAGES: Final = ("torch", "transformers", "tokenizers")
# what `transformers serve` imports besides transformers (`pip install 'transformers[serving]'`)
SERVING_PACKAGES: Final = ("fastapi", "uvicorn", "openai")

# One verdict the judge parser accepts (docs/scoring.md section 7), written as one token.
VERDICT_TEXT: Final = '{"score_1": 4, "score_2": 2, "ranking": 2}'
BOS: Final = "<s>"
EOS: Final = "</s>"
UNK: Final = "<unk>"
PAD: Final = "<pad>"

HIDDEN_SIZE: Final = 64
NUM_LAYERS: Final = 2
VOCAB_TARGET: Final = 600
TRAINING_LINES: Final = 300
MAX_POSITIONS: Final = 8192
# A logit bias that decides the next token outright whatever the random weights say.
FORCE: Final = 100.0

ANY_ROLE_TEMPLATE: Final = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
STRICT_TEMPLATE: Final = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def require_packages(wanted: Sequence[str], *, extras: str, env: str = REQUIRE_ML_ENV) -> None:
    """Skip the calling test when any of `wanted` is missing, naming them and
    `pip install torch '.[extras]'`; fail it instead when the variable `env` is set (CI)."""
    missing = [name for name in wanted if importlib.util.find_spec(name) is None]
    if not missing:
        return
    message = f"{', '.join(missing)} not installed (pip install torch '.[{extras}]')"
    if os.environ.get(env):
        pytest.fail(f"{message}; {env} is set, so they must be installed")
    pytest.skip(message)


def require_ml(*, serving: bool = False) -> None:
    """Skip the calling test when torch, transformers or tokenizers (and, with `serving`,
    `transformers serve`'s own packages) are missing; fail it instead when
    GENRM_TRIO_REQUIRE_ML is set (CI)."""
    require_packages(ML_PACKAGES + (SERVING_PACKAGES if serving else ()), extras="serve-tests")


@dataclass(frozen=True)
class TinyModelSpec:
    """What a tiny model writes: the verdict first or not, whether it ever stops, and whether
    its chat template rejects roles other than system, user and assistant."""

    verdict: bool = False
    stops: bool = True
    strict_roles: bool = False


SAMPLING: Final = TinyModelSpec()
VERDICT: Final = TinyModelSpec(verdict=True)
BUDGET: Final = TinyModelSpec(stops=False)
VERDICT_BUDGET: Final = TinyModelSpec(verdict=True, stops=False)
STRICT: Final = TinyModelSpec(verdict=True, strict_roles=True)


@dataclass(frozen=True)
class TinyModel:
    """A saved tiny model: its directory (a local path for `from_pretrained` and `transformers
    serve`), its spec and the token ids a test may need."""

    path: Path
    spec: TinyModelSpec
    eos_token_id: int
    verdict_token_id: int | None
    vocab_size: int


_WORDS: Final = (
    "the judge reads both answers and compares them on the principle given by the user "
    "a response is helpful when it is correct clear and short reward model score ranking "
    "first second better worse equal python code function list value error test group "
    "rollout prompt token model server request reply step train policy gradient sample"
).split()


def training_lines(count: int = TRAINING_LINES, seed: int = 0) -> list[str]:
    """`count` generated lines of words, digits and punctuation: enough for a byte-level BPE
    to learn some merges; any text still tokenizes through the byte alphabet."""
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 999)))
        lines.append(" ".join(words) + rng.choice((".", "?", "!", ",", ":")))
    return lines


def _tokenizer(spec: TinyModelSpec, seed: int) -> Any:
    """A `PreTrainedTokenizerFast` around a BPE trained on `training_lines`, with the chat
    template of `spec` and, for a verdict model, the verdict as one (non-special) token."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        special_tokens=[BOS, EOS, UNK, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(training_lines(seed=seed), trainer=trainer)
    if spec.verdict:
        # not special: a reply decoded with skip_special_tokens keeps it
        core.add_tokens([AddedToken(VERDICT_TEXT, special=False, normalized=False)])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        chat_template=STRICT_TEMPLATE if spec.strict_roles else ANY_ROLE_TEMPLATE,
    )


def _sequence_bias(spec: TinyModelSpec, eos: int, verdict: int | None) -> list[list[object]]:
    """`generation_config.sequence_bias` (its JSON form, `[[token ids], bias]`): a verdict
    model writes the verdict at once and, when it stops, end of sequence right after it; a
    model that never stops never samples end of sequence."""
    bias: list[list[object]] = []
    if verdict is not None:
        bias.append([[verdict], FORCE])
        if spec.stops:
            bias.append([[verdict, eos], 3 * FORCE])
    if not spec.stops:
        bias.append([[eos], -FORCE])
    return bias


def build_tiny_model(
    directory: Path, spec: TinyModelSpec = SAMPLING, *, seed: int = 0
) -> TinyModel:
    """Build and save the tiny model of `spec` in `directory` (created if missing); nothing is
    downloaded. Calls `require_ml()` first."""
    require_ml()
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(spec, seed)
    eos: int = tokenizer.eos_token_id
    verdict: int | None = None
    if spec.verdict:
        verdict = tokenizer.convert_tokens_to_ids(VERDICT_TEXT)
    vocab_size = len(tokenizer)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=2 * HIDDEN_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        bos_token_id=config.bos_token_id,
        eos_token_id=eos,
        pad_token_id=config.pad_token_id,
        sequence_bias=_sequence_bias(spec, eos, verdict) or None,
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "tiny_model.json").write_text(
        json.dumps({"verdict": spec.verdict, "stops": spec.stops, "strict": spec.strict_roles})
    )
    return TinyModel(directory, spec, eos, verdict, vocab_size)
