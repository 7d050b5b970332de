"""What the in-process benchmarks share (a helper, not a benchmark): the rollout they send to
`open_engine`, the simulated judge wrapped to count or fail calls, a comparison judged in one
attempt (for scoring without a judge), and the commit a results file records.

Imported by budget_escalation.py, reward_quality.py and scoring_cpu.py, which put this folder on
`sys.path` first (so that the tests can load them by path too).
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
from collections.abc import Iterator

from genrm_trio import VerifyInput
from genrm_trio.domain.verdict import Verdict
from genrm_trio.judge.base import ComparisonResult, JudgeCall, JudgeReply, Usage
from genrm_trio.testing import SimJudge


@contextlib.contextmanager
def engine_logs_quiet() -> Iterator[None]:
    """The `genrm_trio` logger at ERROR inside the block, its level restored after: thousands of
    masking and exhaustion lines would drown a benchmark's table (the counts are its result), and
    a level left behind would hide the records of every test that runs after it in the process."""
    logger = logging.getLogger("genrm_trio")
    saved = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(saved)


class WrappedSim:
    """A `Judge` in front of a `SimJudge`: its endpoint, path and close; a subclass's `attempt`
    adds what it measures or injects."""

    def __init__(self, sim: SimJudge) -> None:
        self._sim = sim

    @property
    def endpoint(self) -> str:
        return self._sim.endpoint

    @property
    def path(self) -> str:
        return self._sim.path

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        return await self._sim.attempt(call)

    async def aclose(self) -> None:
        await self._sim.aclose()


def answered(verdict: Verdict) -> ComparisonResult:
    """A comparison the judge answered with `verdict` at its first attempt (100 tokens in, 10
    out): what an `Evaluation` holds for it."""
    return ComparisonResult(
        selected=verdict,
        overall=verdict,
        usage=Usage(100, 10, False),
        overall_parse_failed=False,
        rubric_parse_failed=False,
        attempts=1,
    )


def answer(group: int, index: int) -> str:
    """Rollout `index` of group `group`: distinct per rollout, tagged `[gG:I]` at its start."""
    return f"[g{group}:{index}] The answer, worked through step by step, is {group * 31 + index}."


def verify_input(group: int, index: int, prompt: str) -> VerifyInput:
    """The `/verify` input of `answer(group, index)` in group `g{group}` (attempt 0)."""
    return VerifyInput(
        input=[{"role": "user", "content": prompt, "type": "message"}],
        response={
            "id": f"resp-{group}-{index}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": answer(group, index)}],
                }
            ],
        },
        group_id=f"g{group}",
        group_attempt=0,
        group_attempt_given=True,
        rollout_index=index,
    )


def git_commit() -> str:
    """The checkout's short HEAD, or "unknown" outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()
