"""docs/embedding.md cannot drift: its example is docs/examples/embed_engine.py, and it runs.

The python block after ``<!-- example: docs/examples/embed_engine.py -->`` must equal the file,
and the text block after ``<!-- output: docs/examples/embed_engine.py -->`` must equal what the
file prints. The example runs in this test's trio run (the simulated judge has no latency).
docs/architecture.md's copy of the state diagram must equal the machine's own rendering.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest
import trio
from loading import load_script

import genrm_trio
import genrm_trio.testing
from genrm_trio import GroupFailed, Masked, Scored
from genrm_trio.engine.machine import render_mermaid

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "embedding.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
EXAMPLE = "docs/examples/embed_engine.py"


def block_after(marker: str, language: str) -> str:
    """The fenced ``language`` block right after the HTML comment ``marker`` in embedding.md."""
    text = DOC.read_text(encoding="utf-8")
    pattern = re.escape(f"<!-- {marker} -->") + rf"\n```{language}\n(.*?)^```$"
    found = re.findall(pattern, text, flags=re.DOTALL | re.MULTILINE)
    assert len(found) == 1, f"expected one {language} block after <!-- {marker} --> in {DOC}"
    return str(found[0])


def load_example() -> ModuleType:
    return load_script(EXAMPLE, "embed_engine_example")


def test_doc_block_is_the_example_file() -> None:
    assert block_after(f"example: {EXAMPLE}", "python") == (ROOT / EXAMPLE).read_text(
        encoding="utf-8"
    )


async def test_example_runs_and_prints_the_documented_output(
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = load_example()
    with trio.fail_after(30):
        outcomes = await module.main()
    printed = capsys.readouterr().out
    assert printed == block_after(f"output: {EXAMPLE}", "text")

    assert sorted(outcomes) == [0, 1, 2, 3]
    assert [type(outcomes[i]) for i in range(4)] == [Scored, Scored, Masked, Masked]
    assert outcomes[0].result["reward"] == 5.0
    assert outcomes[1].result["reward"] == 4.0
    assert outcomes[0].result["mask_sample"] is False
    assert outcomes[0].result["genrm_failed_comparison_rate_per_group"] == 0.25
    assert outcomes[0].result["genrm_masked_rollout_rate_per_group"] == 0.5
    assert "pair=(2, 3)" in outcomes[2].reason
    assert not any(isinstance(o, GroupFailed) for o in outcomes.values())


def test_the_embedding_names_are_exported() -> None:
    for name in (
        "open_engine",
        "VerifyInput",
        "CompareInput",
        "Scored",
        "Masked",
        "GroupFailed",
        "make_judge",
        "Settings",
        "load_settings",
        "ConfigError",
        "Judge",
        "JudgeCall",
        "JudgeReply",
        "ReplyStatus",
    ):
        assert name in genrm_trio.__all__, name
        assert getattr(genrm_trio, name) is not None
    assert sorted(genrm_trio.__all__) == sorted(set(genrm_trio.__all__))
    for name in genrm_trio.__all__:
        getattr(genrm_trio, name)  # every listed name resolves
    # the simulated judge is a test tool: genrm_trio.testing, not the top-level package
    for name in ("SimJudge", "SimConfig", "FaultRule"):
        assert name in genrm_trio.testing.__all__, name
        assert getattr(genrm_trio.testing, name) is not None
        assert name not in genrm_trio.__all__, name
        with pytest.raises(AttributeError):
            getattr(genrm_trio, name)


def test_architecture_state_diagram_is_the_machine() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    blocks = re.findall(r"^```mermaid\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)
    assert blocks == [render_mermaid()]
