"""A stand-in for `genrm_trio.engine.engine.Engine` with scripted outcomes, for HTTP-layer tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from genrm_trio.domain.model import (
    CohortView,
    CompareInput,
    CompareResult,
    GroupFailed,
    Masked,
    Scored,
    VerifyInput,
)
from genrm_trio.http.asgi import current_rollout_id
from genrm_trio.judge.base import ReplicaStats
from genrm_trio.metrics import Metrics

Outcome = Scored | Masked | GroupFailed

SCORED_RESULT: dict[str, object] = {
    "reward": 4.25,
    "mask_sample": False,
    "failure_kind": None,
    "failure_reason": None,
    "reasoning_text": "",
    "answer_text": "an answer",
    "reward_score_raw": 4.25,
    "reward_rubric_aggregate_valid": None,
    "reward_overall_score_raw": 4.25,
    "reward_overall_score": 4.25,
    "reward_length_adjustment": 0.0,
    "genrm_parse_failure_rate_per_group": 0.0,
    "genrm_rubric_parse_failure_rate_per_group": 0.0,
    "genrm_input_tokens_per_comparison_mean": 10.0,
    "genrm_input_tokens_per_comparison_p50": 10.0,
    "genrm_input_tokens_per_comparison_p95": 10.0,
    "genrm_output_tokens_per_comparison_mean": 5.0,
    "genrm_output_tokens_per_comparison_p50": 5.0,
    "genrm_output_tokens_per_comparison_p95": 5.0,
    "genrm_output_tokens_total_per_group": 20.0,
    "genrm_max_output_tokens_hit_rate_per_group": 0.0,
    "genrm_failed_comparison_rate_per_group": 0.0,
    "genrm_masked_rollout_rate_per_group": 0.0,
}


@dataclass
class FakeEngine:
    """Returns (or raises) whatever the test scripts; records every input it was given."""

    verify_outcome: Callable[[VerifyInput], Awaitable[Outcome]] | None = None
    compare_outcome: Callable[[CompareInput], Awaitable[CompareResult]] | None = None
    cohorts: list[CohortView] = field(default_factory=list)
    replicas: list[ReplicaStats] = field(default_factory=list)
    unreachable: str | None = None  # what judge_unreachable says (/readyz)
    metrics: Metrics = field(default_factory=Metrics)
    verified: list[VerifyInput] = field(default_factory=list)
    compared: list[CompareInput] = field(default_factory=list)
    rollout_ids: list[str | None] = field(default_factory=list)

    async def verify(self, item: VerifyInput) -> Outcome:
        self.verified.append(item)
        self.rollout_ids.append(current_rollout_id.get())
        if self.verify_outcome is None:
            return Scored(SCORED_RESULT)
        return await self.verify_outcome(item)

    async def compare(self, item: CompareInput) -> CompareResult:
        self.compared.append(item)
        self.rollout_ids.append(current_rollout_id.get())
        if self.compare_outcome is None:
            n = len(item.responses)
            return CompareResult(rewards=[3.0] * n, comparison_results=None, metrics=None)
        return await self.compare_outcome(item)

    def active_cohorts(self) -> list[CohortView]:
        return list(self.cohorts)

    def judge_replicas(self) -> list[ReplicaStats]:
        return list(self.replicas)

    def judge_unreachable(self) -> str | None:
        return self.unreachable
