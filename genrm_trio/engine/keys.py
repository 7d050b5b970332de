"""A `/verify` request's cohort key and digests, and the checks they need (pure).

docs/architecture.md, "Keys, digests and replay": the key names the cohort (by group id and
attempt, else task index, prompt id or the prompt digest, each with the attempt), the digest is
what every member of it must agree on (prompt and principle, plus the baseline's digest and the
rubric ids, which suffix the key too). Refusals are :class:`RequestRejected` (``INVALID``).
"""

from __future__ import annotations

from typing import Final, assert_never, final

from genrm_trio.config import Settings
from genrm_trio.domain.model import Rejection, RequestRejected, VerifyInput
from genrm_trio.domain.text import HistoryError, digest_text, normalize_history, prompt_digest

__all__ = [
    "BASELINE_REQUIRED",
    "RUBRIC_REQUIRED",
    "CohortKey",
    "cohort_key",
    "compares_with_baseline",
    "rubric_mode",
]

RUBRIC_REQUIRED: Final = "score_source=rubric_mean requires expected_rubric_ids"
BASELINE_REQUIRED: Final = (
    "fixed_baseline requires responses_create_params.metadata.baseline_response"
)


def rubric_mode(s: Settings) -> bool:
    """Whether rewards come from the rubric verdicts (`score_source: rubric_mean`), which needs
    every request's ``expected_rubric_ids``."""
    match s.score_source:  # exhaustive: mypy fails here until a new source has its case
        case "overall":
            return False
        case "rubric_mean":
            return True
        case _:
            assert_never(s.score_source)


def compares_with_baseline(s: Settings) -> bool:
    """Whether each member is compared with the group's baseline response
    (`comparison_mode: fixed_baseline`) rather than with the other members."""
    match s.comparison_mode:  # exhaustive: mypy fails here until a new mode has its case
        case "rollout_cohort":
            return False
        case "fixed_baseline":
            return True
        case _:
            assert_never(s.comparison_mode)


@final
class CohortKey:
    """What keys a cohorting request: its key, digest, slot, history and baseline."""

    __slots__ = ("baseline", "baseline_digest", "digest", "history", "index", "key")

    def __init__(
        self,
        key: str,
        digest: str,
        index: int,
        history: list[dict[str, str]],
        baseline: str | None,
        baseline_digest: str | None,
    ) -> None:
        self.key = key
        self.digest = digest
        self.index = index
        self.history = history
        self.baseline = baseline
        self.baseline_digest = baseline_digest


def cohort_key(s: Settings, item: VerifyInput) -> CohortKey:
    """Check the request's slot, baseline and history, and derive its key and digests."""
    size = s.num_rollouts_per_prompt
    index = item.rollout_index
    if index is None:
        raise RequestRejected(
            Rejection.INVALID, "_ng_rollout_index is required for cohort comparison"
        )
    if not 0 <= index < size:
        raise RequestRejected(
            Rejection.INVALID, f"_ng_rollout_index must be in [0, {size}); got {index}"
        )
    baseline: str | None = None
    if compares_with_baseline(s):
        raw = (item.metadata or {}).get("baseline_response")
        if not isinstance(raw, str) or not raw.strip():
            raise RequestRejected(Rejection.INVALID, BASELINE_REQUIRED)
        baseline = raw
    try:
        history = normalize_history(item.input)
    except HistoryError as error:
        raise RequestRejected(Rejection.INVALID, str(error)) from None

    base_digest = prompt_digest(item.input, item.principle)
    if item.group_id is not None:
        key = f"group_id::{item.group_id}::group_attempt::{item.group_attempt}"
    elif item.task_index is not None:
        key = f"task_idx::{item.task_index}::{base_digest}::group_attempt::{item.group_attempt}"
    elif item.prompt_id is not None:
        key = f"prompt_id::{item.prompt_id}::{base_digest}::group_attempt::{item.group_attempt}"
    else:
        key = f"{base_digest}::group_attempt::{item.group_attempt}"
    suffix = ""
    baseline_digest: str | None = None
    if baseline is not None:
        baseline_digest = digest_text(baseline)
        suffix += f":{baseline_digest}"
    if item.expected_rubric_ids is not None:
        suffix += ":rubrics:" + ",".join(map(str, item.expected_rubric_ids))
    key += suffix
    digest = base_digest + suffix
    return CohortKey(key, digest, index, history, baseline, baseline_digest)
