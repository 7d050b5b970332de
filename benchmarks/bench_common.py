"""What the benchmarks share (a helper, not a benchmark): the rollout the in-process ones send
to `open_engine`, the simulated judge wrapped to count or fail calls, a comparison judged in one
attempt (for scoring without a judge), the commit a results file records, and the `/verify` the
HTTP ones (judge_limits.py, judge_restart.py) post.

Imported by the benchmarks that use it, which put this folder on `sys.path` first (so that the
tests can load them by path too).
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import trio

from genrm_trio import VerifyInput
from genrm_trio.app import bench
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


async def post_verify(
    pool: bench.HttpPool,
    errors: list[str],
    *,
    group: int,
    rollout: int,
    group_id: str,
    prompt: str,
    answer_chars: int,
) -> dict[str, Any] | None:
    """POST rollout `rollout` of `group` to `/verify` (an answer of `answer_chars` characters);
    its reply row, or None with why in `errors` (a broken connection, a timeout, a status other
    than 200)."""
    body = bench.verify_body(
        task=group,
        rollout=rollout,
        group_id=group_id,
        attempt=0,
        prompt=prompt,
        answer=bench.answer_text(group, rollout, answer_chars),
    )
    try:
        status, reply = await pool.post("/verify", json.dumps(body).encode())
    except (httpx.HTTPError, trio.TooSlowError) as exc:
        errors.append(f"g{group} r{rollout}: {type(exc).__name__}: {exc}")
        return None
    if status != 200:
        errors.append(f"g{group} r{rollout}: HTTP {status} {reply[:200]!r}")
        return None
    row: dict[str, Any] = json.loads(reply)
    return row
