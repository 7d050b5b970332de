"""A Comparator over a real HttpJudge whose connections a script answers (tests/scripted.py,
an in-memory network), and the judge replies the comparison tests script: shared by
tests/test_attempts.py and tests/test_budget_escalation.py."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from scripted import Reply, Script

from genrm_trio.config import Settings, settings_from_mapping
from genrm_trio.judge.attempts import Comparator
from genrm_trio.judge.base import ComparisonResult, JudgeCall, JudgeError
from genrm_trio.judge.client import HttpJudge, make_http_judge
from genrm_trio.judge.fleet import as_fleet
from genrm_trio.judge.queue import judge_queue
from genrm_trio.metrics import Metrics

HISTORY = [{"role": "user", "content": "What is 2+2?"}]
CALL = JudgeCall(HISTORY, "four", "4", None)
PAIR = (0, 1)


# --- judge replies --------------------------------------------------------------------------


def reply(
    text: str | None = '{"score_1": 4, "score_2": 2, "ranking": 1}',
    *,
    status: str | None = "completed",
    usage: object = None,
    **extra: Any,
) -> Reply:
    body: dict[str, Any] = {
        "status": status,
        "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}],
    }
    if usage is not None:
        body["usage"] = usage
    body.update(extra)
    return Reply.json(body, 200, "content-type: text/plain")


def raw(payload: object) -> Reply:
    return Reply(200, json.dumps(payload).encode())


MALFORMED = reply("I think the first one is better.")
EMPTY = raw({})


def valid(s1: float = 4, s2: float = 2, rank: float = 1) -> Reply:
    return reply(json.dumps({"score_1": s1, "score_2": s2, "ranking": rank}))


def http(status: int, body: bytes = b"judge offline", retry_after: str | None = None) -> Reply:
    headers = () if retry_after is None else (f"Retry-After: {retry_after}",)
    return Reply(status, body, headers)


def settings(**overrides: Any) -> Settings:
    data: dict[str, Any] = {
        "judge": {"base_url": "http://judge.test:8000/v1"},
        "judge_request_timeout_s": 0.2,
        "genrm_parse_retries": 3,
        "genrm_parse_retry_sleep_s": 0.2,
    }
    for key, value in overrides.items():
        if key == "judge":
            data["judge"] = {**data["judge"], **value}
        else:
            data[key] = value
    return settings_from_mapping(data)


class Rig:
    """A Comparator over an HttpJudge whose connections `script` answers."""

    def __init__(self, script: Script, *, rng: random.Random | None = None, **overrides: Any):
        self.script = script
        self.settings = settings(**overrides)
        self.metrics = Metrics()
        self.judge: HttpJudge = make_http_judge(self.settings, backend=script.network)
        fleet = as_fleet(self.judge)
        self.queue = judge_queue(fleet, self.settings, self.metrics)
        self.comparator = Comparator(fleet, self.settings, self.metrics, queue=self.queue, rng=rng)

    async def compare(
        self, pair: tuple[int, int] = PAIR, expected_rubric_ids: list[int] | None = None
    ) -> ComparisonResult:
        return await self.comparator.compare(
            CALL, pair=pair, judge_pass=0, expected_rubric_ids=expected_rubric_ids
        )

    async def fail(self, pair: tuple[int, int] = PAIR) -> JudgeError:
        with pytest.raises(JudgeError) as info:
            await self.compare(pair)
        return info.value

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def assert_idle(self) -> None:
        stats = self.comparator.statistics()
        assert (stats.in_flight, stats.queued, stats.comparisons_active) == (0, 0, 0)
        assert self.queue.statistics().in_use == 0
        assert self.judge.in_flight == 0
        assert self.metric("genrm_trio_judge_inflight") == 0
        assert self.metric("genrm_trio_judge_queued") == 0


RUBRIC = (
    '{"rubric_evaluations": ['
    '{"rubric_id": 1, "score_1": 5, "score_2": 1, "ranking": 1},'
    '{"rubric_id": 2, "score_1": 3, "score_2": 3, "ranking": 4}],'
    ' "overall": {"score_1": 4, "score_2": 2, "ranking": 2}}'
)
