"""Engine-facing request and outcome types, shared by the engine, the HTTP layer and the store.

Outcomes are tagged values: a scored member, a member masked alone, or a failed group. The masked
placeholder reward 0.0 never appears here; only the HTTP layer renders it in the failsafe row.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, final

JSONValue = Any  # a decoded JSON value (dict/list/str/int/float/bool/None)
FailureKind = Literal["judge", "cohort"]
Unavailable = Literal[
    "shutting_down", "at_capacity", "group_failed", "superseded", "compare_failed"
]
"""Why a request got 503: the `reason` field of the reply (docs/http-api.md, "503 reasons"), so a
client tells a shutdown from a failed group without reading the prose of `detail`."""

# The failure of every cohort and `/compare` batch a shutdown cuts short (docs/differences.md,
# D28); the store recognises it too (such a cohort keeps its `open` record).
SHUTTING_DOWN = "GenRM server is shutting down"


@final
@dataclass(frozen=True, slots=True)
class VerifyInput:
    """One validated `/verify` request, reduced to what the engine needs (docs/http-api.md).

    Roles in `input` were validated by the wire layer (422 on a bad role, docs/differences.md D16).
    """

    input: JSONValue  # responses_create_params.input as received: a string or a list of items
    response: Mapping[str, JSONValue]  # the whole policy response object, as received
    principle: str | None = None
    metadata: Mapping[str, JSONValue] | None = None  # responses_create_params.metadata
    task_index: int | None = None
    group_id: str | None = None
    group_attempt: int = 0
    group_attempt_given: bool = False  # False → the "treating legacy requests as zero" log line
    rollout_index: int | None = None
    prompt_id: str | None = None
    expected_rubric_ids: tuple[int, ...] | None = None  # canonical: sorted, unique


@final
@dataclass(frozen=True, slots=True)
class CompareInput:
    """One validated `/compare` request (docs/http-api.md, "POST /compare")."""

    history: Sequence[Mapping[str, str]]
    responses: Sequence[Mapping[str, JSONValue]]
    principle: str | None = None
    expected_rubric_ids: tuple[int, ...] | None = None


@final
@dataclass(frozen=True, slots=True)
class Scored:
    """A scored member. `result` holds every non-echo key of its success row (docs/http-api.md):
    reward, mask_sample (False), failure_kind/failure_reason (None), reasoning_text, answer_text,
    reward_* and genrm_* keys. The HTTP layer adds the echoed identity keys."""

    result: Mapping[str, JSONValue]


@final
@dataclass(frozen=True, slots=True)
class Masked:
    """A member masked alone because one of its comparisons failed."""

    reason: str  # the member reason (docs/differences.md), plus the legacy suffix for D33 cohorts


@final
@dataclass(frozen=True, slots=True)
class GroupFailed:
    """The whole cohort failed. Judge kind → failsafe rows; cohort kind → 503 with `message`."""

    kind: FailureKind
    message: str
    reason: Unavailable = "group_failed"  # a cohort-kind failure's 503 reason


MemberOutcome = Scored | Masked | GroupFailed


@final
@dataclass(frozen=True, slots=True)
class CompareResult:
    rewards: list[float]
    comparison_results: list[dict[str, JSONValue]] | None
    metrics: dict[str, JSONValue] | None


class Rejection(enum.Enum):
    """Why the engine refused a request. Only the HTTP layer knows the status each one gets
    (docs/http-api.md, "Other statuses")."""

    INVALID = "invalid"  # the request cannot be served as sent
    CONFLICT = "conflict"  # it contradicts what its group already holds
    UNAVAILABLE = "unavailable"  # the engine cannot take it now (shutting down, at capacity)


class RequestRejected(Exception):
    """A request refused before (or instead of) attaching to a cohort.

    `retry_after_s`: when the caller may try again, for an UNAVAILABLE that is expected to pass;
    `unavailable`: an UNAVAILABLE's reason on the wire (every UNAVAILABLE names one).
    """

    def __init__(
        self,
        reason: Rejection,
        detail: str,
        *,
        retry_after_s: float | None = None,
        unavailable: Unavailable | None = None,
    ) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.retry_after_s = retry_after_s
        self.unavailable = unavailable


class CompareFailed(Exception):
    """`/compare` failed: a judge error (fail-fast), the deadline, or shutdown → 503."""

    def __init__(self, detail: str, *, reason: Unavailable = "compare_failed") -> None:
        super().__init__(detail)
        self.detail = detail
        self.reason = reason


@final
@dataclass(frozen=True, slots=True)
class CohortView:
    """One active cohort as `GET /cohorts` shows it (docs/http-api.md)."""

    key: str
    group_id: str | None
    group_attempt: int
    state: Literal["collecting", "judging"]
    members_present: int
    members_expected: int
    requests_waiting: int  # /verify requests attached and not answered yet
    comparisons_total: int
    comparisons_done: int
    comparisons_failed: int
    comparisons_pending: int
    deadline: Literal["collection", "evaluation"]
    deadline_s_left: float
    age_s: float  # seconds since the cohort's first member arrived
