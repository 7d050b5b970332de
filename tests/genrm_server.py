"""A live `genrm-trio serve` for the client and trainer tests: groups of 4 under `circular`, and
the simulated judge as a server whose scripted fault fails every comparison with an answer
tagged `FAIL` (a 401: not retried, so the pair is masked at once)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import start_judge, start_server

N = 4
COLLECT_S = 2.0  # the collection deadline: a group with members missing fails after it
FAIL = "[fail]"
PROMPT = "Why is ice slippery?"
CONFIG: dict[str, Any] = {
    "num_rollouts_per_prompt": N,
    "comparison_strategy": "circular",
    "cohort_collection_timeout_s": COLLECT_S,
    "cohort_evaluation_timeout_s": 20.0,
    "judge_request_timeout_s": 5.0,
}


class Server:
    def __init__(self, directory: Path) -> None:
        self.judge = start_judge(directory, "--fault", f"http_401,match={FAIL}")
        try:
            self.serve = start_server(directory, CONFIG, judge_url=self.judge.url + "/v1")
        except BaseException:
            self.judge.close()
            raise
        self.url = self.serve.url

    def close(self) -> None:
        self.serve.close()
        self.judge.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    started = Server(tmp_path_factory.mktemp("genrm"))
    try:
        yield started
    finally:
        started.close()


def answers(tag: str, failing: set[int] | frozenset[int] = frozenset(), n: int = N) -> list[str]:
    """`n` distinct answers; those at `failing` carry the judge's fault tag."""
    return [
        f"answer {i} ({tag}): a thin liquid-like layer {FAIL if i in failing else ''}"
        for i in range(n)
    ]
