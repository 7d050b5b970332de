"""The tiny-model builder (tests/tiny_models.py): each variant writes what its name says, with
no hub download. Skipped without the ML packages unless GENRM_TRIO_REQUIRE_ML=1 (then failed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tiny_models
from tiny_models import (
    BUDGET,
    SAMPLING,
    STRICT,
    VERDICT,
    VERDICT_BUDGET,
    VERDICT_TEXT,
    TinyModel,
    TinyModelSpec,
    build_tiny_model,
)

pytestmark = pytest.mark.slow

MESSAGES = [
    {"role": "system", "content": "judge"},
    {"role": "user", "content": "which answer is better?"},
    {"role": "principle", "content": "be short"},
    {"role": "response_1", "content": "the first answer"},
    {"role": "response_2", "content": "the second answer, longer than the first"},
]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing may come from the hub."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def load(model: TinyModel) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(model.path), AutoModelForCausalLM.from_pretrained(
        model.path
    )


def generate(model: TinyModel, messages: list[dict[str, str]], budget: int, seed: int) -> list[int]:
    """The new token ids of one sampled reply of at most `budget` tokens."""
    import torch

    tokenizer, network = load(model)
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    torch.manual_seed(seed)
    out = network.generate(**inputs, max_new_tokens=budget)
    ids: list[int] = out[0][inputs["input_ids"].shape[1] :].tolist()
    return ids


def test_shape_config_and_files(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "m", SAMPLING)
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(model.path)
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("llama", 64, 2)
    assert config.vocab_size == model.vocab_size
    generation = GenerationConfig.from_pretrained(model.path)
    assert generation.do_sample is True
    assert generation.sequence_bias is None
    names = {path.name for path in model.path.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors"} <= names
    assert {"tokenizer.json", "tokenizer_config.json"} <= names


def test_the_tokenizer_is_trained_here_and_reads_any_text(tmp_path: Path) -> None:
    tokenizer, _ = load(build_tiny_model(tmp_path / "m", SAMPLING))
    # merges were learnt from the generated lines: a frequent word is one token or two
    assert len(tokenizer.tokenize(" judge")) <= 2
    # bytes it never saw still tokenize (byte-level), and decode back unchanged
    text = 'ünïcode ✓ 42 {"x": 1}'
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    # longer text is more tokens: what the real-judge tests read in prompt-token counts
    short = tokenizer.encode("a short answer", add_special_tokens=False)
    long = tokenizer.encode("a short answer " * 40, add_special_tokens=False)
    assert len(long) > len(short) + 40


def test_any_role_template_renders_every_role(tmp_path: Path) -> None:
    tokenizer, _ = load(build_tiny_model(tmp_path / "m", SAMPLING))
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    for message in MESSAGES:
        assert f"<|{message['role']}|>{message['content']}\n" in text
    assert text.endswith("<|assistant|>")


def test_strict_template_rejects_unknown_roles(tmp_path: Path) -> None:
    tokenizer, _ = load(build_tiny_model(tmp_path / "m", STRICT))
    from jinja2.exceptions import TemplateError

    plain = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert "<|user|>u\n" in tokenizer.apply_chat_template(plain, tokenize=False)
    with pytest.raises(TemplateError, match="unknown role: principle"):
        tokenizer.apply_chat_template(MESSAGES, tokenize=False)


@pytest.mark.parametrize("spec", [VERDICT, STRICT], ids=["verdict", "strict"])
def test_verdict_model_writes_the_verdict_and_stops(tmp_path: Path, spec: TinyModelSpec) -> None:
    model = build_tiny_model(tmp_path / "m", spec)
    assert model.verdict_token_id is not None
    tokenizer, _ = load(model)
    messages = MESSAGES[:2]
    for seed in range(5):
        ids = generate(model, messages, budget=16, seed=seed)
        assert ids == [model.verdict_token_id, model.eos_token_id], seed
        assert tokenizer.decode(ids, skip_special_tokens=True) == VERDICT_TEXT


def test_budget_model_runs_to_the_budget(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "m", BUDGET)
    for seed in range(3):
        ids = generate(model, MESSAGES, budget=24, seed=seed)
        assert len(ids) == 24 and model.eos_token_id not in ids, (seed, ids)


def test_verdict_budget_model_writes_verdicts_to_the_budget(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "m", VERDICT_BUDGET)
    ids = generate(model, MESSAGES, budget=5, seed=0)
    assert ids == [model.verdict_token_id] * 5


def test_sampling_model_samples(tmp_path: Path) -> None:
    """do_sample: two seeds give two different replies (greedy decoding would repeat one)."""
    model = build_tiny_model(tmp_path / "m", SAMPLING)
    first = generate(model, MESSAGES, budget=12, seed=1)
    second = generate(model, MESSAGES, budget=12, seed=2)
    assert first != second
    assert len(set(first)) > 3


def test_missing_ml_packages_skip_or_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """require_ml skips without GENRM_TRIO_REQUIRE_ML and fails with it."""

    def hide_torch(name: str, *args: Any) -> Any:
        """Every package present but torch, whatever this venv holds."""
        return None if name == "torch" else object()

    monkeypatch.setattr(tiny_models.importlib.util, "find_spec", hide_torch)
    monkeypatch.delenv(tiny_models.REQUIRE_ML_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"^torch not installed"):
        tiny_models.require_ml()
    monkeypatch.setenv(tiny_models.REQUIRE_ML_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="GENRM_TRIO_REQUIRE_ML is set"):
        tiny_models.require_ml()
